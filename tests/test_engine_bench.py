"""The rounds method of the engine benchmarks (lookahead_client.bench.rounds), the summaries
built on it (engine_bench) and the vLLM and SGLang benchmarks' per-step figures, on made-up
trial results (a child process here is a real one; the engines themselves run in
tests/sglang_engine and in ``lookahead-bench vllm`` / ``sglang``)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time

import pytest

from lookahead_client.bench import sglang_engine
from lookahead_client.bench.engine_bench import (
    _print_capped,
    print_tables,
    run_trial_processes,
    summarise,
    versus,
)
from lookahead_client.bench.hf import workload_prompts
from lookahead_client.bench.rounds import (
    Spread,
    Trial,
    TrialError,
    compare,
    rotated,
    run_child,
    run_rounds,
    schedule,
    speedups,
    strays,
)
from lookahead_client.bench.vllm_engine import per_step_figures
from lookahead_client.errors import InvalidArgumentError


def test_schedule_runs_plain_and_every_config_once_per_round_in_rotated_orders():
    trials = schedule(["a", "b", "c"], rounds=4)
    assert len(trials) == 16
    for r in range(4):
        names = [t.config for t in trials if t.round == r]
        assert sorted(names) == ["a", "b", "c", "plain"]
        assert [t.position for t in trials if t.round == r] == [0, 1, 2, 3]
    # Over as many rounds as configurations, each one runs once in every position.
    for name in ("plain", "a", "b", "c"):
        assert sorted(t.position for t in trials if t.config == name) == [0, 1, 2, 3]
    assert rotated(["x", "y", "z"], 4) == ["y", "z", "x"]


def test_schedule_refuses_no_rounds_and_a_config_named_twice():
    with pytest.raises(InvalidArgumentError, match="rounds"):
        schedule(["a"], rounds=0)
    with pytest.raises(InvalidArgumentError, match="twice"):
        schedule(["a", "a"], rounds=1)


def test_speedups_are_against_the_same_rounds_plain_so_a_slow_round_cancels_out():
    # Round 2 ran with the machine twice as loaded: everything took twice as long.
    seconds = [
        {"plain": 10.0, "fast": 5.0, "slow": 20.0},
        {"plain": 20.0, "fast": 10.0, "slow": 40.0},
        {"plain": 11.0, "fast": 5.0, "slow": 22.0},
    ]
    fast = speedups(seconds)
    assert fast["plain"] == Spread(1.0, 1.0, 1.0, 3)
    assert fast["fast"].median == pytest.approx(2.0)
    assert (fast["fast"].low, fast["fast"].high) == pytest.approx((2.0, 2.2))
    assert fast["slow"] == Spread(0.5, 0.5, 0.5, 3)
    with pytest.raises(ValueError, match="no 'plain'"):
        speedups([{"fast": 1.0}])


def test_compare_calls_a_difference_only_where_the_interval_of_the_rounds_resolves_it():
    # 10% faster in every round, within 1%: ahead; the same the other way round: behind
    assert compare([1.0, 2.0, 1.0], [1.1, 2.22, 1.09])[0] == "ahead"
    assert compare([1.1, 2.22, 1.09], [1.0, 2.0, 1.0])[0] == "behind"
    verdict, paired = compare([1.0, 2.0, 1.0], [1.1, 1.9, 1.05])  # one round disagrees
    assert verdict == "tie" and paired.low < 1.0 < paired.high
    assert paired.spread.low < 1.0 < paired.spread.high
    # Ahead in each of 3 rounds by 2-6% (docs/vllm-runs.md run 38, rag-qa): 3 rounds of trials
    # that stray by a few percent do not resolve it...
    verdict, paired = compare([1.0] * 3, [1.02, 1.03, 1.06])
    assert verdict == "tie" and paired.low < 1.0
    # ...8 rounds of a 4% difference, as scattered, do; a wider scatter is a tie again.
    eight = [1.02, 1.03, 1.06, 1.05, 1.04, 1.03, 1.06, 1.02]
    assert compare([1.0] * 8, eight)[0] == "ahead"
    assert compare([1.0] * 8, [0.95, 1.1, 0.98, 1.08, 1.04, 0.97, 1.12, 1.0])[0] == "tie"
    # The interval narrows with the rounds; one round has none.
    wide, narrow = compare([1.0] * 3, eight[:3])[1], compare([1.0] * 8, eight)[1]
    assert narrow.high - narrow.low < wide.high - wide.low
    assert compare([1.0], [2.0]) == ("tie", compare([1.0], [2.0])[1])
    assert compare([1.0], [2.0])[1].low is None
    assert str(compare([1.0], [2.0])[1]) == "2.000, one round"
    assert str(narrow).startswith(f"{narrow.mean:.3f}, 95% CI {narrow.low:.3f}-")
    with pytest.raises(ValueError, match="rounds differ"):
        compare([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="not positive"):
        compare([1.0, 0.0], [1.0, 2.0])


def test_spread_refuses_nothing_and_non_finite_values():
    assert Spread.of([3.0, 1.0, 2.0]).as_dict() == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "rounds": 3,
    }
    for bad in ([], [1.0, float("nan")], [float("inf")]):
        with pytest.raises(ValueError):
            Spread.of(bad)


def test_run_rounds_says_the_cost_first_and_counts_each_trials_child_cpu():
    ran = []

    def run(trial: Trial) -> int:
        ran.append(trial.config)
        # A real child that burns some CPU: its time must show in the trial's cost.
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
        return len(ran)

    stream = io.StringIO()
    trials = schedule(["x"], rounds=2)
    done = run_rounds(trials, run, estimate_s=lambda t: 90.0, what="a test child", stream=stream)
    assert ran == ["plain", "x", "x", "plain"]
    assert [result for _, result, _ in done] == [1, 2, 3, 4]
    first_line = stream.getvalue().splitlines()[0]
    assert first_line.startswith("4 trials (2 round(s) x 2 configurations), each a test child")
    assert "about 6 min" in first_line
    for _, _, cost in done:
        assert cost.cpu_s > 0.05
        assert cost.wall_s >= cost.cpu_s * 0.5
        assert cost.load >= 0


def _child_result(
    seconds: float,
    batch_seconds: float,
    outputs,
    *,
    accepted=0.0,
    drafts=0.0,
    steps=100.0,
    tokens=50,
):
    """A vLLM bench child's result for one workload: two batch-1 prompts (halves A, B) of
    ``tokens`` tokens each and a full batch of twice that, each pass in ``steps``
    request-steps; at batch 1 every draft is the first prompt's."""

    def counters(share: float, requests: int) -> dict[str, float]:
        return {
            "vllm:spec_decode_num_accepted_tokens": share * accepted,
            "vllm:spec_decode_num_drafts": share * drafts,
            "vllm:spec_decode_num_draft_tokens": share * 4 * drafts,
            "vllm:time_to_first_token_seconds": requests,  # one per request
            "vllm:inter_token_latency_seconds": requests * (steps / 2 - 1),
            "inter_token_seconds": requests * (steps / 2 - 1) * 0.025,  # 25 ms a later step
            "vllm:iteration_tokens_total": requests * steps / 2,
        }

    prompts = [
        {
            "id": str(i),
            "half": half,
            "seconds": seconds / 2,
            "tokens": tokens,
            "outputs": [out],
            "counters": counters(share, 1),
        }
        for i, (half, out, share) in enumerate(zip("AB", outputs, (1.0, 0.0), strict=True))
    ]
    return {
        "workloads": {
            "w": {
                "n": 1,
                "temperature": 0.0,
                "prompts": prompts,
                "batch": {
                    "seconds": batch_seconds,
                    "tokens": 2 * tokens,
                    "outputs": [[o] for o in outputs],
                },
                "counters_batch": counters(1.0, 2),
            }
        }
    }


