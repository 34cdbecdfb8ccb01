//! Small value types shared by the core's modules, so that dependencies point one way: every
//! module may use these; this module uses none of the others (but [`crate::hashing`]).

use crate::Token;
use crate::hashing::pair_hash;

/// The longest group name accepted, in bytes.
pub const MAX_GROUP_NAME_BYTES: usize = 256;

/// The key of a group: the same prompt, or the same group name, gives the same key on every
/// server and in every process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey(pub u64);

impl GroupKey {
    /// The group of the requests with exactly this prompt.
    pub fn of_prompt(prompt: &[Token]) -> Self {
        Self(fold(
            pair_hash(prompt.len() as u32, 0),
            prompt.iter().copied(),
        ))
    }

    /// The group an engine named (never the key of a prompt, barring a 64-bit collision).
    pub fn named(name: &str) -> Self {
        let words = name.as_bytes().chunks(4).map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        });
        Self(fold(pair_hash(name.len() as u32, 0x6772_6f75), words))
    }
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

fn fold(seed: u64, words: impl Iterator<Item = u32>) -> u64 {
    words.fold(seed, |h, w| pair_hash((h ^ (h >> 32)) as u32, w) ^ h)
}

/// The table keys of a candidate's evidence, kept to learn from what happens to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    pub local: u16,
    pub global: u16,
    /// 0 without sibling evidence.
    pub sibling: u16,
    /// Bucket of the first-stage estimate (used with sibling evidence only).
    pub base: u8,
}

/// A candidate considered by the last draft, kept to learn from what happens next.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Considered {
    /// Index of its parent in the draft tree, -1 for the root.
    pub parent: i32,
    pub token: Token,
    pub keys: Keys,
}

/// Counts of the acceptance calibration recorded since they were last taken: what engines
/// reported back to one drafter, for the others to add to theirs, so that every drafter of a
/// cluster calibrates on the whole cluster's feedback as one drafter would.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CalibrationCounts {
    /// Counters in the calibration tables of the drafter that took them: counts apply only to
    /// tables of the same layout.
    pub layout: u32,
    /// The counters that changed, by index.
    pub counts: Vec<CalibrationCount>,
}

/// Trials and hits to add to one calibration counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CalibrationCount {
    /// The counter (below [`CalibrationCounts::layout`]).
    pub index: u32,
    /// Candidates with this evidence scored against the true tokens.
    pub trials: u32,
    /// Those that were the true token (at most `trials`).
    pub hits: u32,
}
