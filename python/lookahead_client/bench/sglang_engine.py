"""``lookahead-bench sglang``: lookahead as SGLang's NGRAM drafter, side by side with SGLang's own.

SmolLM2-135M-Instruct (converted once to a local Hugging Face folder, as for ``lookahead-bench
vllm``) runs in SGLang 0.5.23 (``sgl.Engine``, float32, ``page_size=1``, greedy) on the prompts
of shared workloads. The configurations, all with ``--speculative-algorithm NGRAM`` and the
same tree slots (``--draft-tokens``) except ``plain``:

* ``plain``: no speculation;
* ``sglang-ngram``: SGLang's own C++ n-gram corpus;
* ``lookahead``: lookahead's embedded drafter in the scheduler process (the default: trees);
* ``lookahead-chain``: the same drafter proposing single chains in the same slots;
* ``lookahead-server``: a ``lookahead-server`` on a Unix socket, started for the trial;
* ``lookahead-verify`` (not run by default): the embedded drafter with sizing off, so that
  every decode step verifies its slots (the default runs a decode step whose batch got no
  draft as a plain step where that is measured cheaper).

For every workload each configuration generates every prompt alone (batch 1), timed prompt by
prompt, then other prompts all at once (the full batch). The run is made of rounds
(:mod:`.rounds`): every configuration once per round, each in a fresh process, in an order
rotated each round; speed-ups are against ``plain`` in the same round (median [min-max]);
lookahead is ahead of SGLang's corpus when the rounds' interval says so (:func:`.rounds.compare`).

With ``--engines N`` (N >= 2) every configuration runs as N engines at once, each on its share
of the cores, on traffic where one engine's text can help another (:mod:`.sharing`: the prompts
of a workload group split over the engines, every prompt repeated on another engine): each
engine has its own drafter (SGLang's corpus, lookahead embedded) or, for ``lookahead-server``,
one server drafts for all. Every request is generated alone and timed alone; the figures are
given per kind of request (``WORKLOAD/new``, ``/sibling``, ``/repeat``).

Reported per workload and configuration: tokens/s, speed-up, identical outputs, SGLang's
accept length (completion tokens / verify passes, the first token included) and what a decode
step cost the scheduler: the draft preparation (``draft ms``: the corpus or drafter call,
building SGLang's tree arrays), within it the corpus lookup (``corpus ms``: for lookahead the
request book, the drafter's step and laying its trees out in SGLang's arrays), the corpus
insert after verification, and the whole step.

SGLang verifies greedily on CPU (even at temperature > 0), so the benchmark is greedy only. On a
machine without CUDA it loads SGLang's CPU stand-ins (``../shared/sglang-cpu``, or
``--cpu-standins DIR``) into every SGLang process, and says so.

Run in the project's environment (``scripts/test.sh`` builds ``.venv`` with the sglang extra)::

    .venv/bin/lookahead-bench sglang --workload ../shared/workloads/code-edit.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from lookahead_client.errors import InvalidArgumentError

from .engine_bench import (
    Column,
    add_engine_arguments,
    cell,
    check_engine_arguments,
    check_server_binary,
    config_names,
    delta,
    ensure_model,
    report,
    run_trial_processes,
    sum_counters,
    workload_prompt_sets,
)
from .rounds import Trial, run_rounds, schedule
from .sharing import EngineRun, merge_engine_results, serve_share

__all__ = ["CONFIGS", "add_sglang_parser", "find_cpu_standins", "per_step_figures", "run_sglang"]

#: The configurations of a default run.
CONFIGS = ("plain", "sglang-ngram", "lookahead", "lookahead-chain", "lookahead-server")
#: Every configuration a run may name.
KNOWN_CONFIGS = (*CONFIGS, "lookahead-verify")

#: What the scheduler's timing wrappers measure: NGRAMWorker's method, and its name here.
_TIMED = (
    ("_prepare_for_speculative_decoding", "draft"),
    ("_prepare_draft_tokens", "corpus"),
    ("_update_ngram_corpus", "insert"),
    ("forward_batch_generation", "step"),
)
#: The key of the timings in SGLang's internal state (``get_server_info``).
_STATE_KEY = "lookahead_bench"
# For the up-front guess of a trial's cost: engine start-up and tear-down, and plain's output
# tokens/s on SmolLM2-135M with 2 cores, alone and in a full batch (run 10 of docs/sglang.md:
# plain's trials took 93 s, 49 of them generating at 17 and 26 tokens/s, where the earlier
# guess of 70 s, 12 and 30 tokens/s said 130).
_GUESS_STARTUP_S = 45.0
_GUESS_TOK_S = (17.0, 26.0)


def find_cpu_standins(given: str | None) -> pathlib.Path | None:
    """The folder of SGLang's CPU stand-ins to load, or None where CUDA is there.

    Args:
        given: ``--cpu-standins``: a folder, ``"none"`` (never), or None (find
            ``../shared/sglang-cpu`` from the current folder or the project's checkout when
            this machine has no CUDA).

    Raises:
        InvalidArgumentError: the folder has no ``sitecustomize.py``, or none was found on a
            machine without CUDA.
    """
    if given == "none":
        return None
    if given is None:
        import torch

        if torch.cuda.is_available():
            return None
        checkout = pathlib.Path(__file__).resolve().parents[3]
        candidates = [pathlib.Path.cwd(), checkout]
        found = [c.parent / "shared" / "sglang-cpu" for c in candidates]
        found = [f for f in found if (f / "sitecustomize.py").exists()]
        if not found:
            raise InvalidArgumentError(
                "this machine has no CUDA and SGLang's CPU stand-ins were not found in "
                f"{', '.join(str(c.parent / 'shared' / 'sglang-cpu') for c in candidates)}; "
                "pass --cpu-standins DIR",
                field="cpu_standins",
            )
        return found[0]
    folder = pathlib.Path(given).resolve()
    if not (folder / "sitecustomize.py").exists():
        raise InvalidArgumentError(
            f"{folder} has no sitecustomize.py (SGLang's CPU stand-ins)", field="cpu_standins"
        )
    return folder


# -- the scheduler process: SGLang's, with its NGRAM worker's drafting timed ---------------


class _Timings:
    """Seconds and calls of each timed NGRAMWorker method in this scheduler process."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys((name for _, name in _TIMED), 0.0)
        self.calls = dict.fromkeys((name for _, name in _TIMED), 0)
        self.worker: Any = None

    def wrap(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(worker: Any, *args: Any, **kwargs: Any) -> Any:
            self.worker = worker
            started = time.perf_counter()
            try:
                return method(worker, *args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1

        return timed

    def state(self) -> dict[str, float]:
        out = {f"{name}_s": s for name, s in self.seconds.items()}
        out.update({f"{name}_calls": float(n) for name, n in self.calls.items()})
        stats = getattr(self.worker, "lookahead_stats", None)
        if callable(stats):
            for key, value in stats().items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[f"lookahead_{key}"] = float(value)
        return out


def timed_scheduler(*args: Any, **kwargs: Any) -> Any:
    """SGLang's scheduler process with its NGRAM worker's drafting timed; the timings are
    added to SGLang's internal state (``Engine.get_server_info()``) under ``lookahead_bench``.

    Handed to ``sgl.Engine`` as its ``run_scheduler_process_func`` (picklable by reference,
    so the spawned scheduler gets it); lookahead itself comes in through its plugin
    (``LOOKAHEAD_SGLANG``), as with any SGLang launcher.
    """
    from sglang.srt.managers.scheduler import run_scheduler_process
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController as Controller,
    )
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    timings = _Timings()
    for method, name in _TIMED:
        setattr(NGRAMWorker, method, timings.wrap(getattr(NGRAMWorker, method), name))
    add_speculative = Controller._add_speculative

    def add_timings(controller: Any, state: dict[str, Any]) -> None:
        add_speculative(controller, state)
        state[_STATE_KEY] = timings.state()

    Controller._add_speculative = add_timings
    return run_scheduler_process(*args, **kwargs)


# -- the child: one configuration in one SGLang engine -------------------------------------


def _engine(spec: dict[str, Any]) -> Any:
    from sglang.srt.entrypoints.engine import Engine

    class TimedEngine(Engine):
        # sgl.Engine reads the scheduler entry from the instance (a documented override).
        run_scheduler_process_func = staticmethod(timed_scheduler)

    kwargs: dict[str, Any] = {
        "model_path": spec["model"],
        "dtype": "float32",
        "page_size": 1,
        "skip_tokenizer_init": True,
        "max_total_tokens": spec["max_total_tokens"],
        "max_running_requests": spec["max_running_requests"],
        "log_level": "warning",
        "random_seed": 0,
    }
    if spec["cpu"]:
        # an idle scheduler waits on its sockets instead of spinning a core the other
        # engines and the drafter's server need
        kwargs.update(
            device="cpu",
            attention_backend="torch_native",
            disable_cuda_graph=True,
            sleep_on_idle=True,
        )
    if spec["name"] != "plain":
        kwargs.update(
            speculative_algorithm="NGRAM", speculative_num_draft_tokens=spec["draft_tokens"]
        )
    return TimedEngine(**kwargs)


def _counters(engine: Any) -> dict[str, float]:
    states = engine.get_server_info()["internal_states"]
    return dict(states[0].get(_STATE_KEY, {})) if states else {}


def _spec_counts(outputs: Sequence[dict]) -> dict[str, float]:
    """Completion tokens and verify passes of the requests (SGLang's own accept length)."""
    metas = [o["meta_info"] for o in outputs]
    return {
        "completion_tokens": float(sum(m["completion_tokens"] for m in metas)),
        "spec_verify_ct": float(sum(m.get("spec_verify_ct", 0) for m in metas)),
    }


def _timed_request(engine: Any, prompt: dict[str, Any], params: dict[str, Any]) -> dict:
    """Generates one prompt alone: its record (the layout of :mod:`.engine_bench`), the
    engine's counters over it included."""
    before = _counters(engine)
    t = time.perf_counter()
    out = engine.generate(input_ids=[prompt["ids"]], sampling_params=params)
    return {
        "id": prompt["id"],
        "half": prompt["half"],
        "seconds": time.perf_counter() - t,
        "tokens": len(out[0]["output_ids"]),
        "outputs": [out[0]["output_ids"]],
        "counters": {**delta(_counters(engine), before), **_spec_counts(out)},
    }


def _child(spec_path: str) -> int:
    """Runs one configuration over every workload; writes its JSON next to the spec."""
    spec = json.loads(pathlib.Path(spec_path).read_text())
    started = time.perf_counter()
    engine = _engine(spec)
    result: dict[str, Any] = {"startup_s": round(time.perf_counter() - started, 1), "workloads": {}}
    params = {"temperature": 0.0, "max_new_tokens": spec["max_new_tokens"]}
    try:
        # Warm-up on a prompt of no workload, outside the counters.
        engine.generate(
            input_ids=[list(range(1000, 1064))], sampling_params={**params, "max_new_tokens": 8}
        )
        if "engines" in spec:
            result["workloads"] = _engine_traffic(engine, spec, params)
        else:
            result["workloads"] = {
                w: _passes(engine, sets, params) for w, sets in spec["prompts"].items()
            }
    finally:
        engine.shutdown()
    pathlib.Path(spec["out"]).write_text(json.dumps(result))
    return 0


def _passes(engine: Any, sets: dict[str, list], params: dict[str, Any]) -> dict[str, Any]:
    """A workload's two passes on one engine: its batch-1 prompts one by one, then the
    others at once."""
    row: dict[str, Any] = {"n": 1, "temperature": 0.0}
    row["prompts"] = [_timed_request(engine, p, params) for p in sets["batch1"]]
    before = _counters(engine)
    batch = [p["ids"] for p in sets["batch"]]
    t = time.perf_counter()
    out = engine.generate(input_ids=batch, sampling_params=params) if batch else []
    row["batch"] = {
        "seconds": time.perf_counter() - t,
        "tokens": sum(len(o["output_ids"]) for o in out),
        "outputs": [[o["output_ids"]] for o in out],
    }
    row["counters_batch"] = {**delta(_counters(engine), before), **_spec_counts(out)}
    return row


def _engine_traffic(engine: Any, spec: dict[str, Any], params: dict[str, Any]) -> dict:
    """This engine's share of the traffic of several engines (:func:`.sharing.serve_share`)."""

    return serve_share(spec, lambda prompt: _timed_request(engine, prompt, params))


# -- the parent: every configuration, side by side, in rounds ------------------------------


def per_step_figures(counters: Sequence[dict[str, float]], tokens: int) -> dict[str, Any]:
    """What a configuration did per decode step, from a pass's counters summed over rounds:
    SGLang's accept length (completion tokens / verify passes), and the scheduler's
    milliseconds per decode step in draft preparation, the corpus lookup within it, the
    corpus insert and the whole step; lookahead's own counters where it drafted.

    Args:
        counters: per round, the pass's counters.
        tokens: the tokens emitted in those rounds (unused: SGLang counts its own).
    """
    del tokens
    total = sum_counters(counters)

    def per(a: float, b: float, scale: float = 1.0) -> float | None:
        return round(scale * a / b, 3) if b > 0 else None

    steps = total.get("draft_calls", 0.0)
    out: dict[str, Any] = {
        "accept_length": per(total.get("completion_tokens", 0.0), total.get("spec_verify_ct", 0.0)),
        "decode_steps": int(steps),
    }
    for _, name in _TIMED:
        out[f"{name}_ms"] = per(total.get(f"{name}_s", 0.0), total.get(f"{name}_calls", 0.0), 1e3)
    look: dict[str, float | None] = {
        k.removeprefix("lookahead_"): round(v, 2)
        for k, v in total.items()
        if k.startswith("lookahead_")
    }
    if look:
        accepted = total.get("lookahead_accepted_drafts", 0.0)
        look["accepted_over_expected"] = per(accepted, total.get("lookahead_expected_drafts", 0.0))
        # against the scores as sizing weighed them: the odds the trees were cut on
        look["accepted_over_weighted"] = per(
            accepted, total.get("lookahead_weighted_expected_drafts", 0.0)
        )
        # the share of its accepted tokens the drafter gave from other replicas' text
        look["cross_replica_share"] = per(
            total.get("lookahead_cross_replica_accepted", 0.0),
            total.get("lookahead_replica_accepted", 0.0),
        )
        # decode steps the worker ran as plain steps (sizing on), and each kind's time
        plain, verify = (total.get(f"lookahead_{k}_steps", 0.0) for k in ("plain", "verify"))
        look["plain_share"] = per(plain, plain + verify)
        look["plain_step_ms"] = per(total.get("lookahead_plain_seconds", 0.0), plain, 1e3)
        look["verify_step_ms"] = per(total.get("lookahead_verify_seconds", 0.0), verify, 1e3)
        out["lookahead"] = look
    return out


#: The per-step columns of the printed tables.
_COLUMNS: tuple[Column, ...] = (
    ("accept", 6, cell("accept_length")),
    ("draft ms", 8, cell("draft_ms")),
    ("corpus ms", 9, cell("corpus_ms")),
    ("insert ms", 9, cell("insert_ms")),
    ("step ms", 7, cell("step_ms")),
    ("plain", 5, cell("plain_share", "lookahead")),
    ("x-rep", 5, cell("cross_replica_share", "lookahead")),
)


def add_sglang_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``sglang`` subcommand to ``lookahead-bench``'s subparsers."""
    sp = subparsers.add_parser(
        "sglang",
        help="lookahead as SGLang's NGRAM drafter against SGLang's own corpus (sgl.Engine)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_arguments(sp, CONFIGS, "; also lookahead-verify (every decode step verified)")
    sp.add_argument(
        "--draft-tokens",
        type=int,
        default=8,
        help="SGLang's --speculative-num-draft-tokens: tree slots, root included (default 8)",
    )
    sp.add_argument(
        "--engines",
        type=int,
        default=1,
        help="engines running at once, each on its share of the cores, on traffic where one "
        "engine's text helps another (lookahead_client.bench.sharing; lookahead-server: one "
        "server for all; default 1: one engine, batch 1 and the full batch)",
    )
    sp.add_argument(
        "--cpu-standins",
        metavar="DIR",
        help="SGLang's CPU stand-ins to load on a machine without CUDA (default: "
        "../shared/sglang-cpu, found from here or the checkout; 'none': never)",
    )
    return sp


#: ``LOOKAHEAD_SGLANG`` of the configurations with an embedded drafter.
_EMBEDDED_CONFIGS = {
    "lookahead": "{}",
    "lookahead-chain": json.dumps({"chain": True}),
    "lookahead-verify": json.dumps({"sizing": False}),
}


def _run_trial(
    trial: Trial, spec: dict[str, Any], standins: pathlib.Path | None, tmp: str, engines: int
) -> dict[str, Any]:
    """One configuration in a fresh process, or ``engines`` at once (with one server for the
    trial for ``lookahead-server``)."""
    from lookahead_client.engine.config import SGLANG_ENV

    name = trial.config
    env = dict(os.environ)
    env.pop(SGLANG_ENV, None)
    if standins is not None:
        env.update(SGLANG_USE_CPU_ENGINE="1", SGLANG_CPU_STANDINS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(standins), env.get("PYTHONPATH")]))
    if name in _EMBEDDED_CONFIGS:
        env[SGLANG_ENV] = _EMBEDDED_CONFIGS[name]
    results = run_trial_processes(
        "lookahead_client.bench.sglang_engine",
        trial,
        spec,
        env,
        tmp,
        server_env=(lambda target: {SGLANG_ENV: json.dumps({"target": target})})
        if name == "lookahead-server"
        else None,
        engines=engines,
    )
    return results[0] if engines == 1 else merge_engine_results(results)