def test_vllm_summary_takes_each_rounds_plain_and_counts_steps_that_drafted():
    same = [[1, 2, 3], [4, 5]]
    rounds = [
        {
            "plain": _child_result(10.0, 4.0, same),
            # 60 accepted by vLLM's count, of which 10 were past the end and cut
            "drafty": _child_result(5.0, 4.0 / 1.5, same, accepted=60, drafts=25, steps=50),
            "wrong": _child_result(20.0, 8.0, [[1, 2, 3], [4, 6]]),
        },
        {  # a round on a slower machine: the ratios are the same
            "plain": _child_result(20.0, 8.0, same),
            "drafty": _child_result(10.0, 8.0 / 1.5, same, accepted=60, drafts=25, steps=50),
            "wrong": _child_result(40.0, 16.0, same),
        },
    ]
    table = summarise(rounds, "w", None, per_step_figures)
    drafty = table["drafty"]
    assert drafty["speedup_batch1"] == 2.0 and drafty["ranges"]["speedup_batch1"] == [2.0, 2.0]
    assert drafty["speedup_batch"] == 1.5
    assert drafty["tok_s_batch1"] == 15.0  # 100 tokens in 5 s and in 10 s
    # 100 tokens a round in 50 request-steps, 25 of them drafted with 4 tokens each.
    step = drafty["per_step_batch1"]
    assert step == {
        "request_steps": 100,
        "engine_steps": 100,
        "tokens_per_step": 2.0,
        "drafted_share": 0.5,
        "tokens_per_drafted_step": 4.0,
        "accepted_per_verified": 0.6,
        "mal": 3.4,
        "step_ms": 25.0,
    }
    assert drafty["identical_batch1"] == 2 and drafty["identical_batch"] is True
    # Identical only when identical in every round.
    assert table["wrong"]["identical_batch1"] == 1 and table["wrong"]["identical_batch"] is False
    assert table["wrong"]["prompts_over_5pct_slower"] == 2
    # A half's figures are its own prompts': every draft was half A's.
    halves = {h: summarise(rounds, "w", h, per_step_figures)["drafty"] for h in "AB"}
    assert halves["A"]["prompts"] == 1
    assert halves["A"]["per_step_batch1"]["request_steps"] == 50
    assert halves["A"]["per_step_batch1"]["drafted_share"] == 1.0
    assert halves["B"]["per_step_batch1"]["drafted_share"] == 0.0


