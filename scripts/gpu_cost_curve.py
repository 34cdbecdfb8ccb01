#!/usr/bin/env python3
"""Measures the verify cost curve of realistic model shapes and the sizing policy it implies.

For each model shape (random weights, built from a config: no download), batch size and tree
width, one verification forward pass is timed the way ``lookahead_client.hf`` runs it: a
``[batch, slots]`` block of draft tokens over a KV cache of ``--context`` tokens per request,
with a 4D additive tree mask and tree position ids, torch SDPA attention, logits for every slot.
From the measured curve the script fits ``lookahead_client.cost.CostModel`` and, for drafts
of several qualities (a chain whose tokens are each right with probability ``a`` given the
previous one), lists the width the sizing policy would verify at each batch size and the
expected speed-up over plain decoding, including where it turns speculation off.

Writes ``cost_curve.json`` (every measurement, the fitted policy table, the environment) and
``cost_curve.png`` (matplotlib when installed, else a plain raster drawn here: no labels).

Needs torch, transformers and numpy only (no sglang, no hub, no network, no lookahead native
extension): run it from a checkout, ``python scripts/gpu_cost_curve.py``. Defaults: the 1B and
8B Llama 3 shapes in bf16 on ``cuda``, batch sizes 1-64, widths 1-16, 1024 context tokens,
stopping early (with what it has) when ``--time-budget`` seconds are spent. ``--dry-run`` runs
a tiny shape on the CPU in seconds (the test suite does).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import platform
import statistics
import struct
import sys
import time
import zlib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

# Llama shapes (vocabulary, hidden, intermediate, layers, heads, KV heads): Llama 3.2 1B,
# Llama 3.1 8B; SmolLM2-135M for a CPU run; a tiny one for the dry run.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
    "llama-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
    ),
    "tiny": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}

#: Draft qualities of the policy table: each chain token is right with this probability
#: given the previous one (0.3: weak chat drafts; 0.9: code edits copying their input).
ACCEPTANCE = (0.3, 0.5, 0.7, 0.9)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def build_model(shape: str, device: str, dtype, attention: str = "sdpa"):
    """A random-weight Llama of the given shape, in eval mode, with SDPA attention (or
    ``attention``, a transformers ``attn_implementation``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # rope_theta and attn_implementation go through the config's **kwargs (transformers 5
    # declares neither in its signature)
    settings: dict[str, Any] = {
        **SHAPES[shape],
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "attn_implementation": attention,
    }
    config = LlamaConfig(**settings)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in the target dtype: no float32 copy
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def filled_cache(model, batch: int, context: int, device: str, dtype):
    """A ``DynamicCache`` holding ``context`` random KV entries per request and layer."""
    import torch
    from transformers import DynamicCache

    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    shape = (batch, cfg.num_key_value_heads, context, head_dim)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(shape, device=device, dtype=dtype)
        cache.update(k, torch.randn_like(k), layer)
    return cache


def tree_inputs(batch: int, slots: int, context: int, vocab: int, device: str, dtype, seed: int):
    """Random draft tokens under random trees: ids, positions and the additive 4D mask."""
    import torch

    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, slots)]
    allowed = torch.zeros(slots, slots, dtype=torch.bool)
    depth = [0] * slots
    for i, p in enumerate(parents):
        if p >= 0:
            allowed[i] = allowed[p]
            depth[i] = depth[p] + 1
        allowed[i, i] = True
    mask = torch.cat([torch.ones(slots, context, dtype=torch.bool), allowed], dim=1)
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    ids = torch.randint(0, vocab, (batch, slots), generator=g)
    positions = torch.tensor(depth)[None, :] + context
    return (
        ids.to(device),
        positions.expand(batch, slots).to(device),
        additive[None, None].expand(batch, 1, slots, context + slots).to(device),
    )


