//! The native step: draft shapes, lengths sized against the engine's cost, temperature.

use lookahead_core::{
    CostCurve, DraftError, DraftShape, Drafter, DrafterConfig, Layout, StepCost, StepItem, Token,
};

/// A text that repeats, so that drafts are long and confident.
fn repetitive(len: usize) -> Vec<Token> {
    (0..len).map(|i| (i % 7) as Token + 10).collect()
}

fn started(ids: &[&str]) -> Drafter {
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    for id in ids {
        d.start(id, &repetitive(64)).unwrap();
    }
    d
}

fn item<'a>(id: &'a str, shape: DraftShape, budget: usize, temperature: f32) -> StepItem<'a> {
    StepItem {
        request_id: id,
        budget,
        shape,
        temperature,
        ..Default::default()
    }
}

fn cost(curve: CostCurve, layout: Layout) -> StepCost {
    StepCost {
        curve,
        layout,
        base_tokens: 0,
        explore_every: 0,
        acceptance: 1.0,
    }
}

#[test]
fn chains_have_one_branch() {
    let d = started(&["a"]);
    let tree = d
        .step(&[item("a", DraftShape::Chain, 8, 0.0)])
        .remove(0)
        .unwrap();
    assert_eq!(tree.len(), 8);
    let expected: Vec<i32> = (-1..7).collect();
    assert_eq!(tree.parents, expected);
}

#[test]
fn drafting_that_never_pays_gives_empty_drafts() {
    // every verified token costs a whole step: no draft token is worth it
    let curve = CostCurve::new(vec![1, 1000], vec![1.0, 1000.0]).unwrap();
    for layout in [Layout::Ragged, Layout::Padded] {
        let d = started(&["a", "b", "c"]);
        let items = [
            item("a", DraftShape::SizedChain, 8, 0.0),
            item("b", DraftShape::SizedTree, 8, 0.0),
            item("c", DraftShape::Tree, 8, 0.0),
        ];
        let trees: Vec<_> = d
            .step_costed(&items, &cost(curve.clone(), layout))
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(trees[0].is_empty() && trees[1].is_empty(), "{trees:?}");
        assert_eq!(trees[2].len(), 8, "an unsized shape keeps its budget");
        assert_eq!(trees[0].root, Some(repetitive(64)[63]));
        assert_eq!(d.stats().sized_away, 16);
    }
}

#[test]
fn flat_cost_gives_whole_caps() {
    let d = started(&["a", "b"]);
    let items = [
        item("a", DraftShape::SizedChain, 6, 0.0),
        item("b", DraftShape::SizedTree, 5, 0.0),
    ];
    let trees = d.step_costed(&items, &cost(CostCurve::flat(), Layout::Ragged));
    assert_eq!(trees[0].as_ref().unwrap().len(), 6);
    assert_eq!(trees[1].as_ref().unwrap().len(), 5);
    // without a cost, sized shapes keep their caps too
    let trees = d.step(&items);
    assert_eq!(trees[0].as_ref().unwrap().len(), 6);
}

#[test]
fn sized_drafts_keep_their_best_nodes() {
    // a draft token costs a tenth of a step: confident nodes pay, weak ones do not
    let curve = CostCurve::new(vec![1, 101], vec![1.0, 11.0]).unwrap();
    let d = started(&["a"]);
    let whole = d
        .step(&[item("a", DraftShape::Tree, 32, 0.0)])
        .remove(0)
        .unwrap();
    let sized = d
        .step_costed(
            &[item("a", DraftShape::SizedTree, 32, 0.0)],
            &cost(curve, Layout::Ragged),
        )
        .remove(0)
        .unwrap();
    assert!(sized.len() <= whole.len());
    for (i, &p) in sized.parents.iter().enumerate() {
        assert!(p < i as i32, "breadth-first, parents first: {sized:?}");
    }
    let weakest_kept = sized.scores.iter().copied().fold(1.0f32, f32::min);
    assert!(sized.is_empty() || weakest_kept > 0.1, "{sized:?}");
}

