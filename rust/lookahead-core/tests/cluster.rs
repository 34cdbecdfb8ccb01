//! The cluster hooks beyond ended texts: a running request's text reaches the other drafters'
//! tries step by step and its end adds only the rest, never anything twice (also across a
//! snapshot); calibration counts taken from one drafter make another calibrate as it does.

use lookahead_core::{
    CalibrationCount, CalibrationCounts, DraftError, DraftShape, Drafter, DrafterConfig,
    LearnedText, StepItem, Token,
};

fn cluster_drafter() -> Drafter {
    Drafter::new(DrafterConfig {
        record_for_cluster: true,
        ..Default::default()
    })
    .unwrap()
}

/// A text no other test text shares.
fn novel(seed: u32, len: u32) -> Vec<Token> {
    (0..len).map(|i| 1000 + seed * 997 + i * 7).collect()
}

fn apply_all(to: &Drafter, texts: &[LearnedText]) {
    for text in texts {
        to.apply_learned("node-a", text).unwrap();
    }
}

fn tokens_ingested(d: &Drafter) -> u64 {
    d.stats().tokens_ingested
}

#[test]
fn a_running_request_reaches_other_tries_as_it_runs_and_its_end_adds_only_the_rest() {
    let (a, b) = (cluster_drafter(), cluster_drafter());
    let (prompt, output) = (novel(1, 12), novel(2, 90));
    a.start("x", &prompt).unwrap();
    a.append("x", &output[..40]).unwrap();
    let running = a.take_learned();
    assert!(
        running
            .iter()
            .all(|t| matches!(t, LearnedText::Running { request, .. } if request == "x")),
        "{running:?}"
    );
    apply_all(&b, &running);
    assert_eq!(tokens_ingested(&a), tokens_ingested(&b));
    assert_eq!(a.stats().trie_nodes, b.stats().trie_nodes);
    // a request elsewhere drafts from x's text before x ends, as one drafter's would
    for d in [&a, &b] {
        d.start("q", &output[10..20]).unwrap();
    }
    let tree = a.draft("q", 8).unwrap();
    assert!(tree.len() > 1, "{tree:?}");
    assert_eq!(tree, b.draft("q", 8).unwrap());
    for d in [&a, &b] {
        d.end("q").unwrap();
    }
    let q_ran_on_both = a.take_learned();
    assert!(q_ran_on_both.iter().all(|t| matches!(
        t,
        LearnedText::Running { request, .. } | LearnedText::Request { request, .. } if request == "q"
    )));
    // the last tokens come in the step that ends x: a last part, then the ended text
    let last = StepItem {
        request_id: "x",
        new_tokens: &output[40..],
        finished: true,
        ..Default::default()
    };
    a.step(&[last]).pop().unwrap().unwrap();
    let learned = a.take_learned();
    assert!(
        matches!(
            learned.as_slice(),
            [
                LearnedText::Running { offset: 52, tokens, .. },
                LearnedText::Request { streamed: 102, request, .. },
            ] if tokens.len() == 50 && request == "x"
        ),
        "{learned:?}"
    );
    apply_all(&b, &learned);
    assert_eq!(tokens_ingested(&a), tokens_ingested(&b), "each token once");
    assert_eq!(a.stats().trie_nodes, b.stats().trie_nodes);
}

#[test]
fn a_drafter_restored_between_parts_inserts_nothing_twice() {
    let (a, b) = (cluster_drafter(), cluster_drafter());
    let (prompt, output) = (novel(3, 8), novel(4, 60));
    a.start("x", &prompt).unwrap();
    a.append("x", &output[..20]).unwrap();
    apply_all(&b, &a.take_learned());
    let restored = Drafter::from_snapshot(b.config().clone(), &b.snapshot()).unwrap();
    assert_eq!(tokens_ingested(&restored), 0, "counters are per process");
    a.append("x", &output[20..]).unwrap();
    a.end("x").unwrap();
    let rest = a.take_learned();
    let rest_tokens: usize = rest
        .iter()
        .map(|t| match t {
            LearnedText::Running { tokens, .. } => tokens.len(),
            LearnedText::Request {
                prompt,
                output,
                streamed,
                ..
            } => prompt.len() + output.len() - streamed,
            _ => 0,
        })
        .sum();
    assert_eq!(rest_tokens, 40);
    apply_all(&restored, &rest);
    apply_all(&b, &rest);
    assert_eq!(tokens_ingested(&restored), 40);
    assert_eq!(tokens_ingested(&b), tokens_ingested(&a));
    // the restored drafter lost only the n-grams across the snapshot's boundary
    assert!(restored.stats().trie_nodes <= b.stats().trie_nodes);
    assert!(restored.stats().trie_nodes + 8 >= b.stats().trie_nodes);
}

