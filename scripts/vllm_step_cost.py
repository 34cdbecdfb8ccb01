"""vLLM's decode step time by the draft tokens it verifies, measured size by size.

The cost curve that lookahead's chains are sized against is learnt online from the engine's
own steps (``engine/step_cost.py``), at the sizes the core's own choices make; what it says
is in ``cost_curve_ms`` of the proposer's stats. This script checks it, with one vLLM 0.32
engine in this process:

* ``--proposer fixed`` (the default) measures every size directly: a ``custom_class``
  proposer drafts ``n`` copies of a token the model does not take (so almost every step
  verifies ``n + 1`` tokens a drafted row and keeps one), the sizes ``n = 0..K`` in turn, call
  by call, and times each engine step from its answer to its next call (what lookahead's
  proposer measures of its own steps). Every size is measured all through each generation,
  step beside step, so the machine's pace, which moves by several percent from one second to
  the next, weighs on all of them alike; each round starts the turn at another size.
* ``--proposer lookahead`` runs lookahead's proposer over the workload's first prompts, one at
  a time, and prints the step times it measured by size (what its curve is fitted to) and
  the curve it ended with; ``--observations F`` writes every step it measured (JSON lines of
  tokens, seconds and the step's shape), to fit other models to offline.

The fixed proposer runs the workload's first ``--prompts P`` prompts as one batch (default 1).
``--samples N --temperature T`` generates N sequences of each prompt at once (a batch of P N
rows, as the sampled rollouts of ``lookahead-bench vllm``); with ``--drafted-rows R`` the fixed
proposer drafts for R of the rows only, so that each size is the batch's ``P N + R n`` tokens.

Run with the vLLM environment (``scripts/vllm_env.sh``)::

    .venv-vllm/bin/python scripts/vllm_step_cost.py --workload ../shared/workloads/code-edit.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lookahead_client.bench.engine_bench import MODEL_DIR

# A token id far from any text of these workloads: drafted, it is (nearly) never accepted.
_UNLIKELY = 17


class FixedProposer:
    """vLLM's ``custom_class`` proposer drafting, call by call, ``n`` copies of one token for
    the first ``rows`` rows (None: every row), ``n`` taken from ``sizes`` in turn, and timing
    each engine step (set and read through ``collective_rpc``)."""

    def __init__(self, vllm_config: Any) -> None:
        del vllm_config
        from lookahead_client.vllm.cpu_sampling import repair_expand

        repair_expand()  # the sampler path lookahead's proposer runs at temperatures above 0
        self.sizes = [0]
        self.rows: int | None = None
        #: Each timed step: (draft tokens of a drafted row, rows, seconds).
        self.steps: list[tuple[int, int, float]] = []
        self._calls = 0
        self._last: tuple[int, float] | None = None  # the last call's n and answer time

    def start(self, sizes: list[int], rows: int | None) -> None:
        """A new generation: ``sizes`` in turn from its first step, no step timed yet."""
        self.sizes, self.rows, self.steps, self._calls, self._last = sizes, rows, [], 0, None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], *args: Any, **kwargs: Any):
        """``n`` draft tokens for each drafted row; the step since the last call timed."""
        called = time.perf_counter()
        batch = len(sampled_token_ids)
        if self._last is not None:
            n, answered = self._last
            self.steps.append((n, batch, called - answered))
        n = self.sizes[self._calls % len(self.sizes)]
        self._calls += 1
        drafted = batch if self.rows is None else self.rows
        chains = [[_UNLIKELY] * (n if i < drafted else 0) for i in range(batch)]
        self._last = (n, time.perf_counter())
        return chains


@dataclass(frozen=True)
class Sampling:
    """How each prompt is generated: ``samples`` sequences at ``temperature`` (one batch), the
    fixed proposer drafting for the first ``drafted_rows`` of them (None: all)."""

    samples: int = 1
    temperature: float = 0.0
    drafted_rows: int | None = None

    def describe(self, fixed: bool) -> str:
        """One line for the output (``fixed``: with the rows the fixed proposer drafts for)."""
        line = f"{self.samples} sample(s) at temperature {self.temperature}"
        if fixed:
            rows = "every row" if self.drafted_rows is None else f"{self.drafted_rows} row(s)"
            line += f", drafts for {rows}"
        return line


def _proposer(worker: Any) -> Any:
    """The proposer of a vLLM worker's model runner (this script's or lookahead's)."""
    return worker.model_runner.drafter


def _print_sizes(per_size: dict[int, list[float]]) -> None:
    """Milliseconds per step by tokens verified: median [min-max], and how many."""
    for tokens in sorted(per_size):
        values = per_size[tokens]
        print(
            f"  {tokens:2d} tokens  {statistics.median(values):7.2f} "
            f"[{min(values):.2f}-{max(values):.2f}]  n={len(values)}"
        )


def fixed_sizes(
    llm: Any, ids: list[Any], k: int, new_tokens: int, rounds: int, sampling: Sampling
) -> None:
    """Every size measured with the fixed proposer (see the module docstring)."""
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=new_tokens,
        n=sampling.samples,
        temperature=sampling.temperature,
        seed=0,
        ignore_eos=True,
    )
    rows = len(ids) * sampling.samples
    drafted = sampling.drafted_rows or rows
    sizes = list(range(k + 1))
    per_size: dict[int, list[float]] = {rows + drafted * n: [] for n in sizes}
    # warm-up (kernels, allocator), outside the timed generations
    llm.generate(ids, SamplingParams(max_tokens=8, n=sampling.samples), use_tqdm=False)
    for r in range(rounds):
        turn = sizes[r % len(sizes) :] + sizes[: r % len(sizes)]
        llm.collective_rpc(lambda w, turn=turn: _proposer(w).start(turn, sampling.drafted_rows))
        llm.generate(ids, params, use_tqdm=False)
        for n, batch, seconds in llm.collective_rpc(lambda w: _proposer(w).steps)[0]:
            if batch == rows:  # the batch's first steps may hold fewer rows
                per_size[rows + drafted * n].append(1e3 * seconds)
    print(
        f"ms per step by tokens verified, {new_tokens} new tokens, {rounds} rounds, "
        f"{len(ids)} prompt(s) at once, {sampling.describe(fixed=True)}:"
    )
    _print_sizes(per_size)
    plain = statistics.median(per_size[rows])
    extra = [statistics.median(per_size[rows + drafted * n]) - plain for n in sizes[1:]]
    print(f"  over the step without a draft, n = 1..{k}: {[round(x, 2) for x in extra]} ms")


