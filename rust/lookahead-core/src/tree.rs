//! The draft tree handed to engines.

use crate::Token;

/// A tree of draft tokens under the last known token of a request (the root, not a node).
///
/// Invariants: the three vectors have one entry per node; nodes are in breadth-first order, so
/// `parents[i] < i as i32` (`-1` for children of the root); `scores` never increase along a path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftTree {
    /// The last known token of the request, when it has one.
    pub root: Option<Token>,
    /// Draft token of each node.
    pub tokens: Vec<Token>,
    /// Parent of each node (index into `tokens`), `-1` for children of the root.
    pub parents: Vec<i32>,
    /// Estimated probability that the path from the root to the node is accepted.
    pub scores: Vec<f32>,
}

impl DraftTree {
    /// A tree with no nodes.
    pub fn empty(root: Option<Token>) -> Self {
        Self {
            root,
            ..Self::default()
        }
    }

    /// Number of draft nodes (the root excluded).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the tree has no draft nodes.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The node scores in best-first order (highest first): the expected gain of each further
    /// node kept by [`Self::keep_best`].
    pub fn best_first_scores(&self) -> Vec<f32> {
        let mut scores = self.scores.clone();
        scores.sort_by(|a, b| b.total_cmp(a));
        scores
    }

    /// The tree of its `n` best nodes (highest scores; among equal ones the earlier), still
    /// breadth-first. Scores never increase along a path, so the kept nodes form a tree.
    pub fn keep_best(&self, n: usize) -> DraftTree {
        if n >= self.len() {
            return self.clone();
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|&a, &b| self.scores[b].total_cmp(&self.scores[a]).then(a.cmp(&b)));
        let mut kept = order[..n].to_vec();
        kept.sort_unstable();
        let mut new_index = vec![-1i32; self.len()];
        for (new, &old) in kept.iter().enumerate() {
            new_index[old] = new as i32;
        }
        DraftTree {
            root: self.root,
            tokens: kept.iter().map(|&i| self.tokens[i]).collect(),
            parents: kept
                .iter()
                .map(|&i| match self.parents[i] {
                    -1 => -1,
                    p => new_index[p as usize],
                })
                .collect(),
            scores: kept.iter().map(|&i| self.scores[i]).collect(),
        }
    }

    /// Depth of each node: children of the root have depth 1.
    pub fn depths(&self) -> Vec<usize> {
        let mut depths: Vec<usize> = Vec::with_capacity(self.len());
        for &p in &self.parents {
            let d = if p < 0 { 1 } else { depths[p as usize] + 1 };
            depths.push(d);
        }
        depths
    }

    /// The tokens on the path from the root to `node`, root excluded.
    pub fn path(&self, node: usize) -> Vec<Token> {
        let mut path = Vec::new();
        let mut i = node as i32;
        while i >= 0 {
            path.push(self.tokens[i as usize]);
            i = self.parents[i as usize];
        }
        path.reverse();
        path
    }

    /// Length of the longest root-to-node path whose tokens equal a prefix of `truth`: the
    /// number of draft tokens an exact greedy verifier accepts.
    pub fn accepted_len(&self, truth: &[Token]) -> usize {
        let mut on_path = vec![false; self.len()];
        let mut best = 0;
        for (i, (&tok, &p)) in self.tokens.iter().zip(&self.parents).enumerate() {
            let (parent_ok, depth) = if p < 0 {
                (true, 0)
            } else {
                (on_path[p as usize], self.path_depth(p as usize))
            };
            if parent_ok && truth.get(depth) == Some(&tok) {
                on_path[i] = true;
                best = best.max(depth + 1);
            }
        }
        best
    }

    fn path_depth(&self, mut node: usize) -> usize {
        let mut depth = 1;
        while self.parents[node] >= 0 {
            node = self.parents[node] as usize;
            depth += 1;
        }
        depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_len_follows_matching_branch() {
        // root -> 4 -> 5, root -> 44 -> 55 -> 66
        let tree = DraftTree {
            root: Some(3),
            tokens: vec![4, 44, 5, 55, 66],
            parents: vec![-1, -1, 0, 1, 3],
            scores: vec![0.5; 5],
        };
        assert_eq!(tree.accepted_len(&[44, 55, 66, 7]), 3);
        assert_eq!(tree.accepted_len(&[4, 6]), 1);
        assert_eq!(tree.accepted_len(&[9]), 0);
        assert_eq!(tree.depths(), vec![1, 1, 2, 2, 3]);
        assert_eq!(tree.path(4), vec![44, 55, 66]);
    }
}
