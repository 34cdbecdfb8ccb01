//! The outgoing buffer: batches waiting for NATS to take them, bounded in bytes. Past the
//! bound the oldest batches are dropped (and counted): while NATS is away the newest text is
//! the most useful to the other servers, and memory stays bounded.

use std::collections::VecDeque;

/// One message to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The subject.
    pub subject: String,
    /// The `Nats-Msg-Id` header (JetStream drops a repeat: safe to publish again after a
    /// lost acknowledgement).
    pub msg_id: String,
    /// The encoded `LearnedBatch`.
    pub payload: Vec<u8>,
    /// Tokens in it (for the metrics).
    pub tokens: u64,
}

/// What [`Outbox::push`] dropped to make room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Messages dropped.
    pub messages: u64,
    /// Their tokens.
    pub tokens: u64,
}

/// A FIFO of messages bounded in payload bytes.
#[derive(Debug)]
pub struct Outbox {
    queue: VecDeque<Outgoing>,
    bytes: usize,
    limit: usize,
}

impl Outbox {
    /// An empty buffer of at most `limit` payload bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            limit,
        }
    }

    /// Appends a message, dropping the oldest ones while the buffer is over its bound (a
    /// message larger than the whole bound is dropped itself).
    pub fn push(&mut self, message: Outgoing) -> Dropped {
        let mut dropped = Dropped::default();
        if message.payload.len() > self.limit {
            dropped.messages += 1;
            dropped.tokens += message.tokens;
            return dropped;
        }
        self.bytes += message.payload.len();
        self.queue.push_back(message);
        while self.bytes > self.limit {
            let Some(old) = self.queue.pop_front() else {
                break;
            };
            self.bytes -= old.payload.len();
            dropped.messages += 1;
            dropped.tokens += old.tokens;
        }
        dropped
    }

    /// The oldest message, if any (it stays until [`pop`](Self::pop)).
    pub fn front(&self) -> Option<&Outgoing> {
        self.queue.front()
    }

    /// Removes the oldest message (after it was published).
    pub fn pop(&mut self) -> Option<Outgoing> {
        let message = self.queue.pop_front()?;
        self.bytes -= message.payload.len();
        Some(message)
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Messages held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: u32, bytes: usize) -> Outgoing {
        Outgoing {
            subject: "s".into(),
            msg_id: id.to_string(),
            payload: vec![0; bytes],
            tokens: u64::from(id),
        }
    }

    #[test]
    fn the_oldest_go_first_when_full() {
        let mut outbox = Outbox::new(100);
        assert_eq!(outbox.push(message(1, 40)), Dropped::default());
        assert_eq!(outbox.push(message(2, 40)), Dropped::default());
        assert_eq!(
            outbox.push(message(3, 40)),
            Dropped {
                messages: 1,
                tokens: 1
            }
        );
        assert_eq!((outbox.len(), outbox.bytes()), (2, 80));
        assert_eq!(outbox.front().map(|m| m.msg_id.as_str()), Some("2"));
        assert_eq!(
            outbox.push(message(9, 101)),
            Dropped {
                messages: 1,
                tokens: 9
            }
        );
        assert_eq!(outbox.pop().map(|m| m.msg_id), Some("2".into()));
        assert_eq!(outbox.pop().map(|m| m.msg_id), Some("3".into()));
        assert!(outbox.is_empty());
        assert_eq!(outbox.bytes(), 0);
    }
}