def lookahead_sizes(
    llm: Any,
    prompts: list[Any],
    new_tokens: int,
    sampling: Sampling,
    observations: pathlib.Path | None = None,
) -> None:
    """The step times lookahead's proposer measured, by size, and its curve; every measured
    step written to ``observations`` (JSON lines: tokens, seconds and the step's shape)."""
    from vllm import SamplingParams

    seen: list[dict[str, Any]] = []

    def record(worker: Any) -> None:
        feed = _proposer(worker).cost
        observe = feed.observe

        def recorded(tokens: int, seconds: float, **shape: Any) -> None:
            seen.append({"tokens": tokens, "seconds": seconds, **shape})
            observe(tokens, seconds, **shape)

        feed.observe = recorded

    llm.collective_rpc(record)
    params = SamplingParams(
        max_tokens=new_tokens, n=sampling.samples, temperature=sampling.temperature, seed=0
    )
    for prompt in prompts:
        llm.generate([prompt], params, use_tqdm=False)
    per_size: dict[int, list[float]] = {}
    for step in seen:
        per_size.setdefault(step["tokens"], []).append(1e3 * step["seconds"])
    if observations is not None:
        observations.write_text("".join(json.dumps(step) + "\n" for step in seen))
    print(
        f"ms per step by tokens verified, as lookahead measured them over {len(prompts)} "
        f"prompts, {sampling.describe(fixed=False)}:"
    )
    _print_sizes(per_size)
    rows = sampling.samples

    def curve(worker: Any) -> tuple[list[float] | None, float | None]:
        proposer = _proposer(worker)
        seconds = proposer.cost.seconds_at(range(rows, rows + proposer.k + 1), rows=rows)
        ms = None if seconds is None else [round(1e3 * s, 2) for s in seconds]
        return ms, proposer.stats()["draft_overhead_ms"]

    ms, overhead = llm.collective_rpc(curve)[0]
    print(
        f"  its curve at the end for {rows} rows ({rows} to {rows} + K tokens): {ms}; "
        f"a drafted step's overhead in it: {overhead} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", required=True, help="a .jsonl workload")
    parser.add_argument("--proposer", choices=("fixed", "lookahead"), default="fixed")
    parser.add_argument(
        "--prompts",
        type=int,
        help="the workload's first prompts (fixed: one batch, default 1; lookahead: one at a "
        "time, default 6)",
    )
    parser.add_argument("--k", type=int, default=8, help="draft tokens at most (vLLM's K)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1, help="sequences per prompt (vLLM's n)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--drafted-rows", type=int, help="fixed: draft for this many rows only (default: all)"
    )
    parser.add_argument(
        "--observations", type=pathlib.Path, help="lookahead: write its measured steps here"
    )
    parser.add_argument("--model-dir", default=MODEL_DIR)
    args = parser.parse_args()
    if args.prompts is None:
        args.prompts = 1 if args.proposer == "fixed" else 6
    if args.prompts < 1:
        parser.error(f"--prompts must be >= 1, got {args.prompts}")
    if args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    if args.samples > 1 and args.temperature <= 0.0:
        parser.error("--samples above 1 needs --temperature above 0 (vLLM's greedy n is 1)")
    rows = args.samples * (args.prompts if args.proposer == "fixed" else 1)
    if args.drafted_rows is not None and not 1 <= args.drafted_rows <= rows:
        parser.error(
            f"--drafted-rows must be 1 to the batch's rows ({rows}: --prompts x --samples "
            f"with the fixed proposer), got {args.drafted_rows}"
        )
    sampling = Sampling(args.samples, args.temperature, args.drafted_rows)

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the proposer in this process
    sys.path.insert(0, str(pathlib.Path(__file__).parent))  # importable by vLLM
    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from lookahead_client.bench.hf import workload_prompts

    prompts = workload_prompts(
        args.workload, AutoTokenizer.from_pretrained(args.model_dir), max_prompt_tokens=1024
    )[: args.prompts]
    if args.proposer == "fixed":
        proposer = "vllm_step_cost.FixedProposer"
    else:
        from lookahead_client.vllm import PROPOSER_PATH as proposer
    llm = LLM(
        model=args.model_dir,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024 + args.new_tokens + args.k + 16,
        seed=0,
        enforce_eager=True,
        kv_cache_memory_bytes=2 << 30,
        speculative_config={
            "method": "custom_class",
            "model": proposer,
            "num_speculative_tokens": args.k,
        },
    )
    ids = [TokensPrompt(prompt_token_ids=list(p.ids)) for p in prompts]
    print(f"{pathlib.Path(args.workload).stem}, {args.proposer} proposer, K = {args.k}")
    if args.proposer == "fixed":
        fixed_sizes(llm, ids, args.k, args.new_tokens, args.rounds, sampling)
    else:
        lookahead_sizes(llm, ids, args.new_tokens, sampling, args.observations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
