//! The slot layout of tree verification: what SGLang's NGRAM corpus hands its verifier (and
//! FlashInfer's custom mask is built from).
//!
//! A request gets a row of `d` slots and a `d x d` mask:
//!
//! * slot 0 is the root, the request's last known token;
//! * slots `1..=n` are the tree's first `n = min(len, d - 1)` nodes, level by level (the order
//!   within a level kept), so every parent's slot comes before its children's;
//! * the other slots hold token 0 hanging under the root (SGLang's padding);
//! * `mask[i][j]` is 1 when slot `j` is slot `i` itself or one of its ancestors.
//!
//! The nodes are checked first (the root the engine expects, token ids in the vocabulary,
//! parents before children): a tree that fails is laid out as a root-only row, so the engine
//! decodes that request plainly, and the error says why.
//!
//! The input is the engine-side view of a tree (the columns of a step's answer, from this core,
//! a server or a Python drafter), so tokens are `i64` and the root may be unknown (`-1`).

use thiserror::Error;

/// Why a tree cannot be laid out as it is (the row is laid out root-only instead).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SlotsError {
    /// The tree hangs under another token than the request's last one: the drafter's copy of
    /// the request is wrong.
    #[error("a tree hangs under {found}, not under the last token {expected}")]
    WrongRoot {
        /// The tree's root.
        found: i64,
        /// The request's last token.
        expected: i64,
    },
    /// A node's token is outside the model's vocabulary (a wrong namespace?).
    #[error(
        "the drafter proposed token id {token}, outside the model's vocabulary ({vocab_size}); \
         wrong namespace?"
    )]
    OutOfVocabulary {
        /// The offending token id.
        token: i64,
        /// The model's vocabulary size.
        vocab_size: u32,
    },
    /// A node's parent does not come before it.
    #[error("node {node} has parent {parent}, which does not come before it")]
    ParentNotBefore {
        /// The node (index within the tree).
        node: usize,
        /// Its parent index.
        parent: i32,
    },
}

impl SlotsError {
    /// A short name of the kind of error (`"root"`, `"vocab"` or `"tree"`), for counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::WrongRoot { .. } => "root",
            Self::OutOfVocabulary { .. } => "vocab",
            Self::ParentNotBefore { .. } => "tree",
        }
    }
}

/// What [`write_row`] placed of a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Draft nodes placed (the root excluded).
    pub nodes: usize,
    /// Levels they span: the most draft tokens one verification can accept.
    pub depth: usize,
}

/// One tree as the engine sees it: its root (`-1`: unknown to the drafter) and its nodes.
#[derive(Clone, Copy, Debug)]
pub struct SlotTree<'a> {
    /// The token the drafter hung the tree under, or `-1`.
    pub root: i64,
    /// Each node's token.
    pub tokens: &'a [i64],
    /// Each node's parent (index into `tokens`, `-1` for children of the root).
    pub parents: &'a [i32],
}

/// Lays out one request's row: writes `tokens_out` (`d` slots) and `mask_out` (`d * d`, row
/// major) and returns what it placed.
///
/// `root` is the request's last token (slot 0); `vocab_size` bounds the draft tokens. On an
/// error the row is root-only (every other slot padding) and the error says why.
///
/// # Panics
/// When `mask_out.len() != tokens_out.len()^2` or `tokens_out` is empty (a caller's bug, not
/// input).
pub fn write_row(
    tree: SlotTree<'_>,
    root: i64,
    vocab_size: u32,
    tokens_out: &mut [i64],
    mask_out: &mut [i64],
) -> Result<Placed, SlotsError> {
    let d = tokens_out.len();
    assert!(
        d >= 1 && mask_out.len() == d * d,
        "a row has d >= 1 slots and d * d mask entries"
    );
    let n = tree.tokens.len().min(tree.parents.len()).min(d - 1);
    let checked = check(tree, root, vocab_size, n);
    let placed = place(
        tree,
        if checked.is_ok() { n } else { 0 },
        tokens_out,
        mask_out,
    );
    tokens_out[0] = root;
    checked.map(|()| placed)
}

/// Whether the first `n` nodes may be proposed under `root`.
fn check(tree: SlotTree<'_>, root: i64, vocab_size: u32, n: usize) -> Result<(), SlotsError> {
    if tree.root != -1 && tree.root != root {
        return Err(SlotsError::WrongRoot {
            found: tree.root,
            expected: root,
        });
    }
    for (node, (&token, &parent)) in tree.tokens[..n].iter().zip(&tree.parents[..n]).enumerate() {
        if !(0..i64::from(vocab_size)).contains(&token) {
            return Err(SlotsError::OutOfVocabulary { token, vocab_size });
        }
        if parent < -1 || parent >= node as i32 {
            return Err(SlotsError::ParentNotBefore { node, parent });
        }
    }
    Ok(())
}

