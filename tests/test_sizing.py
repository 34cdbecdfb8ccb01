"""The cost model and the sizing policy: fits, decisions checked against brute force,
exploration, and the calibration loop against simulated drafters (no model, no timing)."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from lookahead_client.cost import CostModel, token_knots
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.hf.sizing import AcceptanceCalibration, SizingPolicy
from lookahead_client.types import DraftTree


def cpu_like(tokens: float) -> float:
    """A CPU step curve as measured with SmolLM2: one token is cheap, two cost much more,
    then it grows slowly."""
    return 0.13 if tokens <= 1 else 0.25 + 0.01 * (tokens - 2)


def gpu_like(tokens: float) -> float:
    """Flat up to 256 tokens (memory-bound), then linear (compute-bound)."""
    return 0.02 + 0.0001 * max(0.0, tokens - 256)


def chain(scores, root: int = 7) -> DraftTree:
    n = len(scores)
    return DraftTree(root, tuple(range(10, 10 + n)), tuple(range(-1, n - 1)), tuple(scores))


def random_tree(rng: random.Random, n: int) -> DraftTree:
    """A random tree of ``n`` nodes (BFS-free order, parents first) whose scores do not
    increase along paths."""
    parents, scores = [], []
    for i in range(n):
        p = rng.randrange(-1, i)
        parents.append(p)
        top = 1.0 if p < 0 else scores[p]
        scores.append(round(top * rng.uniform(0.3, 1.0), 3))
    return DraftTree(1, tuple(range(100, 100 + n)), tuple(parents), tuple(scores))


def fitted(curve, sizes, *, noise: float = 0.0, seed: int = 0, **kwargs) -> CostModel:
    rng = np.random.default_rng(seed)
    model = CostModel(**kwargs)
    for _ in range(400):
        t = int(rng.choice(sizes))
        model.observe(t, curve(t) * (1 + noise * rng.standard_normal()))
    return model


# -- cost model -------------------------------------------------------------------------------


def test_knots_cover_the_range():
    knots = token_knots(100)
    assert list(knots[:8]) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert knots[-1] >= 100 and np.all(np.diff(knots) > 0)


@pytest.mark.parametrize("curve", [cpu_like, gpu_like])
def test_cost_model_learns_measured_curves(curve):
    sizes = list(range(1, 18)) if curve is cpu_like else [1, 16, 64, 128, 256, 384, 512, 1024]
    model = fitted(curve, sizes, noise=0.03)
    got = model.predict(sizes)
    want = np.asarray([curve(t) for t in sizes])
    assert np.allclose(got, want, rtol=0.05), list(zip(sizes, got, want, strict=True))


def test_unmeasured_sizes_are_interpolated_and_extrapolated():
    model = fitted(lambda t: 0.1 + 0.01 * t, [1, 2, 16, 32])
    assert model.predict(8)[0] == pytest.approx(0.18, rel=0.02)
    assert model.predict(100)[0] == pytest.approx(1.1, rel=0.02)  # past the last measurement
    assert model.samples([1, 8, 16]).tolist()[1] < 0.5 < model.samples([1])[0]


def test_noisy_measurements_never_make_more_tokens_cheaper():
    # Steps that lost the CPU at small sizes (as on a shared machine): an unconstrained fit
    # bends the curve down, even below zero, and wide trees look free.
    rows = [
        {"tokens": 1, "seconds": 0.40},
        {"tokens": 2, "seconds": 0.15},
        {"tokens": 4, "seconds": 0.30},
        {"tokens": 8, "seconds": 0.12},
        {"tokens": 16, "seconds": 0.35},
    ]
    model = CostModel.from_measurements(rows)
    sizes = list(range(1, 33))
    got = model.predict(sizes)
    assert np.all(got > 0) and np.all(np.diff(got) >= -1e-12), list(zip(sizes, got, strict=True))


def test_context_is_learnt_apart_from_tokens():
    rng = np.random.default_rng(1)
    model = CostModel()

    def true(t, c):
        return 0.01 + 0.002 * t + 0.03 * c / 1024

    for _ in range(500):
        t, c = int(rng.integers(1, 17)), int(rng.integers(0, 4096))
        model.observe(t, true(t, c), context=c)
    for t, c in [(1, 4000), (16, 0), (8, 2048)]:
        assert model.predict(t, c)[0] == pytest.approx(true(t, c), rel=0.03)


def test_forgetting_follows_a_slower_machine():
    model = fitted(cpu_like, [1, 4, 8, 16], forgetting=0.99)
    for i in range(600):
        t = [1, 4, 8, 16][i % 4]
        model.observe(t, 2 * cpu_like(t))
    assert model.predict([1, 8]) == pytest.approx([0.26, 2 * cpu_like(8)], rel=0.05)
    never = fitted(cpu_like, [1, 4, 8, 16], forgetting=1.0)
    for i in range(600):
        t = [1, 4, 8, 16][i % 4]
        never.observe(t, 2 * cpu_like(t))
    assert never.predict(1)[0] < 0.9 * 0.26  # without forgetting the old machine lingers


def test_outliers_are_clipped():
    model = fitted(cpu_like, [1, 8])
    for _ in range(5):
        model.observe(8, 100.0)  # the process lost the CPU for a while
    assert model.predict(8)[0] < 2 * cpu_like(8)


def test_a_slow_step_where_the_fit_never_measured_is_news_not_an_outlier():
    model = fitted(cpu_like, [1, 2])
    model.predict(1)
    for _ in range(20):
        model.observe(256, 50 * cpu_like(256))  # far above the extrapolation: kept
    assert model.predict(256)[0] > 10 * cpu_like(256)


def test_one_slow_step_at_a_rare_size_does_not_bend_an_engines_curve():
    """The engines' curve (StepCostFeed) needs several steps to change its slope at a knot
    or its draft overhead: one slow step at a size the core seldom drafts (2 tokens, among
    many at 1, 6 and 9) does not make every size up to 6 cost as much as 6 (docs/vllm-runs.md run
    23: the first draft token at 17 ms and four more free)."""
    from lookahead_client.engine.step_cost import StepCostFeed

    feed = StepCostFeed()
    for _ in range(40):
        for tokens, ms in ((1, 57.0), (6, 70.0), (9, 78.0)):
            feed.observe(tokens, ms / 1e3, context=700)
    feed.observe(2, 0.095, context=700)
    assert feed.curve(1) is not None
    at = feed.seconds_at([1, 2, 3, 6])
    assert at is not None
    # the line from 1 to 6 would leave 80% of the rise after the first draft token
    assert at[3] - at[1] > 0.4 * (at[3] - at[0]), at
    assert at[1] < at[2] < at[3]


def test_from_measurements_fits_a_profile():
    rows = [{"tokens": t, "seconds": gpu_like(t)} for t in (1, 64, 256, 512, 1024)]
    model = CostModel.from_measurements(rows)
    assert model.ready and model.forgetting == 0.998
    assert model.predict(768)[0] == pytest.approx(gpu_like(768), rel=0.01)
    assert "CostModel(observations=5" in repr(model)


def test_measurements_folded_in_one_go_fit_as_when_read_after_each():
    """Observing only queues a measurement (the numpy work waits for the next read): the fit
    is the one of adding them one by one, forgetting included."""
    rng = random.Random(3)
    steps = [
        (rng.choice([1, 2, 3, 5, 8, 13]), rng.randrange(0, 4000), rng.uniform(0.5, 1.5))
        for _ in range(300)
    ]
    one_by_one, queued = CostModel(max_tokens=64), CostModel(max_tokens=64)
    for tokens, context, noise in steps:
        seconds = noise * (0.02 + 0.003 * tokens + 1e-6 * context)
        for model in (one_by_one, queued):
            model.observe(tokens, seconds, context=context, pairs=tokens * (context + tokens))
        one_by_one.predict([1])  # read: folds this one measurement in now
    sizes = [1, 2, 4, 8, 16, 32]
    np.testing.assert_allclose(queued.predict(sizes, 2000), one_by_one.predict(sizes, 2000))
    np.testing.assert_allclose(queued.knot_weight, one_by_one.knot_weight)
    assert queued.observations == one_by_one.observations == 300


def test_a_warm_started_solve_finds_the_cold_solution():
    from lookahead_client.cost import _nonnegative_least_squares

    rng = np.random.default_rng(4)
    for _ in range(50):
        a = rng.normal(size=(40, 12))
        gram, moment = a.T @ a, a.T @ rng.normal(size=40)
        cold = _nonnegative_least_squares(gram, moment)
        assert (cold >= 0).all() and (cold > 0).any() and (cold == 0).any()
        nearby = _nonnegative_least_squares(gram + 0.1 * np.eye(12), moment * 1.1)
        for start in (nearby, cold, rng.uniform(0, 1, size=12)):
            warm = _nonnegative_least_squares(gram, moment, start)
            np.testing.assert_allclose(warm, cold, atol=1e-9)


def test_cost_model_rejects_bad_input():
    model = CostModel()
    assert not model.ready and "not ready" in repr(model)
    with pytest.raises(InvalidArgumentError) as err:
        model.predict(4)
    assert err.value.field == "cost"
    for kwargs, field in [
        ({"tokens": 0, "seconds": 1.0}, "tokens"),
        ({"tokens": 1, "seconds": math.nan}, "seconds"),
        ({"tokens": 1, "seconds": -1.0}, "seconds"),
        ({"tokens": 1, "seconds": 1.0, "context": -1}, "context"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            model.observe(**kwargs)
        assert err.value.field == field
    for kwargs, field in [
        ({"max_tokens": 0}, "max_tokens"),
        ({"forgetting": 0.0}, "forgetting"),
        ({"smoothing": 0.0}, "smoothing"),
        ({"outlier_factor": 1.0}, "outlier_factor"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            CostModel(**kwargs)
        assert err.value.field == field
    with pytest.raises(InvalidArgumentError):
        CostModel.from_measurements([])


# -- calibration ------------------------------------------------------------------------------


def test_calibration_learns_realised_acceptance_by_ratio_and_depth():
    cal = AcceptanceCalibration(forgetting=1.0)
    rng = np.random.default_rng(2)
    ratios = np.full(1000, 0.9)
    depths = np.repeat([1, 4], 500)
    # Given their parent, depth-1 nodes are accepted 60% of the time, depth-4 ones 10%: the
    # drafter says 0.9 for both. Nodes whose parent was rejected say nothing.
    accepted = rng.random(1000) < np.where(depths == 1, 0.6, 0.1)
    reached = np.ones(1000, bool)
    reached[::2] = False
    accepted &= reached
    assert cal.conditional(np.asarray([0.9, 0.5]), np.asarray([1, 1])) == pytest.approx([0.9, 0.5])
    cal.observe(ratios, depths, accepted, reached, scores=700.0, expected=650.0)
    got = cal.conditional(np.asarray([0.9, 0.9, 0.5]), np.asarray([1, 4, 1]))
    assert got[0] == pytest.approx(0.6, abs=0.07)
    assert got[1] == pytest.approx(0.1, abs=0.05)
    assert got[2] == 0.5  # a band never observed keeps the drafter's figure
    assert cal.stats() == {
        "nodes": 1000,
        "accepted": int(accepted.sum()),
        "expected_raw": 700.0,
        "expected_calibrated": 650.0,
    }


def test_calibration_fades_back_to_the_scores():
    cal = AcceptanceCalibration(forgetting=0.9)
    ones = np.ones(200, bool)
    cal.observe(np.full(200, 0.8), np.ones(200, np.int64), ~ones, ones)
    assert cal.conditional(np.asarray([0.8]), np.asarray([1]))[0] < 0.05
    for _ in range(100):
        cal.observe(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0, bool))
    assert cal.conditional(np.asarray([0.8]), np.asarray([1]))[0] > 0.7


def test_calibration_rejects_bad_settings():
    for kwargs in ({"score_bins": 0}, {"prior_weight": 0.0}, {"forgetting": 1.5}):
        with pytest.raises(InvalidArgumentError):
            AcceptanceCalibration(**kwargs)


# -- decisions --------------------------------------------------------------------------------


def policy_with(curve, sizes, margin: float = 0.0, **kwargs) -> SizingPolicy:
    """A policy with a fixed cost model fitted to ``curve`` (no margin: exact optima)."""
    rows = [{"tokens": t, "seconds": curve(t)} for t in sizes]
    cost = CostModel.from_measurements(rows)
    return SizingPolicy(cost, learn_cost=False, explore=False, margin=margin, **kwargs)


def rate_of(counts, trees, curve) -> float:
    """Expected tokens per second of keeping each tree's ``counts[b]`` best nodes."""
    gain = sum(sum(sorted(t.scores, reverse=True)[:k]) for t, k in zip(trees, counts, strict=True))
    return (len(trees) + gain) / curve(len(trees) + sum(counts))


