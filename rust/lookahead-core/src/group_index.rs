//! The group index: one generalized suffix automaton over the outputs of every member of a
//! group (samples of one prompt running side by side, finished ones included), appended to as
//! each member grows, so that a member at any point finds the longest match of its context in
//! the text of its siblings and every continuation they took after it.
//!
//! Every member's output is indexed behind [`START`], so that matches at the start of outputs
//! align. Each state records which members contain its strings (a bit per member, slot modulo
//! 64: exact up to 64 members, an approximation above), so that a member can ask what the
//! *others* did after its context, and how many of them agree.
//!
//! Invariants (checked by the tests):
//! - the automaton's own (see [`crate::automaton`]);
//! - a state's member set holds exactly the members whose output contains its strings (for at
//!   most 64 members; above, bits are shared), and it is closed along suffix links: a member
//!   of a state is a member of its link. An append credits its member up the chain and stops
//!   at the first state that has it already, so crediting costs at most 64 bit settings per
//!   state ever created;
//! - [`GroupIndex::sibling_continuations`] only reports tokens that followed the match in
//!   the text of a member outside `own`.

use crate::automaton::{Automaton, ROOT_STATE};
use crate::{SEPARATOR, Token};

/// Opens every member's output in the index; never a real token (ids are below `vocab_size`,
/// which is below it) and never drafted.
pub(crate) const START: Token = SEPARATOR - 1;
/// Transitions of a matched state looked at, at most (the newest first).
const MAX_TRANSITIONS: usize = 16;

/// Members, as bits (member slot modulo 64).
pub(crate) type MemberSet = u64;

/// The bit of member `slot`.
pub(crate) fn member_bit(slot: u32) -> MemberSet {
    1 << (slot % 64)
}

/// A match of a suffix of a member's context (its output so far, or a draft path beyond it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GroupMatch {
    pub state: u32,
    pub len: u32,
}

/// A token other members continued a match with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SiblingContinuation {
    pub token: Token,
    /// Other members whose text has the match followed by the token.
    pub agree: u32,
}

/// What other members continued a match with (see [`GroupIndex::sibling_continuations`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SiblingMatch {
    /// Tokens matched ([`START`] included when the match reaches the output's start).
    pub len: u32,
    /// Other members whose text continues the match (with any token).
    pub total: u32,
}

/// The index of one group's outputs.
#[derive(Debug)]
pub(crate) struct GroupIndex {
    automaton: Automaton<MemberSet>,
    /// Last state of each member's output, by slot.
    last: Vec<u32>,
    tokens: usize,
}

impl Default for GroupIndex {
    fn default() -> Self {
        Self {
            automaton: Automaton::new(0),
            last: Vec::new(),
            tokens: 0,
        }
    }
}

