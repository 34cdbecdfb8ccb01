"""vLLM's decode step time at batch 1 by the draft tokens it verifies, measured size by size.

The cost curve that lookahead's chains are sized against is learnt online from the engine's
own steps (``engine/step_cost.py``), at the sizes the core's own choices make; what it says
is in ``cost_curve_ms`` of the proposer's stats. This script checks it, with one vLLM 0.32
engine in this process:

* ``--proposer fixed`` (the default) measures every size directly: a ``custom_class``
  proposer drafts exactly ``n`` tokens every step, a token the model does not take (so
  almost every step verifies ``n + 1`` tokens and keeps one), for ``n = 0..K`` in rotated
  rounds. A size's step time is ``(t(N) - t(1)) / (steps(N) - steps(1))``: the generation
  of ``N`` tokens less that of one (the prefill), over the proposer's calls between them.
* ``--proposer lookahead`` runs lookahead's proposer over the workload's first prompts, one at
  a time, and prints the step times it measured by size (what its curve is fitted to) and
  the curve it ended with.

``--samples N --temperature T`` generates N sequences of each prompt at once (a batch of N
rows, as the sampled rollouts of ``lookahead-bench vllm``); with ``--drafted-rows R`` the fixed
proposer drafts for R of them only, so that each size is the batch's ``N + R * n`` tokens.

Run with the vLLM environment (``scripts/vllm_env.sh``)::

    .venv-vllm/bin/python scripts/vllm_step_cost.py --workload ../shared/workloads/code-edit.jsonl
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# A token id far from any text of these workloads: drafted, it is (nearly) never accepted.
_UNLIKELY = 17


class FixedProposer:
    """vLLM's ``custom_class`` proposer drafting ``n`` copies of one token for the first
    ``rows`` rows (None: every row), and counting its calls (set through ``collective_rpc``)."""

    def __init__(self, vllm_config: Any) -> None:
        del vllm_config
        from lookahead_client.vllm.cpu_sampling import repair_expand

        repair_expand()  # the sampler path lookahead's proposer runs at temperatures above 0
        self.n = 0
        self.rows: int | None = None
        self.calls = 0

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], *args: Any, **kwargs: Any):
        """``n`` draft tokens for each drafted row."""
        self.calls += 1
        drafted = len(sampled_token_ids) if self.rows is None else self.rows
        return [[_UNLIKELY] * (self.n if i < drafted else 0) for i in range(len(sampled_token_ids))]


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

    def timed(n: int, tokens: int) -> tuple[float, int]:
        """Seconds and proposer calls of one generation of ``tokens`` with ``n``-token drafts."""

        def arm(worker: Any) -> int:
            proposer = _proposer(worker)
            proposer.n, proposer.rows = n, sampling.drafted_rows
            return proposer.calls

        before = llm.collective_rpc(arm)[0]
        params = SamplingParams(
            max_tokens=tokens,
            n=sampling.samples,
            temperature=sampling.temperature,
            seed=0,
            ignore_eos=True,
        )
        started = time.perf_counter()
        llm.generate(ids, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        return seconds, llm.collective_rpc(lambda w: _proposer(w).calls)[0] - before

    timed(0, 8)  # warm-up
    sizes = list(range(k + 1))
    rows, drafted = sampling.samples, sampling.drafted_rows or sampling.samples
    per_size: dict[int, list[float]] = {rows + drafted * n: [] for n in sizes}
    for r in range(rounds):
        for n in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
            t1, c1 = timed(n, 1)
            tn, cn = timed(n, new_tokens)
            per_size[rows + drafted * n].append(1e3 * (tn - t1) / max(cn - c1, 1))
    print(
        f"ms per step by tokens verified, {new_tokens} new tokens, {rounds} rounds, "
        f"{sampling.describe(fixed=True)}:"
    )
    _print_sizes(per_size)


def lookahead_sizes(llm: Any, prompts: list[Any], new_tokens: int, sampling: Sampling) -> None:
    """The step times lookahead's proposer measured, by size, and its curve."""
    from vllm import SamplingParams

    seen: list[tuple[int, float]] = []

    def record(worker: Any) -> None:
        feed = _proposer(worker).cost
        observe = feed.observe

        def recorded(tokens: int, seconds: float, **shape: Any) -> None:
            seen.append((tokens, seconds))
            observe(tokens, seconds, **shape)

        feed.observe = recorded

    llm.collective_rpc(record)
    params = SamplingParams(
        max_tokens=new_tokens, n=sampling.samples, temperature=sampling.temperature, seed=0
    )
    for prompt in prompts:
        llm.generate([prompt], params, use_tqdm=False)
    per_size: dict[int, list[float]] = {}
    for tokens, seconds in seen:
        per_size.setdefault(tokens, []).append(1e3 * seconds)
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
        "--prompts", type=int, default=6, help="prompts (fixed: the first; lookahead: all)"
    )
    parser.add_argument("--k", type=int, default=8, help="draft tokens at most (vLLM's K)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1, help="sequences per prompt (vLLM's n)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--drafted-rows", type=int, help="fixed: draft for this many rows only (default: all)"
    )
    parser.add_argument("--model-dir", default="bench-out/smollm2-135m-hf")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    if args.drafted_rows is not None and not 1 <= args.drafted_rows <= args.samples:
        parser.error(
            f"--drafted-rows must be 1 to --samples ({args.samples}), got {args.drafted_rows}"
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
        fixed_sizes(llm, ids[:1], args.k, args.new_tokens, args.rounds, sampling)
    else:
        lookahead_sizes(llm, ids, args.new_tokens, sampling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
