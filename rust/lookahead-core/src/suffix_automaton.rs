//! A suffix automaton over one request's tokens (prompt, then outputs as they arrive).
//!
//! It recognises every substring of the text, so the longest suffix of the context that occurs
//! earlier in the request is found in time proportional to the match, whatever the history's
//! length, and every continuation seen after it is one transition away.
//!
//! The construction is the shared one of [`crate::automaton`], over one string. Invariants of
//! the evidence kept per state (checked by the tests):
//! - `recent_end[s]` is always an end position of an occurrence of the strings of `s`, earlier
//!   than the current last position when such an occurrence exists (updated one append late);
//! - `occ[s]` is a lower bound of the number of such earlier occurrences (the walk that updates
//!   it is capped at [`OCC_WALK_CAP`] states so that an append costs O(1) amortised).

use crate::Token;
use crate::automaton::{Automaton, NONE, ROOT_STATE};

/// How far up the suffix-link chain an append refreshes `recent_end` and `occ`. Drafts read
/// them at the longest matches, near the top of the chain: on the seven replay workloads, caps
/// from 3 to 48 give the same acceptance to within 0.01 token a step, while the walk was the
/// largest cost of indexing a repetitive prompt at 48 (1.5x to 2x slower starts).
pub(crate) const OCC_WALK_CAP: usize = 8;

/// Occurrence evidence of a state.
#[derive(Clone, Copy, Debug)]
struct Occurrences {
    recent_end: u32,
    occ: u32,
}

/// A match of a suffix of some text: the automaton state and how many tokens match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalMatch {
    pub state: u32,
    pub len: u32,
}

/// One continuation of a matched string: the token that followed it and its evidence.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Continuation {
    pub token: Token,
    /// Earlier occurrences of the extended string (a lower bound).
    pub occ: u32,
    /// Whether this token followed the most recent earlier occurrence.
    pub most_recent: bool,
    /// An end position of an earlier occurrence of the extended string (its most recent one
    /// as far as the bookkeeping's walk refreshed it).
    pub recent_end: u32,
}

/// The automaton plus the text it indexes.
#[derive(Debug)]
pub(crate) struct SuffixAutomaton {
    text: Vec<Token>,
    automaton: Automaton<Occurrences>,
    last: u32,
}

impl Default for SuffixAutomaton {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixAutomaton {
    /// An automaton of the empty text.
    pub fn new() -> Self {
        Self {
            text: Vec::new(),
            automaton: Automaton::new(Occurrences {
                recent_end: NONE,
                occ: 0,
            }),
            last: ROOT_STATE,
        }
    }

    /// The indexed text.
    pub fn text(&self) -> &[Token] {
        &self.text
    }

    /// Heap bytes held (capacity, not length: what the allocator really gave).
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() * size_of::<Token>() + self.automaton.heap_bytes()
    }

    /// Bytes an append of `n` tokens may add, at most (used to refuse requests up front).
    pub fn bytes_per_token_bound() -> usize {
        2 * size_of::<Token>() + Automaton::<Occurrences>::bytes_per_token_bound()
    }

    /// Appends tokens to the text.
    pub fn extend(&mut self, tokens: &[Token]) {
        for &t in tokens {
            self.push(t);
        }
    }

    /// Credits the occurrence ending at the previous last position to the states of its
    /// suffixes. Done one append late so that the current position, which has no continuation
    /// yet, never shadows an earlier occurrence.
    fn credit_previous_end(&mut self) {
        let Some(end) = (self.text.len() as u32).checked_sub(1) else {
            return;
        };
        let mut s = self.last;
        for _ in 0..OCC_WALK_CAP {
            if s == ROOT_STATE || s == NONE {
                break;
            }
            let link = self.automaton.state(s).link;
            let data = self.automaton.data_mut(s);
            data.recent_end = end;
            data.occ = data.occ.saturating_add(1);
            s = link;
        }
    }

    fn push(&mut self, token: Token) {
        self.credit_previous_end();
        let pos = self.text.len() as u32;
        self.text.push(token);
        let fresh = Occurrences {
            recent_end: pos,
            occ: 0,
        };
        self.last = self.automaton.append(self.last, token, fresh);
    }

    /// The longest suffix of the whole text that also occurs earlier in it.
    pub fn longest_earlier_suffix(&self) -> LocalMatch {
        let link = self.automaton.state(self.last).link;
        if link == NONE {
            return LocalMatch { state: 0, len: 0 };
        }
        LocalMatch {
            state: link,
            len: self.automaton.state(link).len,
        }
    }