def run_sglang(args: argparse.Namespace) -> int:
    """Runs the benchmark (see the module docstring); prints a summary table."""
    check_engine_arguments(args)
    configs = config_names(args.configs, KNOWN_CONFIGS)
    check_server_binary(configs)
    if args.draft_tokens < 2:
        raise InvalidArgumentError(
            f"--draft-tokens counts the root: at least 2, got {args.draft_tokens}",
            field="draft_tokens",
        )
    if args.engines < 1:
        raise InvalidArgumentError(f"--engines: at least 1, got {args.engines}", field="engines")
    trials = schedule(configs, args.rounds)
    standins = find_cpu_standins(args.cpu_standins)
    if standins is not None:
        print(
            f"no CUDA here: SGLang's CPU stand-ins from {standins} load into every SGLang process"
        )
    folder = ensure_model(pathlib.Path(args.model_dir).resolve())
    if args.engines > 1:
        return _run_engines(args, trials, standins, folder)
    prompts = workload_prompt_sets(
        args.workload, folder, args.prompts_per_half, args.max_prompt_tokens
    )
    batch_tokens = max(
        sum(len(p["ids"]) + args.max_new_tokens + args.draft_tokens for p in sets["batch"])
        for sets in prompts.values()
    )
    most = max(max(len(sets["batch"]), 1) for sets in prompts.values())
    tokens = [
        sum(len(sets[p]) * args.max_new_tokens for sets in prompts.values())
        for p in ("batch1", "batch")
    ]
    spec = {
        **_engine_spec(args, standins, folder, batch_tokens, most),
        "prompts": prompts,
    }
    with tempfile.TemporaryDirectory(prefix="lookahead-sglang-bench-") as tmp:
        done = run_rounds(
            trials,
            lambda t: _run_trial(t, spec, standins, tmp, engines=1),
            estimate_s=lambda _: (
                _GUESS_STARTUP_S + sum(n / s for n, s in zip(tokens, _GUESS_TOK_S, strict=True))
            ),
            what=f"a fresh SGLang engine generating up to {sum(tokens)} tokens",
        )
    _report(
        args,
        done,
        standins,
        lambda w: (
            f"{len(prompts[w]['batch1'])} prompts at batch 1, {len(prompts[w]['batch'])} "
            f"others in the full batch, {args.draft_tokens} tree slots"
        ),
    )
    return 0