def test_speedups_are_per_output_token_so_sampled_text_that_stops_early_is_not_fast():
    """Sampled outputs end where their EOS falls: a configuration that wrote half the tokens
    in half the time is as fast as plain, not twice as fast."""
    same = [[1], [2]]
    rounds = [
        {
            "plain": _child_result(10.0, 4.0, same),
            "null": _child_result(5.0, 2.0, same, tokens=25),
            "lookahead": _child_result(6.0, 2.0, same),
        }
    ] * 3
    table = summarise(rounds, "w", None, per_step_figures)
    assert table["null"]["speedup_batch1"] == 1.0 and table["null"]["speedup_batch"] == 1.0
    assert table["null"]["slowest_prompt_speedup"] == 1.0
    assert table["lookahead"]["speedup_batch1"] == round(10.0 / 6.0, 3)
    [against_null] = versus(rounds, "w", ())["lookahead"]["batch1"]
    assert against_null["against"] == "null" and against_null["verdict"] == "ahead"
    assert against_null["ratio"]["median"] == round(5.0 / 25 / (6.0 / 50), 3)


def test_vllm_verdicts_pair_lookahead_with_the_best_vllm_drafter_and_null():
    same = [[1], [2]]
    rounds = [
        {
            "plain": _child_result(10.0, 4.0, same),
            "null": _child_result(11.0, 4.4, same),
            "ngram:8": _child_result(6.0, 3.0, same),
            "suffix": _child_result(5.0, 2.8, same),
            "lookahead": _child_result(5.5 - r, 2.0, same),
        }
        for r in (0.0, 1.0, 0.5)  # round 0: behind suffix; round 1: ahead of it; round 2: level
    ]
    verdicts = versus(rounds, "w", ("ngram", "suffix"))["lookahead"]
    by_rival = {v["against"]: v for v in verdicts["batch1"]}
    assert set(by_rival) == {"suffix", "null"}
    assert by_rival["suffix"]["verdict"] == "tie"
    assert by_rival["null"]["verdict"] == "ahead"
    assert {v["against"]: v["verdict"] for v in verdicts["batch"]}["suffix"] == "ahead"
    # A pair asked for: one lookahead configuration against another; absent ones are skipped.
    paired = versus(rounds, "w", ("ngram", "suffix"), [("lookahead", "null"), ("x", "null")])
    assert [v["against"] for v in paired["lookahead"]["batch1"]] == ["suffix", "null", "null"]


