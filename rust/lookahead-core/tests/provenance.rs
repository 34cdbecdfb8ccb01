//! Provenance: the draft tokens an engine accepted that only another replica's text could
//! have given are counted (`Stats::accepted_cross_replica`), and never a replica's own.

use lookahead_core::{DraftTree, Drafter, DrafterConfig, Origin, StepItem, Token};

/// A text no other test text shares.
fn novel(seed: u32, len: u32) -> Vec<Token> {
    (0..len).map(|i| 1000 + seed * 997 + i * 7).collect()
}

/// One step of one request from replica `origin`.
fn step(
    d: &Drafter,
    origin: Origin,
    request_id: &str,
    prompt: Option<&[Token]>,
    new_tokens: &[Token],
    accepted_last: Option<u32>,
) -> DraftTree {
    let item = StepItem {
        request_id,
        prompt,
        new_tokens,
        accepted_last,
        budget: 8,
        origin,
        ..Default::default()
    };
    d.step(&[item]).pop().unwrap().unwrap()
}

/// Replica `origin` generates `text` twice (text seen once drafts little): its first 10
/// tokens are the prompt.
fn generate(d: &Drafter, origin: Origin, request_id: &str, text: &[Token]) {
    for time in 0..2 {
        let id = format!("{request_id}-{time}");
        step(d, origin, &id, Some(&text[..10]), &[], None);
        step(d, origin, &id, None, &text[10..], None);
        d.end(&id).unwrap();
    }
}

/// A request of replica `origin` whose prompt is `text[20..30]` is drafted `text[30..]`, and
/// its engine accepts `n` of those tokens: the stats after it.
fn accept(d: &Drafter, origin: Origin, text: &[Token], n: usize) -> lookahead_core::Stats {
    let tree = step(d, origin, "follower", Some(&text[20..30]), &[], None);
    assert!(
        tree.len() >= n && tree.tokens[..n] == text[30..30 + n],
        "{tree:?}"
    );
    step(
        d,
        origin,
        "follower",
        None,
        &text[30..31 + n],
        Some(n as u32),
    );
    d.stats()
}

#[test]
fn tokens_drafted_from_another_replicas_text_count_as_cross_replica() {
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    let (a, b) = (d.origin_of("replica-a"), d.origin_of("replica-b"));
    let text = novel(1, 60);
    generate(&d, a, "first", &text);
    let stats = accept(&d, b, &text, 4);
    assert_eq!(stats.accepted_reported, 4);
    assert_eq!(stats.accepted_cross_replica, 4);
}

#[test]
fn a_replicas_own_text_is_never_another_replicas() {
    let text = novel(1, 60);
    // the text came from the same replica
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    let a = d.origin_of("replica-a");
    generate(&d, a, "first", &text);
    assert_eq!(accept(&d, a, &text, 4).accepted_cross_replica, 0);
    // both replicas wrote it: the follower's own replica could have drafted it alone
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    let (a, b) = (d.origin_of("replica-a"), d.origin_of("replica-b"));
    generate(&d, a, "first", &text);
    generate(&d, b, "second", &text);
    assert_eq!(accept(&d, b, &text, 4).accepted_cross_replica, 0);
    // a document nobody generated, and an embedded drafter (one unnamed writer)
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    d.ingest(&text).unwrap();
    d.ingest(&text).unwrap();
    let b = d.origin_of("replica-b");
    assert_eq!(accept(&d, b, &text, 2).accepted_cross_replica, 0);
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    generate(&d, Origin::default(), "first", &text);
    assert_eq!(
        accept(&d, Origin::default(), &text, 4).accepted_cross_replica,
        0
    );
}

#[test]
fn text_from_the_other_drafters_of_a_cluster_is_another_replicas() {
    let config = DrafterConfig {
        record_for_cluster: true,
        ..Default::default()
    };
    let (here, there) = (
        Drafter::new(config.clone()).unwrap(),
        Drafter::new(config).unwrap(),
    );
    let text = novel(3, 60);
    generate(&there, Origin::default(), "first", &text);
    for learned in there.take_learned() {
        here.apply_learned("node-b", &learned).unwrap();
    }
    let stats = accept(&here, Origin::default(), &text, 4);
    assert_eq!(stats.accepted_cross_replica, 4);
}

#[test]
fn only_accepted_tokens_count_and_a_repeated_step_counts_once() {
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    let (a, b) = (d.origin_of("replica-a"), d.origin_of("replica-b"));
    let text = novel(4, 60);
    generate(&d, a, "first", &text);
    step(&d, b, "follower", Some(&text[20..30]), &[], None);
    // the engine accepted 2 and then sampled a token the draft did not have
    let item = StepItem {
        request_id: "follower",
        new_tokens: &[text[30], text[31], 7],
        accepted_last: Some(2),
        offset: Some(10),
        budget: 8,
        origin: b,
        ..Default::default()
    };
    d.step(&[item]).pop().unwrap().unwrap();
    d.step(&[item]).pop().unwrap().unwrap();
    let stats = d.stats();
    assert_eq!(
        (stats.accepted_reported, stats.accepted_cross_replica),
        (2, 2)
    );
}

#[test]
fn a_prompt_repeated_on_another_replica_drafts_the_first_replicas_response_as_cross_replica() {
    // The second request of a prompt starts with the first one's response in its own index
    // (a sibling response): drafted from there, it is still the other replica's text.
    let repeat = |second: &str| {
        let d = Drafter::new(DrafterConfig::default()).unwrap();
        let (first, second) = (d.origin_of("replica-a"), d.origin_of(second));
        let text = novel(5, 60);
        let (prompt, response) = text.split_at(20);
        step(&d, first, "first", Some(prompt), &[], None);
        step(&d, first, "first", None, response, None);
        let item = StepItem {
            request_id: "first",
            finished: true,
            origin: first,
            ..Default::default()
        };
        d.step(&[item]).pop().unwrap().unwrap();
        let tree = step(&d, second, "again", Some(prompt), &[], None);
        assert!(
            tree.len() >= 4 && tree.tokens[..4] == response[..4],
            "{tree:?}"
        );
        step(&d, second, "again", None, &response[..5], Some(4));
        d.stats()
    };
    let elsewhere = repeat("replica-b");
    assert_eq!(
        (
            elsewhere.accepted_reported,
            elsewhere.accepted_cross_replica
        ),
        (4, 4)
    );
    let same_replica = repeat("replica-a");
    assert_eq!(
        (
            same_replica.accepted_reported,
            same_replica.accepted_cross_replica
        ),
        (4, 0)
    );
}