def _engine_spec(
    args: argparse.Namespace,
    standins: pathlib.Path | None,
    folder: pathlib.Path,
    batch_tokens: int,
    most: int,
) -> dict[str, Any]:
    """What every engine of the run is started with (``batch_tokens``: the most tokens a batch
    holds, ``most``: the most requests at once)."""
    return {
        "model": str(folder),
        "cpu": standins is not None,
        "draft_tokens": args.draft_tokens,
        "max_total_tokens": max(8192, 2 * batch_tokens),
        "max_running_requests": most,
        "max_new_tokens": args.max_new_tokens,
    }


def _run_engines(
    args: argparse.Namespace,
    trials: Sequence[Trial],
    standins: pathlib.Path | None,
    folder: pathlib.Path,
) -> int:
    """``--engines N``: every configuration as N engines at once, on the traffic of
    :mod:`.sharing` (each engine its own drafter, or one server for all)."""
    run = EngineRun.plan(args, folder)
    spec = {
        **_engine_spec(args, standins, folder, run.longest + args.max_new_tokens, 1),
        "traffic": run.traffic,
    }
    with tempfile.TemporaryDirectory(prefix="lookahead-sglang-bench-") as tmp:
        done = run_rounds(
            trials,
            lambda t: _run_trial(t, spec, standins, tmp, engines=run.engines),
            estimate_s=lambda _: run.estimate_s(_GUESS_STARTUP_S, _GUESS_TOK_S[0]),
            what=f"{run.engines} fresh SGLang engines at once, each generating up to "
            f"{run.tokens} tokens",
        )
    slots = f"; {args.draft_tokens} tree slots"
    _report(args, done, standins, lambda name: run.describe(name, slots))
    return 0


def _report(
    args: argparse.Namespace,
    done: Sequence[tuple[Trial, dict[str, Any], Any]],
    standins: pathlib.Path | None,
    describe: Callable[[str], str],
) -> None:
    engines = f", {args.engines} engines at once" if args.engines > 1 else ""
    report(
        done,
        per_step=per_step_figures,
        engine_drafters=("sglang-ngram",),
        # Several engines: one server for all against a drafter per engine.
        pairs=(("lookahead-server", "lookahead"),) if args.engines > 1 else (),
        describe=describe,
        columns=_COLUMNS,
        args=vars(args),
        json_path=args.json,
        plot_path=args.plot,
        plot_title="SmolLM2-135M in SGLang 0.5.23" + (" (CPU)" if standins else "") + engines,
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        # Through the module's own name, so that the scheduler entry handed to SGLang pickles
        # as lookahead_client.bench.sglang_engine.timed_scheduler, not __main__'s.
        from lookahead_client.bench import sglang_engine

        sys.exit(sglang_engine._child(sys.argv[2]))
    sys.exit("usage: lookahead-bench sglang ... (this module's --child is internal)")