def test_weak_drafts_decode_plainly_and_strong_ones_speculate():
    policy = policy_with(cpu_like, range(1, 33))
    weak = policy.plan([chain([0.5, 0.3, 0.2, 0.1])], [600], max_nodes=16)
    assert weak.num_slots == 1 and weak.trees[0].tokens == () and weak.expected_tokens == 1.0
    strong = policy.plan([chain([0.95**k for k in range(1, 17)])], [600], max_nodes=16)
    assert strong.num_slots == 17 and len(strong.trees[0]) == 16
    capped = policy.plan([chain([0.95**k for k in range(1, 17)])], [600], max_nodes=5)
    assert capped.num_slots == 6
    # A request about to finish gains nothing from deep nodes.
    short = policy.plan(
        [chain([0.95**k for k in range(1, 17)])], [600], max_nodes=16, remaining=[3]
    )
    assert len(short.trees[0]) == 2 and short.trees[0].depth == 2


@pytest.mark.parametrize("seed", range(20))
def test_padded_choice_is_the_best_common_width(seed):
    rng = random.Random(seed)
    slope = rng.choice([0.005, 0.05, 0.3])

    def curve(t):
        return 1.0 + slope * t

    bs = rng.randrange(1, 5)
    trees = [random_tree(rng, rng.randrange(0, 12)) for _ in range(bs)]
    policy = policy_with(curve, [1, 2, 4, 8, 16, 32, 64])
    plan = policy.plan(trees, [0] * bs, max_nodes=16)
    widest = max(len(t) for t in trees)

    def padded_rate(k):
        gain = sum(sum(sorted(t.scores, reverse=True)[:k]) for t in trees)
        return (bs + gain) / curve(bs * (k + 1))

    best = max(range(widest + 1), key=lambda k: (padded_rate(k), -k))
    assert plan.num_slots == best + 1
    assert plan.expected_tokens / plan.predicted_seconds == pytest.approx(padded_rate(best))
    for tree, cut in zip(trees, plan.trees, strict=True):
        # The cut keeps the best nodes and is a tree of the original's nodes.
        assert len(cut) == min(best, len(tree))
        assert sorted(cut.scores, reverse=True) == sorted(tree.scores, reverse=True)[: len(cut)]
        assert {tuple(p) for p in cut.paths()} <= {tuple(p) for p in tree.paths()}


