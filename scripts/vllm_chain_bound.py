"""What lookahead's chains can gain over vLLM's ngram at batch 1, replayed without engine noise.

The engine benchmark (``lookahead-bench vllm``) measures wall time on a noisy 2-core machine:
rounds resolve a few percent only with many prompts. This script answers the question behind
its figures exactly, on more prompts: how many engine steps, and how many verified tokens, does
each drafter need to produce SmolLM2-135M's own greedy outputs?

1. The outputs are made once by vLLM 0.32 without speculation (greedy, in this process) for the
   first ``--prompts`` prompts of each workload (or read back from ``--outputs``).
2. Each output is replayed one request at a time (batch 1), as vLLM's model runner would: a
   step verifies the root and the step's chain, keeps the longest correct prefix and one token
   of the model's.
3. Each step is charged the engine's measured step time for the tokens it verifies
   (``--step-ms``: one token, two tokens, each further token; run 11 of docs/vllm-runs.md measured
   33.5, 35.5 and about 1.2-1.7 ms on this machine), or a whole curve of K + 1 values, such as
   the one ``lookahead-bench vllm`` prints as what the chains were sized against.

Drafters, each from an empty state and fed the prompts in file order (``--fresh-every N``: a
fresh drafter every ``N`` prompts, as each trial of the engine benchmark starts one for its
pass of a few prompts; outputs read back longer than ``--max-new-tokens`` are cut to it):

* ``ngram:K``: vLLM's own prompt-lookup function (``prompt_lookup_min`` 2, ``max`` 5, as the
  benchmark's ``ngram:K`` configuration);
* ``suffix``: vLLM's ``suffix`` method (ArcticInference's cache with vLLM's defaults, K tokens
  at most, :class:`~lookahead_client.bench.baselines.suffix.SuffixDecodingDrafter`);
* ``lookahead``: the embedded core's sized chains (``SIZED_CHAIN`` against the step-time curve
  above, the scores as they are);
* ``lookahead-weighted``: the same, the scores weighed as vLLM's proposer weighs them, by the
  request's own accepted over expected draft tokens (the proposer's ``RequestBook``);
* ``lookahead-oracle``: the core's whole chain cut where it first goes wrong, a bound that no
  choice of lengths for these chains can beat.

Run with the vLLM environment (``scripts/vllm_env.sh``)::

    .venv-vllm/bin/python scripts/vllm_chain_bound.py --workload ../shared/workloads/code-edit.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
from collections.abc import Callable, Sequence

import numpy as np

from lookahead_client.bench.engine_bench import MODEL_DIR
from lookahead_client.embedded import EmbeddedDrafter
from lookahead_client.engine.book import RequestBook, RequestView
from lookahead_client.engine.guard import DraftGuard
from lookahead_client.engine.session import DraftSession
from lookahead_client.types import Drafter, DraftShape, EngineCost, StepRequest

# Steps: (draft tokens verified, draft tokens accepted, the prompt's half).
Steps = list[tuple[int, int, str]]


def generate(workloads: Sequence[str], model: str, prompts: int, new_tokens: int) -> dict:
    """SmolLM2's greedy outputs, per workload stem: ``half``, ``prompt``, ``output``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one process, as the replay is
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from lookahead_client.bench.hf import workload_prompts

    tokenizer = AutoTokenizer.from_pretrained(model)
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024 + new_tokens + 16,
        seed=0,
        enforce_eager=True,
        kv_cache_memory_bytes=2 << 30,
    )
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    out = {}
    for path in workloads:
        chosen = workload_prompts(path, tokenizer, max_prompt_tokens=1024)[:prompts]
        ids = [TokensPrompt(prompt_token_ids=list(p.ids)) for p in chosen]
        done = llm.generate(ids, params, use_tqdm=False)
        out[pathlib.Path(path).stem] = [
            {"half": p.half, "prompt": list(p.ids), "output": list(d.outputs[0].token_ids)}
            for p, d in zip(chosen, done, strict=True)
        ]
        print(f"generated {len(chosen)} outputs of {pathlib.Path(path).stem}", file=sys.stderr)
    return out


