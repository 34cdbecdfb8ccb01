//! What a drafter hands to, and takes from, the other drafters of a cluster: the texts it
//! learnt from ([`LearnedText`]: every server's shared statistics learn all of them, running
//! requests' text step by step), the acceptance feedback its calibration learnt from
//! ([`CalibrationCounts`]) and the new tokens of group members ([`GroupUpdate`]: servers
//! running other members of the group draft from them). Transport is the server's business;
//! the core only records, bounded, and applies.

use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::Token;
use crate::types::{CalibrationCounts, GroupKey};

/// A text a drafter learnt from, as another drafter must apply it to learn the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LearnedText {
    /// A request that ended (finished, expired, or dropped by a reset): its prompt and its
    /// output, as they went into the shared trie.
    Request {
        /// The request's prompt.
        prompt: Vec<Token>,
        /// Its output.
        output: Vec<Token>,
        /// The output is complete: it is remembered as a sibling response of its group.
        finished: bool,
        /// The group name the request was started with (`None`: its group is its prompt).
        group: Option<String>,
        /// The request's id on its drafter (the one its [`LearnedText::Running`] parts name).
        request: String,
        /// Tokens at the start of prompt + output that went out before as
        /// [`LearnedText::Running`] parts: only the rest goes into the trie with this text.
        streamed: usize,
    },
    /// A document given to `ingest`.
    Document(Vec<Token>),
    /// New tokens of a running request (its prompt first, then its outputs), as they went into
    /// the shared trie at a step: other drafters' tries learn them while it runs, as one
    /// drafter's trie does. The request's [`LearnedText::Request`] follows when it ends.
    Running {
        /// The request's id on its drafter.
        request: String,
        /// Position of `tokens[0]` in the request's text (prompt, then output).
        offset: usize,
        /// The new tokens.
        tokens: Vec<Token>,
        /// Where the output of a prompt sampled more than once starts in the text (kept in
        /// the trie at more orders at once), if the request's prompt is such a prompt.
        shared_from: Option<usize>,
    },
    /// Acceptance feedback the drafter's calibration learnt from (see
    /// [`crate::Drafter::take_calibration`]).
    Calibration(CalibrationCounts),
}

impl LearnedText {
    /// Tokens it carries (0 for calibration counts).
    pub fn tokens(&self) -> usize {
        match self {
            Self::Request { prompt, output, .. } => prompt.len() + output.len(),
            Self::Document(tokens) | Self::Running { tokens, .. } => tokens.len(),
            Self::Calibration(_) => 0,
        }
    }
}

/// New output tokens of a group member, for the servers running other members of its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupUpdate {
    /// The member's group.
    pub group: GroupKey,
    /// The member's request id on its own server.
    pub member: String,
    /// Output position of `tokens[0]`.
    pub offset: u32,
    /// Output tokens appended since the member's previous update.
    pub tokens: Vec<Token>,
    /// The member ended after `tokens`.
    pub finished: bool,
}

/// A bounded queue of records for the cluster, oldest first; past its bound in tokens the
/// oldest records are dropped and counted.
#[derive(Debug)]
pub(crate) struct Outbox<T> {
    queue: VecDeque<(T, usize)>,
    tokens: usize,
    max_tokens: usize,
    dropped: u64,
}

impl<T> Outbox<T> {
    /// An outbox holding at most `max_tokens` tokens.
    pub fn new(max_tokens: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            tokens: 0,
            max_tokens,
            dropped: 0,
        }
    }

    /// Queues a record of `tokens` tokens, dropping the oldest ones past the bound.
    pub fn push(&mut self, record: T, tokens: usize) {
        self.queue.push_back((record, tokens));
        self.tokens += tokens;
        while self.tokens > self.max_tokens
            && let Some((_, n)) = self.queue.pop_front()
        {
            self.tokens -= n;
            self.dropped += 1;
        }
    }

    /// Takes every queued record, oldest first.
    pub fn take(&mut self) -> Vec<T> {
        self.tokens = 0;
        self.queue.drain(..).map(|(record, _)| record).collect()
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// What a drafter sends the other drafters of its cluster: the texts it learnt and the new
/// tokens of group members, each in its own bounded outbox.
#[derive(Debug)]
pub(crate) struct Outboxes {
    learned: Mutex<Outbox<LearnedText>>,
    group_updates: Mutex<Outbox<GroupUpdate>>,
}

impl Outboxes {
    /// Two outboxes of at most `max_tokens` tokens each.
    pub fn new(max_tokens: usize) -> Self {
        Self {
            learned: Mutex::new(Outbox::new(max_tokens)),
            group_updates: Mutex::new(Outbox::new(max_tokens)),
        }
    }

    /// Queues a text learnt, of `tokens` tokens.
    pub fn learned(&self, text: LearnedText, tokens: usize) {
        self.learned.lock().push(text, tokens);
    }

    /// Queues a group member's new tokens (`tokens` of them).
    pub fn group_update(&self, update: GroupUpdate, tokens: usize) {
        self.group_updates.lock().push(update, tokens);
    }

    /// Takes the queued texts, oldest first.
    pub fn take_learned(&self) -> Vec<LearnedText> {
        self.learned.lock().take()
    }

    /// Takes the queued group updates, oldest first.
    pub fn take_group_updates(&self) -> Vec<GroupUpdate> {
        self.group_updates.lock().take()
    }

    /// Records of both outboxes dropped past their bounds so far.
    pub fn dropped(&self) -> u64 {
        self.learned.lock().dropped() + self.group_updates.lock().dropped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_the_oldest_past_its_bound() {
        let mut outbox = Outbox::new(10);
        outbox.push("a", 6);
        outbox.push("b", 3);
        outbox.push("c", 4);
        assert_eq!(outbox.dropped(), 1);
        assert_eq!(outbox.take(), vec!["b", "c"]);
        assert!(outbox.take().is_empty());
    }
}