def test_batch1_verdicts_give_each_prompts_own_ratio(capsys):
    """A verdict's interval is the rounds'; each prompt's ratio says whether the prompts agree:
    here lookahead is twice suffix's speed on the first prompt and half of it on the second,
    in every round."""
    same = [[1], [2]]

    def result(first: float, second: float) -> dict:
        out = _child_result(first + second, 4.0, same)
        prompts = out["workloads"]["w"]["prompts"]
        prompts[0]["seconds"], prompts[1]["seconds"] = first, second
        return out

    rounds = [
        {
            "plain": result(8.0 * f, 8.0 * f),
            "suffix": result(4.0 * f, 2.0 * f),
            "lookahead": result(2.0 * f, 4.0 * f),
        }
        for f in (1.0, 1.2, 0.9)  # the machine's pace moves from round to round
    ]
    verdicts = versus(rounds, "w", ("suffix",))
    [entry] = verdicts["lookahead"]["batch1"]
    assert entry["against"] == "suffix"
    assert entry["per_prompt"] == [{"id": "0", "ratio": 2.0}, {"id": "1", "ratio": 0.5}]
    assert "per_prompt" not in verdicts["lookahead"]["batch"][0]
    table = summarise(rounds, "w", None, per_step_figures)
    halves = {"w": {h: summarise(rounds, "w", h, per_step_figures) for h in "AB"}}
    print_tables({"w": table}, halves, {"w": verdicts}, lambda w: "made up", [])
    assert "\n    per prompt, below 1 on 1 of 2: 2.000, 0.500\n" in capsys.readouterr().out


def test_a_failed_trial_names_itself_and_shows_its_log():
    trial = Trial(round=1, position=0, config="broken")
    fail = [sys.executable, "-c", "import sys; print('engine says: no KV cache'); sys.exit(3)"]
    with pytest.raises(TrialError, match=r"broken failed in round 2 \(exit status 3\)") as e:
        run_child(fail, os.environ, trial)
    assert "engine says: no KV cache" in str(e.value)
    run_child([sys.executable, "-c", "print('fine')"], os.environ, trial)  # no error


def test_sglang_figures_are_per_decode_step_and_accept_length_is_sglangs():
    rounds = [
        {
            "completion_tokens": 60.0,
            "spec_verify_ct": 20.0,
            "draft_s": 0.02,
            "draft_calls": 19.0,
            "corpus_s": 0.01,
            "corpus_calls": 19.0,
            "insert_s": 0.0,
            "insert_calls": 19.0,
            "step_s": 1.9,
            "step_calls": 19.0,
            "lookahead_accepted_drafts": 30.0,
            "lookahead_expected_drafts": 40.0,
            "lookahead_weighted_expected_drafts": 25.0,
        },
        {"completion_tokens": 40.0, "spec_verify_ct": 20.0, "draft_s": 0.018, "draft_calls": 17.0},
    ]
    figures = sglang_engine.per_step_figures(rounds, tokens=100)
    assert figures["accept_length"] == 2.5  # 100 tokens in 40 verify passes
    assert figures["decode_steps"] == 36
    assert figures["draft_ms"] == pytest.approx(1e3 * 0.038 / 36, abs=1e-3)
    assert figures["step_ms"] == 100.0
    assert figures["lookahead"]["accepted_over_expected"] == 0.75
    assert figures["lookahead"]["accepted_over_weighted"] == 1.2
    plain = sglang_engine.per_step_figures([{"completion_tokens": 50.0}], tokens=50)
    assert plain["accept_length"] is None and "lookahead" not in plain


def test_sglang_bench_refuses_a_folder_without_the_cpu_standins(tmp_path):
    with pytest.raises(InvalidArgumentError, match="sitecustomize.py") as e:
        sglang_engine.find_cpu_standins(str(tmp_path))
    assert e.value.field == "cpu_standins"
    assert sglang_engine.find_cpu_standins("none") is None
    (tmp_path / "sitecustomize.py").write_text("")
    assert sglang_engine.find_cpu_standins(str(tmp_path)) == tmp_path


def test_engine_benches_refuse_bad_configurations_with_status_2(capsys):
    from lookahead_client.bench.cli import main

    assert main(["sglang", "--workload", "w.jsonl", "--configs", "plain,bogus"]) == 2
    assert "unknown configuration bogus" in capsys.readouterr().err
    assert main(["vllm", "--workload", "w.jsonl", "--configs", "ngram:x"]) == 2
    assert "unknown configuration 'ngram:x'" in capsys.readouterr().err


@pytest.mark.parametrize("bench", ["sglang", "vllm", "replicas"])
@pytest.mark.parametrize("flag", ["--prompts-per-half", "--max-prompt-tokens", "--max-new-tokens"])
def test_engine_benches_refuse_counts_below_one_naming_the_flag(bench, flag, capsys):
    from lookahead_client.bench.cli import main

    assert main([bench, "--workload", "w.jsonl", flag, "0"]) == 2  # before any model or file
    assert f"{flag}: at least 1, got 0" in capsys.readouterr().err


