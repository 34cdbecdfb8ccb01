"""``lookahead-bench sizing``: the simulated batch sweep (replayed acceptance, a cost curve in
the format of scripts/gpu_cost_curve.py) and the replay's step hook."""

from __future__ import annotations

import json

import pytest

from lookahead_client import EmbeddedDrafter
from lookahead_client.bench import cli
from lookahead_client.bench.replay import ReplaySettings, accepted_length, accepted_nodes, replay
from lookahead_client.bench.sizing import MeasuredCurve, TimedSteps, sweep
from lookahead_client.bench.workload import DEMO_WORKLOAD, load_workload
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.types import DraftTree

CONTEXT = 1024


def curve_file(tmp_path, seconds, name: str = "synthetic") -> str:
    """A cost-curve JSON as gpu_cost_curve.py writes it, with ``seconds(batch, slots)``."""
    points = [
        {
            "batch": b,
            "slots": d,
            "tokens": b * d,
            "context": b * CONTEXT,
            "pairs": b * d * (CONTEXT + d),
            "seconds": seconds(b, d),
        }
        for b in (1, 2, 4, 8, 16, 32, 64)
        for d in range(1, 17)
    ]
    path = tmp_path / f"{name}.json"
    path.write_text(
        json.dumps({"device": "test", "context": CONTEXT, "models": {name: {"points": points}}})
    )
    return str(path)


def memory_bound(b: int, d: int) -> float:
    """A GPU at small batch: the step costs the same up to 512 tokens, then grows."""
    return 0.02 + 2e-5 * max(0, b * d - 512)


def compute_bound(b: int, d: int) -> float:
    """Every verified token costs as much as a plain step's token."""
    return 0.002 + 0.001 * b * d


@pytest.fixture(scope="module")
def workload():
    return load_workload(DEMO_WORKLOAD, limit=24)


def rows_by_mode(rows):
    return {(r.concurrency, r.mode, r.budget): r for r in rows}


def test_policy_speculates_when_verifying_is_free_and_stops_when_it_is_not(tmp_path, workload):
    free = MeasuredCurve.load(curve_file(tmp_path, memory_bound))
    rows = rows_by_mode(sweep(workload, EmbeddedDrafter, free, [1], [4, 16]))
    best_fixed = max(rows[(1, "fixed", 4)].speedup, rows[(1, "fixed", 16)].speedup)
    assert best_fixed > 1.5
    assert rows[(1, "policy", 16)].speedup >= 0.97 * best_fixed
    assert rows[(1, "policy", 16)].plain_step_fraction < 0.5

    costly = MeasuredCurve.load(curve_file(tmp_path, compute_bound, "costly"))
    rows = rows_by_mode(sweep(workload, EmbeddedDrafter, costly, [16], [4, 16]))
    assert rows[(16, "fixed", 16)].speedup < 1.0  # whole trees lose to plain decoding here
    policy = rows[(16, "policy", 16)]
    assert policy.speedup >= 0.97 and policy.speedup > rows[(16, "fixed", 16)].speedup
    assert policy.slots_per_request < rows[(16, "fixed", 16)].slots_per_request
    assert policy.extra["accepted"] > 0  # its calibration saw real acceptance


def test_plain_mode_runs_one_token_per_step(tmp_path, workload):
    curve = MeasuredCurve.load(curve_file(tmp_path, compute_bound))
    hook = TimedSteps(curve, "plain", 8)
    result = replay(workload, EmbeddedDrafter, ReplaySettings(8, 4), hook=hook)
    assert result.accepted == 0 and hook.plain_steps == hook.steps
    assert hook.slots == hook.requests == result.steps


def test_accepted_nodes_follow_the_longest_matching_path():
    # root -> 5 -> 6 -> 7 and a sibling branch 5' -> 9 that matches less.
    tree = DraftTree(1, (5, 8, 6, 9, 7), (-1, -1, 0, 0, 2), (1.0,) * 5)
    assert accepted_nodes(tree, [5, 6, 7, 4]) == [0, 2, 4]
    assert accepted_nodes(tree, [5, 6, 7, 4]).__len__() == accepted_length(tree, [5, 6, 7, 4])
    assert accepted_nodes(tree, [8]) == [1]
    assert accepted_nodes(tree, [3]) == []


def test_curve_file_errors_and_cli(tmp_path, capsys):
    path = curve_file(tmp_path, memory_bound)
    with pytest.raises(InvalidArgumentError) as err:
        MeasuredCurve.load(path, "no-such-model")
    assert err.value.field == "cost_curve"
    out = tmp_path / "rows.json"
    status = cli.main(
        [
            "sizing",
            "--cost-curve",
            path,
            "--concurrency",
            "2",
            "--budget",
            "4",
            "--limit",
            "6",
            "--json",
            str(out),
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "policy" in printed and "plain" in printed
    rows = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in rows] == ["plain", "fixed", "policy"]
    assert cli.main(["sizing", "--cost-curve", str(tmp_path / "missing.json")]) == 2
