//! Behaviour and property tests of the public drafter API.

use std::sync::Arc;

use lookahead_core::{DraftError, DraftTree, Drafter, DrafterConfig, StepItem, Token};
use proptest::prelude::*;

fn drafter() -> Drafter {
    Drafter::new(DrafterConfig::default()).unwrap()
}

/// Runs a finished request through the drafter: its text then stays in the shared trie.
fn feed(d: &Drafter, id: &str, text: &[Token]) {
    d.start(id, text).unwrap();
    d.end(id).unwrap();
}

fn children_of_root(tree: &DraftTree) -> Vec<Token> {
    tree.tokens
        .iter()
        .zip(&tree.parents)
        .filter(|(_, p)| **p == -1)
        .map(|(t, _)| *t)
        .collect()
}

#[test]
fn drafts_both_branches_seen_after_the_context() {
    let d = drafter();
    feed(&d, "a", &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    feed(&d, "b", &[1, 2, 3, 44, 55, 66, 77, 88, 99, 100]);
    d.start("q", &[7, 1, 2, 3]).unwrap();
    let tree = d.draft("q", 8).unwrap();
    let first = children_of_root(&tree);
    assert!(first.contains(&4) && first.contains(&44), "{tree:?}");
    assert_eq!(tree.root, Some(3));
}

#[test]
fn frequent_continuation_comes_first() {
    let d = drafter();
    for i in 0..10 {
        feed(&d, &format!("f{i}"), &[1, 2, 3, 20, 21]);
    }
    feed(&d, "rare", &[1, 2, 3, 10, 11]);
    d.start("q", &[9, 1, 2, 3]).unwrap();
    let tree = d.draft("q", 8).unwrap();
    assert_eq!(tree.tokens[0], 20, "{tree:?}");
    assert_eq!(tree.parents[0], -1);
    let rare = tree.tokens.iter().position(|&t| t == 10);
    assert!(rare.is_none_or(|i| tree.scores[i] < tree.scores[0]));
}

#[test]
fn longest_matching_suffix_wins() {
    let d = drafter();
    // after "3" alone the text goes on with 50 (three times); after "8 9 3" with 60 (once)
    for i in 0..3 {
        feed(&d, &format!("s{i}"), &[5, 3, 50, 51]);
    }
    feed(&d, "long", &[7, 8, 9, 3, 60, 61, 62]);
    d.start("q", &[7, 8, 9, 3]).unwrap();
    let tree = d.draft("q", 8).unwrap();
    assert_eq!(tree.tokens[0], 60, "{tree:?}");
}

#[test]
fn copies_from_the_request_own_prompt() {
    let d = drafter();
    let doc: Vec<Token> = (100..400).collect();
    let mut prompt = doc.clone();
    prompt.extend([7, 8, 9]);
    d.start("rag", &prompt).unwrap();
    d.append("rag", &doc[..20]).unwrap();
    let tree = d.draft("rag", 8).unwrap();
    // a chain through the document: every node's path is the document's next tokens
    assert_eq!(tree.len(), 8);
    let best = (0..tree.len())
        .map(|i| tree.path(i))
        .max_by_key(|p| p.len())
        .unwrap();
    assert_eq!(best, doc[20..28].to_vec());
}

#[test]
fn weak_evidence_gives_small_trees() {
    let d = drafter();
    d.start("q", &[1, 2, 3, 4, 5]).unwrap();
    assert!(
        d.draft("q", 8).unwrap().is_empty(),
        "nothing was ever seen after 5"
    );
}

#[test]
fn tiny_budget_never_crashes_and_holds() {
    let config = DrafterConfig {
        memory_budget_bytes: 1 << 20,
        ..Default::default()
    };
    let d = Drafter::new(config).unwrap();
    let mut refused = 0;
    for i in 0..200u32 {
        let text: Vec<Token> = (0..300).map(|j| (i * 7 + j * 13) % 97).collect();
        match d.start(&format!("r{i}"), &text) {
            Ok(()) => {
                d.draft(&format!("r{i}"), 8).unwrap();
                d.end(&format!("r{i}")).unwrap();
            }
            Err(DraftError::MemoryExhausted { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        let s = d.stats();
        assert!(s.memory_bytes <= s.memory_budget_bytes, "{s:?}");
    }
    assert!(refused < 200, "some requests must fit in 1 MiB");
}

#[test]
fn errors_name_their_field_and_change_nothing() {
    let d = drafter();
    assert_eq!(d.draft("nope", 8).unwrap_err().field(), "request_id");
    d.start("a", &[1, 2]).unwrap();
    assert!(matches!(
        d.start("a", &[1]),
        Err(DraftError::RequestAlreadyActive { .. })
    ));
    let err = d.append("a", &[3, 1 << 30]).unwrap_err();
    assert_eq!(err.field(), "new_tokens");
    assert!(matches!(
        d.draft("a", 10_000),
        Err(DraftError::BudgetTooLarge { .. })
    ));
    // the refused append left the request as it was
    d.append("a", &[1, 2]).unwrap();
    assert_eq!(d.draft("a", 4).unwrap().tokens.first(), Some(&1));
}

#[test]
fn step_items_are_independent() {
    let d = drafter();
    d.start("ok", &[1, 2, 3, 1, 2]).unwrap();
    let items = [
        StepItem {
            request_id: "missing",
            new_tokens: &[1],
            budget: 4,
            ..Default::default()
        },
        StepItem {
            request_id: "ok",
            new_tokens: &[3],
            budget: 4,
            ..Default::default()
        },
    ];
    let results = d.step(&items);
    assert!(results[0].is_err());
    assert_eq!(results[1].as_ref().unwrap().tokens.first(), Some(&1));
}

#[test]
fn samples_of_one_prompt_learn_from_each_other() {
    let d = drafter();
    let prompt: Vec<Token> = vec![1, 2, 3];
    let answer: Vec<Token> = (500..560).collect();
    d.start("s0", &prompt).unwrap();
    d.append("s0", &answer).unwrap();
    d.end("s0").unwrap();
    d.start("s1", &prompt).unwrap();
    d.append("s1", &answer[..1]).unwrap();
    let tree = d.draft("s1", 8).unwrap();
    assert_eq!(tree.path(tree.len() - 1), answer[1..9].to_vec(), "{tree:?}");
}

#[test]
fn outputs_of_a_shared_prompt_are_kept_at_every_order() {
    // Two requests running side by side, one of them emitting a novel output; only when they
    // are samples of one prompt does the trie keep that output's longer n-grams at once.
    let output: Vec<Token> = (1000..1100).collect();
    let trie_nodes = |second_prompt: &[Token]| {
        let d = drafter();
        d.start("a", &[1, 2, 3]).unwrap();
        d.start("b", second_prompt).unwrap();
        d.append("a", &output).unwrap();
        d.stats().trie_nodes
    };
    let shared = trie_nodes(&[1, 2, 3]);
    let distinct = trie_nodes(&[4, 5, 6]);
    // orders up to 8 for each output token, against 3 when not shared
    assert!(
        shared > 2 * distinct,
        "shared {shared}, distinct {distinct}"
    );
}

#[test]
fn concurrent_steps_from_many_threads() {
    let d = Arc::new(drafter());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                for r in 0..20u32 {
                    let id = format!("t{t}-r{r}");
                    let text: Vec<Token> = (0..200).map(|i| (i * (t + 3) + r) % 50).collect();
                    d.start(&id, &text[..100]).unwrap();
                    for chunk in text[100..].chunks(3) {
                        let item = StepItem {
                            request_id: &id,
                            new_tokens: chunk,
                            budget: 8,
                            ..Default::default()
                        };
                        let tree = d.step(&[item]).pop().unwrap().unwrap();
                        assert!(tree.len() <= 8);
                    }
                    d.end(&id).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(d.stats().active_requests, 0);
}

/// One random operation on a small set of requests.
#[derive(Clone, Debug)]
enum Op {
    Start(u8, Vec<Token>),
    Append(u8, Vec<Token>),
    Draft(u8, usize),
    End(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let tokens = prop::collection::vec(0u32..12, 0..40);
    prop_oneof![
        (0u8..4, tokens.clone()).prop_map(|(r, t)| Op::Start(r, t)),
        (0u8..4, tokens).prop_map(|(r, t)| Op::Append(r, t)),
        (0u8..4, 0usize..20).prop_map(|(r, b)| Op::Draft(r, b)),
        (0u8..4).prop_map(Op::End),
    ]
}

/// Runs `ops` on `d`, checking every tree; returns the trees in order.
fn run(d: &Drafter, ops: &[Op], seen: &mut Vec<Token>) -> Vec<DraftTree> {
    let mut trees = Vec::new();
    for op in ops {
        match op {
            Op::Start(r, t) => {
                if d.start(&r.to_string(), t).is_ok() {
                    seen.extend(t);
                }
            }
            Op::Append(r, t) => {
                if d.append(&r.to_string(), t).is_ok() {
                    seen.extend(t);
                }
            }
            Op::Draft(r, b) => {
                if let Ok(tree) = d.draft(&r.to_string(), *b) {
                    check_tree(&tree, *b, seen);
                    trees.push(tree);
                }
            }
            Op::End(r) => {
                let _ = d.end(&r.to_string());
            }
        }
        let s = d.stats();
        assert!(s.memory_bytes <= s.memory_budget_bytes, "{s:?}");
    }
    trees
}

fn check_tree(tree: &DraftTree, budget: usize, seen: &[Token]) {
    assert!(tree.len() <= budget);
    assert_eq!(tree.tokens.len(), tree.parents.len());
    assert_eq!(tree.tokens.len(), tree.scores.len());
    let depths = tree.depths();
    for (i, &p) in tree.parents.iter().enumerate() {
        assert!(p < i as i32 && p >= -1, "parents precede children");
        if p >= 0 {
            assert!(depths[p as usize] <= depths[i], "breadth-first order");
            assert!(
                tree.scores[i] <= tree.scores[p as usize],
                "scores shrink along paths"
            );
        }
        assert!(tree.scores[i] > 0.0 && tree.scores[i] <= 1.0);
        assert!(seen.contains(&tree.tokens[i]), "drafted a token never seen");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn trees_are_valid_and_memory_bounded(ops in prop::collection::vec(op(), 1..60), small in any::<bool>()) {
        let budget = if small { 1 << 20 } else { 1 << 24 };
        let config = DrafterConfig { memory_budget_bytes: budget, max_ngram: 6, ..Default::default() };
        let d = Drafter::new(config).unwrap();
        run(&d, &ops, &mut Vec::new());
    }

    #[test]
    fn same_calls_give_same_trees(ops in prop::collection::vec(op(), 1..60)) {
        let a = run(&drafter(), &ops, &mut Vec::new());
        let b = run(&drafter(), &ops, &mut Vec::new());
        prop_assert_eq!(a, b);
    }

    #[test]
    fn without_edits_paths_continue_the_seen_text(text in prop::collection::vec(0u32..6, 8..120), cut in 4usize..8) {
        // one request whose text is a prefix of `text`: every drafted path must continue some
        // earlier occurrence of a suffix of the context (here: of its last token at least)
        let d = drafter();
        let n = text.len() - cut;
        d.start("r", &text[..n]).unwrap();
        let tree = d.draft("r", 16).unwrap();
        let context = &text[..n];
        for i in 0..tree.len() {
            let mut with_path = context.to_vec();
            with_path.extend(tree.path(i));
            let m = with_path.len();
            let (prev, tok) = (with_path[m - 2], with_path[m - 1]);
            let seen = context.windows(2).any(|w| w == [prev, tok]);
            prop_assert!(seen, "bigram {prev}->{tok} of node {i} never occurred");
        }
    }
}

mod snapshots {
    use lookahead_core::SnapshotError;

    use super::*;

    fn learnt() -> Drafter {
        let d = drafter();
        for i in 0..5 {
            feed(&d, &format!("f{i}"), &[1, 2, 3, 20, 21, 22, 23]);
        }
        d.start("s0", &[9, 9]).unwrap();
        d.append("s0", &[40, 41, 42, 43]).unwrap();
        d.end("s0").unwrap();
        d
    }

    #[test]
    fn restore_gives_the_same_drafts() {
        let d = learnt();
        let bytes = d.snapshot();
        let restored = Drafter::from_snapshot(DrafterConfig::default(), &bytes).unwrap();
        for x in [&d, &restored] {
            x.start("q", &[7, 1, 2, 3]).unwrap();
            x.start("sib", &[9, 9]).unwrap();
            x.append("sib", &[40]).unwrap();
        }
        assert_eq!(d.draft("q", 8).unwrap(), restored.draft("q", 8).unwrap());
        assert_eq!(
            d.draft("sib", 8).unwrap(),
            restored.draft("sib", 8).unwrap()
        );
        assert_eq!(restored.stats().trie_nodes, d.stats().trie_nodes);
    }

    #[test]
    fn corruption_and_truncation_are_refused() {
        let bytes = learnt().snapshot();
        let config = DrafterConfig::default;
        for cut in [0, 4, 8, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                Drafter::from_snapshot(config(), &bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut flipped = bytes.clone();
        flipped[bytes.len() / 2] ^= 0x40;
        assert!(matches!(
            Drafter::from_snapshot(config(), &flipped),
            Err(SnapshotError::ChecksumMismatch { .. })
        ));
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert_eq!(
            Drafter::from_snapshot(config(), &magic).unwrap_err(),
            SnapshotError::BadMagic
        );
        let other = DrafterConfig {
            max_ngram: 8,
            ..config()
        };
        assert!(matches!(
            Drafter::from_snapshot(other, &bytes),
            Err(SnapshotError::IncompatibleConfig {
                field: "max_ngram",
                ..
            })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn random_bytes_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..400), keep_header in any::<bool>()) {
            if keep_header && bytes.len() > 12 {
                bytes[..8].copy_from_slice(lookahead_core::SNAPSHOT_MAGIC);
                bytes[8..12].copy_from_slice(&lookahead_core::SNAPSHOT_VERSION.to_le_bytes());
            }
            let _ = Drafter::from_snapshot(DrafterConfig::default(), &bytes);
        }
    }
}

#[test]
fn idle_requests_expire_and_keep_their_text() {
    let d = drafter();
    d.start("idle", &[1, 2, 3, 4]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    d.start("busy", &[5, 6]).unwrap();
    assert_eq!(d.expire_idle(std::time::Duration::from_millis(20)), 1);
    assert!(matches!(
        d.draft("idle", 4),
        Err(DraftError::UnknownRequest { .. })
    ));
    assert!(d.draft("busy", 4).is_ok());
    assert_eq!(d.stats().active_requests, 1);
}
