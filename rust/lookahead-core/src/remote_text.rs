//! Where other drafters' running requests stand in this drafter's shared trie: the running
//! parts of a request ([`crate::LearnedText::Running`]) arrive step by step, and each goes on
//! from the n-grams the previous one ended with, as the request's own cursor does on its
//! drafter.
//!
//! Only continuity depends on this state, never correctness: a part that finds no entry (the
//! first of a request, one after a restart or an eviction, one after a gap) starts a new
//! entry and loses only the n-grams that span the boundary; the request's ended text inserts
//! exactly what its parts did not carry, whatever is here. So the table can be small and
//! bounded: the least recently used entry goes first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::Token;
use crate::provenance::Origin;
use crate::request::TrieCursor;
use crate::snapshot::{Reader, SnapshotError, Writer};
use crate::trie::NgramTrie;

/// One remote running request.
#[derive(Debug)]
struct RemoteText {
    cursor: TrieCursor,
    /// The last inserted tokens (at most the trie's depth), then the part being inserted.
    window: Vec<Token>,
    /// Position in the request's text of the next token expected.
    next: usize,
    last_used: Instant,
}

/// The table of remote running requests, by [`crate::group::member_key`] of their origin
/// and request id.
#[derive(Debug)]
pub(crate) struct RemoteTexts {
    entries: HashMap<u64, RemoteText>,
    max_entries: usize,
    max_depth: usize,
}

impl RemoteTexts {
    /// A table of at most `max_entries` requests, for a trie of depth `max_depth`.
    pub fn new(max_entries: usize, max_depth: usize) -> Self {
        Self {
            entries: HashMap::new(),
            max_entries: max_entries.max(1),
            max_depth,
        }
    }

    /// Heap bytes one entry may hold.
    pub fn entry_bytes(max_depth: usize) -> usize {
        size_of::<(u64, RemoteText)>() + 1 + (2 * max_depth + 1) * size_of::<u32>()
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * Self::entry_bytes(self.max_depth)
    }

    /// Inserts `tokens`, at position `offset` of request `key`'s text, into the trie (under
    /// its write lock); `shared_from` as for [`TrieCursor::insert`], in text positions.
    pub fn insert(
        &mut self,
        trie: &mut NgramTrie,
        key: u64,
        offset: usize,
        tokens: &[Token],
        shared_from: usize,
    ) {
        if self.entries.get(&key).is_none_or(|e| e.next != offset) {
            self.start(key, offset);
        }
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        entry.last_used = Instant::now();
        let base = entry.next - entry.window.len(); // text position of window[0]
        entry.window.extend_from_slice(tokens);
        let end = entry.window.len();
        entry.cursor.insert(
            trie,
            &entry.window,
            end,
            shared_from.saturating_sub(base),
            Origin::OTHERS,
        );
        entry.next += tokens.len();
        let done = entry.window.len().saturating_sub(self.max_depth);
        entry.window.drain(..done);
        entry.window.shrink_to(self.max_depth);
        entry.cursor.rebase(done);
    }

