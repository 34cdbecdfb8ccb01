//! A suffix automaton over one request's tokens (prompt, then outputs as they arrive).
//!
//! It recognises every substring of the text, so the longest suffix of the context that occurs
//! earlier in the request is found in time proportional to the match, whatever the history's
//! length, and every continuation seen after it is one transition away.
//!
//! Invariants (checked by the tests):
//! - state 0 is the root (the empty string); `link` of every other state points to a state
//!   with a strictly smaller `len`;
//! - `recent_end[s]` is always an end position of an occurrence of the strings of `s`, earlier
//!   than the current last position when such an occurrence exists (updated one append late);
//! - `occ[s]` is a lower bound of the number of such earlier occurrences (the walk that updates
//!   it is capped at [`OCC_WALK_CAP`] states so that an append costs O(1) amortised).

use hashbrown::HashTable;

use crate::Token;
use crate::hashing::pair_hash;

const NONE: u32 = u32::MAX;
/// How far up the suffix-link chain an append refreshes `recent_end` and `occ`. Drafts read
/// them at the longest matches, near the top of the chain: on the seven replay workloads, caps
/// from 3 to 48 give the same acceptance to within 0.01 token a step, while the walk was the
/// largest cost of indexing a repetitive prompt at 48 (1.5x to 2x slower starts).
pub(crate) const OCC_WALK_CAP: usize = 8;

#[derive(Clone, Copy, Debug)]
struct State {
    len: u32,
    link: u32,
    first_edge: u32,
    recent_end: u32,
    occ: u32,
}

#[derive(Clone, Copy, Debug)]
struct Edge {
    source: u32,
    token: Token,
    target: u32,
    next: u32,
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
}

/// The automaton plus the text it indexes.
#[derive(Debug, Default)]
pub(crate) struct SuffixAutomaton {
    text: Vec<Token>,
    states: Vec<State>,
    edges: Vec<Edge>,
    index: HashTable<u32>,
    last: u32,
}

impl SuffixAutomaton {
    /// An automaton of the empty text.
    pub fn new() -> Self {
        let root = State {
            len: 0,
            link: NONE,
            first_edge: NONE,
            recent_end: NONE,
            occ: 0,
        };
        Self {
            text: Vec::new(),
            states: vec![root],
            edges: Vec::new(),
            index: HashTable::new(),
            last: 0,
        }
    }

    /// The indexed text.
    pub fn text(&self) -> &[Token] {
        &self.text
    }