def accepted(draft: Sequence[int], truth: Sequence[int]) -> int:
    """The length of the longest prefix of ``draft`` equal to ``truth``'s."""
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return n


def replay(requests: list[dict], propose: Callable[[str, list[int], list[int], int], list[int]]):
    """Each request decoded alone; ``propose(rid, prompt, new_tokens, accepted_last)`` gives
    the step's chain (the whole output so far is ``prompt`` + every ``new_tokens``)."""
    steps: Steps = []
    for i, request in enumerate(requests):
        output, pos, new, last = request["output"], 1, request["output"][:1], -1
        while pos < len(output):
            chain = propose(f"r{i}", request["prompt"], new, last)
            last = accepted(chain, output[pos:])
            advance = min(last + 1, len(output) - pos)
            new = output[pos : pos + advance]
            pos += advance
            steps.append((len(chain), last, request["half"]))
        propose(f"r{i}", request["prompt"], new, -2)  # -2: the request is over
    return steps


def ngram(k: int):
    """vLLM's own ngram proposer on the request's context."""
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as lookup,
    )

    history: dict[str, list[int]] = {}

    def propose(rid: str, prompt: list[int], new: list[int], last: int) -> list[int]:
        context = history.setdefault(rid, list(prompt))
        context.extend(new)
        if last == -2:
            return []
        return [int(t) for t in lookup(np.asarray(context, dtype=np.int32), 2, 5, 1 << 30, k)]

    return propose


def lookahead(k: int, cost: EngineCost | None):
    """The embedded core's chains: sized against ``cost``, or whole (None, for the oracle)."""
    shape = DraftShape.CHAIN if cost is None else DraftShape.SIZED_CHAIN
    return stepped(EmbeddedDrafter(vocab_size=1 << 16), k, cost, shape)


def suffix(k: int):
    """vLLM's ``suffix`` method: ArcticInference's cache driven as vLLM drives it."""
    from lookahead_client.bench.baselines.suffix import SuffixDecodingDrafter

    return stepped(SuffixDecodingDrafter(), k, None, DraftShape.CHAIN)


def stepped(drafter: Drafter, k: int, cost: EngineCost | None, shape: DraftShape):
    """A drafter of the step protocol replayed one request at a time: a step per engine step,
    the prompt with the first, ``finished`` with the last."""
    started: set[str] = set()

    def propose(rid: str, prompt: list[int], new: list[int], last: int) -> list[int]:
        first = rid not in started
        started.add(rid)
        request = StepRequest(
            rid,
            new_tokens=new,
            budget=k,
            prompt=prompt if first else None,
            accepted_last=max(last, -1),
            finished=last == -2,
            shape=shape,
        )
        batch = drafter.step([request], cost)
        return [] if last == -2 else list(batch[0].tokens)

    return propose


def lookahead_weighted(k: int, cost: EngineCost):
    """The core's sized chains with the scores weighed as vLLM's proposer weighs them, through
    its own :class:`DraftSession`: by the request's own accepted over expected draft tokens."""
    book = RequestBook(budget=k, shape=DraftShape.SIZED_CHAIN)
    session = DraftSession(
        DraftGuard(EmbeddedDrafter(vocab_size=1 << 16), None), book, logging.getLogger(__name__)
    )
    outputs: dict[str, list[int]] = {}

    def propose(rid: str, prompt: list[int], new: list[int], last: int) -> list[int]:
        output = outputs.setdefault(rid, [])
        output.extend(new)
        if last == -2:
            book.forget(rid)
            return []
        session.begin()
        drafts = session.draft([RequestView(rid, prompt, output)], cost)
        if drafts is None or (index := drafts.tree_of(0)) < 0:
            return []
        tree = drafts.batch[index]
        session.fed(drafts, 0, len(tree.tokens), float(sum(tree.scores)))
        return list(tree.tokens)

    return propose


