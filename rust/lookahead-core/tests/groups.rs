//! Group drafting: requests of one group (the same prompt, or the same group name) draft from
//! each other's outputs while they run; nothing crosses groups or drafters; groups free their
//! memory when their last request ends; the cluster hooks carry what a drafter learns.

use lookahead_core::{
    DraftError, DraftTree, Drafter, DrafterConfig, GroupKey, GroupUpdate, LearnedText,
    MAX_GROUP_NAME_BYTES, StepItem, Token,
};
use proptest::prelude::*;

fn drafter() -> Drafter {
    Drafter::new(DrafterConfig::default()).unwrap()
}

/// Starts a request, optionally in a named group.
fn start(d: &Drafter, id: &str, prompt: &[Token], group: Option<&str>) {
    let item = StepItem {
        request_id: id,
        prompt: Some(prompt),
        group,
        ..Default::default()
    };
    d.step(&[item]).pop().unwrap().unwrap();
}

/// Whether some root-to-node path of `tree` spells `want`.
fn spells(tree: &DraftTree, want: &[Token]) -> bool {
    (0..tree.len()).any(|i| tree.path(i) == want)
}

/// A text no other test text shares: its n-grams are nowhere else.
fn novel(seed: u32, len: u32) -> Vec<Token> {
    (0..len).map(|i| 1000 + seed * 997 + i * 7).collect()
}

#[test]
fn a_sample_drafts_what_a_running_sibling_wrote() {
    let d = drafter();
    let prompt = [1, 2, 3, 4];
    let answer = novel(1, 40);
    start(&d, "a", &prompt, None);
    start(&d, "b", &prompt, None);
    d.append("a", &answer).unwrap(); // a runs ahead; neither has finished
    d.append("b", &answer[..10]).unwrap();
    let tree = d.draft("b", 8).unwrap();
    assert!(spells(&tree, &answer[10..18]), "{tree:?}");
    assert_eq!(d.stats().active_groups, 1);
}

#[test]
fn a_named_group_joins_requests_with_different_prompts() {
    let d = drafter();
    let answer = novel(2, 40);
    // an agent's calls: other prompts, one group
    start(&d, "call-1", &[5, 6, 7], Some("agent-9"));
    start(&d, "call-2", &[8, 9], Some("agent-9"));
    start(&d, "stranger", &[8, 9], Some("agent-10"));
    d.append("call-1", &answer).unwrap();
    d.append("call-2", &answer[..10]).unwrap();
    d.append("stranger", &answer[..10]).unwrap();
    let tree = d.draft("call-2", 8).unwrap();
    assert!(spells(&tree, &answer[10..18]), "{tree:?}");
    // another group sees it only through the shared trie, which needs more than one sighting
    // for long n-grams: far less than the sibling gives
    let stranger = d.draft("stranger", 8).unwrap();
    assert!(!spells(&stranger, &answer[10..18]), "{stranger:?}");
    assert_eq!(d.stats().active_groups, 2);
}

#[test]
fn a_group_of_one_drafts_as_before_groups_existed() {
    // the same request alone, and with a sibling in another (named) group: identical trees
    let answer = novel(3, 30);
    let (alone, other) = (drafter(), drafter());
    start(&alone, "r", &[1, 2], None);
    start(&other, "r", &[1, 2], None);
    start(&other, "x", &[1, 2], Some("elsewhere"));
    other.append("x", &novel(4, 30)).unwrap();
    for d in [&alone, &other] {
        d.append("r", &answer).unwrap();
    }
    assert_eq!(alone.draft("r", 8).unwrap(), other.draft("r", 8).unwrap());
}

#[test]
fn ending_a_group_frees_its_memory() {
    let d = drafter();
    for i in 0..8 {
        start(&d, &format!("s{i}"), &[1, 2, 3], None);
        d.append(&format!("s{i}"), &novel(i, 200)).unwrap();
    }
    let s = d.stats();
    assert!(s.group_bytes > 8 * 200 * 4, "{s:?}");
    for i in 0..8 {
        d.end(&format!("s{i}")).unwrap();
    }
    let s = d.stats();
    assert_eq!(
        (s.active_groups, s.group_bytes, s.active_requests),
        (0, 0, 0)
    );
}