@pytest.mark.parametrize("seed", range(20))
def test_ragged_choice_beats_every_allocation(seed):
    """Brute force over every number of nodes per request (tiny batches): nothing beats the
    policy's choice."""
    rng = random.Random(100 + seed)
    slope = rng.choice([0.02, 0.1, 0.4])

    def curve(t):
        return 1.0 + slope * t

    trees = [random_tree(rng, rng.randrange(0, 6)) for _ in range(rng.randrange(1, 4))]
    policy = policy_with(curve, range(1, 20), layout="ragged")
    plan = policy.plan(trees, [0] * len(trees), max_nodes=16)
    chosen = [len(t) for t in plan.trees]
    best = max(
        rate_of(counts, trees, curve)
        for counts in itertools.product(*[range(len(t) + 1) for t in trees])
    )
    assert rate_of(chosen, trees, curve) == pytest.approx(best, rel=1e-9)
    assert plan.tokens == len(trees) + sum(chosen)
    for tree, cut in zip(trees, plan.trees, strict=True):
        assert sorted(cut.scores, reverse=True) == sorted(tree.scores, reverse=True)[: len(cut)]


def test_ragged_spends_nodes_where_they_pay():
    policy = policy_with(lambda t: 1.0 + 0.1 * t, range(1, 40), layout="ragged")
    good, bad = chain([0.9**k for k in range(1, 9)]), chain([0.05] * 8)
    plan = policy.plan([good, bad, good], [100] * 3, max_nodes=8)
    assert [len(t) for t in plan.trees][1] == 0
    assert len(plan.trees[0]) == len(plan.trees[2]) > 0


