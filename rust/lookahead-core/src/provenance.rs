//! Provenance: which engine replica wrote the text a draft token came from.
//!
//! One drafter shared by many replicas drafts for each from the text of all; what that buys a
//! replica is the draft tokens it accepted that only other replicas' text could have given
//! ([`crate::Stats::accepted_cross_replica`]). Every trie node remembers, as a few bits, which
//! writers recorded its n-gram; a draft node counts as another replica's when its longest
//! n-gram in the trie was never written by the requesting replica but was by another, and its
//! request's own text did not predict it.
//!
//! The bits are few (a trie node has five to spare): the unnamed writer (an embedded drafter,
//! a client that names no replica), three named replicas (the first three names a drafter
//! sees), and everyone else (further replicas, the other drafters of a cluster). Writers that
//! share a bit cannot be told apart, and bits are not kept in snapshots, so the count is a
//! lower bound: it never counts a replica's own text as another's.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// One writer of the shared trie, as its bit (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin(u8);

impl Origin {
    /// Text no replica wrote (ingested documents): never counted as any replica's.
    pub const NOBODY: Self = Self(0);
    /// The writer with no name: an embedded drafter's engine, a client that names no replica.
    pub const UNNAMED: Self = Self(1);
    /// Replicas past the named ones, and the other drafters of a cluster.
    pub const OTHERS: Self = Self(1 << (NAMED_REPLICAS + 1));

    /// The writer bits a trie node keeps.
    pub(crate) const BITS: u32 = NAMED_REPLICAS as u32 + 2;

    /// The bit (or none, for [`Self::NOBODY`]).
    pub(crate) fn bits(self) -> u8 {
        self.0
    }

    /// The bit's place (`None` for [`Self::NOBODY`]).
    fn slot(self) -> Option<usize> {
        (self.0 != 0).then(|| self.0.trailing_zeros() as usize)
    }

    /// Whether a node written by `writers` (bits) holds text only other writers than this
    /// one wrote: some replica wrote it, and never this one.
    pub(crate) fn foreign(self, writers: u8) -> bool {
        writers != 0 && writers & self.0 == 0
    }
}

impl Default for Origin {
    fn default() -> Self {
        Self::UNNAMED
    }
}

/// Replicas told apart by name, each with its own bit.
const NAMED_REPLICAS: usize = 3;
const ORIGINS: usize = Origin::BITS as usize;

/// What the engines of one named replica accepted ([`crate::Stats::replicas`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// The replica's name (empty: the unnamed writer).
    pub replica: String,
    /// Sum of the accepted counts its engine reported.
    pub accepted_reported: u64,
    /// Of those, draft tokens drafted from text only other replicas had written.
    pub accepted_cross_replica: u64,
}

/// The replica names a drafter has seen, in the order it first saw them, and what each
/// accepted.
#[derive(Debug, Default)]
pub(crate) struct Replicas {
    names: Mutex<Vec<String>>,
    reported: [AtomicU64; ORIGINS],
    cross: [AtomicU64; ORIGINS],
}

impl Replicas {
    /// The origin of the replica named `name`: its own bit for the first
    /// [`NAMED_REPLICAS`] names, [`Origin::OTHERS`] for later ones, [`Origin::UNNAMED`] for
    /// the empty name.
    pub fn origin_of(&self, name: &str) -> Origin {
        if name.is_empty() {
            return Origin::UNNAMED;
        }
        let mut names = self.names.lock();
        let slot = match names.iter().position(|n| n == name) {
            Some(slot) => slot,
            None if names.len() < NAMED_REPLICAS => {
                names.push(name.to_owned());
                names.len() - 1
            }
            None => return Origin::OTHERS,
        };
        Origin(1 << (slot + 1))
    }

    /// Counts `reported` accepted draft tokens of a request from `origin`, `cross` of them
    /// drafted from other replicas' text.
    pub fn accepted(&self, origin: Origin, reported: u64, cross: u64) {
        if let Some(slot) = origin.slot() {
            self.reported[slot].fetch_add(reported, Ordering::Relaxed);
            self.cross[slot].fetch_add(cross, Ordering::Relaxed);
        }
    }

    /// Accepted draft tokens drafted from other replicas' text, all replicas together.
    pub fn cross_total(&self) -> u64 {
        self.cross.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// What each named replica accepted, in the order they were first seen, after the
    /// unnamed writer's (when it reported anything). Replicas past the named ones are not
    /// listed.
    pub fn stats(&self) -> Vec<ReplicaStats> {
        let of = |slot: usize, replica: String| ReplicaStats {
            replica,
            accepted_reported: self.reported[slot].load(Ordering::Relaxed),
            accepted_cross_replica: self.cross[slot].load(Ordering::Relaxed),
        };
        let unnamed = Some(of(0, String::new())).filter(|s| s.accepted_reported > 0);
        let names = self.names.lock();
        let named = names.iter().enumerate().map(|(i, n)| of(i + 1, n.clone()));
        unnamed.into_iter().chain(named).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_their_own_bits_until_they_run_out() {
        let replicas = Replicas::default();
        let a = replicas.origin_of("a");
        let b = replicas.origin_of("b");
        assert_ne!(a, b);
        assert_eq!(replicas.origin_of("a"), a);
        assert_eq!(replicas.origin_of(""), Origin::UNNAMED);
        let c = replicas.origin_of("c");
        assert_eq!(replicas.origin_of("d"), Origin::OTHERS);
        let all = [Origin::UNNAMED, a, b, c, Origin::OTHERS];
        let bits: u8 = all.iter().map(|o| o.bits()).fold(0, |x, y| x | y);
        assert_eq!(bits.count_ones(), all.len() as u32, "one bit each");
        assert!(bits < 1 << Origin::BITS);
    }

    #[test]
    fn accepted_tokens_are_counted_per_named_replica() {
        let replicas = Replicas::default();
        let (a, b) = (replicas.origin_of("a"), replicas.origin_of("b"));
        replicas.accepted(a, 5, 2);
        replicas.accepted(b, 3, 0);
        replicas.accepted(a, 1, 1);
        replicas.accepted(Origin::NOBODY, 9, 9);
        let row = |name: &str, r, c| ReplicaStats {
            replica: name.into(),
            accepted_reported: r,
            accepted_cross_replica: c,
        };
        assert_eq!(replicas.stats(), [row("a", 6, 3), row("b", 3, 0)]);
        replicas.accepted(Origin::UNNAMED, 4, 0);
        assert_eq!(replicas.stats()[0], row("", 4, 0));
        assert_eq!(replicas.cross_total(), 3);
    }

    #[test]
    fn foreign_means_written_by_another_replica_and_never_by_this_one() {
        let (a, b) = (Origin(2), Origin(4));
        assert!(a.foreign(b.bits()));
        assert!(!a.foreign(a.bits() | b.bits()), "its own text too");
        assert!(!a.foreign(0), "nobody's (a document)");
        assert!(Origin::UNNAMED.foreign(a.bits()));
        assert!(!Origin::UNNAMED.foreign(Origin::UNNAMED.bits()));
    }
}
