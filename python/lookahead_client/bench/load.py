"""``lookahead-bench load``: step latency and throughput of the drafter under engine load.

N simulated engine replicas (processes) each keep a batch of B requests in flight (real token
streams from a workload, refilled as they finish: continuous batching) and call
``drafter.step`` once per engine step, exactly as an engine would: every request reports the
tokens it gained (accepted draft tokens, verified greedily against the recorded response,
plus one) and asks for a tree of ``--budget`` nodes. Only the ``step`` call is timed.

Modes, run one after the other in one invocation, side by side in one table:

* ``embedded``: each replica has its own in-process ``EmbeddedDrafter``;
* ``tcp`` / ``uds``: all replicas share one namespace of a ``lookahead-server`` over TCP
  loopback / a Unix socket, one unary call per step;
* ``tcp-stream`` / ``uds-stream``: the same over one bidirectional stream per replica.

The server is started by the benchmark (``--server-bin``, default: see
``lookahead_client.processes.server.find_server_binary``) unless ``--tcp`` / ``--uds`` name a
running one. Server CPU time is read from /proc for the measured window, which gives
"request-drafts per server CPU-second" (the throughput of one fully busy core).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lookahead_client.types import DraftBatch, StepRequest

from .replay import accepted_length
from .workload import DEMO_WORKLOAD, load_workload

__all__ = ["MODES", "LoadResult", "add_load_parser", "run_load"]

MODES = ("embedded", "tcp", "uds", "tcp-stream", "uds-stream")


@dataclass(frozen=True)
class _ReplicaConfig:
    mode: str
    target: str | None
    namespace: str
    workload: str
    batch: int
    budget: int
    warmup: int
    steps: int
    timeout: float
    prompt_tokens: int


@dataclass
class _ReplicaResult:
    latencies_ns: list[int]
    request_drafts: int
    draft_nodes: int
    accepted: int
    wall_s: float
    fallback_steps: int
    error: str | None = None


@dataclass
class LoadResult:
    """One mode's figures, all replicas together."""

    mode: str
    replicas: int
    batch: int
    budget: int
    steps: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    steps_per_s: float
    request_drafts_per_s: float
    mean_draft_nodes: float
    mean_accepted: float
    fallback_steps: int
    server_cpu_s: float | None
    request_drafts_per_server_cpu_s: float | None
    errors: list[str] = field(default_factory=list)


def _make_drafter(config: _ReplicaConfig) -> Any:
    if config.mode == "embedded":
        from lookahead_client.embedded import EmbeddedDrafter

        return EmbeddedDrafter()
    from lookahead_client.remote import RemoteDrafter

    assert config.target is not None
    return RemoteDrafter(
        config.target,
        namespace=config.namespace,
        timeout=config.timeout,
        connect_timeout=max(config.timeout, 5.0),
        stream=config.mode.endswith("-stream"),
    )


class _Slots:
    """B request slots over the workload's requests (continuous batching, wrapping around)."""

    def __init__(self, config: _ReplicaConfig, replica: int, replicas: int) -> None:
        requests = load_workload(config.workload).requests
        self._requests = [r for r in requests if len(r.response) > 1]
        if not self._requests:
            raise ValueError(f"{config.workload}: no request with a response to replay")
        self._next = replica  # replicas take interleaved requests
        self._stride = replicas
        self._serial = 0
        self._replica = replica
        self._prompt_tokens = config.prompt_tokens
        self.ids: list[str] = []
        self.responses: list[tuple[int, ...]] = []
        self.pos: list[int] = []
        self.prompts: list[list[int] | None] = []
        for _ in range(config.batch):
            self._fill(None)

    def _fill(self, slot: int | None) -> None:
        request = self._requests[self._next % len(self._requests)]
        self._next += self._stride
        self._serial += 1
        rid = f"r{self._replica}-{self._serial}"
        prompt = list(request.prompt[-self._prompt_tokens :]) + [request.response[0]]
        if slot is None:
            self.ids.append(rid)
            self.responses.append(request.response)
            self.pos.append(1)
            self.prompts.append(prompt)
        else:
            self.ids[slot], self.responses[slot], self.pos[slot] = rid, request.response, 1
            self.prompts[slot] = prompt

    def requests(self, trees: DraftBatch | None, budget: int) -> tuple[list[StepRequest], int]:
        """The step's requests; the number of draft tokens the last trees got accepted."""
        out: list[StepRequest] = []
        accepted_total = 0
        refills: list[int] = []
        for i, rid in enumerate(self.ids):
            prompt = self.prompts[i]
            if prompt is not None:
                self.prompts[i] = None
                out.append(StepRequest(rid, prompt=prompt, budget=budget))
                continue
            response, pos = self.responses[i], self.pos[i]
            tree = trees[i] if trees is not None else None
            accepted = accepted_length(tree, response[pos:]) if tree is not None else 0
            accepted_total += accepted
            new = response[pos : pos + accepted + 1]
            self.pos[i] = pos + len(new)
            finished = self.pos[i] >= len(response)
            out.append(
                StepRequest(
                    rid, new_tokens=new, budget=budget, accepted_last=accepted, finished=finished
                )
            )
            if finished:
                refills.append(i)
        for i in refills:  # the slot takes a new request next step
            self._fill(i)
        return out, accepted_total