#[test]
fn a_group_name_too_long_is_refused_naming_the_field() {
    let d = drafter();
    let name = "g".repeat(MAX_GROUP_NAME_BYTES + 1);
    let item = StepItem {
        request_id: "r",
        prompt: Some(&[1, 2]),
        group: Some(&name),
        ..Default::default()
    };
    let err = d.step(&[item]).pop().unwrap().unwrap_err();
    assert!(
        matches!(err, DraftError::GroupNameTooLong { bytes: 257, .. }),
        "{err}"
    );
    assert_eq!(err.field(), "group");
    assert_eq!(d.stats().active_requests, 0, "nothing started");
    let ok = "g".repeat(MAX_GROUP_NAME_BYTES);
    start(&d, "r", &[1, 2], Some(&ok));
}

#[test]
fn ten_thousand_requests_in_one_group_stay_inside_the_budget() {
    let budget = 8 << 20;
    let d = Drafter::new(DrafterConfig {
        memory_budget_bytes: budget,
        ..Default::default()
    })
    .unwrap();
    let (mut started, mut refused) = (0, 0);
    for i in 0..10_000u32 {
        let id = format!("s{i}");
        let item = StepItem {
            request_id: &id,
            prompt: Some(&[1, 2, 3]),
            group: Some("one-big-group"),
            ..Default::default()
        };
        match d.step(&[item]).pop().unwrap() {
            Ok(_) => {
                started += 1;
                // every sample writes a little, mostly like the others
                let out: Vec<Token> = (0..24).map(|j| (i % 7) * 31 + j).collect();
                d.append(&id, &out).unwrap();
                d.draft(&id, 8).unwrap();
            }
            Err(DraftError::MemoryExhausted { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        if i % 500 == 0 {
            let s = d.stats();
            assert!(s.memory_bytes <= budget, "{s:?}");
        }
    }
    let s = d.stats();
    assert!(s.memory_bytes <= budget, "{s:?}");
    assert!(started > 1000, "started {started}, refused {refused}");
    assert_eq!(s.active_groups, 1);
}

#[test]
fn updates_from_another_server_feed_the_group() {
    let (here, there) = (
        drafter(),
        Drafter::new(DrafterConfig {
            record_for_cluster: true,
            ..Default::default()
        })
        .unwrap(),
    );
    let prompt = [4, 5, 6];
    let answer = novel(5, 40);
    start(&there, "remote-sample", &prompt, None);
    there.append("remote-sample", &answer[..25]).unwrap();
    there.append("remote-sample", &answer[25..]).unwrap();
    let updates = there.take_group_updates();
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[1].offset, 25);
    assert_eq!(updates[0].group, GroupKey::of_prompt(&prompt));
    // ignored while no request of the group runs here
    here.apply_group_update("node-b", &updates[0]).unwrap();
    start(&here, "local-sample", &prompt, None);
    assert_eq!(here.active_groups(), vec![GroupKey::of_prompt(&prompt)]);
    for u in updates.iter().chain(&updates) {
        here.apply_group_update("node-b", u).unwrap(); // duplicates are skipped
    }
    here.append("local-sample", &answer[..10]).unwrap();
    let tree = here.draft("local-sample", 8).unwrap();
    // (the uncalibrated first guess of one sibling's word stops the chain before 8 nodes)
    assert!(spells(&tree, &answer[10..16]), "{tree:?}");
    let bad = GroupUpdate {
        tokens: vec![u32::MAX - 5],
        ..updates[0].clone()
    };
    assert!(matches!(
        here.apply_group_update("node-b", &bad),
        Err(DraftError::TokenOutOfRange {
            field: "tokens",
            ..
        })
    ));
}

#[test]
fn a_drafter_applying_what_another_learnt_learns_the_same() {
    let config = DrafterConfig {
        record_for_cluster: true,
        ..Default::default()
    };
    let (a, b) = (
        Drafter::new(config.clone()).unwrap(),
        Drafter::new(config).unwrap(),
    );
    a.ingest(&novel(6, 50)).unwrap();
    for i in 0..3 {
        let id = format!("r{i}");
        start(&a, &id, &[7, 8, 9], None);
        a.append(&id, &novel(7 + i, 60)).unwrap();
        a.end(&id).unwrap();
    }
    let learned = a.take_learned();
    assert!(matches!(&learned[0], LearnedText::Document(t) if t.len() == 50));
    let ended: Vec<&LearnedText> = learned
        .iter()
        .filter(|t| matches!(t, LearnedText::Request { .. }))
        .collect();
    assert_eq!(ended.len(), 3);
    assert!(
        matches!(ended[0], LearnedText::Request { finished: true, output, streamed: 63, .. } if output.len() == 60),
        "the whole text went out while it ran: {:?}",
        ended[0]
    );
    let running = learned
        .iter()
        .filter(|t| matches!(t, LearnedText::Running { .. }));
    assert_eq!(
        running.count(),
        6,
        "the prompt's step and the output's, per request"
    );
    for text in &learned {
        b.apply_learned("node-a", text).unwrap();
    }
    assert!(
        b.take_learned().is_empty(),
        "applied texts are not recorded again"
    );
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.trie_nodes, sa.tokens_ingested),
        (sb.trie_nodes, sb.tokens_ingested)
    );
    // a later sample of the prompt finds the siblings on both
    for d in [&a, &b] {
        start(d, "next", &[7, 8, 9], None);
        d.append("next", &novel(9, 60)[..5]).unwrap();
    }
    assert_eq!(a.draft("next", 8).unwrap(), b.draft("next", 8).unwrap());
}