impl GroupIndex {
    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.automaton.heap_bytes() + self.last.capacity() * size_of::<u32>()
    }

    /// Bytes an indexed token may add, at most, amortised.
    pub fn bytes_per_token_bound() -> usize {
        Automaton::<MemberSet>::bytes_per_token_bound()
    }

    /// Tokens indexed, all members together.
    #[cfg(test)]
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Adds a member with an empty output; returns its slot.
    pub fn add_member(&mut self) -> u32 {
        let slot = self.last.len() as u32;
        self.last.push(ROOT_STATE);
        self.push(slot, START);
        slot
    }

    /// Appends output tokens of member `slot`.
    pub fn extend(&mut self, slot: u32, tokens: &[Token]) {
        for &t in tokens {
            self.push(slot, t);
        }
    }

    fn push(&mut self, slot: u32, token: Token) {
        let last = self.automaton.append(self.last[slot as usize], token, 0);
        self.last[slot as usize] = last;
        self.tokens += 1;
        // Member sets are closed along links: once a state has the member, so has the rest.
        let bit = member_bit(slot);
        let mut s = last;
        while s != ROOT_STATE && self.automaton.state(s).data & bit == 0 {
            *self.automaton.data_mut(s) |= bit;
            s = self.automaton.state(s).link;
        }
    }

    /// The match of member `slot`'s whole output (behind [`START`]).
    pub fn member_match(&self, slot: u32) -> GroupMatch {
        let state = self.last[slot as usize];
        GroupMatch {
            state,
            len: self.automaton.state(state).len,
        }
    }

    /// The match after appending `token` to the matched text (see [`Automaton::advance`]).
    pub fn advance(&self, m: GroupMatch, token: Token) -> GroupMatch {
        let (state, len) = self.automaton.advance(m.state, m.len, token);
        GroupMatch { state, len }
    }

    /// The tokens members outside `own` went on with after the longest suffix of the match
    /// that one of them continued (trying at most `max_backoff` suffixes shorter than the
    /// match), into `out`; `None` when there is none.
    pub fn sibling_continuations(
        &self,
        m: GroupMatch,
        own: MemberSet,
        max_backoff: usize,
        out: &mut Vec<SiblingContinuation>,
    ) -> Option<SiblingMatch> {
        out.clear();
        let (mut state, mut len) = (m.state, m.len);
        for _ in 0..=max_backoff {
            if state == ROOT_STATE || len == 0 {
                return None;
            }
            let mut continued: MemberSet = 0;
            for (token, target) in self.automaton.transitions(state).take(MAX_TRANSITIONS) {
                let others = self.automaton.state(target).data & !own;
                if others != 0 {
                    continued |= others;
                    out.push(SiblingContinuation {
                        token,
                        agree: others.count_ones(),
                    });
                }
            }
            if continued != 0 {
                return Some(SiblingMatch {
                    len,
                    total: continued.count_ones(),
                });
            }
            state = self.automaton.state(state).link;
            len = self.automaton.state(state).len;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The longest suffix of `context` that occurs followed by a token in one of `others`
    /// (each behind START), and those tokens with the number of texts agreeing, by brute force.
    fn brute(context: &[Token], others: &[Vec<Token>]) -> Option<(usize, Vec<(Token, u32)>)> {
        let texts: Vec<Vec<Token>> = others
            .iter()
            .map(|o| std::iter::once(START).chain(o.iter().copied()).collect())
            .collect();
        let ctx: Vec<Token> = std::iter::once(START)
            .chain(context.iter().copied())
            .collect();
        for len in (1..=ctx.len()).rev() {
            let suffix = &ctx[ctx.len() - len..];
            let mut found: Vec<(Token, u32)> = Vec::new();
            for text in &texts {
                let mut seen = Vec::new();
                for end in len..text.len() {
                    if &text[end - len..end] == suffix && !seen.contains(&text[end]) {
                        seen.push(text[end]);
                    }
                }
                for t in seen {
                    match found.iter_mut().find(|(k, _)| *k == t) {
                        Some((_, n)) => *n += 1,
                        None => found.push((t, 1)),
                    }
                }
            }
            if !found.is_empty() {
                found.sort();
                return Some((len, found));
            }
        }
        None
    }

    #[test]
    fn a_member_copies_a_sibling_ahead_of_it() {
        let mut g = GroupIndex::default();
        let (a, b) = (g.add_member(), g.add_member());
        g.extend(a, &[1, 2, 3, 4, 5, 6]);
        g.extend(b, &[1, 2, 3]);
        let mut out = Vec::new();
        let m = g
            .sibling_continuations(g.member_match(b), member_bit(b), 4, &mut out)
            .unwrap();
        assert_eq!(m.len, 4, "START 1 2 3");
        assert_eq!(out, vec![SiblingContinuation { token: 4, agree: 1 }]);
        // its own text never counts: a alone has nothing to learn from b
        assert!(
            g.sibling_continuations(g.member_match(a), member_bit(a), 4, &mut out)
                .is_none()
        );
    }

    proptest! {
        #[test]
        fn matches_brute_force_with_few_members(
            texts in prop::collection::vec(prop::collection::vec(0u32..3, 0..24), 2..5),
            order in prop::collection::vec(0usize..4, 0..120),
        ) {
            // interleave the members' appends in a random order
            let mut g = GroupIndex::default();
            let slots: Vec<u32> = texts.iter().map(|_| g.add_member()).collect();
            let mut done = vec![0usize; texts.len()];
            for &i in &order {
                let i = i % texts.len();
                if done[i] < texts[i].len() {
                    g.extend(slots[i], &texts[i][done[i]..=done[i]]);
                    done[i] += 1;
                }
            }
            let mut out = Vec::new();
            for (i, &slot) in slots.iter().enumerate() {
                let context = &texts[i][..done[i]];
                let others: Vec<Vec<Token>> = (0..texts.len())
                    .filter(|&j| j != i)
                    .map(|j| texts[j][..done[j]].to_vec())
                    .collect();
                let m = g.member_match(slot);
                let got = g.sibling_continuations(m, member_bit(slot), usize::MAX, &mut out);
                let want = brute(context, &others);
                match (got, want) {
                    (None, None) => {}
                    (Some(m), Some((len, mut tokens))) => {
                        prop_assert_eq!(m.len as usize, len);
                        let mut seen: Vec<(Token, u32)> =
                            out.iter().map(|c| (c.token, c.agree)).collect();
                        seen.sort();
                        tokens.sort();
                        prop_assert_eq!(seen, tokens);
                    }
                    (got, want) => prop_assert!(false, "index {:?}, brute force {:?}", got, want),
                }
            }
        }
    }
}