def test_cut_trees_keep_parents_before_children():
    # Best-first node order from a drafter: a deep good path listed before a weak sibling.
    tree = DraftTree(5, (1, 2, 3, 4, 5), (-1, 0, 1, -1, 2), (0.9, 0.85, 0.8, 0.1, 0.75))
    plan = policy_with(lambda t: 1.0 + 0.15 * t, range(1, 10)).plan([tree], [10], max_nodes=8)
    cut = plan.trees[0]
    assert cut.tokens == (1, 2, 3, 5) and cut.parents == (-1, 0, 1, 2)


def test_a_correction_at_one_depth_carries_below():
    """Children of the root accepted 20% of the time although their ratio is 0.9: deeper
    nodes of the same ratio (never observed) borrow that rate, and paths multiply it."""
    cal = AcceptanceCalibration(forgetting=1.0)
    n = 200
    cal.observe(np.full(n, 0.9), np.ones(n, np.int64), np.arange(n) % 5 == 0, np.ones(n, bool))
    policy = policy_with(lambda t: 1.0 + 1e-4 * t, range(1, 10), calibration=cal)
    probs = policy.plan([chain([0.9, 0.81, 0.729])], [0], max_nodes=3)._probs
    assert probs[0] == pytest.approx(0.2, abs=0.03)
    assert probs[1] == pytest.approx(probs[0] ** 2, rel=0.1)
    assert probs[2] == pytest.approx(probs[0] ** 3, rel=0.15)
    # Another band keeps the drafter's figure (nothing was learnt about it).
    other = policy.plan([chain([0.5, 0.25])], [0], max_nodes=2)._probs
    assert other == pytest.approx([0.5, 0.25])