def test_a_server_configuration_without_a_server_binary_is_refused_up_front(
    tmp_path, monkeypatch, capsys
):
    from lookahead_client.bench.cli import main

    not_executable = tmp_path / "lookahead-server"
    not_executable.write_text("")
    monkeypatch.setenv("LOOKAHEAD_SERVER_BIN", str(not_executable))
    for bench in ("sglang", "vllm"):
        args = [bench, "--workload", "w.jsonl", "--configs", "plain,lookahead-server"]
        assert main(args) == 2  # before the model, the workload or any trial
        assert "configuration lookahead-server" in capsys.readouterr().err


def test_the_server_binary_is_found_beside_the_interpreter_without_path(monkeypatch):
    # ``.venv/bin/lookahead-bench`` run without .venv/bin on PATH (the project's environment
    # has the console script).
    from lookahead_client.processes.server import find_server_binary

    monkeypatch.delenv("LOOKAHEAD_SERVER_BIN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    found = find_server_binary()
    assert found == os.path.join(sysconfig.get_path("scripts"), "lookahead-server")
    assert os.access(found, os.X_OK)


def test_an_interrupted_trial_takes_its_whole_session_down(tmp_path):
    # The trial's process starts a grandchild (as an engine starts its scheduler) and hangs.
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    with pytest.raises(SystemExit):
        run_child([sys.executable, "-c", script], os.environ, Trial(0, 0, "hung"))
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once killed
        if not os.path.exists(f"/proc/{grandchild}") or "Z" in _state(grandchild):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the trial's grandchild outlived the benchmark")


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0]
    except FileNotFoundError:
        return "gone"


def _fake_trial(tmp_path, key: str) -> dict[str, str]:
    """A stand-in trial module in ``tmp_path`` (and the environment that finds it): it writes
    its spec's ``key``, the server it was pointed at and whether that server's socket was
    there while it ran."""
    (tmp_path / "fake_trial.py").write_text(
        "import json, os, sys\n"
        "spec = json.load(open(sys.argv[2]))\n"
        "target = os.environ['TARGET']\n"
        "alive = os.path.exists(target.removeprefix('unix://'))\n"
        f"json.dump({{{key!r}: spec[{key!r}], 'target': target, 'alive': alive}},"
        " open(spec['out'], 'w'))\n"
    )
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_a_trial_drafting_from_a_server_gets_a_live_one_of_its_own(tmp_path):
    env = _fake_trial(tmp_path, "name")
    trial = Trial(0, 0, "lookahead-server")
    [got] = run_trial_processes(
        "fake_trial", trial, {}, env, str(tmp_path), server_env=lambda t: {"TARGET": t}
    )
    assert got["name"] == "lookahead-server" and got["alive"] is True
    assert got["target"].startswith("unix://")
    assert not os.path.exists(got["target"].removeprefix("unix://"))  # closed after the trial


def test_a_cluster_trial_gives_each_engine_its_own_live_sidecar(tmp_path):
    # Two stand-in engines: each writes the server it was pointed at and whether it was up.
    env = _fake_trial(tmp_path, "engine")
    trial = Trial(0, 0, "lookahead-cluster")
    got = run_trial_processes(
        "fake_trial",
        trial,
        {},
        env,
        str(tmp_path),
        server_env=lambda t: {"TARGET": t},
        cluster=True,
        engines=2,
    )
    assert [g["engine"] for g in got] == [0, 1]
    assert all(g["alive"] for g in got)
    assert got[0]["target"] != got[1]["target"], "a sidecar each"


def test_a_cluster_configuration_needs_several_engines(capsys):
    from lookahead_client.bench.cli import main

    args = ["vllm", "--workload", "w.jsonl", "--configs", "plain,lookahead-cluster"]
    assert main(args) == 2
    assert "--engines 2 or more" in capsys.readouterr().err


def test_a_workload_named_without_its_file_is_refused_naming_the_flag():
    with pytest.raises(InvalidArgumentError, match=r"workload code-edit: .*\.jsonl") as e:
        workload_prompts("code-edit", tokenizer=None)
    assert e.value.field == "workload"


