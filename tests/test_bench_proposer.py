"""`lookahead-bench proposer`: lookahead's vLLM proposer driven as vLLM's model runner drives
it, on the bundled demo workload, with the real embedded drafter."""

from __future__ import annotations

import json

import pytest

from lookahead_client.bench import cli
from lookahead_client.bench.proposer import measure
from lookahead_client.bench.workload import DEMO_WORKLOAD, load_workload
from lookahead_client.errors import InvalidArgumentError


def test_a_batch_of_demo_requests_is_drafted_and_timed():
    workload = load_workload(DEMO_WORKLOAD)
    result = measure(workload.name, list(workload.requests), batch=4, steps=200)
    assert 0 < result.steps <= 200
    assert 1 <= result.rows <= 4
    assert 0 < result.median_ms <= result.p90_ms
    assert 0 < result.drafted <= 1 and 1 <= result.tokens_per_draft <= 8
    assert 0 < result.accepted_per_token <= 1
    assert result.accepted_over_expected is not None and result.accepted_over_expected > 0


def test_bad_settings_are_refused_by_name():
    workload = load_workload(DEMO_WORKLOAD)
    with pytest.raises(InvalidArgumentError) as e:
        measure(workload.name, list(workload.requests), batch=0, steps=10)
    assert e.value.field == "batch"
    with pytest.raises(InvalidArgumentError) as e:
        measure(workload.name, [], batch=1, steps=10)
    assert e.value.field == "workload"
    with pytest.raises(InvalidArgumentError) as e:
        measure(workload.name, list(workload.requests), batch=1, steps=10, forward_mb=-1)
    assert e.value.field == "forward_mb"


def test_a_simulated_forward_pass_runs_between_calls():
    """The memory read between two calls (``--forward-mb``) is the simulated engine's work,
    outside the timed call: the run still drafts and times every step."""
    workload = load_workload(DEMO_WORKLOAD)
    result = measure(workload.name, list(workload.requests), batch=2, steps=100, forward_mb=8)
    assert 0 < result.steps <= 100
    assert 0 < result.median_ms <= result.p90_ms
    assert 0 < result.drafted <= 1 and 0 < result.accepted_per_token <= 1


def test_cli_prints_a_row_per_batch_and_writes_json(tmp_path, capsys):
    out = tmp_path / "proposer.json"
    assert cli.main(["proposer", "--batch", "1,2", "--steps", "50", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["workload", "B", "steps"]
    assert len([line for line in lines if line.startswith("demo")]) == 2
    rows = json.loads(out.read_text())["results"]
    assert [r["batch"] for r in rows] == [1, 2]
    with pytest.raises(SystemExit) as e:
        cli.main(["proposer", "--step-ms", "0,1"])
    assert e.value.code == 2
    assert "--step-ms: expected BASE > 0" in capsys.readouterr().err