/// A request of the property test: its group (by index) and its drafter.
#[derive(Clone, Debug)]
enum Op {
    Start {
        drafter: usize,
        group: usize,
        named: bool,
    },
    Write {
        request: usize,
        len: usize,
    },
    End {
        request: usize,
    },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        (0..2usize, 0..4usize, any::<bool>()).prop_map(|(drafter, group, named)| Op::Start {
            drafter,
            group,
            named
        }),
        (0..12usize, 1..30usize).prop_map(|(request, len)| Op::Write { request, len }),
        (0..12usize).prop_map(|request| Op::End { request }),
    ];
    prop::collection::vec(op, 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Groups (and drafters, i.e. namespaces) use disjoint token ranges: a draft token outside
    /// its own group's range would be text of another group or drafter.
    #[test]
    fn no_draft_crosses_groups_or_drafters(ops in ops(), seed in any::<u64>()) {
        let drafters = [drafter(), drafter()];
        // group g of drafter k writes tokens in [base, base + 50)
        let base = |k: usize, g: usize| 100 + (k * 4 + g) as Token * 50;
        let mut requests: Vec<(usize, usize, String, bool)> = Vec::new();
        let mut rng = seed;
        let mut next = |n: Token| {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            (rng % u64::from(n)) as Token
        };
        for op in ops {
            match op {
                Op::Start { drafter: k, group: g, named } => {
                    let id = format!("r{}", requests.len());
                    // two prompts per group, so that unnamed requests share groups too
                    let prompt: Vec<Token> = (0..3).map(|i| base(k, g) + i + next(2)).collect();
                    let name = format!("grp-{g}");
                    let item = StepItem {
                        request_id: &id,
                        prompt: Some(&prompt),
                        group: named.then_some(name.as_str()),
                        budget: 16,
                        ..Default::default()
                    };
                    // drafted at once: from the start of the outputs of its siblings
                    let tree = drafters[k].step(&[item]).pop().unwrap().unwrap();
                    for &t in &tree.tokens {
                        prop_assert!(
                            (base(k, g)..base(k, g) + 50).contains(&t),
                            "request {id} of group {g} on drafter {k} drafted {t} at its start"
                        );
                    }
                    requests.push((k, g, id, true));
                }
                Op::Write { request, len } => {
                    let Some((k, g, id, true)) = requests.get(request).cloned() else { continue };
                    let text: Vec<Token> = (0..len).map(|_| base(k, g) + next(50)).collect();
                    let item = StepItem {
                        request_id: &id,
                        new_tokens: &text,
                        budget: 16,
                        ..Default::default()
                    };
                    let tree = drafters[k].step(&[item]).pop().unwrap().unwrap();
                    for &t in &tree.tokens {
                        prop_assert!(
                            (base(k, g)..base(k, g) + 50).contains(&t),
                            "request {id} of group {g} on drafter {k} drafted {t}"
                        );
                    }
                }
                Op::End { request } => {
                    let Some((k, _, id, true)) = requests.get(request).cloned() else { continue };
                    drafters[k].end(&id).unwrap();
                    requests[request].3 = false;
                }
            }
        }
        for (k, _, id, active) in &requests {
            if *active {
                drafters[*k].end(id).unwrap();
            }
        }
        for d in &drafters {
            let s = d.stats();
            prop_assert_eq!((s.active_groups, s.group_bytes), (0, 0));
        }
    }
}