def report(name: str, steps: Steps, cost: Callable[[int], float]) -> str:
    """One row: steps, tokens per step, drafted share, tokens per draft, accepted per draft
    token, simulated ms per output token."""
    tokens = sum(a + 1 for _, a, _ in steps)
    drafted = [(n, a) for n, a, _ in steps if n]
    ms = sum(cost(n + 1) for n, _, _ in steps)
    per_draft = sum(n for n, _ in drafted) / max(len(drafted), 1)
    acc = sum(a for _, a in drafted) / max(sum(n for n, _ in drafted), 1)
    return (
        f"  {name:18s} steps {len(steps):5d}  tok/step {tokens / len(steps):.3f}  "
        f"drafted {len(drafted) / len(steps):.2f}  tok/draft {per_draft:.2f}  "
        f"acc/tok {acc:.3f}  ms/token {ms / tokens:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", required=True, help="a .jsonl workload")
    parser.add_argument("--prompts", type=int, default=16, help="first N prompts per workload")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=8, help="draft tokens at most (vLLM's K)")
    parser.add_argument(
        "--step-ms",
        default="33.5,35.5,1.5",
        help="1 token, 2, each further; or K + 1 values: the step ms for 1 to K + 1 tokens "
        "(a curve the engine benchmark printed)",
    )
    parser.add_argument("--model-dir", default=MODEL_DIR)
    parser.add_argument("--outputs", help="JSON of the outputs: read if it exists, else written")
    parser.add_argument(
        "--fresh-every",
        type=int,
        default=0,
        metavar="N",
        help="a fresh drafter every N prompts (default 0: one for all the workload's prompts)",
    )
    args = parser.parse_args()
    if args.fresh_every < 0:
        parser.error(f"--fresh-every: a count of prompts >= 0, got {args.fresh_every}")
    given = [float(x) for x in args.step_ms.split(",")]
    if len(given) == 3:
        one, two, each = given
        curve = [one] + [two + each * (n - 2) for n in range(2, args.k + 2)]
    elif len(given) == args.k + 1:
        curve = given
    else:
        parser.error(f"--step-ms: 3 values or K + 1 = {args.k + 1}, got {len(given)}")

    def step_ms(tokens: int) -> float:
        return curve[min(max(tokens, 1), len(curve)) - 1]

    outputs_path = pathlib.Path(args.outputs) if args.outputs else None
    if outputs_path is not None and outputs_path.exists():
        outputs = json.loads(outputs_path.read_text())
    else:
        outputs = generate(args.workload, args.model_dir, args.prompts, args.max_new_tokens)
        if outputs_path is not None:
            outputs_path.write_text(json.dumps(outputs))
    sizes = list(range(1, args.k + 2))
    cost = EngineCost(tuple(sizes), tuple(step_ms(n) / 1e3 for n in sizes))
    drafters: dict[str, Callable[[], Callable]] = {
        f"ngram:{args.k}": lambda: ngram(args.k),
        "suffix": lambda: suffix(args.k),
        "lookahead": lambda: lookahead(args.k, cost),
        "lookahead-weighted": lambda: lookahead_weighted(args.k, cost),
        "whole": lambda: lookahead(args.k, None),
    }
    for stem, requests in outputs.items():
        requests = [dict(r, output=r["output"][: args.max_new_tokens]) for r in requests]
        every = args.fresh_every or len(requests)
        chunks = [requests[i : i + every] for i in range(0, len(requests), every)]
        runs = {
            name: [step for chunk in chunks for step in replay(chunk, make())]
            for name, make in drafters.items()
        }
        whole = runs.pop("whole")
        runs["lookahead-oracle"] = [(a, a, half) for _, a, half in whole]
        print(
            f"{stem}: {len(requests)} prompts (a fresh drafter every {every}), "
            f"step ms for 1 to K + 1 tokens {curve}"
        )
        for half in ("both", "A", "B"):
            print(f" half {half}")
            for name, steps in runs.items():
                kept = [s for s in steps if half == "both" or s[2] == half]
                print(report(name, kept, step_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
