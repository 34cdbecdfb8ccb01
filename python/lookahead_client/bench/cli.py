"""``lookahead-bench``: replays recorded workloads against drafters and reports MAT.

Example::

    lookahead-bench replay --drafter lookahead --drafter prompt-lookup \\
        --budget 4,8,16 --concurrency 1,16 --json out.json --plot out.png
    lookahead-bench sizing --cost-curve cost_curve.json --model llama-8b \\
        --workload ../shared/workloads/sharegpt-chat.jsonl --concurrency 1,4,16,64

Exit status: 0 on success, 2 on a usage problem (bad option, unknown drafter, missing
package, bad workload file), 1 when a drafter fails during a run.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lookahead_client.errors import InvalidArgumentError

from .arguments import int_list
from .cluster import ClusterLag
from .load import add_load_parser, run_load
from .proposer import add_proposer_parser, run_proposer
from .registry import DRAFTERS, DrafterOptions, DrafterSpec, UnknownDrafterError, get_spec
from .replay import ADMISSION, SHARING, ReplayError, ReplayResult, ReplaySettings, replay
from .replicas import add_replicas_parser, run_replicas
from .report import check_plotting, format_header, format_row, plot_mat, result_row, write_json
from .rounds import TrialError
from .sglang_engine import add_sglang_parser, run_sglang
from .vllm_engine import add_vllm_parser, run_vllm
from .workload import DEMO_WORKLOAD, Workload, WorkloadError, load_workload

__all__ = ["main", "build_parser"]


def _choice_list(choices: Sequence[str]):
    """An argparse type: a comma-separated list of some of ``choices``."""

    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(
                f"expected a list of {'/'.join(choices)}, got {text!r}"
            )
        return list(dict.fromkeys(values))

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lookahead-bench``."""
    parser = argparse.ArgumentParser(
        prog="lookahead-bench", description="Benchmarks for lookahead drafters."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    names = "\n".join(f"  {s.name:<21} {s.summary}" for s in DRAFTERS.values())
    rp = sub.add_parser(
        "replay",
        help="replay recorded workloads and report mean accepted tokens per step (MAT)",
        description="Replays recorded token streams (shared/workloads/FORMAT.md) through a "
        "simulated engine and reports MAT = sum(accepted) / sum(steps).",
        epilog=f"drafters:\n{names}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument(
        "--workload",
        action="append",
        metavar="PATH",
        help="a workload .jsonl (repeatable; default: the bundled demo)",
    )
    rp.add_argument(
        "--drafter",
        action="append",
        metavar="NAME",
        help="a drafter name (repeatable; default: lookahead); see the list below",
    )
    rp.add_argument("--budget", type=int_list, default=[4, 8, 16], help="draft budgets B")
    rp.add_argument("--concurrency", type=int_list, default=[1], help="slots per replica C")
    rp.add_argument("--replicas", type=int_list, default=[1], help="replicas R")
    rp.add_argument(
        "--sharing",
        type=_choice_list(SHARING),
        default=["shared"],
        help="with R > 1: one drafter for all replicas (shared), one each (private), or one "
        "lookahead-server each joined through a local nats-server (cluster; drafter lookahead)",
    )
    rp.add_argument(
        "--admission",
        type=_choice_list(ADMISSION),
        default=["continuous"],
        help="continuous: a free slot takes the next request; lockstep: the requests of a "
        "group (the samples of a prompt) start together, as in an RL rollout step",
    )
    rp.add_argument(
        "--group-names",
        action="store_true",
        help="every request names its workload group as its drafter group (default: "
        "drafters group requests by prompt on their own)",
    )
    rp.add_argument(
        "--split",
        choices=("a", "b"),
        help="replay half of each workload, split by group (a: the 1st, 3rd... group of the "
        "file; b: the 2nd, 4th...), for tuning on one half and checking on the other",
    )
    rp.add_argument("--target", help="server address for the 'remote' drafter")
    rp.add_argument(
        "--cluster-batch-ms",
        type=int,
        default=20,
        metavar="MS",
        help="with --sharing cluster: the servers' --cluster-batch-ms (default 20)",
    )
    rp.add_argument(
        "--sglang-capacity",
        type=int,
        default=10_000_000,
        metavar="NODES",
        help="trie nodes of the 'sglang' drafters (SGLang server default 10000000; the issue's "
        "reference figures used NgramCorpus's default 1000000)",
    )
    rp.add_argument("--limit", type=int, metavar="N", help="replay only the first N requests")
    rp.add_argument("--json", metavar="OUT", help="write every result row to this JSON file")
    rp.add_argument("--plot", metavar="OUT.png", help="draw MAT against budget (matplotlib)")
    rp.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    sp = sub.add_parser(
        "sizing",
        help="simulate the sizing policy against fixed budgets and plain decoding",
        description="Replays a workload at each concurrency with plain decoding, fixed "
        "budgets and the cost-aware sizing policy, timing every step with a cost curve "
        "measured by scripts/gpu_cost_curve.py; reports tokens per simulated second.",
    )
    sp.add_argument("--cost-curve", required=True, metavar="JSON", help="gpu_cost_curve.py output")
    sp.add_argument("--model", help="the model shape in the curve file (default: the first)")
    sp.add_argument(
        "--workload", action="append", metavar="PATH", help="a workload .jsonl (repeatable)"
    )
    sp.add_argument("--drafter", default="lookahead", help="a drafter name (default: lookahead)")
    sp.add_argument(
        "--concurrency", type=int_list, default=[1, 2, 4, 8, 16, 32, 64], help="engine slots C"
    )
    sp.add_argument("--budget", type=int_list, default=[4, 8, 16], help="fixed budgets")
    sp.add_argument("--layout", choices=("padded", "ragged"), default="padded")
    sp.add_argument("--limit", type=int, metavar="N", help="replay only the first N requests")
    sp.add_argument("--json", metavar="OUT", help="write the rows to this JSON file")
    add_load_parser(sub)
    add_vllm_parser(sub)
    add_replicas_parser(sub)
    add_sglang_parser(sub)
    add_proposer_parser(sub)
    return parser


def _sizing_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from dataclasses import asdict

    from .sizing import MeasuredCurve, sweep

    try:
        spec = get_spec(args.drafter)
        options = DrafterOptions(max(args.budget))
        spec.check(options)
        curve = MeasuredCurve.load(args.cost_curve, args.model)
        paths = args.workload or [str(DEMO_WORKLOAD)]
        workloads = [load_workload(path, limit=args.limit) for path in paths]
    except (UnknownDrafterError, ImportError, ValueError, OSError, KeyError) as exc:
        print(f"lookahead-bench: error: {exc}", file=sys.stderr)
        return 2
    print(f"cost curve: {curve.label}, context {curve.context} tokens per request", flush=True)
    print(
        f"{'workload':<16} {'C':>3} {'mode':<7} {'B':>3} {'tok/s':>9} {'speedup':>8} "
        f"{'tok/step':>8} {'slots':>6} {'plain':>6}",
        flush=True,
    )
    rows: list[dict] = []

    def log(row) -> None:
        print(
            f"{row.workload:<16} {row.concurrency:>3} {row.mode:<7} {row.budget:>3} "
            f"{row.tok_per_s:>9.1f} {row.speedup:>7.3f}x {row.tokens_per_step:>8.3f} "
            f"{row.slots_per_request:>6.2f} {row.plain_step_fraction:>6.1%}",
            flush=True,
        )
        rows.append({**asdict(row), "tok_per_s": round(row.tok_per_s, 2)})
        if args.json:
            write_json(args.json, rows, argv)

    for workload in workloads:
        try:
            sweep(
                workload,
                lambda: spec.factory(options),
                curve,
                args.concurrency,
                args.budget,
                args.layout,
                log=log,
            )
        except ReplayError as exc:
            print(f"lookahead-bench: error: {exc}", file=sys.stderr)
            return 1
    return 0


def _settings(args: argparse.Namespace) -> list[ReplaySettings]:
    out = []
    for admission in args.admission:
        for replicas in args.replicas:
            for sharing in args.sharing if replicas > 1 else args.sharing[:1]:
                for concurrency in args.concurrency:
                    for budget in args.budget:
                        out.append(
                            ReplaySettings(
                                budget,
                                concurrency,
                                replicas,
                                sharing,
                                admission,
                                args.group_names,
                            )
                        )
    return out


def _replay_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    drafters = list(dict.fromkeys(args.drafter or ["lookahead"]))
    settings = _settings(args)
    try:
        specs = [get_spec(name) for name in drafters]
        for spec in specs:
            spec.check(DrafterOptions(settings[0].budget, args.target, args.sglang_capacity))
        if args.plot:
            check_plotting()
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        for option, out in (("--json", args.json), ("--plot", args.plot)):
            if out and not Path(out).resolve().parent.is_dir():
                raise ValueError(f"{option}: the folder of {out} does not exist")
        if args.sglang_capacity < 1:
            raise ValueError(f"--sglang-capacity must be >= 1, got {args.sglang_capacity}")
        if any(s.sharing == "cluster" for s in settings):
            if drafters != ["lookahead"]:
                raise ValueError("--sharing cluster runs the lookahead drafter only")
            from lookahead_client.processes.nats import find_nats_server
            from lookahead_client.processes.server import find_server_binary

            find_nats_server()
            find_server_binary()
        paths = args.workload or [str(DEMO_WORKLOAD)]
        workloads = [(path, load_workload(path, limit=args.limit)) for path in paths]
        if args.split:
            workloads = [(path, w.half(args.split)) for path, w in workloads]
    except (UnknownDrafterError, ImportError, ValueError, WorkloadError, FileNotFoundError) as exc:
        print(f"lookahead-bench: error: {exc}", file=sys.stderr)
        return 2

    from tqdm import tqdm

    rows: list[dict] = []
    print(format_header(), flush=True)
    for path, workload in workloads:
        for spec in specs:
            for s in settings:
                options = DrafterOptions(s.budget, args.target, args.sglang_capacity)
                desc = (
                    f"{workload.name} {spec.name} B={s.budget} C={s.concurrency} "
                    f"R={s.replicas} {s.sharing_label} {s.admission}"
                )
                with tqdm(
                    total=workload.response_tokens,
                    desc=desc,
                    unit="tok",
                    unit_scale=True,
                    leave=False,
                    file=sys.stderr,
                    disable=args.no_progress,
                    mininterval=0.5,
                ) as bar:
                    try:
                        result, lag = _run(
                            workload, spec, options, s, bar.update, args.cluster_batch_ms
                        )
                    except ReplayError as exc:
                        print(f"lookahead-bench: error: {desc}: {exc}", file=sys.stderr)
                        return 1
                gc.collect()  # free the drafters (SGLang preallocates GBs) before the next run
                row = result_row(workload.name, path, spec.name, s, result)
                rows.append(row)
                print(format_row(row), flush=True)
                if lag is not None:
                    row["cluster_lag"] = {
                        "messages": lag.messages,
                        "p50_s": lag.p50_s,
                        "p99_s": lag.p99_s,
                    }
                    print(
                        f"  cluster lag (made on one server -> applied on another): "
                        f"p50 {lag.p50_s * 1e3:.1f} ms, p99 {lag.p99_s * 1e3:.1f} ms "
                        f"over {lag.messages} messages",
                        flush=True,
                    )
                if args.json:  # rewritten after every run: a long sweep keeps what it did
                    write_json(args.json, rows, argv)
    if args.plot:
        plot_mat(args.plot, rows)
        print(f"plot: {args.plot}")
    if args.json:
        print(f"json: {args.json}")
    return 0


def _run(
    workload: Workload,
    spec: DrafterSpec,
    options: DrafterOptions,
    settings: ReplaySettings,
    progress: Callable[[int], object],
    cluster_batch_ms: int,
) -> tuple[ReplayResult, ClusterLag | None]:
    """One replay; with ``sharing="cluster"`` on a fresh local cluster, whose lag it returns."""
    if settings.sharing != "cluster" or settings.replicas == 1:
        return replay(workload, lambda: spec.factory(options), settings, progress=progress), None
    from .cluster import LocalCluster

    with LocalCluster(settings.replicas, ["--cluster-batch-ms", str(cluster_batch_ms)]) as cluster:
        result = replay(workload, cluster.factory(), settings, progress=progress)
        return result, cluster.lag()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``lookahead-bench``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "replay":
        return _replay_command(args, argv)
    if args.command == "load":
        return run_load(args)
    if args.command == "sizing":
        return _sizing_command(args, argv)
    if args.command == "proposer":
        try:
            return run_proposer(args)
        except InvalidArgumentError as exc:
            print(f"lookahead-bench proposer: error: {exc}", file=sys.stderr)
            return 2
    engine_benches = {"vllm": run_vllm, "replicas": run_replicas, "sglang": run_sglang}
    if args.command in engine_benches:
        try:
            return engine_benches[args.command](args)
        except InvalidArgumentError as exc:
            print(f"lookahead-bench {args.command}: error: {exc}", file=sys.stderr)
            return 2
        except TrialError as exc:
            print(f"lookahead-bench {args.command}: {exc}", file=sys.stderr)
            return 1
    raise AssertionError(args.command)  # argparse only accepts the commands above