    /// The match after appending `token` to the matched text: the transition when the extended
    /// string was seen, else the longest shorter suffix that continues with `token`.
    pub fn advance(&self, m: LocalMatch, token: Token) -> LocalMatch {
        let (state, len) = self.automaton.advance(m.state, m.len, token);
        LocalMatch { state, len }
    }

    /// The longest proper suffix of the matched string that is matched by another state (more
    /// occurrences, less context), if the match is not already the shortest.
    pub fn shorter(&self, m: LocalMatch) -> Option<LocalMatch> {
        let link = self.automaton.state(m.state).link;
        (link != NONE && link != ROOT_STATE).then(|| LocalMatch {
            state: link,
            len: self.automaton.state(link).len,
        })
    }

    /// End position of the most recent earlier occurrence of the matched string.
    pub fn recent_end(&self, m: LocalMatch) -> Option<u32> {
        let end = self.automaton.state(m.state).data.recent_end;
        (m.len > 0 && end != NONE).then_some(end)
    }

    /// Earlier occurrences of the matched string (a lower bound, at least 1 for a match).
    pub fn occurrences(&self, m: LocalMatch) -> u32 {
        self.automaton.state(m.state).data.occ.max(1)
    }

    /// Tokens seen after the matched string with their evidence, at most `limit` of them
    /// (edges added last come first, so a cap keeps mostly the newest continuations).
    pub fn continuations(&self, m: LocalMatch, limit: usize, out: &mut Vec<Continuation>) {
        out.clear();
        if m.len == 0 {
            return;
        }
        let recent_next = (self.automaton.state(m.state).data.recent_end as usize)
            .checked_add(1)
            .and_then(|i| self.text.get(i))
            .copied();
        let transitions = self.automaton.transitions(m.state).take(limit);
        out.extend(transitions.map(|(token, target)| {
            let data = self.automaton.state(target).data;
            Continuation {
                token,
                occ: data.occ.max(1),
                most_recent: recent_next == Some(token),
                recent_end: data.recent_end,
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Longest suffix of `text` occurring ending before the last position, by brute force.
    fn brute_longest_earlier(text: &[Token]) -> usize {
        let n = text.len();
        (1..n)
            .rev()
            .find(|&len| {
                let suffix = &text[n - len..];
                (len..n).any(|end| &text[end - len..end] == suffix)
            })
            .unwrap_or(0)
    }

    #[test]
    fn finds_copy_source_and_its_continuation() {
        let mut sam = SuffixAutomaton::new();
        sam.extend(&[1, 2, 3, 4, 5, 9, 9, 1, 2, 3]);
        let m = sam.longest_earlier_suffix();
        assert_eq!(m.len, 3);
        let mut out = Vec::new();
        sam.continuations(m, usize::MAX, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token, 4);
        assert!(out[0].most_recent);
        let m = sam.advance(m, 4);
        assert_eq!(m.len, 4);
        let m = sam.advance(m, 77);
        assert_eq!(m.len, 0);
    }

    proptest! {
        #[test]
        fn longest_earlier_suffix_matches_brute_force(text in prop::collection::vec(0u32..4, 1..80)) {
            let mut sam = SuffixAutomaton::new();
            for (i, &t) in text.iter().enumerate() {
                sam.extend(&[t]);
                let m = sam.longest_earlier_suffix();
                prop_assert_eq!(m.len as usize, brute_longest_earlier(&text[..=i]));
            }
        }

        #[test]
        fn continuations_were_seen_after_the_match(text in prop::collection::vec(0u32..5, 2..80)) {
            let mut sam = SuffixAutomaton::new();
            sam.extend(&text);
            let m = sam.longest_earlier_suffix();
            let n = text.len();
            let suffix = &text[n - m.len as usize..];
            let mut out = Vec::new();
            sam.continuations(m, usize::MAX, &mut out);
            for c in &out {
                let seen = (m.len as usize..n).any(|end| {
                    &text[end - m.len as usize..end] == suffix && text[end] == c.token
                });
                prop_assert!(seen, "continuation {} never followed the match", c.token);
            }
            // the most recent earlier occurrence's continuation is the flagged one
            if m.len > 0 {
                let recent = (m.len as usize..n)
                    .rev()
                    .find(|&end| &text[end - m.len as usize..end] == suffix)
                    .map(|end| text[end]);
                let flagged: Vec<_> = out.iter().filter(|c| c.most_recent).map(|c| c.token).collect();
                prop_assert!(flagged.len() <= 1);
                if text.len() < OCC_WALK_CAP {
                    prop_assert_eq!(flagged.first().copied(), recent);
                }
            }
        }
    }
}
