//! Errors of drafting calls. Every variant names what was wrong so that the server can turn it
//! into a gRPC status and the bindings into a typed Python exception.

use thiserror::Error;

use crate::Token;

/// Why a drafting call was refused. A refused call changes nothing.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DraftError {
    /// The request id is not active.
    #[error("unknown request_id {request_id:?}: not started, or already ended")]
    UnknownRequest {
        /// The id given.
        request_id: String,
    },
    /// A prompt was given for a request that is already active.
    #[error("request_id {request_id:?} is already active: end it before starting it again")]
    RequestAlreadyActive {
        /// The id given.
        request_id: String,
    },
    /// A token id is not below the vocabulary size.
    #[error("{field}[{index}] = {token} is out of range: token ids must be < {vocab_size}")]
    TokenOutOfRange {
        /// `prompt`, `new_tokens` or `tokens`.
        field: &'static str,
        /// Position of the bad token in that field.
        index: usize,
        /// The bad token.
        token: Token,
        /// The configured vocabulary size.
        vocab_size: u32,
    },
    /// The draft budget is above the configured maximum.
    #[error("budget {budget} is above the maximum {max}")]
    BudgetTooLarge {
        /// The budget asked.
        budget: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The sampling temperature is negative or not a number.
    #[error("temperature {value} must be a finite number >= 0 (0: greedy)")]
    InvalidTemperature {
        /// The temperature given.
        value: f32,
    },
    /// The step's tokens start past the end of what the request holds: applying them would
    /// leave a gap (a step was lost). Send the missing tokens from `held` on.
    #[error(
        "request_id {request_id:?}: offset {offset} is past the {held} tokens it holds; send the tokens from offset {held} on"
    )]
    OffsetGap {
        /// The id given.
        request_id: String,
        /// The offset given.
        offset: usize,
        /// The tokens the request holds.
        held: usize,
    },
    /// Tokens re-sent at an offset the request holds differ from the ones it holds there.
    #[error(
        "request_id {request_id:?}: new_tokens at offset {offset} differ from the tokens it holds there ({held} held)"
    )]
    TokensDiffer {
        /// The id given.
        request_id: String,
        /// The offset given.
        offset: usize,
        /// The tokens the request holds.
        held: usize,
    },
    /// A start's offset is not the length of its prompt.
    #[error("offset {offset} of a start must be the prompt's length {prompt}")]
    OffsetNotAfterPrompt {
        /// The offset given.
        offset: usize,
        /// The prompt's length.
        prompt: usize,
    },
    /// The request would hold more tokens than allowed.
    #[error("request_id {request_id:?} would hold {tokens} tokens, above the maximum {max}")]
    RequestTooLong {
        /// The id given.
        request_id: String,
        /// Tokens it would hold.
        tokens: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The group name is longer than allowed.
    #[error("group is {bytes} bytes long, above the maximum {max}")]
    GroupNameTooLong {
        /// Its length in bytes.
        bytes: usize,
        /// The most bytes allowed.
        max: usize,
    },
    /// Calibration counts of another drafter that do not fit this one's tables.
    #[error("calibration counts refused: {reason}")]
    CalibrationCounts {
        /// What is wrong with them.
        reason: &'static str,
    },
    /// Active requests alone would use more than their share of the memory budget.
    #[error("memory budget exhausted: active requests need {needed} bytes, allowed {budget}")]
    MemoryExhausted {
        /// Bytes the active requests would use.
        needed: usize,
        /// Bytes they may use.
        budget: usize,
    },
}

/// What kind of refusal a [`DraftError`] is: the one mapping the server turns into error
/// codes and the bindings into exception classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request id is not active.
    UnknownRequest,
    /// A prompt came for a request that is already active.
    RequestAlreadyActive,
    /// Something the caller sent is wrong (a token, a budget, an offset...).
    InvalidArgument,
    /// A limit was reached (request length, memory).
    ResourceExhausted,
}

impl DraftError {
    /// The kind of refusal.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::UnknownRequest { .. } => ErrorKind::UnknownRequest,
            Self::RequestAlreadyActive { .. } => ErrorKind::RequestAlreadyActive,
            Self::TokenOutOfRange { .. }
            | Self::BudgetTooLarge { .. }
            | Self::InvalidTemperature { .. }
            | Self::OffsetGap { .. }
            | Self::TokensDiffer { .. }
            | Self::OffsetNotAfterPrompt { .. }
            | Self::GroupNameTooLong { .. }
            | Self::CalibrationCounts { .. } => ErrorKind::InvalidArgument,
            Self::RequestTooLong { .. } | Self::MemoryExhausted { .. } => {
                ErrorKind::ResourceExhausted
            }
        }
    }

    /// The request field at fault, for error messages and status details.
    pub fn field(&self) -> &'static str {
        match self {
            Self::UnknownRequest { .. } | Self::RequestAlreadyActive { .. } => "request_id",
            Self::TokenOutOfRange { field, .. } => field,
            Self::BudgetTooLarge { .. } => "budget",
            Self::InvalidTemperature { .. } => "temperature",
            Self::OffsetGap { .. } | Self::OffsetNotAfterPrompt { .. } => "offset",
            Self::TokensDiffer { .. } => "new_tokens",
            Self::GroupNameTooLong { .. } => "group",
            Self::CalibrationCounts { .. } => "calibration",
            Self::RequestTooLong { .. } | Self::MemoryExhausted { .. } => "tokens",
        }
    }
}
