//! Groups: requests that draft from each other's outputs.
//!
//! Requests with the same prompt form a group on their own (samples of one prompt: RL
//! rollouts, parallel sampling, best-of-n); an engine may also name the group a request
//! belongs to, which then holds requests with any prompts (an agent's calls). A group lives
//! while it has an active request. It holds:
//! - the sibling responses remembered when it formed: the history every member starts with;
//! - the outputs of its members, running and finished, and once two members have output, the
//!   [`GroupIndex`] over them, from which each member drafts what its siblings wrote.
//!
//! Members come from this drafter (its requests) or from other servers (their updates, see
//! [`crate::GroupUpdate`]); a member is named by its origin and request id.
//!
//! Invariants: member `i` of the group is slot `i` of its index; the index holds exactly the
//! first `indexed` tokens of each member's output (the rest waits for memory or is dropped
//! with the member, see [`Group::extend`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::Token;
use crate::group_index::{GroupIndex, GroupMatch, MemberSet, member_bit};
use crate::siblings::MAX_SIBLING_TOKENS;
use crate::types::GroupKey;

/// The request's group index and its place in it.
#[derive(Clone, Copy)]
pub(crate) struct GroupSource<'a> {
    pub index: &'a GroupIndex,
    /// The match of the request's whole output.
    pub root: GroupMatch,
    /// The request's own member bit: its own text is not sibling evidence.
    pub own: MemberSet,
}

/// A member's name within its group: its origin (`""` for this drafter) and request id.
pub(crate) fn member_key(origin: &str, request_id: &str) -> u64 {
    let key = GroupKey::named(origin).0;
    key ^ GroupKey::named(request_id).0.rotate_left(17)
}

/// One member: its output as far as known.
#[derive(Debug)]
struct Member {
    /// Output position of `output[0]` (a member from another server may be joined late).
    base: u32,
    output: Vec<Token>,
    /// Tokens of `output` in the index.
    indexed: usize,
    /// No more of its output is kept (memory ran short, or its updates had a gap).
    closed: bool,
    /// Its whole output, once it finished.
    finished: Option<Arc<[Token]>>,
    /// Members whose text the member has in its own history (itself, and the finished
    /// outputs it started with): what the group index tells it about them is not news.
    sees: MemberSet,
}

/// A group of requests (see the module docs).
#[derive(Debug)]
pub(crate) struct Group {
    /// Active requests of this drafter in the group.
    pub active: u32,
    /// Sibling responses remembered when the group formed, the most recent first.
    pub prefix: Vec<Arc<[Token]>>,
    members: Vec<Member>,
    by_key: HashMap<u64, u32>,
    index: Option<GroupIndex>,
    /// Heap bytes last added to the drafter's total of request bytes.
    pub accounted_bytes: usize,
}

impl Group {
    /// A group with no member yet, whose members start with the history `prefix`.
    pub fn new(prefix: Vec<Arc<[Token]>>) -> Self {
        Self {
            active: 0,
            prefix,
            members: Vec::new(),
            by_key: HashMap::new(),
            index: None,
            accounted_bytes: 0,
        }
    }

    /// Heap bytes held (outputs, index, member table).
    pub fn heap_bytes(&self) -> usize {
        let outputs: usize = self
            .members
            .iter()
            .map(|m| m.output.capacity() + m.finished.as_ref().map_or(0, |f| f.len()))
            .sum();
        outputs * size_of::<Token>()
            + self.members.capacity() * size_of::<Member>()
            + self.by_key.capacity() * (size_of::<(u64, u32)>() + 1)
            + self.index.as_ref().map_or(0, GroupIndex::heap_bytes)
    }

    /// Bytes a member's output token may add at most, amortised: its copy and its indexing.
    pub fn bytes_per_token_bound() -> usize {
        2 * size_of::<Token>() + GroupIndex::bytes_per_token_bound()
    }

    /// Members so far, running and finished, from here and elsewhere.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The slot of member `key`, which joins (with an output starting at `base`) if new.
    pub fn join(&mut self, key: u64, base: u32) -> u32 {
        if let Some(&slot) = self.by_key.get(&key) {
            return slot;
        }
        let slot = self.members.len() as u32;
        self.members.push(Member {
            base,
            output: Vec::new(),
            indexed: 0,
            closed: false,
            finished: None,
            sees: member_bit(slot),
        });
        self.by_key.insert(key, slot);
        if let Some(index) = &mut self.index {
            index.add_member();
        }
        slot
    }

    /// Appends the output tokens of member `key` (which joins if new) starting at output
    /// position `offset`, keeping at most `room_bytes` more heap (past it the member's output
    /// is closed for good). Tokens it already has are skipped. After a gap (tokens lost in
    /// transit) its known output stays, and it goes on as a new member from `offset`.
    pub fn extend(&mut self, key: u64, offset: u32, tokens: &[Token], room_bytes: usize) {
        let mut slot = self.join(key, offset);
        let member = &self.members[slot as usize];
        if member.closed {
            return;
        }
        let known = member.base as usize + member.output.len();
        if offset as usize > known {
            self.members[slot as usize].closed = true;
            self.by_key.remove(&key);
            slot = self.join(key, offset);
        }
        let member = &mut self.members[slot as usize];
        let known = member.base as usize + member.output.len();
        let new = &tokens[(known - offset as usize).min(tokens.len())..];
        if new.is_empty() {
            return;
        }
        if new.len() * Self::bytes_per_token_bound() > room_bytes {
            member.closed = true;
            return;
        }
        member.output.extend_from_slice(new);
        self.index_new_output();
    }

