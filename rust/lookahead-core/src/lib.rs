//! The drafting core of lookahead: per-request suffix automata, a shared n-gram trie with
//! counts under a byte budget, and best-first draft trees that combine both.
//!
//! No I/O, no async, no Python: the server and the Python bindings are thin layers over
//! [`Drafter`].

mod anchor;
mod answer;
mod automaton;
mod calibration;
mod cluster;
mod config;
mod draft;
mod drafter;
mod error;
mod group;
mod group_index;
mod hashing;
mod provenance;
mod realise;
mod remote_text;
mod request;
mod siblings;
pub mod sizing;
pub mod slots;
mod snapshot;
mod suffix_automaton;
mod tree;
mod trie;
mod types;

pub use answer::{Drafted, StepColumns};
pub use cluster::{GroupUpdate, LearnedText};
pub use config::{ConfigError, DrafterConfig};
pub use drafter::{DraftShape, Drafter, Stats, StepItem};
pub use error::{DraftError, ErrorKind};
pub use provenance::{Origin, ReplicaStats};
pub use sizing::{CostCurve, CostError, Layout, StepCost};
pub use snapshot::{SNAPSHOT_MAGIC, SNAPSHOT_VERSION, SnapshotError};
pub use tree::DraftTree;
pub use types::{CalibrationCount, CalibrationCounts, GroupKey, MAX_GROUP_NAME_BYTES};

/// A token id. Ids are opaque to the core; the tokenizer's vocabulary bounds them
/// (see [`DrafterConfig::vocab_size`]).
pub type Token = u32;

/// Separates texts joined into one history; never a real token (ids are < `vocab_size`,
/// which is below it) and never drafted.
pub(crate) const SEPARATOR: Token = Token::MAX;