def test_plan_rejects_bad_arguments():
    policy = SizingPolicy()
    with pytest.raises(InvalidArgumentError):
        policy.plan([chain([0.5])], [1, 2], max_nodes=4)
    with pytest.raises(InvalidArgumentError):
        policy.plan([chain([0.5])], [1], max_nodes=-1)
    with pytest.raises(InvalidArgumentError) as err:
        SizingPolicy(layout="diagonal")
    assert err.value.field == "layout"
    with pytest.raises(InvalidArgumentError):
        SizingPolicy(min_samples=0)
    with pytest.raises(InvalidArgumentError) as err:
        SizingPolicy(margin=-0.1)
    assert err.value.field == "margin"


def test_drafts_must_beat_plain_by_the_margin():
    # Expected 1.3 tokens for 1.2 seconds against 1 token for 1 second: 8% better.
    tree = chain([0.3])
    curve = {1: 1.0, 2: 1.2, 3: 1.4}.__getitem__
    assert policy_with(curve, [1, 2, 3]).plan([tree], [0], max_nodes=1).num_slots == 2
    assert policy_with(curve, [1, 2, 3], margin=0.1).plan([tree], [0], max_nodes=1).num_slots == 1


# -- exploration and the feedback loop --------------------------------------------------------


def accepted_nodes(tree: DraftTree, truth_depth: int) -> list[int]:
    """The nodes of a chain accepted when the first ``truth_depth`` draft tokens are right."""
    return [i for i, d in enumerate(tree.depths()) if d <= truth_depth]


def test_exploration_measures_each_size_then_stops():
    policy = SizingPolicy()
    tree = chain([0.9**k for k in range(1, 9)])
    probed = []
    for _ in range(30):
        plan = policy.plan([tree], [100], max_nodes=8)
        if plan.probe:
            probed.append(plan.num_slots)
        policy.observe(plan, [accepted_nodes(plan.trees[0], 3)], cpu_like(plan.tokens))
    assert probed[0] == 9  # the whole tree first
    assert 1 in probed and len(probed) < 20 and policy.stats()["probe_steps"] == len(probed)
    # Every width the policy chooses among has been measured (or both knots around it).
    assert policy.cost.samples(np.arange(1, 10)).min() > 0.9
    assert not policy.plan([tree], [100], max_nodes=8).probe
    assert policy.cost.ready


def simulate(policy: SizingPolicy, accept_prob: float, scores, steps: int, seed: int = 0):
    """Chains scored ``scores`` whose nodes are each right with ``accept_prob`` (given the
    previous one); the step time follows ``cpu_like``. Returns the tokens per second."""
    rng = np.random.default_rng(seed)
    tree = chain(scores)
    tokens, seconds = 0, 0.0
    for _ in range(steps):
        plan = policy.plan([tree], [500], max_nodes=len(scores))
        hits = rng.random(len(scores)) < accept_prob
        right = len(scores) if hits.all() else int(np.argmin(hits))  # leading hits
        depth = min(right, len(plan.trees[0]))
        step = cpu_like(plan.tokens)
        policy.observe(plan, [accepted_nodes(plan.trees[0], depth)], step)
        tokens += depth + 1
        seconds += step
    return tokens / seconds


