"""``lookahead-bench proposer``: the vLLM proposer's own time per engine step, without vLLM.

Drives :class:`~lookahead_client.vllm.proposer.LookaheadProposer` (vLLM 0.32/0.33's
``custom_class``; vLLM 0.34's speculator runs the same ``ChainDrafting``) the way vLLM's model
runner does: a token table with a row per running request, the step's scheduler output, the
tokens each row gained. The requests are real token streams of a workload, ``B`` at a time
(continuous batching: a finished request's row goes to the next one); a chain is accepted
greedily against the recorded response. Only ``propose`` is timed: the proposer's whole work
(the request book, the drafter's step, the chains).

The engine is simulated: each step is reported to the proposer's cost feed as taking
``--step-ms BASE,PER_TOKEN`` milliseconds (base plus per token verified), so chains are sized
as on an engine with that cost; the proposer's time does not depend on it. Called back to back
the proposer runs on warm caches; in an engine a forward pass streams the model's weights
through them between two calls, and every call starts cold (3-4x slower at batch 1,
docs/benchmarks.md). ``--forward-mb N`` reads ``N`` MB between two calls, untimed, as that
forward pass would.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.errors import InvalidArgumentError

from .arguments import int_list, ms_pair
from .workload import DEMO_WORKLOAD, Request, load_workload

__all__ = ["ProposerResult", "add_proposer_parser", "measure", "run_proposer"]

#: Steps run before timing starts (imports, first allocations, the cost curve's first fit).
_WARMUP = 20


@dataclass(frozen=True)
class ProposerResult:
    """What one batch size measured.

    Attributes:
        workload: the workload's name.
        batch: requests kept running (B).
        steps: timed engine steps.
        rows: mean rows per timed step (below B when the workload runs out).
        median_ms, p90_ms, mean_ms: the proposer's time per step.
        drafted: share of request-steps that got a chain.
        tokens_per_draft: draft tokens per chain.
        accepted_per_token: accepted over drafted tokens.
        accepted_over_expected: accepted draft tokens over the drafter's expected count.
    """

    workload: str
    batch: int
    steps: int
    rows: float
    median_ms: float
    p90_ms: float
    mean_ms: float
    drafted: float
    tokens_per_draft: float
    accepted_per_token: float
    accepted_over_expected: float | None


class _Running:
    """A request in a row: its recorded response and how much of it is known."""

    __slots__ = ("req", "known", "gained", "chain")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.known = 1  # the first response token comes from prefill
        self.gained: list[int] = [req.response[0]]
        self.chain = 0  # tokens of its last chain

    def tokens(self) -> list[int]:
        return [*self.req.prompt, *self.req.response[: self.known]]


def measure(
    name: str,
    requests: list[Request],
    *,
    batch: int,
    steps: int,
    k: int = 8,
    config: LookaheadConfig | None = None,
    step_ms: tuple[float, float] = (20.0, 0.5),
    forward_mb: int = 0,
) -> ProposerResult:
    """Runs the proposer over ``requests``, ``batch`` at a time, for at most ``steps`` timed
    steps (after a warm-up), reading ``forward_mb`` MB between two calls; see the module
    docstring.

    Raises:
        InvalidArgumentError: ``batch``/``steps``/``k`` below 1, ``forward_mb`` below 0, or no
            request.
    """
    for field_name, value in (("batch", batch), ("steps", steps), ("k", k)):
        if value < 1:
            raise InvalidArgumentError(f"{field_name} must be >= 1, got {value}", field=field_name)
    if forward_mb < 0:
        raise InvalidArgumentError(f"forward_mb must be >= 0, got {forward_mb}", field="forward_mb")
    if not requests:
        raise InvalidArgumentError("the workload has no request", field="workload")
    from lookahead_client.vllm.proposer import LookaheadProposer

    longest = max(len(r.prompt) + len(r.response) for r in requests)
    max_len = longest + k + 2
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(
            max_model_len=max_len, get_vocab_size=lambda: 1 + max(_ids(requests))
        ),
    )
    # No vLLM model runner to hook here (this benchmark hands the proposer its rows itself):
    # the proposer's warning that it cannot hook one would mislead.
    log = logging.getLogger("lookahead_client.vllm")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        proposer = LookaheadProposer(vllm_config, config or LookaheadConfig())
    finally:
        log.setLevel(level)
    queue = list(requests)
    running: dict[str, _Running] = {}
    finished: set[str] = set()
    table = np.zeros((batch, max_len), dtype=np.int64)
    # what a forward pass streams through the caches between two calls (the model's weights)
    weights = np.ones(forward_mb * (1 << 20) // 4, dtype=np.float32) if forward_mb else None
    times: list[float] = []
    rows_seen = drafted = draft_tokens = accepted = 0
    for step in range(_WARMUP + steps):
        while len(running) < batch and queue:
            req = queue.pop(0)
            running[req.id] = _Running(req)
        if not running:
            break
        ids = list(running)
        for i, rid in enumerate(ids):
            seq = running[rid].tokens()
            table[i, : len(seq)] = seq
        counts = np.asarray([running[r].known + len(running[r].req.prompt) for r in ids])
        # the step that just ran verified each row's token and its last chain
        scheduled = {r: 1 + running[r].chain for r in ids}
        total = sum(scheduled.values())
        engine_s = (step_ms[0] + step_ms[1] * total) / 1e3
        if weights is not None:
            weights.sum()
        proposer.scheduled(
            SimpleNamespace(
                req_ids=ids,
                num_prompt_tokens=np.asarray([len(running[r].req.prompt) for r in ids]),
                temperature_cpu=np.full(len(ids), -1.0),  # vLLM's mark of a greedy row
            ),
            SimpleNamespace(
                finished_req_ids=set(finished),
                num_scheduled_tokens=scheduled,
                total_num_scheduled_tokens=total,
            ),
            time.perf_counter() - engine_s,
        )
        finished.clear()
        sampled = [running[r].gained for r in ids]
        started = time.perf_counter()
        chains = proposer.propose(sampled, counts, table[: len(ids)])
        elapsed = time.perf_counter() - started
        timed = step >= _WARMUP
        if timed:
            times.append(elapsed)
            rows_seen += len(ids)
        for rid, chain in zip(ids, chains, strict=True):
            r = running[rid]
            r.chain = len(chain)
            response, known = r.req.response, r.known
            ok = 0
            while (
                ok < len(chain) and known + ok < len(response) and chain[ok] == response[known + ok]
            ):
                ok += 1
            gained = min(ok + 1, len(response) - known)
            r.gained = list(response[known : known + gained])
            r.known += gained
            if timed and chain:
                drafted += 1
                draft_tokens += len(chain)
                accepted += ok
            if r.known >= len(response):
                del running[rid]
                finished.add(rid)
    if not times:
        raise InvalidArgumentError(
            f"the workload ran out within the {_WARMUP} warm-up steps", field="workload"
        )
    stats = proposer.stats()
    expected = float(stats.get("expected_drafts", 0.0))
    ms = sorted(1e3 * t for t in times)
    return ProposerResult(
        workload=name,
        batch=batch,
        steps=len(times),
        rows=rows_seen / len(times),
        median_ms=statistics.median(ms),
        p90_ms=ms[int(0.9 * (len(ms) - 1))],
        mean_ms=statistics.fmean(ms),
        drafted=drafted / max(rows_seen, 1),
        tokens_per_draft=draft_tokens / max(drafted, 1),
        accepted_per_token=accepted / max(draft_tokens, 1),
        accepted_over_expected=(
            float(stats.get("accepted_drafts", 0)) / expected if expected > 0 else None
        ),
    )


def _ids(requests: list[Request]) -> list[int]:
    return [max(max(r.prompt, default=0), max(r.response, default=0)) for r in requests]


def add_proposer_parser(sub: Any) -> None:
    """Adds the ``proposer`` command to the ``lookahead-bench`` parser."""
    p = sub.add_parser(
        "proposer",
        help="the vLLM proposer's time per engine step, without vLLM",
        description="Drives lookahead's vLLM proposer as vLLM's model runner does, on real "
        "token streams B requests at a time, and times its work per engine step (the engine "
        "is simulated, see --step-ms). Reports the proposer's ms per step, the share of "
        "request-steps drafted, tokens per draft, accepted per drafted token and accepted "
        "over the drafter's expected count.",
    )
    p.add_argument("--workload", action="append", metavar="PATH", help="a workload .jsonl")
    p.add_argument("--batch", type=int_list, default=[1, 32], help="requests at once B")
    p.add_argument("--steps", type=int, default=600, help="timed steps per batch size")
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens (default 8)")
    p.add_argument("--split", choices=("a", "b"), help="half of each workload, by group")
    p.add_argument("--target", help="a lookahead-server (default: the embedded drafter)")
    p.add_argument(
        "--step-ms",
        type=ms_pair,
        default=(20.0, 0.5),
        metavar="BASE,PER_TOKEN",
        help="the simulated engine step: base ms plus ms per token verified (default 20,0.5)",
    )
    p.add_argument(
        "--forward-mb",
        type=int,
        default=0,
        metavar="N",
        help="MB read between two calls, as a forward pass streams the model's weights through "
        "the caches (SmolLM2-135M in float32: 540); default 0, warm caches",
    )
    p.add_argument("--json", metavar="OUT", help="write the rows to this JSON file")


def run_proposer(args: argparse.Namespace) -> int:
    """Runs ``lookahead-bench proposer``; returns the exit status."""
    config = LookaheadConfig(target=args.target)
    rows = []
    header = (
        f"{'workload':<16} {'B':>3} {'steps':>5} {'rows':>5} {'median ms':>9} {'p90 ms':>7} "
        f"{'mean ms':>7} {'drafted':>7} {'tok/draft':>9} {'acc/tok':>7} {'acc/exp':>7}"
    )
    print(header, flush=True)
    for path in args.workload or [str(DEMO_WORKLOAD)]:
        workload = load_workload(path)
        if args.split:
            workload = workload.half(args.split)
        for batch in args.batch:
            r = measure(
                workload.name,
                list(workload.requests),
                batch=batch,
                steps=args.steps,
                k=args.k,
                config=config,
                step_ms=args.step_ms,
                forward_mb=args.forward_mb,
            )
            rows.append(asdict(r))
            ratio = "-" if r.accepted_over_expected is None else f"{r.accepted_over_expected:.2f}"
            print(
                f"{r.workload:<16} {r.batch:>3} {r.steps:>5} {r.rows:>5.1f} {r.median_ms:>9.3f} "
                f"{r.p90_ms:>7.3f} {r.mean_ms:>7.3f} {r.drafted:>7.2f} {r.tokens_per_draft:>9.2f} "
                f"{r.accepted_per_token:>7.2f} {ratio:>7}",
                flush=True,
            )
    if args.json:
        doc = {"schema": "lookahead-bench.proposer/1", "command": sys.argv, "results": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"json: {args.json}")
    return 0
