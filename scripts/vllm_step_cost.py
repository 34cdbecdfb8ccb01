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
from typing import Any

# A token id far from any text of these workloads: drafted, it is (nearly) never accepted.
_UNLIKELY = 17


class FixedProposer:
    """vLLM's ``custom_class`` proposer drafting ``n`` copies of one token for every row, and
    counting its calls (set both through ``collective_rpc``)."""

    def __init__(self, vllm_config: Any) -> None:
        del vllm_config
        self.n = 0
        self.calls = 0

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], *args: Any, **kwargs: Any):
        """``n`` draft tokens for every row."""
        self.calls += 1
        return [[_UNLIKELY] * self.n for _ in sampled_token_ids]


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


def fixed_sizes(llm: Any, ids: list[Any], k: int, new_tokens: int, rounds: int) -> None:
    """Every size measured with the fixed proposer (see the module docstring)."""
    from vllm import SamplingParams

    def timed(n: int, tokens: int) -> tuple[float, int]:
        """Seconds and proposer calls of one generation of ``tokens`` with ``n``-token drafts."""

        def arm(worker: Any) -> int:
            proposer = _proposer(worker)
            proposer.n = n
            return proposer.calls

        before = llm.collective_rpc(arm)[0]
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        llm.generate(ids, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        return seconds, llm.collective_rpc(lambda w: _proposer(w).calls)[0] - before

    timed(0, 8)  # warm-up
    sizes = list(range(k + 1))
    per_size: dict[int, list[float]] = {n + 1: [] for n in sizes}
    for r in range(rounds):
        for n in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
            t1, c1 = timed(n, 1)
            tn, cn = timed(n, new_tokens)
            per_size[n + 1].append(1e3 * (tn - t1) / max(cn - c1, 1))
    print(f"ms per step by tokens verified, {new_tokens} new tokens, {rounds} rounds:")
    _print_sizes(per_size)


def lookahead_sizes(llm: Any, prompts: list[Any], new_tokens: int) -> None:
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
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    for prompt in prompts:
        llm.generate([prompt], params, use_tqdm=False)
    per_size: dict[int, list[float]] = {}
    for tokens, seconds in seen:
        per_size.setdefault(tokens, []).append(1e3 * seconds)
    print(
        f"ms per step by tokens verified, as lookahead measured them over {len(prompts)} prompts:"
    )
    _print_sizes(per_size)
    curve = llm.collective_rpc(lambda w: _proposer(w).stats()["cost_curve_ms"])[0]
    print(f"  its curve at the end (1 to K + 1 tokens): {curve}")


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
    parser.add_argument("--model-dir", default="bench-out/smollm2-135m-hf")
    args = parser.parse_args()

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
        fixed_sizes(llm, ids[:1], args.k, args.new_tokens, args.rounds)
    else:
        lookahead_sizes(llm, ids, args.new_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