def test_overconfident_drafts_are_caught():
    """Scores of 0.95 for drafts right 30% of the time: the calibration learns it and the
    policy decodes plainly, which is what pays with this cost curve."""
    policy = SizingPolicy()
    rate = simulate(policy, 0.3, [0.95] * 8, 400)
    stats = policy.stats()
    assert stats["plain_steps"] > 0.8 * stats["steps"], stats
    assert stats["accepted"] < 0.5 * stats["expected_raw"]
    assert rate > 0.95 / cpu_like(1)  # within 5% of plain decoding, probes included
    # The same drafts verified whole every step would be slower than plain.
    assert (1 + 0.3 / 0.7) / cpu_like(9) < 1 / cpu_like(1)


def test_underconfident_drafts_are_found_out():
    """Scores of 0.1 for drafts right 95% of the time: the probes show it, and the policy
    speculates although the raw scores say it does not pay."""
    policy = SizingPolicy()
    assert (
        policy_with(cpu_like, range(1, 10)).plan([chain([0.1] * 8)], [500], max_nodes=8).num_slots
        == 1
    )
    rate = simulate(policy, 0.95, [0.1] * 8, 300)
    stats = policy.stats()
    assert stats["plain_steps"] < 0.2 * stats["steps"], stats
    assert rate > 1.5 / cpu_like(1)


def test_per_request_correction_tells_requests_apart():
    """Two requests with the same scores, one whose drafts are right 90% of the time and one
    whose drafts are right 10%: the correction learns which is which, and a ragged policy
    spends its nodes on the first."""
    policy = policy_with(lambda t: 1.0 + 0.1 * t, range(1, 40), layout="ragged")
    rng = np.random.default_rng(3)
    tree = chain([0.6**k for k in range(1, 7)])
    keys = ["good", "bad"]
    for _ in range(30):
        plan = policy.plan([tree, tree], [100, 100], max_nodes=6, requests=keys)
        accepted = []
        for cut, p in zip(plan.trees, (0.9, 0.1), strict=True):
            hits = rng.random(len(cut)) < p
            accepted.append(list(range(len(cut) if hits.all() else int(np.argmin(hits)))))
        policy.observe(plan, accepted, None)
    # The shared calibration is dominated by the good request (its deeper nodes are the ones
    # reached), so the good one stays near 1 and the bad one is scaled down.
    factors = policy.correction.factors(keys)
    assert factors[0] > 0.95 and factors[1] < 0.5 and factors[0] > 2 * factors[1], factors
    plan = policy.plan([tree, tree], [100, 100], max_nodes=6, requests=keys)
    assert len(plan.trees[0]) > len(plan.trees[1])
    policy.end("good")
    assert policy.correction.factors(["good"])[0] == 1.0 and len(policy.correction) == 1


def test_request_correction_is_bounded():
    from lookahead_client.hf.sizing import RequestCorrection

    correction = RequestCorrection(max_requests=3)
    for i in range(10):
        correction.observe(i, 0.0, 5.0)
    assert len(correction) == 3
    assert correction.factors([0, 9]).tolist() == [1.0, pytest.approx(2 / 7)]
    for kwargs in ({"prior_weight": 0}, {"forgetting": 0}, {"max_requests": 0}):
        with pytest.raises(InvalidArgumentError):
            RequestCorrection(**kwargs)


def test_path_probabilities_never_rise_along_a_path():
    """Products of factors of 1.0 and below, computed by pointer jumping, group the factors
    differently for a node and its parent: without care a child comes out an ulp above its
    parent (this happens for several percent of these random trees), is ranked first and
    kept without its parent. The cut must stay a tree."""
    from lookahead_client.hf.sizing import _StepNodes

    rng = np.random.default_rng(0)
    for _ in range(3000):
        k = int(rng.integers(2, 17))
        parents = [-1] + [
            i - 1 if rng.random() < 0.7 else int(rng.integers(-1, i)) for i in range(1, k)
        ]
        tree = DraftTree(1, tuple(range(k)), tuple(parents), (0.5,) * k)
        nodes = _StepNodes([tree])
        factors = np.where(rng.random(k) < 0.5, 1.0, rng.random(k))
        nodes.path_products(np.minimum(factors * rng.choice([1.0, 0.97, 1.3]), 1.0))
        child = nodes.parent >= 0
        assert (nodes.prob[child] <= nodes.prob[nodes.parent[child]]).all()
        rank = nodes.ranks()
        for j in range(k + 1):  # every cut by rank keeps a tree
            kept = set(np.flatnonzero(rank < j))
            assert all(parents[i] < 0 or parents[i] in kept for i in kept)