class Timer:
    """Times a callable on the device: CUDA events on a GPU, the wall clock elsewhere."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device.startswith("cuda")
        self.torch = torch

    def __call__(self, fn) -> float:
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t


def _verify_step(model, cache, ids, positions, mask, context: int) -> None:
    """One verification forward pass; the cache is cut back to ``context`` entries after."""
    import torch

    with torch.inference_mode():
        model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :context]
        layer.values = layer.values[:, :, :context]


def measure(model, shape, args, dtype, deadline: float, log) -> list[dict]:
    """The median verify time of every (batch, width), largest batches first per width
    group so that running out of time loses the least informative points last."""
    import torch

    timer = Timer(args.device)
    points = []
    vocab = model.config.vocab_size
    for batch in args.batch_sizes:
        if time.monotonic() > deadline:
            log(f"{shape}: time budget spent, batch sizes from {batch} on skipped")
            break
        cache = filled_cache(model, batch, args.context, args.device, dtype)
        for slots in args.slots:
            ids, pos, mask = tree_inputs(
                batch, slots, args.context, vocab, args.device, dtype, slots
            )

            step = functools.partial(_verify_step, model, cache, ids, pos, mask, args.context)
            for _ in range(args.warmup):
                timer(step)
            times = [timer(step) for _ in range(args.repeats)]
            seconds = statistics.median(times)
            points.append(
                {
                    "batch": batch,
                    "slots": slots,
                    "tokens": batch * slots,
                    "context": batch * args.context,
                    "pairs": batch * slots * (args.context + slots),
                    "seconds": seconds,
                    "all_seconds": times,
                }
            )
        del cache
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        row = [p for p in points if p["batch"] == batch]
        log(
            f"{shape} batch {batch:3d}: "
            + " ".join(f"{p['slots']}:{p['seconds'] * 1e3:.1f}ms" for p in row)
        )
    return points


def policy_table(points: list[dict], context: int) -> dict:
    """For each draft quality and measured batch size: the width the sizing policy verifies
    (on the measured curve, fitted) and the expected speed-up over plain decoding."""
    from lookahead_client.cost import CostModel
    from lookahead_client.hf.sizing import SizingPolicy
    from lookahead_client.types import DraftTree

    cost = CostModel.from_measurements(points)
    widest = max(p["slots"] for p in points)
    batches = sorted({p["batch"] for p in points})
    table = {}
    for a in ACCEPTANCE:
        scores = tuple(a**k for k in range(1, widest))
        tree = DraftTree(0, tuple(range(1, widest)), tuple(range(-1, widest - 2)), scores)
        rows = []
        for bs in batches:
            policy = SizingPolicy(cost, learn_cost=False, explore=False)
            plan = policy.plan([tree] * bs, [context] * bs, max_nodes=widest - 1)
            plain = float(cost.predict(bs, bs * context, bs * (context + 1))[0])
            if plan.predicted_seconds is None:  # the policy was given a measured model
                raise RuntimeError("the sizing policy predicted no step time")
            rate = plan.expected_tokens / plan.predicted_seconds
            rows.append(
                {
                    "batch": bs,
                    "width": plan.num_slots,
                    "expected_tokens_per_request": round(plan.expected_tokens / bs, 3),
                    "speedup_over_plain": round(rate / (bs / plain), 3),
                }
            )
        off = [r["batch"] for r in rows if r["width"] == 1]
        table[str(a)] = {"rows": rows, "off_from_batch": min(off) if off else None}
    curve = {
        str(bs): [
            round(float(x), 6)
            for x in cost.predict(
                [bs * d for d in range(1, widest + 1)],
                bs * context,
                [bs * d * (context + d) for d in range(1, widest + 1)],
            )
        ]
        for bs in batches
    }
    return {"acceptance": table, "fitted_seconds": curve, "fit_error": _fit_error(cost, points)}


def _fit_error(cost, points) -> float:
    """The largest relative gap between the fitted and the measured times."""
    import numpy as np

    got = cost.predict(
        [p["tokens"] for p in points], [p["context"] for p in points], [p["pairs"] for p in points]
    )
    want = np.asarray([p["seconds"] for p in points])
    return round(float(np.max(np.abs(got - want) / want)), 4)


# -- the picture ----------------------------------------------------------------------------


def plot(results: dict, path: pathlib.Path) -> str:
    """Writes the PNG (matplotlib when importable); returns how it was drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _raster_plot(results, path)
        return "raster (matplotlib not installed: lines only, no labels)"
    models = list(results["models"])
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 9), squeeze=False)
    for col, name in enumerate(models):
        m = results["models"][name]
        ax = axes[0][col]
        for bs in sorted({p["batch"] for p in m["points"]}):
            pts = sorted((p["slots"], p["seconds"]) for p in m["points"] if p["batch"] == bs)
            base = pts[0][1]
            ax.plot([s for s, _ in pts], [t / base for _, t in pts], marker="o", label=f"bs {bs}")
        ax.set_title(f"{name}: verify time / plain step time")
        ax.set_xlabel("slots per request (1 = plain decoding)")
        ax.set_ylabel("relative step time")
        ax.legend(fontsize=7)
        ax = axes[1][col]
        for a, entry in m["policy"]["acceptance"].items():
            rows = entry["rows"]
            ax.plot(
                [r["batch"] for r in rows],
                [r["width"] for r in rows],
                marker="o",
                label=f"accept {a}",
            )
        ax.set_xscale("log", base=2)
        ax.set_title(f"{name}: width chosen by the sizing policy")
        ax.set_xlabel("batch size")
        ax.set_ylabel("slots per request (1 = speculation off)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{results['device']} — context {results['context']} tokens, {results['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


def _to_pixel(point: tuple[float, float], box: tuple) -> tuple[float, float]:
    left, top, w, h, x_lo, x_hi, y_lo, y_hi = box
    x, y = point
    return left + (x - x_lo) / (x_hi - x_lo) * w, top + h - (y - y_lo) / (y_hi - y_lo) * h


def _raster_plot(results: dict, path: pathlib.Path, width: int = 900, height: int = 600) -> None:
    """The same panels as polylines on a white canvas, written as an RGB PNG (zlib only)."""
    canvas = bytearray(b"\xff" * (width * height * 3))
    colors = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
    ]

    def line(x0, y0, x1, y1, color):
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for i in range(steps + 1):
            x = round(x0 + (x1 - x0) * i / steps)
            y = round(y0 + (y1 - y0) * i / steps)
            if 0 <= x < width and 0 <= y < height:
                canvas[(y * width + x) * 3 : (y * width + x) * 3 + 3] = bytes(color)

    models = list(results["models"])
    panel_w, panel_h = width // max(len(models), 1), height // 2
    for col, name in enumerate(models):
        m = results["models"][name]
        panels = []
        for bs in sorted({p["batch"] for p in m["points"]}):
            pts = sorted((p["slots"], p["seconds"]) for p in m["points"] if p["batch"] == bs)
            panels.append((0, [(s, t / pts[0][1]) for s, t in pts]))
        for entry in m["policy"]["acceptance"].values():
            panels.append((1, [(math.log2(r["batch"]), r["width"]) for r in entry["rows"]]))
        for row in (0, 1):
            series = [pts for r, pts in panels if r == row]
            xs = [x for pts in series for x, _ in pts] or [0.0]
            ys = [y for pts in series for _, y in pts] or [0.0]
            x_lo, x_hi = min(xs), max(max(xs), min(xs) + 1e-9)
            y_lo, y_hi = min(0.0, min(ys)), max(max(ys), 1e-9)
            left, top = col * panel_w + 40, row * panel_h + 20
            w, h = panel_w - 60, panel_h - 50
            line(left, top + h, left + w, top + h, (0, 0, 0))
            line(left, top, left, top + h, (0, 0, 0))
            box = (left, top, w, h, x_lo, x_hi, y_lo, y_hi)
            for i, pts in enumerate(series):
                for a, b in zip(pts, pts[1:], strict=False):
                    line(*_to_pixel(a, box), *_to_pixel(b, box), colors[i % len(colors)])
    raw = b"".join(
        b"\x00" + bytes(canvas[y * width * 3 : (y + 1) * width * 3]) for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    path.write_bytes(png)


# -- command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="llama-1b,llama-8b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--batch-sizes", type=_ints, default=_ints("1,2,4,8,16,32,64"))
    parser.add_argument(
        "--slots",
        type=_ints,
        default=list(range(1, 17)),
        help="tree widths, root included (1 = plain decoding)",
    )
    parser.add_argument("--context", type=int, default=1024, help="cached tokens per request")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--time-budget",
        type=float,
        default=270.0,
        help="seconds; later measurements are skipped once spent",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--out-dir", default=".", help="where cost_curve.json/.png go")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny shape on the CPU, 2 batch sizes, 3 widths (seconds)",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        args.models, args.device, args.dtype = "tiny", "cpu", "float32"
        args.batch_sizes, args.slots, args.context = [1, 2], [1, 2, 4], 16
        args.warmup, args.repeats = 1, 2

    import torch
    import transformers

    started = time.monotonic()
    deadline = started + args.time_budget

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU (use --device cpu or --dry-run)")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.device.startswith("cuda"):
        device_name = torch.cuda.get_device_name(args.device)
    else:
        cpu = platform.processor() or platform.machine()
        device_name = f"CPU ({cpu}, {torch.get_num_threads()} threads)"
    results = {
        "device": device_name,
        "dtype": args.dtype,
        "context": args.context,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "acceptance_profiles": list(ACCEPTANCE),
        "models": {},
    }
    for shape in args.models.split(","):
        if shape not in SHAPES:
            parser.error(f"unknown model shape {shape!r} (known: {', '.join(SHAPES)})")
        if time.monotonic() > deadline:
            log(f"time budget spent, {shape} skipped")
            continue
        log(f"{shape}: building random weights ({args.dtype}, {args.device})")
        model = build_model(shape, args.device, dtype)
        params = sum(p.numel() for p in model.parameters())
        points = measure(model, shape, args, dtype, deadline, log)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        if not points:
            continue
        entry = {"shape": SHAPES[shape], "parameters": params, "points": points}
        entry["policy"] = policy_table(points, args.context)
        for a, t in entry["policy"]["acceptance"].items():
            widths = " ".join(f"{r['batch']}:{r['width']}" for r in t["rows"])
            log(f"{shape} accept {a}: width by batch {widths}; off from {t['off_from_batch']}")
        results["models"][shape] = entry
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_curve.json").write_text(json.dumps(results, indent=1))
    drawn = plot(results, out / "cost_curve.png")
    log(f"wrote {out / 'cost_curve.json'} and {out / 'cost_curve.png'} ({drawn})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
