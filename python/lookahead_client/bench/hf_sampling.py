"""Accepted draft tokens per step at temperature > 0, by draft mode, on a real model.

Runs SmolLM2-135M-Instruct (see :mod:`lookahead_client.bench.hf`) through
:func:`lookahead_client.hf.speculative_generate` with sampling, once per draft mode, over a
workload's prompts in file order: the samples of one rollout group run one after another, and
each mode's drafter (embedded, kept for the whole run) learns from every earlier sample, its
own outputs included. Modes (``--variants``): ``best-chain:B`` (the most likely path of a
tree of B nodes: one-hot drafts), ``sampled-chain:B`` (a path drawn from that tree's
next-token distributions, verified with them) and ``tree:B`` (the whole tree, verified as a
tree); chains hold at most ``--chain-length`` tokens. Output is sampled, so no mode's text
equals another's; the figure is accepted draft tokens per verification step, per half of the
workload's groups (``A``/``B`` as in :mod:`.hf`) and overall, and each mode's ratio to the
first.

Run: ``python -m lookahead_client.bench.hf_sampling --workload
../shared/workloads/code-rollouts.jsonl --temperature 1``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lookahead_client.errors import InvalidArgumentError

from .hf import load_smollm2, make_drafter, workload_prompts

__all__ = ["SamplingVariant", "parse_sampling_variant", "main"]


@dataclass(frozen=True)
class SamplingVariant:
    """A draft mode of :func:`~lookahead_client.hf.speculative_generate` with its tree size.

    Attributes:
        name: as given on the command line (``best-chain:B``...).
        mode: the ``draft_mode``.
        budget: the drafter's tree nodes per step.
    """

    name: str
    mode: str
    budget: int


def parse_sampling_variant(text: str) -> SamplingVariant:
    """``tree:B``, ``best-chain:B`` or ``sampled-chain:B`` (B >= 1).

    Raises:
        InvalidArgumentError: anything else.
    """
    mode, _, budget = text.partition(":")
    if mode in ("tree", "best-chain", "sampled-chain") and budget.isdigit() and int(budget) >= 1:
        return SamplingVariant(text, mode, int(budget))
    raise InvalidArgumentError(
        f"unknown variant {text!r}: tree:B, best-chain:B or sampled-chain:B", field="variants"
    )


def _totals(rows: Sequence[dict], names: Sequence[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in names:
        runs = [r["runs"][name] for r in rows]
        steps = sum(r["steps"] for r in runs)
        accepted = sum(r["accepted"] for r in runs)
        out[name] = {
            "prompts": len(runs),
            "tokens": sum(r["tokens"] for r in runs),
            "steps": steps,
            "accepted_per_step": round(accepted / steps, 4) if steps else 0.0,
            "draft_nodes_per_step": round(sum(r["draft_nodes"] for r in runs) / steps, 3)
            if steps
            else 0.0,
        }
    first = out[names[0]]["accepted_per_step"] if names else 0.0
    for row in out.values():
        row["vs_first"] = round(row["accepted_per_step"] / first, 3) if first else None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: one JSON line per prompt, then the totals of each half and of all."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", required=True, help="a shared workload .jsonl file")
    parser.add_argument("--half", choices=("A", "B"), default=None, help="one half only")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--chain-length", type=int, default=8)
    parser.add_argument(
        "--variants",
        default="best-chain:32,sampled-chain:32",
        help="comma-separated: tree:B, best-chain:B, sampled-chain:B (the first is the "
        "reference of the ratios)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--out", default=None, help="write the rows and totals as JSON here")
    args = parser.parse_args(argv)
    variants = [parse_sampling_variant(v.strip()) for v in args.variants.split(",") if v.strip()]
    if not args.temperature > 0:
        raise InvalidArgumentError(
            f"temperature must be > 0, got {args.temperature}", field="temperature"
        )

    import torch

    from lookahead_client.hf import speculative_generate
    from lookahead_client.hf.verify import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_smollm2()
    prompts = workload_prompts(args.workload, tokenizer, args.limit)
    if args.half:
        prompts = [p for p in prompts if p.half == args.half]
    drafters = {v.name: make_drafter("embedded", model.config.vocab_size) for v in variants}
    params = SamplingParams(temperature=args.temperature)
    started = time.perf_counter()
    rows = []
    for i, prompt in enumerate(prompts):
        runs = {}
        for v in variants:
            result = speculative_generate(
                model,
                [prompt.ids],
                drafters[v.name],
                max_new_tokens=args.max_new_tokens,
                budget=v.budget,
                sampling=params,
                generator=torch.Generator().manual_seed(args.seed * 1_000_003 + i),
                request_ids=[f"{v.name}/{prompt.id}"],
                sizing=False,
                draft_mode=v.mode,
                chain_length=args.chain_length,
            )
            runs[v.name] = {
                "tokens": len(result.tokens[0]),
                "steps": result.steps[0],
                "accepted": result.accepted[0],
                "draft_nodes": result.draft_nodes,
            }
        row = {"id": prompt.id, "group": prompt.group, "half": prompt.half, "runs": runs}
        rows.append(row)
        print(json.dumps({**row, "done": f"{i + 1}/{len(prompts)}"}), flush=True)
    names = [v.name for v in variants]
    totals = {half: _totals([r for r in rows if r["half"] == half], names) for half in "AB"}
    totals["all"] = _totals(rows, names)
    info = {
        "workload": args.workload,
        "temperature": args.temperature,
        "chain_length": args.chain_length,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "seconds": round(time.perf_counter() - started, 1),
    }
    for half, total in totals.items():
        print(json.dumps({"totals": half, **total}))
    print(json.dumps(info))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "totals": totals, "info": info}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