#[test]
fn the_engines_measured_acceptance_weighs_the_scores() {
    // a draft token costs a tenth of a step: the cut moves with how far scores are believed
    let curve = CostCurve::new(vec![1, 101], vec![1.0, 11.0]).unwrap();
    let sized = |acceptance: f64| {
        let d = started(&["a"]);
        let mut weighed = cost(curve.clone(), Layout::Ragged);
        weighed.acceptance = acceptance;
        let items = [item("a", DraftShape::SizedTree, 32, 0.0)];
        d.step_costed(&items, &weighed).remove(0).unwrap().len()
    };
    // the repetitive text's nodes score 0.8 to 0.96: all pay at face value; weighed by 0.12
    // the weakest no longer do; at 5% none does
    let (believed, doubted, distrusted) = (sized(1.0), sized(0.12), sized(0.05));
    assert_eq!(believed, 7, "confident drafts pay at face value");
    assert!(
        0 < doubted && doubted < believed,
        "{doubted} of 7 nodes kept at 0.12"
    );
    assert_eq!(
        distrusted, 0,
        "no node is worth a tenth of a step at 5% of its score"
    );
    let bad = StepCost::new(vec![1], vec![1.0], false, 0, 0, f64::NAN).unwrap_err();
    assert_eq!(bad.field(), "cost.acceptance");
    let unset = StepCost::new(vec![1], vec![1.0], false, 0, 0, 0.0).unwrap();
    assert_eq!(unset.acceptance, 1.0);
}

/// Starts a request with the repetitive prompt, drafts a chain at `temperature`, and appends
/// the true next token: the draft's first when `follows`, else `novel` (what sampling at a
/// high temperature does to a confident draft). Returns the draft's first score.
fn one_draft(d: &Drafter, id: &str, temperature: f32, follows: bool, novel: Token) -> f32 {
    d.start(id, &repetitive(64)).unwrap();
    let tree = d
        .step(&[item(id, DraftShape::Chain, 4, temperature)])
        .remove(0)
        .unwrap();
    let next = if follows { tree.tokens[0] } else { novel };
    d.append(id, &[next]).unwrap();
    d.end(id).unwrap();
    tree.scores[0]
}

#[test]
fn temperature_bands_are_learnt_apart() {
    // Greedy and sampled requests with the same prompt: the same evidence, the same first
    // stage of calibration; only what their temperature band realised tells them apart.
    let d = Drafter::new(DrafterConfig::default()).unwrap();
    for i in 0..100 {
        one_draft(&d, &format!("greedy{i}"), 0.0, true, 0);
        one_draft(&d, &format!("hot{i}"), 1.0, false, 1000 + i);
    }
    d.start("g", &repetitive(64)).unwrap();
    d.start("h", &repetitive(64)).unwrap();
    let trees = d.step(&[
        item("g", DraftShape::Chain, 4, 0.0),
        item("h", DraftShape::Chain, 4, 1.0),
    ]);
    let greedy = trees[0].as_ref().unwrap().scores[0];
    let hot = trees[1].as_ref().unwrap().scores[0];
    assert!(
        hot < greedy / 2.0,
        "scores at temperature 1 ({hot}) should fall well below greedy ones ({greedy})"
    );
}

#[test]
fn bad_temperature_is_refused_and_neighbours_are_unharmed() {
    let d = started(&["a", "b"]);
    for bad in [-0.5, f32::NAN, f32::INFINITY] {
        let results = d.step(&[
            item("a", DraftShape::Tree, 8, bad),
            item("b", DraftShape::Tree, 8, 0.7),
        ]);
        let err = results[0].clone().unwrap_err();
        assert!(matches!(err, DraftError::InvalidTemperature { .. }));
        assert_eq!(err.field(), "temperature");
        assert_eq!(results[1].as_ref().unwrap().len(), 8);
    }
}