def test_the_outlier_rule_predicts_as_the_fit_does_without_a_solve_per_step():
    """Every observation is checked against the last fit in plain Python: the same prediction
    as ``predict`` at knots, between them, beyond the last and with context; the fit is
    refitted once per 32 observations, not per observation."""
    model = fitted(cpu_like, [1, 2, 8, 64])
    model.observe(4, 1.0, context=2048, pairs=9000)
    model.predict(1)  # a read refits; the rule follows the new fit
    coef = model._reference
    assert coef is not None
    for tokens, context, pairs in [(1, 0, 0), (5, 0, 0), (64, 100, 0), (9000, 4096, 70000)]:
        expected = model.predict(tokens, context, pairs)[0]
        assert model._predict_one(coef, tokens, context, pairs, False) == pytest.approx(expected)
        expected = model.predict(tokens, context, pairs, drafted=True)[0]
        assert model._predict_one(coef, tokens, context, pairs, True) == pytest.approx(expected)
    solves = 0
    real_solve = model._solve

    def counting_solve():
        nonlocal solves
        solves += 1
        return real_solve()

    model._solve = counting_solve
    for _ in range(64):
        model.observe(8, 100.0)
    assert solves <= 64 // 32  # not one per observation
    assert model.predict(8)[0] < 2 * cpu_like(8)


def test_a_draft_steps_overhead_is_learnt_apart_from_its_tokens():
    """An engine's speculative path costs a step something once (vLLM's rejection sampler):
    a batch of 16 that verifies 17 tokens costs more than one of 16 by more than a token.
    Fitted as tokens alone, that jump would be spread over the knots around 16, and a step
    without drafts would look dearer than it is."""
    rng = np.random.default_rng(3)
    model = CostModel()

    def true(rows: int, drafts: int) -> float:
        return 0.04 + 0.002 * (rows + drafts) + (0.012 if drafts else 0.0)

    for _ in range(600):
        rows = int(rng.choice([1, 3, 8, 16]))
        drafts = int(rng.choice([0, 0, 1, 2, 5, 8])) * (1 if rows < 16 else 2)
        model.observe(rows + drafts, true(rows, drafts), drafted=drafts > 0)
    assert model.draft_seconds == pytest.approx(0.012, rel=0.05)
    for rows, drafts in [(16, 0), (16, 1), (8, 0), (3, 5)]:
        got = model.predict(rows + drafts, drafted=drafts > 0)[0]
        assert got == pytest.approx(true(rows, drafts), rel=0.02), (rows, drafts)


def test_the_engines_curve_starts_its_drafts_where_each_batch_does():
    """The feed's curve for a batch of ``rows`` puts the overhead between ``rows`` and
    ``rows + 1`` tokens: the core weighs its first draft token at its real price."""
    from lookahead_client.engine.step_cost import StepCostFeed

    feed = StepCostFeed()
    for rows in (1, 4, 16):
        for drafts in (0, 1, 3, 8):
            for _ in range(40):
                ms = 40.0 + 2.0 * (rows + drafts) + (12.0 if drafts else 0.0)
                feed.observe(rows + drafts, ms / 1e3, rows=rows)
    for rows in (4, 16, 5):
        cost = feed.curve(rows)
        assert cost is not None and cost.base_tokens == rows
        plain, first, second = np.interp([rows, rows + 1, rows + 2], cost.tokens, cost.seconds)
        assert first - plain == pytest.approx(0.014, rel=0.1), rows
        assert second - first == pytest.approx(0.002, rel=0.25), rows
    assert feed.curve(16) is feed.curve(16)  # built once per refit
    at = feed.seconds_at([1, 2, 3])
    assert at is not None and at[1] - at[0] > 5 * (at[2] - at[1])