    /// Builds the index once two members have output, then keeps it up to date.
    fn index_new_output(&mut self) {
        if self.index.is_none() {
            if self.members.iter().filter(|m| !m.output.is_empty()).count() < 2 {
                return;
            }
            let mut index = GroupIndex::default();
            for _ in &self.members {
                index.add_member();
            }
            self.index = Some(index);
        }
        let Some(index) = &mut self.index else { return };
        for (slot, member) in self.members.iter_mut().enumerate() {
            if member.indexed < member.output.len() {
                index.extend(slot as u32, &member.output[member.indexed..]);
                member.indexed = member.output.len();
            }
        }
    }

    /// The history a new member starts with: the outputs of the members that finished, the
    /// most recent first, then the sibling responses the group formed with; at most
    /// [`MAX_SIBLING_TOKENS`] tokens. Joins member `key`, which is told that it has those
    /// members' text already.
    pub fn join_with_history(&mut self, key: u64) -> Vec<Arc<[Token]>> {
        let slot = self.join(key, 0);
        let mut history = Vec::new();
        let mut sees = member_bit(slot);
        let mut total = 0;
        let finished = self.members.iter().enumerate().rev();
        for (i, output) in finished.filter_map(|(i, m)| Some((i, m.finished.clone()?))) {
            total += output.len();
            if total > MAX_SIBLING_TOKENS {
                break;
            }
            sees |= member_bit(i as u32);
            history.push(output);
        }
        for response in &self.prefix {
            total += response.len();
            if total > MAX_SIBLING_TOKENS {
                break;
            }
            history.push(response.clone());
        }
        self.members[slot as usize].sees = sees;
        history
    }

    /// Member `key` ended with the output known of it: later members start with it (see
    /// [`Self::join_with_history`]). Returns that output.
    pub fn finish(&mut self, key: u64) -> Option<Arc<[Token]>> {
        let slot = *self.by_key.get(&key)?;
        let member = &mut self.members[slot as usize];
        if member.closed || member.base != 0 || member.output.is_empty() {
            return None; // not the whole output: no history to start from
        }
        let output: Arc<[Token]> = member.output.as_slice().into();
        member.finished = Some(output.clone());
        Some(output)
    }

    /// The index, with the match of member `key`'s output and the members it already knows,
    /// once the group has other members with output.
    pub fn draft_source(&self, key: u64) -> Option<GroupSource<'_>> {
        let index = self.index.as_ref()?;
        let slot = *self.by_key.get(&key)?;
        Some(GroupSource {
            index,
            root: index.member_match(slot),
            own: self.members[slot as usize].sees,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_distinct() {
        assert_eq!(
            GroupKey::of_prompt(&[1, 2, 3]),
            GroupKey::of_prompt(&[1, 2, 3])
        );
        assert_ne!(GroupKey::of_prompt(&[1, 2]), GroupKey::of_prompt(&[2, 1]));
        assert_ne!(GroupKey::named("a"), GroupKey::named("b"));
        assert_ne!(GroupKey::named("ab"), GroupKey::named("ab\0"));
        // fixed value: keys travel between servers, so they must not change between builds
        assert_eq!(GroupKey::named("rollout-7").to_string().len(), 16);
        assert_eq!(member_key("", "r1"), member_key("", "r1"));
        assert_ne!(member_key("", "r1"), member_key("node-b", "r1"));
    }

    #[test]
    fn index_forms_with_the_second_output_and_skips_known_tokens() {
        let mut g = Group::new(Vec::new());
        let (a, b) = (1, 2);
        g.join(b, 0);
        g.extend(a, 0, &[5, 6, 7], usize::MAX);
        assert!(
            g.draft_source(a).is_none(),
            "one member with output: no index"
        );
        g.extend(b, 0, &[5], usize::MAX);
        g.extend(b, 0, &[5, 6], usize::MAX); // 5 is known, 6 is new
        let source = g.draft_source(b).unwrap();
        assert_eq!(source.index.tokens(), 2 + 3 + 2, "START and outputs");
        g.extend(b, 9, &[1, 2], usize::MAX); // a gap: b goes on as a new member
        assert_eq!(g.members(), 3);
        assert_eq!(g.draft_source(b).unwrap().index.tokens(), 7 + 3);
        g.extend(a, 3, &[8], 0); // no room: closed, not an error
        g.extend(a, 4, &[9], usize::MAX); // closed stays closed
        assert_eq!(g.draft_source(a).unwrap().index.tokens(), 10);
    }
}
