//! A step's answer in columns: the layout the proto's `StepResponse` and the bindings' NumPy
//! arrays share, written once here.
//!
//! Invariants: every request of the step has one row, in request order, in `roots`, `sizes`
//! and `held`; `tokens`, `parents` and `scores` hold the rows' nodes one row after another
//! (`sizes` says how many each); a failed request has root -1, size 0, held 0, and its error in
//! `errors` with its row index.

use crate::tree::DraftTree;

/// What the drafter answered one request of a step: its tree, and the tokens it holds of the
/// request after the step (prompt included; 0 once the request ended).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Drafted {
    /// The draft tree (empty for a finished request or a budget of 0).
    pub tree: DraftTree,
    /// Tokens of the request the drafter holds; the next step may send from there.
    pub held: usize,
}

/// The answer to one engine step, column-wise (see the module's invariants). `E` is the
/// caller's error type: the core's `DraftError`, or the wire's per-request error.
#[derive(Clone, Debug, PartialEq)]
pub struct StepColumns<E> {
    /// Per row: the root token, -1 when the request has none (failed, or no token yet).
    pub roots: Vec<i64>,
    /// Per row: the number of draft nodes.
    pub sizes: Vec<u32>,
    /// The nodes' tokens.
    pub tokens: Vec<i64>,
    /// The nodes' parents, within their row (-1: a child of the root).
    pub parents: Vec<i32>,
    /// The nodes' scores: the probability that the path to the node is accepted.
    pub scores: Vec<f32>,
    /// Per row: tokens of the request the drafter holds after the step (0: failed or ended).
    pub held: Vec<u64>,
    /// The failed rows: (row index, error), in row order.
    pub errors: Vec<(u32, E)>,
}

impl<E> StepColumns<E> {
    /// An empty answer with room for `requests` rows.
    pub fn with_capacity(requests: usize) -> Self {
        Self {
            roots: Vec::with_capacity(requests),
            sizes: Vec::with_capacity(requests),
            tokens: Vec::new(),
            parents: Vec::new(),
            scores: Vec::new(),
            held: Vec::with_capacity(requests),
            errors: Vec::new(),
        }
    }

    /// Rows so far.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Whether there is no row yet.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// Appends the next request's tree and the tokens the drafter holds of it.
    pub fn push_tree(&mut self, drafted: &Drafted) {
        let tree = &drafted.tree;
        self.roots.push(tree.root.map_or(-1, i64::from));
        // A tree never has 2^32 nodes (budgets are far smaller); saturate rather than wrap.
        self.sizes
            .push(u32::try_from(tree.len()).unwrap_or(u32::MAX));
        self.tokens
            .extend(tree.tokens.iter().map(|&t| i64::from(t)));
        self.parents.extend_from_slice(&tree.parents);
        self.scores.extend_from_slice(&tree.scores);
        self.held.push(drafted.held as u64);
    }

    /// Appends the next request's failure: an empty row, and the error with its index.
    pub fn push_error(&mut self, error: E) {
        let index = u32::try_from(self.len()).unwrap_or(u32::MAX);
        self.roots.push(-1);
        self.sizes.push(0);
        self.held.push(0);
        self.errors.push((index, error));
    }

    /// Appends the next request's outcome, its error converted by `convert`.
    pub fn push<F>(&mut self, outcome: Result<Drafted, F>, convert: impl FnOnce(F) -> E) {
        match outcome {
            Ok(drafted) => self.push_tree(&drafted),
            Err(e) => self.push_error(convert(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_in_request_order_with_failures_empty() {
        let mut answer: StepColumns<&str> = StepColumns::with_capacity(3);
        assert!(answer.is_empty());
        let tree = DraftTree {
            root: Some(5),
            tokens: vec![6, 7, 8],
            parents: vec![-1, 0, -1],
            scores: vec![0.9, 0.5, 0.1],
        };
        answer.push_tree(&Drafted { tree, held: 12 });
        answer.push::<&str>(Err("bad"), |e| e);
        answer.push_tree(&Drafted {
            tree: DraftTree::empty(None),
            held: 0,
        });
        assert_eq!(answer.len(), 3);
        assert_eq!(answer.roots, vec![5, -1, -1]);
        assert_eq!(answer.sizes, vec![3, 0, 0]);
        assert_eq!(answer.tokens, vec![6, 7, 8]);
        assert_eq!(answer.parents, vec![-1, 0, -1]);
        assert_eq!(answer.scores, vec![0.9, 0.5, 0.1]);
        assert_eq!(answer.held, vec![12, 0, 0]);
        assert_eq!(answer.errors, vec![(1, "bad")]);
        // the node columns hold exactly the rows' sizes
        let nodes: u32 = answer.sizes.iter().sum();
        assert_eq!(nodes as usize, answer.tokens.len());
    }
}
