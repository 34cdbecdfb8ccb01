//! Responses of finished requests, remembered by prompt, so that a later sample of the same
//! prompt (RL rollouts, best-of-n, several models answering one question) can copy from its
//! siblings with exact positions, across edits, like it copies from its own prompt.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::Token;
use crate::snapshot::{Reader, SnapshotError, Writer};
use crate::types::GroupKey;

/// Siblings kept per prompt, the most recent first.
const SIBLINGS_PER_PROMPT: usize = 8;
/// Sibling tokens given to one new request, at most.
pub(crate) const MAX_SIBLING_TOKENS: usize = 32 << 10;

/// The store, bounded in tokens; the group used least recently goes first. A collision of
/// group keys only adds unrelated text to a request's history: a little memory, no errors.
#[derive(Debug, Default)]
pub(crate) struct SiblingResponses {
    by_prompt: HashMap<GroupKey, VecDeque<Arc<[Token]>>>,
    /// Groups from least to most recently recorded.
    order: VecDeque<GroupKey>,
    tokens: usize,
    max_tokens: usize,
}

impl SiblingResponses {
    /// A store holding at most `max_tokens` tokens.
    pub fn new(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            ..Self::default()
        }
    }

    /// The most tokens the store holds.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Heap bytes held (approximate: token storage plus per-entry overhead).
    pub fn heap_bytes(&self) -> usize {
        self.tokens * size_of::<Token>() + (self.by_prompt.len() + self.order.len()) * 64
    }

    /// Remembers a finished response of a request of group `key`.
    pub fn record(&mut self, key: GroupKey, response: Arc<[Token]>) {
        if response.is_empty() || response.len() > self.max_tokens {
            return;
        }
        let len = response.len();
        let list = self.by_prompt.entry(key).or_default();
        list.push_front(response);
        self.tokens += len;
        if list.len() > SIBLINGS_PER_PROMPT
            && let Some(old) = list.pop_back()
        {
            self.tokens -= old.len();
        }
        if let Some(pos) = self.order.iter().position(|&k| k == key) {
            self.order.remove(pos);
        }
        self.order.push_back(key);
        while self.tokens > self.max_tokens {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(list) = self.by_prompt.remove(&oldest) {
                self.tokens -= list.iter().map(|r| r.len()).sum::<usize>();
            }
        }
    }

    /// Writes the store, least recently used prompt first.
    pub fn encode(&self, w: &mut Writer) {
        w.len(self.order.len());
        for key in &self.order {
            let list = &self.by_prompt[key];
            w.u64(key.0);
            w.len(list.len());
            for response in list.iter().rev() {
                w.len(response.len());
                response.iter().for_each(|&t| w.u32(t));
            }
        }
    }

    /// Reads a store written by [`Self::encode`] into one of `max_tokens` tokens.
    pub fn decode(r: &mut Reader<'_>, max_tokens: usize) -> Result<Self, SnapshotError> {
        let mut store = Self::new(max_tokens);
        for _ in 0..r.len(16)? {
            let key = GroupKey(r.u64()?);
            for _ in 0..r.len(8)? {
                let len = r.len(4)?;
                let response = (0..len).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
                if response.contains(&crate::SEPARATOR) {
                    return Err(SnapshotError::Corrupt("separator token inside a response"));
                }
                store.record(key, response.into());
            }
        }
        Ok(store)
    }

    /// Whether responses of group `key` are remembered.
    pub fn contains(&self, key: GroupKey) -> bool {
        self.by_prompt.contains_key(&key)
    }

    /// The remembered responses for `key`, the most recent first, at most
    /// [`MAX_SIBLING_TOKENS`] tokens in all.
    pub fn get(&self, key: GroupKey) -> Vec<Arc<[Token]>> {
        let mut total = 0;
        self.by_prompt
            .get(&key)
            .into_iter()
            .flatten()
            .take_while(|r| {
                total += r.len();
                total <= MAX_SIBLING_TOKENS
            })
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_most_recent_first() {
        let mut s = SiblingResponses::new(10);
        let k = GroupKey::of_prompt(&[1, 2, 3]);
        s.record(k, [1, 2, 3, 4].into());
        s.record(k, [5, 6, 7, 8].into());
        assert_eq!(s.get(k)[0].as_ref(), &[5, 6, 7, 8]);
        s.record(GroupKey::of_prompt(&[9]), [9, 9, 9, 9].into());
        assert!(s.tokens <= 10);
        assert!(s.get(k).is_empty(), "the least recent prompt went first");
    }
}