/// Writes the first `n` (checked) nodes level by level, then the padding.
fn place(tree: SlotTree<'_>, n: usize, tokens_out: &mut [i64], mask_out: &mut [i64]) -> Placed {
    let d = tokens_out.len();
    tokens_out.fill(0);
    mask_out.fill(0);
    // Depth of each node; parents come first, so one pass suffices.
    let mut depths = Vec::with_capacity(n);
    for &parent in &tree.parents[..n] {
        let depth = if parent < 0 {
            1
        } else {
            depths[parent as usize] + 1
        };
        depths.push(depth);
    }
    // Level order (stable: the drafter's order within a level is kept). A breadth-first
    // tree, the core's own, is already in it.
    let mut order: Vec<usize> = (0..n).collect();
    if depths.windows(2).any(|w| w[0] > w[1]) {
        order.sort_by_key(|&i| depths[i]);
    }
    let mut slot_of = vec![0usize; n];
    for (position, &node) in order.iter().enumerate() {
        slot_of[node] = position + 1;
    }
    mask_out[0] = 1;
    for slot in 1..d {
        let parent_slot = match order.get(slot - 1) {
            Some(&node) => {
                tokens_out[slot] = tree.tokens[node];
                match tree.parents[node] {
                    -1 => 0,
                    p => slot_of[p as usize],
                }
            }
            None => 0, // padding hangs under the root
        };
        // A slot's ancestors are its parent's, and itself; the parent's row is complete.
        let (done, rest) = mask_out.split_at_mut(slot * d);
        rest[..d].copy_from_slice(&done[parent_slot * d..parent_slot * d + d]);
        rest[slot] = 1;
    }
    Placed {
        nodes: n,
        depth: depths.iter().copied().max().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(
        tree: SlotTree<'_>,
        root: i64,
        d: usize,
    ) -> (Vec<i64>, Vec<i64>, Result<Placed, SlotsError>) {
        let mut tokens = vec![-7; d];
        let mut mask = vec![-7; d * d];
        let result = write_row(tree, root, 100, &mut tokens, &mut mask);
        (tokens, mask, result)
    }

    fn tree<'a>(root: i64, tokens: &'a [i64], parents: &'a [i32]) -> SlotTree<'a> {
        SlotTree {
            root,
            tokens,
            parents,
        }
    }

    #[test]
    fn a_tree_is_laid_out_level_by_level_with_padding_under_the_root() {
        // 5 -> 6 -> 7, and 5 -> 8; listed best-first (7 before 8).
        let (tokens, mask, result) = row(tree(5, &[6, 7, 8], &[-1, 0, -1]), 5, 5);
        assert_eq!(result, Ok(Placed { nodes: 3, depth: 2 }));
        assert_eq!(tokens, vec![5, 6, 8, 7, 0]);
        #[rustfmt::skip]
        let expected = vec![
            1, 0, 0, 0, 0,
            1, 1, 0, 0, 0,
            1, 0, 1, 0, 0,
            1, 1, 0, 1, 0,
            1, 0, 0, 0, 1,
        ];
        assert_eq!(mask, expected);
    }

    #[test]
    fn a_tree_larger_than_the_row_keeps_its_first_nodes() {
        let (tokens, _, result) = row(tree(-1, &[1, 2, 3, 4], &[-1, 0, 1, 2]), 9, 3);
        assert_eq!(result, Ok(Placed { nodes: 2, depth: 2 }));
        assert_eq!(tokens, vec![9, 1, 2]);
    }

    #[test]
    fn refused_trees_give_a_root_only_row_and_say_why() {
        let cases: [(SlotTree<'_>, &str); 3] = [
            (tree(4, &[1], &[-1]), "root"),
            (tree(5, &[1, 100], &[-1, 0]), "vocab"),
            (tree(5, &[1, 2], &[-1, 1]), "tree"),
        ];
        for (t, kind) in cases {
            let (tokens, mask, result) = row(t, 5, 3);
            assert_eq!(result.unwrap_err().kind(), kind);
            assert_eq!(tokens, vec![5, 0, 0]);
            assert_eq!(mask, vec![1, 0, 0, 1, 1, 0, 1, 0, 1]);
        }
    }

    #[test]
    fn only_the_nodes_that_fit_are_checked() {
        let (_, _, result) = row(tree(5, &[1, 100], &[-1, 0]), 5, 2);
        assert_eq!(result, Ok(Placed { nodes: 1, depth: 1 }));
    }

    /// A random tree: each node's parent is an earlier node or the root.
    fn random_tree() -> impl Strategy<Value = (Vec<i64>, Vec<i32>)> {
        prop::collection::vec((0i64..100, any::<prop::sample::Index>()), 0..12).prop_map(|nodes| {
            let tokens = nodes.iter().map(|(t, _)| *t).collect();
            let parents = nodes
                .iter()
                .enumerate()
                .map(|(i, (_, p))| p.index(i + 1) as i32 - 1)
                .collect();
            (tokens, parents)
        })
    }

    proptest! {
        /// Every placed slot's mask row is exactly its path to the root, its parent's slot
        /// precedes it, and the multiset of (token, path of tokens) pairs is the tree's own.
        #[test]
        fn rows_hold_the_trees_paths((tokens, parents) in random_tree(), d in 1usize..10) {
            let (out, mask, result) = row(tree(-1, &tokens, &parents), 3, d);
            let placed = result.unwrap();
            let n = placed.nodes;
            prop_assert_eq!(n, tokens.len().min(d - 1));
            let path = |mut node: i32| {
                let mut p = vec![];
                while node >= 0 {
                    p.push(tokens[node as usize]);
                    node = parents[node as usize];
                }
                p
            };
            let mut want: Vec<Vec<i64>> = (0..n).map(|i| path(i as i32)).collect();
            let mut got = vec![];
            for slot in 1..=n {
                let ancestors: Vec<usize> = (0..d).filter(|&j| mask[slot * d + j] == 1).collect();
                prop_assert_eq!(ancestors[0], 0);
                prop_assert!(ancestors.iter().all(|&j| j <= slot));
                got.push(ancestors[1..].iter().rev().map(|&j| out[j]).collect::<Vec<i64>>());
            }
            prop_assert_eq!(placed.depth, want.iter().map(Vec::len).max().unwrap_or(0));
            want.sort();
            got.sort();
            prop_assert_eq!(got, want);
            for slot in n + 1..d {
                prop_assert_eq!(out[slot], 0);
                let ancestors: Vec<usize> = (0..d).filter(|&j| mask[slot * d + j] == 1).collect();
                prop_assert_eq!(ancestors, vec![0, slot]);
            }
        }
    }
}