def _replica(
    config: _ReplicaConfig, index: int, replicas: int, ready: Any, measure: Any, results: Any
) -> None:
    """One engine replica (runs in its own process)."""
    try:
        drafter = _make_drafter(config)
        slots = _Slots(config, index, replicas)
    except Exception as e:  # reported to the parent, which fails the run
        ready.abort()
        results.put((index, _ReplicaResult([], 0, 0, 0, 0.0, 0, error=repr(e))))
        return
    latencies: list[int] = []
    request_drafts = nodes = accepted = 0
    trees: DraftBatch | None = None
    error: str | None = None
    wall = 0.0
    try:
        ready.wait()
        started = 0.0
        for step in range(config.warmup + config.steps):
            if step == config.warmup:
                measure.wait()
                started = time.perf_counter()
            requests, got = slots.requests(trees, config.budget)
            t0 = time.perf_counter_ns()
            trees = drafter.step(requests)
            elapsed = time.perf_counter_ns() - t0
            if step >= config.warmup:
                latencies.append(elapsed)
                request_drafts += sum(1 for r in requests if not r.finished)
                nodes += int(trees.sizes.sum())
                accepted += got
        wall = time.perf_counter() - started
    except Exception as e:
        error = repr(e)
        measure.abort()
    fallbacks = drafter.client_stats()["fallback_steps"] if config.mode != "embedded" else 0
    results.put(
        (index, _ReplicaResult(latencies, request_drafts, nodes, accepted, wall, fallbacks, error))
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(sorted_values: list[int], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index] / 1e6


def run_mode(
    mode: str, target: str | None, args: argparse.Namespace, server_pid: int | None, run_id: str
) -> LoadResult:
    """Runs one mode with ``args.replicas`` replica processes; returns its figures."""
    ctx = multiprocessing.get_context("spawn")
    parties = args.replicas + 1
    ready, measure = ctx.Barrier(parties), ctx.Barrier(parties)
    results = ctx.Queue()
    config = _ReplicaConfig(
        mode,
        target,
        f"load-{run_id}-{mode}",
        str(args.workload),
        args.batch,
        args.budget,
        args.warmup,
        args.steps,
        args.timeout,
        args.prompt_tokens,
    )
    procs = [
        ctx.Process(
            target=_replica, args=(config, i, args.replicas, ready, measure, results), daemon=True
        )
        for i in range(args.replicas)
    ]
    for p in procs:
        p.start()
    errors: list[str] = []
    cpu0 = cpu1 = None
    try:
        ready.wait(timeout=600)
        measure.wait(timeout=600)
        cpu0 = _cpu_seconds(server_pid) if server_pid and mode != "embedded" else None
    except Exception as e:  # a replica failed to start or to warm up
        errors.append(f"barrier: {e!r}")
    collected = [results.get(timeout=3600) for _ in procs]
    if cpu0 is not None and server_pid:
        cpu1 = _cpu_seconds(server_pid)
    for p in procs:
        p.join(60)
    replica_results = [r for _, r in sorted(collected, key=lambda x: x[0])]
    errors += [r.error for r in replica_results if r.error]
    latencies = sorted(v for r in replica_results for v in r.latencies_ns)
    steps = len(latencies)
    drafts = sum(r.request_drafts for r in replica_results)
    wall = max((r.wall_s for r in replica_results), default=0.0)
    server_cpu = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
    return LoadResult(
        mode=mode,
        replicas=args.replicas,
        batch=args.batch,
        budget=args.budget,
        steps=steps,
        p50_ms=_percentile(latencies, 0.50) if latencies else float("nan"),
        p99_ms=_percentile(latencies, 0.99) if latencies else float("nan"),
        mean_ms=statistics.fmean(latencies) / 1e6 if latencies else float("nan"),
        steps_per_s=steps / wall if wall else 0.0,
        request_drafts_per_s=drafts / wall if wall else 0.0,
        mean_draft_nodes=sum(r.draft_nodes for r in replica_results) / drafts if drafts else 0,
        mean_accepted=sum(r.accepted for r in replica_results) / drafts if drafts else 0.0,
        fallback_steps=sum(r.fallback_steps for r in replica_results),
        server_cpu_s=server_cpu,
        request_drafts_per_server_cpu_s=(drafts / server_cpu) if server_cpu else None,
        errors=errors,
    )


def add_load_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``load`` subcommand to ``lookahead-bench``'s subparsers."""
    lp = subparsers.add_parser(
        "load",
        help="step latency and throughput of embedded vs remote (TCP, Unix socket) drafters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lp.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated modes among {', '.join(MODES)} (default: all)",
    )
    lp.add_argument("--replicas", type=int, default=1, help="engine replica processes")
    lp.add_argument("--batch", type=int, default=64, help="requests per step per replica")
    lp.add_argument("--budget", type=int, default=8, help="draft nodes per request")
    lp.add_argument("--steps", type=int, default=300, help="measured steps per replica")
    lp.add_argument("--warmup", type=int, default=30, help="unmeasured steps first")
    lp.add_argument(
        "--prompt-tokens",
        type=int,
        default=512,
        help="keep the last N prompt tokens of each request",
    )
    lp.add_argument(
        "--timeout", type=float, default=1.0, help="step deadline of the remote client, seconds"
    )
    lp.add_argument(
        "--workload",
        type=Path,
        default=DEMO_WORKLOAD,
        help="a workload file (default: the demo workload shipped in the package)",
    )
    lp.add_argument("--server-bin", default=None, help="the lookahead-server binary to start")
    lp.add_argument(
        "--server-workers",
        type=int,
        default=0,
        help="--worker-threads of the started server (0: one per CPU)",
    )
    lp.add_argument("--tcp", default=None, help="use this running server for tcp modes")
    lp.add_argument(
        "--uds", default=None, help="use this running server for uds modes (unix:///path)"
    )
    lp.add_argument("--json", type=Path, default=None, help="write the results here")
    return lp


def _format(results: list[LoadResult]) -> str:
    head = (
        f"{'mode':<11} {'repl':>4} {'batch':>5} {'steps':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'mean ms':>7} {'steps/s':>8} {'req-drafts/s':>12} {'srv cpu s':>9} "
        f"{'drafts/srv-cpu-s':>16} {'nodes':>5} {'acc':>5} {'fallbk':>6}"
    )
    lines = [head]
    for r in results:
        cpu = f"{r.server_cpu_s:9.2f}" if r.server_cpu_s is not None else f"{'-':>9}"
        per_cpu = (
            f"{r.request_drafts_per_server_cpu_s:16.0f}"
            if r.request_drafts_per_server_cpu_s
            else f"{'-':>16}"
        )
        lines.append(
            f"{r.mode:<11} {r.replicas:>4} {r.batch:>5} {r.steps:>6} {r.p50_ms:7.3f} "
            f"{r.p99_ms:7.3f} {r.mean_ms:7.3f} {r.steps_per_s:8.1f} "
            f"{r.request_drafts_per_s:12.0f} {cpu} {per_cpu} {r.mean_draft_nodes:5.2f} "
            f"{r.mean_accepted:5.2f} {r.fallback_steps:>6}"
        )
        for e in r.errors:
            lines.append(f"    error: {e}")
    return "\n".join(lines)


def run_load(args: argparse.Namespace) -> int:
    """Runs ``lookahead-bench load``; returns the exit status (1 if any replica failed)."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"lookahead-bench load: unknown mode(s) {bad}; choose among {MODES}", file=sys.stderr)
        return 2
    for name in ("replicas", "batch", "steps"):
        if getattr(args, name) < 1:
            print(f"lookahead-bench load: --{name} must be >= 1", file=sys.stderr)
            return 2
    load_workload(args.workload, limit=1)  # fail early on a bad file
    server = None
    remote = [m for m in modes if m != "embedded"]
    needs_server = (any(m.startswith("tcp") for m in remote) and not args.tcp) or (
        any(m.startswith("uds") for m in remote) and not args.uds
    )
    if needs_server:
        from lookahead_client.processes.server import ServerProcess

        server_args = [
            "--max-namespaces",
            "16",
            "--memory-budget",
            "16GiB",
            "--worker-threads",
            str(args.server_workers),
            "--log-level",
            "warn",
        ]
        server = ServerProcess(server_args, binary=args.server_bin).start()
    run_id = f"{os.getpid()}-{int(time.time())}"
    results: list[LoadResult] = []
    try:
        for mode in modes:
            if mode == "embedded":
                target, pid = None, None
            elif mode.startswith("tcp"):
                target = args.tcp or (server.tcp_target if server else None)
                pid = server.pid if server and not args.tcp else None
            else:
                target = args.uds or (server.unix_target if server else None)
                pid = server.pid if server and not args.uds else None
            results.append(run_mode(mode, target, args, pid, run_id))
            print(_format(results[-1:]).splitlines()[-1], flush=True)
    finally:
        if server is not None:
            server.close()
    print()
    print(f"workload {args.workload}, budget {args.budget}, {os.cpu_count()} CPUs")
    print(_format(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"argv": sys.argv, "cpus": os.cpu_count(), "results": [asdict(r) for r in results]},
                indent=2,
            )
        )
    return 1 if any(r.errors for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    """Runs the load benchmark alone (``python -m lookahead_client.bench.load``)."""
    parser = argparse.ArgumentParser(prog="lookahead-bench")
    add_load_parser(parser.add_subparsers(dest="command", required=True))
    return run_load(parser.parse_args(["load", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    raise SystemExit(main())
