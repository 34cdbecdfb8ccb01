#!/usr/bin/env python3
"""Tree verification on a GPU against ``generate``: the HF loop's greedy output, token for token.

``lookahead_client.hf.speculative_generate`` with lookahead's embedded drafter verifies whole
draft trees (``sizing=False``, budget 8: a tree of up to 8 nodes in one forward pass, 4D tree
mask, tree position ids, the KV cache pruned to the accepted path) and is compared with
``model.generate(do_sample=False)`` run prompt by prompt. The model is a Llama shape of
``scripts/gpu_cost_curve.py`` with random weights (no hub on the machines this runs on; a
lossless verifier must reproduce ``generate`` whatever the weights say), float32 with TF32 off
and eager attention (so that differently shaped kernels round alike), on repetitive prompts,
in two passes: cold, then the same prompts again with the drafter warm (it has seen the first
pass's outputs, as with RL rollouts and repeated prompts). Reported per batch size: outputs
identical, outputs that part at a near tie of ``generate``'s own logits (rounding) and outputs
that diverge (a verifier bug), draft tokens accepted per forward pass, seconds, and at batch 1
the speed-up over ``generate``.

The cost of a verification pass as the tree grows is ``scripts/gpu_cost_curve.py``'s job.

Usage (from a checkout, the native module built; not part of CI)::

    python scripts/gpu_lossless.py --out lossless.json [--model llama-1b] [--smoke]

``--smoke``: the tiny shape, 4 short prompts, on whatever device there is.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_cost_curve import SHAPES, build_model  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prompts_for(vocab: int, count: int, seed: int) -> list[list[int]]:
    """Short patterns repeated (text that repeats, as n-gram drafting wants), 60-200 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        pattern = [rng.randrange(3, vocab) for _ in range(rng.randrange(8, 40))]
        out.append((pattern * 20)[: rng.randrange(60, 200)])
    return out


# A random model's logits have near ties; a tree pass and a one-token step round differently
# (other kernel shapes), so a tie can break the other way there. A verifier bug diverges where
# generate's choice was clear.
NEAR_TIE = 1e-4


def divergence(got: list[int], want: list[int], logits: torch.Tensor) -> str:
    """``identical``, ``near_tie`` (the first differing token was within ``NEAR_TIE`` of
    generate's choice in generate's logits, relative to their scale) or ``diverged``."""
    if got == want:
        return "identical"
    step = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if step is None:  # one is a prefix of the other: a length bug, never rounding
        return "diverged"
    row = logits[step]
    gap = float(row[want[step]] - row[got[step]])  # >= 0 when generate took the argmax
    scale = max(float(row.abs().max()), 1.0)
    return "near_tie" if 0 <= gap <= NEAR_TIE * scale else "diverged"


@torch.inference_mode()
def compare(model, device: str, prompts: list[list[int]], max_new: int, batch: int) -> dict:
    """``generate`` prompt by prompt, then the HF loop in batches of ``batch``, cold and warm."""
    from lookahead_client.embedded import EmbeddedDrafter
    from lookahead_client.hf import speculative_generate

    reference, reference_logits = [], []
    _sync(device)
    started = time.perf_counter()
    for p in prompts:  # one by one: generate pads a batch, the loop does not
        ids = torch.tensor([p], device=device)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,
        )
        reference.append(out.sequences[0, len(p) :].tolist())
        reference_logits.append(torch.cat(out.logits).float().cpu())
    _sync(device)
    generate_s = time.perf_counter() - started
    drafter = EmbeddedDrafter()
    passes = []
    for name in ("cold", "warm"):
        _sync(device)
        started = time.perf_counter()
        tokens, accepted, forward_passes = [], 0, 0
        for i in range(0, len(prompts), batch):
            result = speculative_generate(
                model,
                prompts[i : i + batch],
                drafter,
                max_new_tokens=max_new,
                budget=8,
                sizing=False,
            )
            tokens += result.tokens
            accepted += sum(result.accepted)
            forward_passes += result.forward_passes
        _sync(device)
        seconds = time.perf_counter() - started
        verdicts = [
            divergence(got, want, logits)
            for got, want, logits in zip(tokens, reference, reference_logits, strict=True)
        ]
        entry = {
            "pass": name,
            "identical": f"{verdicts.count('identical')}/{len(prompts)}",
            # first differing token a near tie in generate's own logits: rounding, not the loop
            "near_tie": verdicts.count("near_tie"),
            "diverged": verdicts.count("diverged"),
            # draft tokens accepted per forward pass, all requests of the batch together
            "accepted_per_pass": round(accepted / max(forward_passes, 1), 3),
            "forward_passes": forward_passes,
            "seconds": round(seconds, 2),
        }
        if batch == 1:  # generate ran one by one too
            entry["speedup_over_generate"] = round(generate_s / seconds, 3)
        passes.append(entry)
        print(f"batch {batch}: {json.dumps(entry)}", flush=True)
    return {"generate_seconds": round(generate_s, 2), "passes": passes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON written")
    parser.add_argument("--model", default="llama-1b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.prompts, args.max_new_tokens = "tiny", 4, 16
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers

    report: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": f"{args.model}, random weights, float32, eager attention",
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "batches": {},
    }
    print(json.dumps(report), flush=True)
    # Eager attention: SDPA picks kernels by query length, whose rounding differs between a
    # one-token step and a tree, and a random model's logits have near ties.
    torch.manual_seed(0)  # the same random weights on every run
    model = build_model(args.model, device, torch.float32, attention="eager")
    # No stop token for either side: random weights have no end of text, and generate's
    # min_new_tokens would mask the config's EOS logit where the loop does not.
    model.generation_config.eos_token_id = None
    prompts = prompts_for(model.config.vocab_size, args.prompts, seed=1)
    for batch in (1, 4):
        report["batches"][str(batch)] = compare(model, device, prompts, args.max_new_tokens, batch)
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"written: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
