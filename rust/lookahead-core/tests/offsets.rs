//! Idempotent steps: with offsets, a step sent twice (whole or overlapping the one before)
//! changes nothing; a gap is refused naming `offset`, and the request drafts on afterwards.

use lookahead_core::{DraftError, DraftTree, Drafter, DrafterConfig, StepItem, Token};
use proptest::prelude::*;

fn drafter() -> Drafter {
    Drafter::new(DrafterConfig::default()).unwrap()
}

/// One step of a request: its tokens from `offset` on, with a draft of 8 nodes.
fn step<'a>(
    id: &'a str,
    prompt: Option<&'a [Token]>,
    text: &'a [Token],
    offset: usize,
    end: usize,
) -> StepItem<'a> {
    StepItem {
        request_id: id,
        prompt,
        new_tokens: &text[offset..end],
        budget: 8,
        offset: Some(offset),
        ..Default::default()
    }
}

/// Runs a request through `cuts` (the text's length after each step), each step once, or
/// each twice with the repeat re-sending `back` tokens before it too (capped at the prompt).
/// Returns the drafts of the first sends.
fn run(
    text: &[Token],
    prompt_len: usize,
    cuts: &[usize],
    repeat_back: Option<&[usize]>,
) -> Vec<DraftTree> {
    let d = drafter();
    let prompt = &text[..prompt_len];
    let mut drafts = Vec::new();
    let first = [step("r", Some(prompt), text, prompt_len, prompt_len)];
    drafts.push(d.step(&first).remove(0).unwrap());
    if repeat_back.is_some() {
        d.step(&first).remove(0).unwrap(); // a repeated start goes on from the prompt
    }
    let mut held = prompt_len;
    for (i, &cut) in cuts.iter().enumerate() {
        let item = step("r", None, text, held, cut);
        drafts.push(d.step(&[item]).remove(0).unwrap());
        if let Some(back) = repeat_back {
            let from = held.saturating_sub(back[i % back.len()]).max(prompt_len);
            d.step(&[step("r", None, text, from, cut)])
                .remove(0)
                .unwrap();
        }
        held = cut;
        assert_eq!(d.held_tokens("r"), Some(held));
    }
    drafts
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every step sent twice, the repeat overlapping earlier tokens or not: the same drafts
    /// as a clean run.
    #[test]
    fn repeated_steps_change_nothing(
        motif in prop::collection::vec(1u32..40, 3..9),
        steps in prop::collection::vec(1usize..4, 5..30),
        back in prop::collection::vec(0usize..6, 1..4),
    ) {
        let text: Vec<Token> = motif.iter().copied().cycle().take(200).collect();
        let prompt_len = 12;
        let mut cuts = Vec::new();
        let mut at = prompt_len;
        for s in steps {
            at += s;
            cuts.push(at);
        }
        let clean = run(&text, prompt_len, &cuts, None);
        let twice = run(&text, prompt_len, &cuts, Some(&back));
        prop_assert_eq!(clean, twice);
    }
}

#[test]
fn a_gap_is_refused_naming_offset_and_the_request_drafts_on() {
    let d = drafter();
    let text: Vec<Token> = [5, 6, 7, 8].iter().copied().cycle().take(40).collect();
    d.step(&[step("r", Some(&text[..10]), &text, 10, 12)])
        .remove(0)
        .unwrap();
    let err = d
        .step(&[step("r", None, &text, 14, 16)])
        .remove(0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            DraftError::OffsetGap {
                offset: 14,
                held: 12,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.field(), "offset");
    assert!(err.to_string().contains("12 tokens it holds"), "{err}");
    assert_eq!(d.held_tokens("r"), Some(12), "nothing applied");
    let tree = d.step(&[step("r", None, &text, 12, 16)]).remove(0).unwrap();
    assert!(!tree.is_empty());
    assert_eq!(d.held_tokens("r"), Some(16));
}

#[test]
fn different_tokens_at_a_held_offset_are_refused() {
    let d = drafter();
    let text: Vec<Token> = (1..30).collect();
    d.step(&[step("r", Some(&text[..10]), &text, 10, 14)])
        .remove(0)
        .unwrap();
    let other: Vec<Token> = (100..130).collect();
    let err = d
        .step(&[step("r", None, &other, 12, 15)])
        .remove(0)
        .unwrap_err();
    assert!(matches!(err, DraftError::TokensDiffer { .. }), "{err:?}");
    assert_eq!(err.field(), "new_tokens");
    assert_eq!(d.held_tokens("r"), Some(14));
}

#[test]
fn a_start_offset_must_follow_its_prompt() {
    let d = drafter();
    let text: Vec<Token> = (1..30).collect();
    let err = d
        .step(&[step("r", Some(&text[..10]), &text, 9, 12)])
        .remove(0)
        .unwrap_err();
    assert!(matches!(err, DraftError::OffsetNotAfterPrompt { .. }));
    // without an offset, starting an active request is still refused
    d.start("s", &text[..5]).unwrap();
    assert!(matches!(
        d.start("s", &text[..5]),
        Err(DraftError::RequestAlreadyActive { .. })
    ));
}

#[test]
fn feedback_of_a_repeat_counts_once_and_a_step_with_new_tokens_counts() {
    let d = drafter();
    let text: Vec<Token> = (1..40).collect();
    d.step(&[step("r", Some(&text[..10]), &text, 10, 10)])
        .remove(0)
        .unwrap();
    let with_feedback = |offset, end| StepItem {
        accepted_last: Some(1),
        ..step("r", None, &text, offset, end)
    };
    d.step(&[with_feedback(10, 12)]).remove(0).unwrap();
    d.step(&[with_feedback(10, 12)]).remove(0).unwrap(); // sent again
    assert_eq!(d.stats().steps_reported, 1);
    // the lost tokens again, with new ones: a new step
    d.step(&[with_feedback(11, 14)]).remove(0).unwrap();
    assert_eq!(d.stats().steps_reported, 2);
    assert_eq!(d.held_tokens("r"), Some(14));
}