def test_the_free_set_solve_is_exact_or_least_squares_where_the_data_leaves_it_open():
    from lookahead_client.cost import _solve_free

    gram = np.array([[4.0, 1.0], [1.0, 3.0]])
    assert _solve_free(gram, np.array([1.0, 2.0])) == pytest.approx(np.linalg.solve(gram, [1, 2]))
    # two collinear features (singular): the minimum-norm answer, not an error or a blow-up
    singular = np.array([[1.0, 1.0], [1.0, 1.0]])
    assert _solve_free(singular, np.array([2.0, 2.0])) == pytest.approx([1.0, 1.0])


def test_a_young_curve_is_refitted_every_step_until_it_has_the_steps_of_a_refresh():
    """vLLM on SmolLM2 (2026-12-06): warm-up steps of one request, then the first step of a
    full batch (114 tokens, 173 ms, far more context). A fit of those puts the whole step on
    the context: the curve for 16 requests is flat, every draft token free. Kept for 32
    steps, the core drafted whole chains for 16 rows all that time; the next step's
    measurement already mends it."""
    from lookahead_client.engine.step_cost import StepCostFeed

    feed = StepCostFeed()
    for ms in (26.3, 22.7, 37.2, 26.6, 29.1, 26.9, 26.7):
        feed.observe(1, ms / 1e3, rows=1, context=70, pairs=71)
    feed.observe(114, 0.173, rows=16, context=2128, pairs=16060)
    flat = feed.curve(16)
    assert flat is not None
    feed.observe(128, 0.204, rows=16, context=2158, pairs=18414)
    mended = feed.curve(16)
    assert mended is not None and mended is not flat
    at = np.interp([16, 17, 24], mended.tokens, mended.seconds)
    assert at[0] < 0.1 and at[2] - at[0] > 0.005, at  # draft tokens cost again


def test_a_background_feed_fits_what_an_inline_one_does():
    """Refitting on the feed's own thread changes when a fit is handed out, not the fit."""
    from lookahead_client.engine.step_cost import StepCostFeed

    inline, background = StepCostFeed(), StepCostFeed(background=True)
    rng = random.Random(5)
    for _ in range(50):
        tokens = rng.choice([1, 2, 4, 9])
        ms = 17.0 + 1.5 * tokens + rng.uniform(-0.5, 0.5)
        for feed in (inline, background):
            feed.observe(tokens, ms / 1e3, context=400, pairs=tokens * (400 + tokens))
    assert inline.curve(1) is not None
    background.curve(1)  # starts the refit of all 50 steps
    background.settle()
    assert background.seconds_at(range(1, 10)) == inline.seconds_at(range(1, 10))


def test_a_background_feed_hands_out_its_last_curve_while_a_refit_runs():
    """The step that starts a refit does not wait for it: it gets the last finished fit, and
    the first step after the refit finished gets the new one."""
    import threading

    from lookahead_client.engine.step_cost import StepCostFeed

    feed = StepCostFeed(background=True)
    for tokens in (1, 5, 9) * 20:
        feed.observe(tokens, (17.0 + 1.5 * tokens) / 1e3)
    feed.curve(1)
    feed.settle()
    old = feed.curve(1)
    assert old is not None
    release = threading.Event()
    predict = feed.model.predict

    def held_predict(*args, **kwargs):
        assert release.wait(timeout=10), "the refit was never released"
        return predict(*args, **kwargs)

    feed.model.predict = held_predict  # type: ignore[method-assign]
    for _ in range(40):  # the curve is due for a refit (32 steps old) and everything is dearer
        feed.observe(9, 60e-3)
        assert feed.curve(1) is old  # the refit holds; every step gets the old curve at once
    release.set()
    feed.settle()
    new = feed.curve(1)
    assert new is not old and new is not None
    assert np.interp(9, new.tokens, new.seconds) > np.interp(9, old.tokens, old.seconds)


def test_a_failed_background_refit_raises_once_and_the_next_one_runs():
    from lookahead_client.engine.step_cost import StepCostFeed

    feed = StepCostFeed(background=True)
    predict = feed.model.predict
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise FloatingPointError("a broken solve")
        return predict(*args, **kwargs)

    feed.model.predict = failing_once  # type: ignore[method-assign]
    for tokens in (1, 9):
        feed.observe(tokens, (17.0 + 1.5 * tokens) / 1e3)
    assert feed.curve(1) is None
    with pytest.raises(FloatingPointError):
        feed.settle()
    feed.settle()  # raised once: nothing in flight now
    feed.observe(5, 24.5e-3)
    feed.curve(1)
    feed.settle()
    assert feed.curve(1) is not None
