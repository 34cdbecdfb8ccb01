"""The GPU scripts' CPU runs: ``scripts/gpu_cost_curve.py``'s dry run, in an interpreter where
the lookahead native extension, gRPC, SGLang and matplotlib cannot be imported (a bare GPU
machine has torch and transformers only), and ``scripts/gpu_lossless.py --smoke``."""

from __future__ import annotations

import json
import pathlib
import runpy
import struct
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "gpu_cost_curve.py"
BLOCKED = ("lookahead_client._native", "grpc", "sglang", "matplotlib")


def test_dry_run_on_a_bare_machine(tmp_path):
    code = (
        "import runpy, sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        f"sys.argv = ['gpu_cost_curve.py', '--dry-run', '--out-dir', {str(tmp_path)!r}]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "matplotlib not installed" in run.stdout
    results = json.loads((tmp_path / "cost_curve.json").read_text())
    tiny = results["models"]["tiny"]
    assert {(p["batch"], p["slots"]) for p in tiny["points"]} == {
        (b, d) for b in (1, 2) for d in (1, 2, 4)
    }
    assert all(p["seconds"] > 0 and p["tokens"] == p["batch"] * p["slots"] for p in tiny["points"])
    table = tiny["policy"]["acceptance"]
    assert set(table) == {"0.3", "0.5", "0.7", "0.9"}
    for entry in table.values():
        for row in entry["rows"]:
            assert 1 <= row["width"] <= 4
            # Plain decoding is always a candidate: the choice is never predicted slower.
            assert row["speedup_over_plain"] >= 1.0 - 1e-9
            if row["width"] == 1:
                assert row["speedup_over_plain"] == 1.0
    png = (tmp_path / "cost_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (900, 600)

    # With matplotlib the same results give a labelled figure.
    script = runpy.run_path(str(SCRIPT), run_name="gpu_cost_curve")
    assert script["plot"](results, tmp_path / "labelled.png") == "matplotlib"
    assert (tmp_path / "labelled.png").read_bytes().startswith(b"\x89PNG")


def test_lossless_smoke_run(tmp_path):
    script = SCRIPT.with_name("gpu_lossless.py")
    out = tmp_path / "lossless.json"
    run = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["batches"]) == {"1", "4"}
    for entry in results["batches"].values():
        cold, warm = entry["passes"]
        # Every output generate's, or parted from it only where generate's logits tie.
        assert cold["diverged"] == warm["diverged"] == 0, results
        assert int(cold["identical"].split("/")[0]) + cold["near_tie"] == 4, results
        # The warm drafter has seen these outputs: more accepted per pass, fewer passes.
        assert warm["accepted_per_pass"] > cold["accepted_per_pass"], results
        assert warm["forward_passes"] < cold["forward_passes"]
