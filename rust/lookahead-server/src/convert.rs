//! Conversions between the wire messages and the core's types, with the checks that the wire
//! types cannot express (token ids are int64 on the wire, u32 in the core).

use lookahead_core::{DraftError, ErrorKind, StepColumns};

use crate::pb::{ErrorCode, RequestError, StepResponse};

/// Why a token id was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadToken {
    /// Its index in the list.
    pub index: usize,
    /// Its value.
    pub value: i64,
    /// The vocabulary size it had to be below.
    pub vocab_size: u32,
}

impl BadToken {
    /// A sentence naming the field, e.g. `new_tokens[3] = -1 is negative`.
    pub fn describe(&self, field: &str) -> String {
        let Self {
            index,
            value,
            vocab_size,
        } = self;
        if *value < 0 {
            format!("{field}[{index}] = {value} is negative; token ids are 0 <= id < {vocab_size}")
        } else {
            format!(
                "{field}[{index}] = {value} is out of range; token ids are 0 <= id < {vocab_size}"
            )
        }
    }
}

/// Appends `src` to `out` as core tokens, refusing ids outside `0..vocab_size`. On error
/// `out` is left as it was.
pub fn push_tokens(src: &[i64], vocab_size: u32, out: &mut Vec<u32>) -> Result<(), BadToken> {
    let start = out.len();
    out.reserve(src.len());
    for (index, &value) in src.iter().enumerate() {
        match u32::try_from(value) {
            Ok(token) if token < vocab_size => out.push(token),
            _ => {
                out.truncate(start);
                return Err(BadToken {
                    index,
                    value,
                    vocab_size,
                });
            }
        }
    }
    Ok(())
}

/// A per-request error.
pub fn request_error(code: ErrorCode, field: &str, message: String) -> RequestError {
    RequestError {
        code: code as i32,
        field: field.to_string(),
        message,
        index: 0,
    }
}

/// The per-request error for a failure of the core, prefixed with `context` (which request).
pub fn core_error(context: &str, error: &DraftError) -> RequestError {
    let (code, hint) = match error.kind() {
        ErrorKind::UnknownRequest => (
            ErrorCode::UnknownRequest,
            " (never started, finished, or lost by a server restart: send its tokens as a prompt)",
        ),
        ErrorKind::RequestAlreadyActive => (
            ErrorCode::RequestAlreadyActive,
            " (set reset to restart it)",
        ),
        ErrorKind::InvalidArgument => (ErrorCode::InvalidArgument, ""),
        ErrorKind::ResourceExhausted => (ErrorCode::ResourceExhausted, ""),
    };
    request_error(code, error.field(), format!("{context}: {error}{hint}"))
}

/// The wire answer to step `step_id`: the core's columns moved into the message, each error
/// told its row.
pub fn step_response(step_id: u64, answer: StepColumns<RequestError>) -> StepResponse {
    StepResponse {
        step_id,
        roots: answer.roots,
        sizes: answer.sizes,
        tokens: answer.tokens,
        parents: answer.parents,
        scores: answer.scores,
        held: answer.held,
        errors: answer
            .errors
            .into_iter()
            .map(|(index, error)| RequestError { index, ..error })
            .collect(),
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_nothing_is_left_on_error() {
        let mut out = vec![7];
        assert_eq!(push_tokens(&[1, 2, 3], 10, &mut out), Ok(()));
        assert_eq!(out, vec![7, 1, 2, 3]);
        let err = push_tokens(&[4, -1], 10, &mut out).expect_err("negative");
        assert_eq!(
            err,
            BadToken {
                index: 1,
                value: -1,
                vocab_size: 10
            }
        );
        assert_eq!(
            err.describe("new_tokens"),
            "new_tokens[1] = -1 is negative; token ids are 0 <= id < 10"
        );
        assert_eq!(out, vec![7, 1, 2, 3]);
        assert!(push_tokens(&[10], 10, &mut out).is_err());
        assert!(push_tokens(&[i64::from(u32::MAX) + 1], u32::MAX, &mut out).is_err());
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn core_errors_keep_their_kind_and_field() {
        let e = core_error(
            "requests[2] (\"r\")",
            &DraftError::BudgetTooLarge {
                budget: 99,
                max: 64,
            },
        );
        assert_eq!(e.code, ErrorCode::InvalidArgument as i32);
        assert_eq!(e.field, "budget");
        assert!(
            e.message.starts_with("requests[2] (\"r\"): "),
            "{}",
            e.message
        );
        let e = core_error(
            "x",
            &DraftError::UnknownRequest {
                request_id: "r".into(),
            },
        );
        assert_eq!(e.code, ErrorCode::UnknownRequest as i32);
        assert_eq!(e.field, "request_id");
    }

    #[test]
    fn responses_are_the_columns_with_errors_told_their_row() {
        let mut answer = StepColumns::with_capacity(2);
        answer.push_tree(&lookahead_core::Drafted {
            tree: lookahead_core::DraftTree {
                root: Some(5),
                tokens: vec![6, 7],
                parents: vec![-1, 0],
                scores: vec![0.5, 0.25],
            },
            held: 12,
        });
        answer.push_error(request_error(
            ErrorCode::InvalidArgument,
            "budget",
            "x".into(),
        ));
        let r = step_response(7, answer);
        assert_eq!(r.step_id, 7);
        assert_eq!(r.held, vec![12, 0]);
        assert_eq!(r.roots, vec![5, -1]);
        assert_eq!(r.sizes, vec![2, 0]);
        assert_eq!(r.tokens, vec![6, 7]);
        assert_eq!(r.errors.len(), 1);
        assert_eq!(
            (r.errors[0].index, r.errors[0].field.as_str()),
            (1, "budget")
        );
    }
}
