//! Drafter configuration and its validation.

use thiserror::Error;

/// Settings of one [`crate::Drafter`]. `Default` gives sane production values.
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterConfig {
    /// Bytes the drafter may use in all: the shared trie plus every active request's index.
    pub memory_budget_bytes: usize,
    /// Depth of the shared n-gram trie: the longest n-gram whose count is kept. Drafts are not
    /// capped by it: deeper draft nodes back off to the longest suffix the trie holds.
    pub max_ngram: usize,
    /// The largest draft budget (nodes, root excluded) a caller may ask for.
    pub max_budget: usize,
    /// Nodes whose estimated path acceptance probability is below this are never proposed, so
    /// weak evidence gives small trees instead of junk.
    pub min_score: f32,
    /// Single-branch drafts: every node has at most one child.
    pub chain: bool,
    /// Token ids must be below this (the tokenizer's vocabulary size).
    pub vocab_size: u32,
    /// The most tokens (prompt plus output) one request may hold.
    pub max_request_tokens: usize,
    /// Record what the drafter learns and its group members' new tokens, for the other
    /// drafters of a cluster ([`crate::Drafter::take_learned`]).
    pub record_for_cluster: bool,
}

impl Default for DrafterConfig {
    fn default() -> Self {
        Self {
            memory_budget_bytes: 1 << 30,
            max_ngram: 16,
            max_budget: 64,
            min_score: 0.02,
            chain: false,
            vocab_size: 1 << 24,
            max_request_tokens: 1 << 20,
            record_for_cluster: false,
        }
    }
}

/// Bounds on [`DrafterConfig::max_ngram`].
pub const MAX_NGRAM_RANGE: std::ops::RangeInclusive<usize> = 2..=64;
/// Bounds on [`DrafterConfig::max_budget`].
pub const MAX_BUDGET_LIMIT: usize = 1024;
/// The smallest memory budget accepted: enough for the fixed tables of one drafter.
pub const MIN_MEMORY_BUDGET: usize = 1 << 16;

/// A configuration value out of its range.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    /// `field` has `value`, which is outside `expected`.
    #[error("invalid config field `{field}`: {value} (expected {expected})")]
    OutOfRange {
        /// The configuration field at fault.
        field: &'static str,
        /// The value given, rendered.
        value: String,
        /// The accepted range, in words.
        expected: String,
    },
}

impl DrafterConfig {
    /// Checks every field; the error names the first one out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn bad(field: &'static str, value: impl ToString, expected: String) -> ConfigError {
            ConfigError::OutOfRange {
                field,
                value: value.to_string(),
                expected,
            }
        }
        if self.memory_budget_bytes < MIN_MEMORY_BUDGET {
            return Err(bad(
                "memory_budget_bytes",
                self.memory_budget_bytes,
                format!(">= {MIN_MEMORY_BUDGET}"),
            ));
        }
        if !MAX_NGRAM_RANGE.contains(&self.max_ngram) {
            return Err(bad(
                "max_ngram",
                self.max_ngram,
                format!("{}..={}", MAX_NGRAM_RANGE.start(), MAX_NGRAM_RANGE.end()),
            ));
        }
        if !(1..=MAX_BUDGET_LIMIT).contains(&self.max_budget) {
            return Err(bad(
                "max_budget",
                self.max_budget,
                format!("1..={MAX_BUDGET_LIMIT}"),
            ));
        }
        if !(0.0..1.0).contains(&self.min_score) {
            return Err(bad("min_score", self.min_score, "0.0 <= x < 1.0".into()));
        }
        if self.vocab_size == 0 || self.vocab_size > u32::MAX - 1 {
            return Err(bad(
                "vocab_size",
                self.vocab_size,
                format!("1..={}", u32::MAX - 1),
            ));
        }
        if self.max_request_tokens == 0 || self.max_request_tokens > (u32::MAX / 4) as usize {
            return Err(bad(
                "max_request_tokens",
                self.max_request_tokens,
                format!("1..={}", u32::MAX / 4),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        DrafterConfig::default().validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let config = DrafterConfig {
            max_ngram: 1,
            ..Default::default()
        };
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("max_ngram"), "{err}");
    }
}