    /// Heap bytes held (capacity, not length: what the allocator really gave).
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() * size_of::<Token>()
            + self.states.capacity() * size_of::<State>()
            + self.edges.capacity() * size_of::<Edge>()
            + self.index.capacity() * (size_of::<u32>() + 1)
    }

    /// Bytes an append of `n` tokens may add, at most (used to refuse requests up front).
    pub fn bytes_per_token_bound() -> usize {
        // one text slot, at most two states and three edges (amortised), index slots, and the
        // doubling slack of growing vectors
        2 * (size_of::<Token>() + 2 * size_of::<State>() + 3 * (size_of::<Edge>() + 8))
    }

    /// Appends tokens to the text.
    pub fn extend(&mut self, tokens: &[Token]) {
        for &t in tokens {
            self.push(t);
        }
    }

    fn transition(&self, state: u32, token: Token) -> Option<u32> {
        self.edge_id(state, token)
            .map(|e| self.edges[e as usize].target)
    }

    fn edge_id(&self, state: u32, token: Token) -> Option<u32> {
        let edges = &self.edges;
        self.index
            .find(pair_hash(state, token), |&e| {
                let e = &edges[e as usize];
                e.source == state && e.token == token
            })
            .copied()
    }

    fn add_edge(&mut self, source: u32, token: Token, target: u32) {
        let id = self.edges.len() as u32;
        let next = self.states[source as usize].first_edge;
        self.edges.push(Edge {
            source,
            token,
            target,
            next,
        });
        self.states[source as usize].first_edge = id;
        let edges = &self.edges;
        self.index
            .insert_unique(pair_hash(source, token), id, |&e| {
                let e = &edges[e as usize];
                pair_hash(e.source, e.token)
            });
    }

    fn new_state(&mut self, len: u32, link: u32, recent_end: u32, occ: u32) -> u32 {
        self.states.push(State {
            len,
            link,
            first_edge: NONE,
            recent_end,
            occ,
        });
        (self.states.len() - 1) as u32
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
            if s == 0 || s == NONE {
                break;
            }
            let state = &mut self.states[s as usize];
            state.recent_end = end;
            state.occ = state.occ.saturating_add(1);
            s = state.link;
        }
    }

    fn push(&mut self, token: Token) {
        self.credit_previous_end();
        let pos = self.text.len() as u32;
        self.text.push(token);
        let cur = self.new_state(self.states[self.last as usize].len + 1, NONE, pos, 0);
        let mut p = self.last;
        // walk up until a state already continues with `token`
        let mut found = None;
        while p != NONE {
            if let Some(edge) = self.edge_id(p, token) {
                found = Some(edge);
                break;
            }
            self.add_edge(p, token, cur);
            p = self.states[p as usize].link;
        }
        let link = match found {
            None => 0,
            Some(edge) => self.split_if_needed(p, edge, token),
        };
        self.states[cur as usize].link = link;
        self.last = cur;
    }

    /// The suffix link of a new last state whose walk stopped at state `p`, which goes on with
    /// `token` through `edge`: the edge's target when it is solid (one token longer than `p`),
    /// else a clone of the target that takes over the shorter strings (the classic split).
    fn split_if_needed(&mut self, mut p: u32, edge: u32, token: Token) -> u32 {
        let q = self.edges[edge as usize].target;
        let (p_len, q_state) = (self.states[p as usize].len, self.states[q as usize]);
        if p_len + 1 == q_state.len {
            return q;
        }
        let clone = self.new_state(p_len + 1, q_state.link, q_state.recent_end, q_state.occ);
        let mut e = q_state.first_edge;
        while e != NONE {
            let Edge {
                token,
                target,
                next,
                ..
            } = self.edges[e as usize];
            self.add_edge(clone, token, target);
            e = next;
        }
        // redirect to the clone every transition by `token` into `q` up the suffix links
        let mut redirect = Some(edge);
        while let Some(e) = redirect.filter(|&e| self.edges[e as usize].target == q) {
            self.edges[e as usize].target = clone;
            p = self.states[p as usize].link;
            redirect = if p == NONE {
                None
            } else {
                self.edge_id(p, token)
            };
        }
        self.states[q as usize].link = clone;
        clone
    }

    /// The longest suffix of the whole text that also occurs earlier in it.
    pub fn longest_earlier_suffix(&self) -> LocalMatch {
        let link = self.states[self.last as usize].link;
        if link == NONE {
            return LocalMatch { state: 0, len: 0 };
        }
        LocalMatch {
            state: link,
            len: self.states[link as usize].len,
        }
    }

    /// The match after appending `token` to the matched text: the transition when the extended
    /// string was seen, else the longest shorter suffix that continues with `token`.
    pub fn advance(&self, m: LocalMatch, token: Token) -> LocalMatch {
        let (mut state, mut len) = (m.state, m.len);
        loop {
            if let Some(next) = self.transition(state, token) {
                return LocalMatch {
                    state: next,
                    len: len + 1,
                };
            }
            if state == 0 {
                return LocalMatch { state: 0, len: 0 };
            }
            state = self.states[state as usize].link;
            len = self.states[state as usize].len;
        }
    }

    /// The longest proper suffix of the matched string that is matched by another state (more
    /// occurrences, less context), if the match is not already the shortest.
    pub fn shorter(&self, m: LocalMatch) -> Option<LocalMatch> {
        let link = self.states[m.state as usize].link;
        (link != NONE && link != 0).then(|| LocalMatch {
            state: link,
            len: self.states[link as usize].len,
        })
    }

    /// End position of the most recent earlier occurrence of the matched string.
    pub fn recent_end(&self, m: LocalMatch) -> Option<u32> {
        let end = self.states[m.state as usize].recent_end;
        (m.len > 0 && end != NONE).then_some(end)
    }

    /// Earlier occurrences of the matched string (a lower bound, at least 1 for a match).
    pub fn occurrences(&self, m: LocalMatch) -> u32 {
        self.states[m.state as usize].occ.max(1)
    }

    /// Tokens seen after the matched string with their evidence, at most `limit` of them
    /// (edges added last come first, so a cap keeps mostly the newest continuations).
    pub fn continuations(&self, m: LocalMatch, limit: usize, out: &mut Vec<Continuation>) {
        out.clear();
        if m.len == 0 {
            return;
        }
        let state = &self.states[m.state as usize];
        let recent_next = (state.recent_end as usize)
            .checked_add(1)
            .and_then(|i| self.text.get(i))
            .copied();
        let mut e = state.first_edge;
        while e != NONE && out.len() < limit {
            let edge = &self.edges[e as usize];
            out.push(Continuation {
                token: edge.token,
                occ: self.states[edge.target as usize].occ.max(1),
                most_recent: recent_next == Some(edge.token),
            });
            e = edge.next;
        }
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