def test_a_members_trial_gives_the_engines_one_live_nats_server(tmp_path):
    # Two stand-in engines: each connects to the NATS server it was given and writes its name.
    (tmp_path / "fake_members.py").write_text(
        "import json, os, socket, sys\n"
        "spec = json.load(open(sys.argv[2]))\n"
        "url = os.environ['NATS']\n"
        "host, port = url.removeprefix('nats://').rsplit(':', 1)\n"
        "socket.create_connection((host, int(port)), timeout=5).close()\n"
        "json.dump({'engine': spec['engine'], 'url': url, 'node': os.environ['NODE']},"
        " open(spec['out'], 'w'))\n"
    )
    got = run_trial_processes(
        "fake_members",
        Trial(0, 0, "lookahead-members"),
        {},
        {**os.environ, "PYTHONPATH": str(tmp_path)},
        str(tmp_path),
        members_env=lambda url, e: {"NATS": url, "NODE": f"r{e}"},
        engines=2,
    )
    assert [g["node"] for g in got] == ["r0", "r1"]
    assert got[0]["url"] == got[1]["url"], "one NATS server for the trial's engines"


def test_summary_counts_the_sequences_that_ran_to_the_cap(capsys):
    """A batch of sequences that all run to ``--max-new-tokens`` is done with its slowest one;
    the summary says how many did, per pass, and prints it (with why, where all did)."""
    rounds = [
        {
            "plain": _child_result(10.0, 4.0, [[1, 2, 3], [4, 5]]),
            "drafty": _child_result(5.0, 4.0, [[1, 2, 3], [4, 5, 6]]),
        }
    ]
    table = summarise(rounds, "w", None, per_step_figures, cap=3)
    assert table["plain"]["at_cap_batch1"] == 0.5 and table["plain"]["at_cap_batch"] == 0.5
    assert table["drafty"]["at_cap_batch1"] == 1.0
    assert "at_cap_batch1" not in summarise(rounds, "w", None, per_step_figures)["plain"]
    _print_capped(table["plain"])
    assert "ran to --max-new-tokens: batch 1 50%, full 50%\n" in capsys.readouterr().out
    _print_capped(table["drafty"])
    assert "done with its slowest one" in capsys.readouterr().out


def test_a_stray_trial_is_named_and_the_verdict_is_also_given_without_it(capsys):
    """One trial that took several times its configuration's usual time (run 50 of
    docs/vllm-runs.md: 5.3x) widens the interval into a tie that says nothing; the summary
    names the stray and gives the verdict of the rounds without it beside the verdict of all."""
    assert strays([1.0, 2.0]) == []  # of two rounds, neither is known to be the odd one
    assert strays([1.0, 1.0, 1.5]) == []  # 1.5x exactly is not a stray
    assert strays([1.0, 1.02, 1.6, 0.98]) == [2]
    same = [[1], [2]]
    rounds = [
        {
            "plain": _child_result(10.0, 4.0, same),
            # round 0's null batch-1 pass strayed; its full batch did not
            "null": _child_result(55.0 if r == 0 else 11.0 + 0.1 * r, 4.4, same),
            "lookahead": _child_result(10.0 + 0.05 * r, 4.4 + 0.05 * r, same),
        }
        for r in range(4)
    ]
    table = summarise(rounds, "w", None, per_step_figures)
    assert table["null"]["strays_batch1"] == [{"round": 1, "times": 4.89}]
    assert table["null"]["strays_batch"] == [] and table["lookahead"]["strays_batch1"] == []
    verdicts = versus(rounds, "w", ())
    [at_batch1] = verdicts["lookahead"]["batch1"]
    assert at_batch1["verdict"] == "tie"  # the stray round's 5.5x makes the interval wide
    assert at_batch1["without_strays"]["rounds"] == [1]
    assert at_batch1["without_strays"]["verdict"] == "ahead"
    assert at_batch1["without_strays"]["ratio"]["rounds"] == 3
    assert "without_strays" not in verdicts["lookahead"]["batch"][0]
    halves = {"w": {h: summarise(rounds, "w", h, per_step_figures) for h in "AB"}}
    print_tables({"w": table}, halves, {"w": verdicts}, lambda w: "made up", [])
    out = capsys.readouterr().out
    assert "stray trials (over 1.5x their configuration's median time a token): " in out
    assert "null batch 1 round 1 (4.9x)" in out
    assert "\n    without stray round(s) 1: ahead (" in out