    /// A new entry for request `key` from text position `offset` (no context before it).
    fn start(&mut self, key: u64, offset: usize) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.max_entries {
            let oldest = self.entries.iter().min_by_key(|(_, e)| e.last_used);
            if let Some((&oldest, _)) = oldest {
                self.entries.remove(&oldest);
            }
        }
        let entry = RemoteText {
            cursor: TrieCursor::new(self.max_depth),
            window: Vec::with_capacity(self.max_depth),
            next: offset,
            last_used: Instant::now(),
        };
        self.entries.insert(key, entry);
    }

    /// Forgets request `key` (it ended).
    pub fn remove(&mut self, key: u64) {
        self.entries.remove(&key);
    }

    /// Forgets the requests no part reached for `max_idle` (their drafter went away).
    pub fn expire(&mut self, now: Instant, max_idle: Duration) {
        self.entries
            .retain(|_, e| now.duration_since(e.last_used) <= max_idle);
        self.entries.shrink_to_fit();
    }

    /// The most requests tracked.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Writes every entry to a snapshot (so that a restored drafter goes on where this one
    /// stands: the stream it applies resumes after the snapshot).
    pub fn encode(&self, w: &mut Writer) {
        let mut keys: Vec<u64> = self.entries.keys().copied().collect();
        keys.sort_unstable();
        w.len(keys.len());
        for key in keys {
            let entry = &self.entries[&key];
            w.u64(key);
            w.u64(entry.next as u64);
            w.len(entry.window.len());
            entry.window.iter().for_each(|&t| w.u32(t));
        }
    }

    /// Reads entries written by [`Self::encode`] into a table of at most `max_entries` (the
    /// ones past it are left out: they only lose continuity).
    pub fn decode(
        r: &mut Reader<'_>,
        max_entries: usize,
        max_depth: usize,
    ) -> Result<Self, SnapshotError> {
        let mut table = Self::new(max_entries, max_depth);
        for _ in 0..r.len(24)? {
            let key = r.u64()?;
            let next = usize::try_from(r.u64()?)
                .map_err(|_| SnapshotError::Corrupt("remote text position"))?;
            let len = r.len(4)?;
            if len > max_depth || len > next {
                return Err(SnapshotError::Corrupt("remote text window"));
            }
            let window = (0..len).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
            if table.entries.len() < table.max_entries {
                let entry = RemoteText {
                    cursor: TrieCursor::starting_at(max_depth, len),
                    window,
                    next,
                    last_used: Instant::now(),
                };
                table.entries.insert(key, entry);
            }
        }
        Ok(table)
    }

    /// Requests tracked.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trie's nodes and counts, for comparisons.
    fn counts(trie: &NgramTrie, texts: &[&[Token]]) -> Vec<Option<u32>> {
        let mut out = Vec::new();
        for text in texts {
            for start in 0..text.len() {
                for end in start + 1..=text.len().min(start + trie.max_depth()) {
                    out.push(trie.walk(0, &text[start..end]).map(|n| trie.count(n)));
                }
            }
        }
        out
    }

    #[test]
    fn parts_insert_what_the_whole_text_does() {
        let text: Vec<Token> = (0..40).map(|i| i % 7 + 1).collect();
        let mut whole = NgramTrie::new(6, 1 << 16);
        TrieCursor::new(6).insert(&mut whole, &text, text.len(), 20, Origin::OTHERS);
        let mut parts = NgramTrie::new(6, 1 << 16);
        let mut remote = RemoteTexts::new(4, 6);
        let mut at = 0;
        for len in [3, 1, 9, 2, 25] {
            remote.insert(&mut parts, 9, at, &text[at..at + len], 20);
            at += len;
        }
        assert_eq!(counts(&whole, &[&text]), counts(&parts, &[&text]));
        remote.remove(9);
        assert_eq!(remote.len(), 0);
    }

    #[test]
    fn the_least_recently_used_goes_first_and_a_gap_starts_over() {
        let mut trie = NgramTrie::new(4, 1 << 12);
        let mut remote = RemoteTexts::new(2, 4);
        remote.insert(&mut trie, 1, 0, &[1, 2, 3], usize::MAX);
        remote.insert(&mut trie, 2, 0, &[4, 5], usize::MAX);
        remote.insert(&mut trie, 1, 3, &[4], usize::MAX);
        remote.insert(&mut trie, 3, 0, &[6], usize::MAX); // evicts 2
        assert_eq!(remote.len(), 2);
        assert_eq!(remote.entries.get(&1).map(|e| e.next), Some(4));
        assert!(!remote.entries.contains_key(&2));
        // a gap: the part is inserted without the context before it
        remote.insert(&mut trie, 1, 9, &[7, 8], usize::MAX);
        assert!(trie.walk(0, &[4, 7]).is_none());
        assert!(trie.walk(0, &[7, 8]).is_some());
        remote.expire(
            Instant::now() + Duration::from_secs(2),
            Duration::from_secs(1),
        );
        assert_eq!(remote.len(), 0);
    }

    #[test]
    fn a_decoded_table_goes_on_where_the_encoded_one_stood() {
        let text: Vec<Token> = (0..30).map(|i| i % 5 + 1).collect();
        let (mut whole, mut parts) = (NgramTrie::new(4, 1 << 12), NgramTrie::new(4, 1 << 12));
        TrieCursor::new(4).insert(&mut whole, &text, text.len(), usize::MAX, Origin::OTHERS);
        let mut remote = RemoteTexts::new(8, 4);
        remote.insert(&mut parts, 5, 0, &text[..13], usize::MAX);
        remote.insert(&mut NgramTrie::new(4, 1 << 12), 6, 0, &[7, 7], usize::MAX);
        let mut w = Writer::default();
        remote.encode(&mut w);
        let mut restored = RemoteTexts::decode(&mut Reader::new(&w.buf), 8, 4).unwrap();
        restored.insert(&mut parts, 5, 13, &text[13..], usize::MAX);
        assert_eq!(counts(&whole, &[&text]), counts(&parts, &[&text]));
        let tight = RemoteTexts::decode(&mut Reader::new(&w.buf), 1, 4).unwrap();
        assert_eq!(tight.len(), 1, "past its bound an entry is left out");
        w.buf[8 + 16] = 9; // a window longer than the trie's depth
        assert!(RemoteTexts::decode(&mut Reader::new(&w.buf), 8, 4).is_err());
    }
}