#[test]
fn an_ended_text_from_a_drafter_without_running_parts_inserts_it_all() {
    let (a, b) = (cluster_drafter(), cluster_drafter());
    a.start("x", &novel(5, 10)).unwrap();
    a.append("x", &novel(6, 30)).unwrap();
    a.end("x").unwrap();
    let older_server = a.take_learned().into_iter().filter_map(|t| match t {
        LearnedText::Request {
            prompt,
            output,
            finished,
            group,
            ..
        } => Some(LearnedText::Request {
            prompt,
            output,
            finished,
            group,
            request: String::new(),
            streamed: 0,
        }),
        _ => None,
    });
    apply_all(&b, &older_server.collect::<Vec<_>>());
    assert_eq!(tokens_ingested(&a), tokens_ingested(&b));
    assert_eq!(a.stats().trie_nodes, b.stats().trie_nodes);
}

/// Steps request `id` through `text` the way an engine does, reporting what it accepted.
fn generate(d: &Drafter, id: &str, prompt: &[Token], text: &[Token]) {
    generate_as(d, id, prompt, text, DraftShape::Tree, 8);
}

/// [`generate`] with drafts of `shape` and `budget`.
fn generate_as(
    d: &Drafter,
    id: &str,
    prompt: &[Token],
    text: &[Token],
    shape: DraftShape,
    budget: usize,
) {
    d.start(id, prompt).unwrap();
    let mut at = 0;
    let mut accepted = None;
    while at < text.len() {
        let item = StepItem {
            request_id: id,
            new_tokens: &text[at..(at + 1).min(text.len())],
            accepted_last: accepted,
            budget,
            shape,
            ..Default::default()
        };
        let tree = d.step(&[item]).pop().unwrap().unwrap();
        at += 1;
        let hit = (0..tree.len()).any(|i| tree.path(i).first() == text.get(at));
        accepted = Some(u32::from(hit));
    }
    d.end(id).unwrap();
}

#[test]
fn a_chain_learns_from_every_candidate_it_weighed_as_a_tree_does() {
    // Contexts that go on in several ways: every draft weighs several candidates. A draft of
    // one node is the same chain or tree; what the calibration learns from it must be too.
    // (A chain that taught it only its own token taught each key the rate of the times it
    // won: a key that seldom wins learnt a high rate and crowded out the right candidate.)
    let mut x = 7u32;
    let text: Vec<Token> = (0..200)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            1000 + (x >> 16) % 3
        })
        .collect();
    let learnt = |shape| {
        let d = cluster_drafter();
        generate_as(&d, "x", &[1, 2, 3], &text, shape, 1);
        match d.take_calibration() {
            Some(LearnedText::Calibration(counts)) => counts.counts,
            other => panic!("{other:?}"),
        }
    };
    let chain = learnt(DraftShape::Chain);
    let trials: u64 = chain.iter().map(|c| u64::from(c.trials)).sum();
    // local, global and pair counters for each candidate weighed, one realised per node
    assert!(
        trials > 4 * text.len() as u64,
        "one candidate a step: {trials}"
    );
    assert_eq!(chain, learnt(DraftShape::Tree));
}

#[test]
fn calibration_counts_make_another_drafter_calibrate_the_same() {
    let (a, b) = (cluster_drafter(), cluster_drafter());
    let motif = novel(7, 12);
    let text: Vec<Token> = motif.iter().cycle().take(120).copied().collect();
    generate(&a, "x", &[1, 2, 3], &text);
    let counts = a.take_calibration().expect("feedback was recorded");
    assert!(a.take_calibration().is_none(), "counts since the last take");
    apply_all(&b, &a.take_learned());
    b.apply_learned("node-a", &counts).unwrap();
    assert!(
        b.take_calibration().is_none(),
        "applied counts are not recorded"
    );
    for d in [&a, &b] {
        d.start("q", &[9, 9, motif[0], motif[1], motif[2]]).unwrap();
    }
    assert_eq!(a.draft("q", 16).unwrap(), b.draft("q", 16).unwrap());
    let foreign = LearnedText::Calibration(CalibrationCounts {
        layout: 7,
        counts: vec![CalibrationCount {
            index: 0,
            trials: 1,
            hits: 1,
        }],
    });
    assert!(matches!(
        b.apply_learned("node-a", &foreign),
        Err(DraftError::CalibrationCounts { .. })
    ));
    let LearnedText::Calibration(mut bad) = counts else {
        panic!("{counts:?}")
    };
    bad.counts[0].hits = bad.counts[0].trials + 1;
    assert!(
        b.apply_learned("node-a", &LearnedText::Calibration(bad))
            .is_err()
    );
}

#[test]
fn without_the_cluster_nothing_is_recorded() {
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    generate(&d, "x", &[1, 2], &novel(8, 30));
    assert!(d.take_learned().is_empty());
    assert!(d.take_calibration().is_none());
}
