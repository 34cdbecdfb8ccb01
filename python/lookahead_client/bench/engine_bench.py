"""What the engine benchmarks (``lookahead-bench vllm``, ``sglang``) share: the model, the
prompt sets, the layout of a trial's result, and its summaries over rounds (:mod:`.rounds`).

A trial's process writes, per workload::

    {"n": samples per prompt, "temperature": ...,
     "prompts": [{"id", "half", "seconds", "tokens", "outputs": [[token, ...], ...],
                  "counters": {...}}, ...],
     "batch": {"seconds", "tokens", "outputs": [[[token, ...], ...], ...]},
     "counters_batch": {...}}

(``prompts``: the batch-1 pass, one prompt at a time; ``batch``: the full batch; counters: the
engine's own, read around each batch-1 prompt and around the full batch, which each benchmark
turns into per-step figures: a half's figures are its own prompts').
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..errors import InvalidArgumentError
from .rounds import (
    BASELINE,
    STRAY_FACTOR,
    Spread,
    Trial,
    TrialCost,
    compare,
    paired_text,
    run_children,
    speedups,
    strays,
)

__all__ = [
    "MODEL_DIR",
    "Column",
    "add_engine_arguments",
    "check_engine_arguments",
    "config_names",
    "cell",
    "run_trial_processes",
    "sum_counters",
    "delta",
    "distinct_prompts",
    "cores_per_engine",
    "ensure_model",
    "number",
    "pass_counters",
    "pass_figures",
    "plot",
    "print_costs",
    "print_tables",
    "prompt_ratios",
    "report",
    "summarise",
    "versus",
    "workload_prompt_sets",
    "workload_prompts_by_stem",
]


#: Where the engine benchmarks and the engine tests keep SmolLM2 converted from its GGUF,
#: relative to the checkout (ignored by git).
MODEL_DIR = "bench-out/smollm2-135m-hf"


def ensure_model(folder: pathlib.Path) -> pathlib.Path:
    """The SmolLM2 Hugging Face folder, converted from the GGUF the first time."""
    if (folder / "config.json").exists():
        return folder
    from lookahead_client.bench.hf import load_smollm2

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


def workload_prompts_by_stem(
    workloads: Sequence[str], folder: pathlib.Path, max_tokens: int
) -> dict[str, list[dict[str, Any]]]:
    """Per workload (by file stem), its prompts re-encoded for the model in ``folder``, in
    file order: ``id``, ``group``, ``half`` (A/B: alternate prompt groups) and ``ids``."""
    from transformers import AutoTokenizer

    from lookahead_client.bench.hf import workload_prompts

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return {
        pathlib.Path(path).stem: [
            {"id": p.id, "group": p.group, "half": p.half, "ids": p.ids}
            for p in workload_prompts(path, tokenizer, max_prompt_tokens=max_tokens)
        ]
        for path in workloads
    }


def distinct_prompts(prompts: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The prompts whose ids were not seen before (rollout files repeat each prompt once per
    sample)."""
    seen: set[tuple[int, ...]] = set()
    for p in prompts:
        key = tuple(p["ids"])
        if key not in seen:
            seen.add(key)
            yield p


def cores_per_engine(engines: int) -> int:
    """This machine's cores shared out between ``engines`` engines running at once."""
    return max(1, (os.cpu_count() or 1) // engines)


def workload_prompt_sets(
    workloads: Sequence[str], folder: pathlib.Path, per_half: int, max_tokens: int
):
    """Per workload (by file stem), two disjoint sets of distinct prompts re-encoded for the
    model in ``folder``: ``batch1``, the first ``per_half`` of each half (A/B: alternate prompt
    groups), generated one by one; ``batch``, the next ``per_half`` of each, generated at once
    (a pass must not regenerate what the drafters saw the other pass generate)."""
    out = {}
    for stem, prompts in workload_prompts_by_stem(workloads, folder, max_tokens).items():
        halves: dict[str, list] = {"A": [], "B": []}
        for p in distinct_prompts(prompts):
            if len(halves[p["half"]]) < 2 * per_half:
                halves[p["half"]].append(p)
        out[stem] = {
            "batch1": halves["A"][:per_half] + halves["B"][:per_half],
            "batch": halves["A"][per_half:] + halves["B"][per_half:],
        }
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """``after - before``, key by key (counters read around a pass)."""
    return {k: after[k] - before.get(k, 0.0) for k in after}


def pass_figures(run: dict, name: str, keep: Sequence[int]) -> tuple[float, int, list]:
    """(seconds, output tokens, each prompt's outputs) of one pass over a workload."""
    if name == "batch1":
        rows = [run["prompts"][i] for i in keep]
        return (
            sum(r["seconds"] for r in rows),
            sum(r["tokens"] for r in rows),
            [r["outputs"] for r in rows],
        )
    return run["batch"]["seconds"], run["batch"]["tokens"], run["batch"]["outputs"]


def pass_counters(run: dict, name: str, keep: Sequence[int]) -> dict[str, float]:
    """The engine's counters over one pass of a workload (``batch1``: the ``keep`` prompts')."""
    if name == "batch1":
        return sum_counters([run["prompts"][i]["counters"] for i in keep])
    return run["counters_batch"]


def per_token(seconds: float, tokens: int) -> float:
    """Seconds per output token: what speed-ups compare. Sampled outputs end where their EOS
    falls, so two configurations' passes over the same prompts write different amounts of
    text; per token, a pass that stopped early does not count as fast."""
    return seconds / max(tokens, 1)


def _prompt_per_token(result: dict, workload: str, i: int) -> float:
    """Seconds per output token of the ``i``-th batch-1 prompt in a child's ``result``."""
    prompt = result["workloads"][workload]["prompts"][i]
    return per_token(prompt["seconds"], prompt["tokens"])


def _prompt_speedups(
    rounds: Sequence[dict[str, dict]], workload: str, i: int, name: str, against: str
) -> list[float]:
    """Per round, ``name``'s speed over ``against``'s on the ``i``-th batch-1 prompt."""
    return [
        _prompt_per_token(r[against], workload, i) / _prompt_per_token(r[name], workload, i)
        for r in rounds
    ]


def _strays(token_seconds: Sequence[float]) -> list[dict[str, float]]:
    """A configuration's stray rounds (1-based) and how many times its median it took."""
    typical = statistics.median(token_seconds)
    return [
        {"round": i + 1, "times": round(token_seconds[i] / typical, 2)}
        for i in strays(token_seconds)
    ]


def summarise(
    rounds: Sequence[dict[str, dict]],
    workload: str,
    half: str | None,
    per_step: Callable[[list[dict[str, float]], int], dict[str, Any]],
    cap: int | None = None,
) -> dict:
    """Per configuration, over rounds, for each pass (``batch1``, and ``batch`` when ``half``
    is None): tokens/s and the speed-up over the same round's ``plain`` in time per output
    token (:func:`per_token`; medians; ``ranges`` holds each one's [min, max]), identical
    outputs (``identical_batch1``: the prompts equal to plain's in every round;
    ``identical_batch``: all of them; None when sampled), what the configuration did per
    engine step, its stray trials (``strays_batch1``, ``strays_batch``: ``{"round", "times"}``,
    1-based, and how many times its median time a token it took; see
    :func:`.rounds.strays`), and with ``cap`` the share of its sequences that ran to it
    (``at_cap_batch1``, ``at_cap_batch``).

    Args:
        rounds: per round, each configuration's child result.
        half: ``"A"`` or ``"B"`` for the batch-1 prompts of one half, None for all.
        per_step: the engine's per-step figures from a pass's counters in each round and the
            tokens emitted in them.
        cap: the most tokens a sequence was allowed (``--max-new-tokens``).
    """
    plain = rounds[0][BASELINE]["workloads"][workload]
    keep = [i for i, p in enumerate(plain["prompts"]) if half is None or p["half"] == half]
    passes = ["batch1"]
    if half is None and plain["batch"]["outputs"]:
        passes.append("batch")
    out: dict[str, dict] = {
        name: {"prompts": len(keep), "rounds": len(rounds), "ranges": {}} for name in rounds[0]
    }
    for p in passes:
        measured = [
            {c: pass_figures(res["workloads"][workload], p, keep) for c, res in r.items()}
            for r in rounds
        ]
        token_seconds = {c: [per_token(*r[c][:2]) for r in measured] for c in out}
        fast = speedups([{c: token_seconds[c][i] for c in out} for i in range(len(rounds))])
        for name, entry in out.items():
            runs = [r[name] for r in measured]
            bases = [r[BASELINE] for r in measured]
            tok_s = Spread.of(tokens / seconds for seconds, tokens, _ in runs)
            # A prompt counts as identical only when it is identical in every round.
            identical = sum(
                all(run[2][i] == base[2][i] for run, base in zip(runs, bases, strict=True))
                for i in range(len(runs[0][2]))
            )
            sampled = rounds[0][name]["workloads"][workload]["temperature"] > 0
            entry.update(
                {
                    f"tok_s_{p}": round(tok_s.median, 2),
                    f"speedup_{p}": round(fast[name].median, 3),
                    f"identical_{p}": None
                    if sampled
                    else (identical if p == "batch1" else identical == len(runs[0][2])),
                    f"per_step_{p}": per_step(
                        [pass_counters(r[name]["workloads"][workload], p, keep) for r in rounds],
                        sum(tokens for _, tokens, _ in runs),
                    ),
                }
            )
            if cap is not None:
                lengths = [len(seq) for run in runs for prompt in run[2] for seq in prompt]
                entry[f"at_cap_{p}"] = round(sum(n >= cap for n in lengths) / len(lengths), 3)
            entry[f"strays_{p}"] = _strays(token_seconds[name])
            entry["ranges"][f"tok_s_{p}"] = [round(tok_s.low, 2), round(tok_s.high, 2)]
            entry["ranges"][f"speedup_{p}"] = [round(fast[name].low, 3), round(fast[name].high, 3)]
    for name, entry in out.items():
        per_prompt = [
            Spread.of(_prompt_speedups(rounds, workload, i, name, BASELINE)).median for i in keep
        ]
        entry["slowest_prompt_speedup"] = round(min(per_prompt), 3) if per_prompt else None
        entry["prompts_over_5pct_slower"] = sum(x < 1 / 1.05 for x in per_prompt)
    return out


def prompt_ratios(
    rounds: Sequence[dict[str, dict]], workload: str, ours: str, rival: str
) -> list[dict[str, Any]]:
    """Each batch-1 prompt's ``{"id", "ratio"}``: ``ours``' speed over ``rival``'s on that
    prompt, the geometric mean over rounds of the two's time per output token. A verdict's
    interval is the rounds' (how sure the timing is); these say whether every prompt of the
    cell agrees with it, or one prompt makes it."""
    prompts = rounds[0][BASELINE]["workloads"][workload]["prompts"]
    return [
        {
            "id": prompt["id"],
            "ratio": round(
                statistics.geometric_mean(_prompt_speedups(rounds, workload, i, ours, rival)), 3
            ),
        }
        for i, prompt in enumerate(prompts)
    ]


def versus(
    rounds: Sequence[dict[str, dict]],
    workload: str,
    engine_drafters: Sequence[str],
    pairs: Sequence[tuple[str, str]] = (),
) -> dict[str, dict]:
    """Each lookahead configuration against the best of the engine's own drafters in the run
    (by median speed-up, per pass) and against ``null`` when it ran, paired round by round
    in time per output token (see :func:`.rounds.compare`, :func:`per_token`):
    ``{config: {pass: [{"against", "verdict", "ratio"}]}}``, at batch 1 with each prompt's
    own ratio (``per_prompt``, :func:`prompt_ratios`); where either one has a stray
    trial (:func:`.rounds.strays`) and two rounds are left without them, the entry's
    ``without_strays`` holds those rounds' ``verdict`` and ``ratio`` and which ``rounds``
    were left out (1-based).

    Args:
        engine_drafters: the names (before any ``:``) of the engine's own drafters.
        pairs: more comparisons, ``(config, against)``, made where both ran.
    """
    names = list(rounds[0])
    theirs = [n for n in names if n.partition(":")[0] in engine_drafters]
    ours = [n for n in names if n.startswith("lookahead")]
    plain = rounds[0][BASELINE]["workloads"][workload]
    keep = range(len(plain["prompts"]))
    passes = ["batch1"] + (["batch"] if plain["batch"]["outputs"] else [])
    out: dict[str, dict] = {}
    for p in passes:
        token_seconds = {
            c: [per_token(*pass_figures(r[c]["workloads"][workload], p, keep)[:2]) for r in rounds]
            for c in names
        }
        fast = speedups([{c: token_seconds[c][i] for c in names} for i in range(len(rounds))])
        rivals = []
        if theirs:
            rivals.append(max(theirs, key=lambda c: fast[c].median))
        if "null" in names:
            rivals.append("null")
        wanted = [(o, r) for o in ours for r in rivals]
        wanted += [(a, b) for a, b in pairs if a in names and b in names]
        for ours_name, rival in wanted:
            a, b = token_seconds[ours_name], token_seconds[rival]
            verdict, paired = compare(a, b)
            entry: dict[str, Any] = {
                "against": rival,
                "verdict": verdict,
                "ratio": paired.as_dict(),
            }
            if p == "batch1":
                entry["per_prompt"] = prompt_ratios(rounds, workload, ours_name, rival)
            strayed = sorted({*strays(a), *strays(b)})
            kept = [i for i in range(len(a)) if i not in strayed]
            if strayed and len(kept) >= 2:
                verdict, paired = compare([a[i] for i in kept], [b[i] for i in kept])
                entry["without_strays"] = {
                    "rounds": [i + 1 for i in strayed],
                    "verdict": verdict,
                    "ratio": paired.as_dict(),
                }
            out.setdefault(ours_name, {}).setdefault(p, []).append(entry)
    return out


def plot(path: str, table: dict[str, dict[str, dict]], title: str) -> None:
    """Speed-up bars (median, min-max whiskers) per workload, batch 1 and full batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    workloads = list(table)
    configs = list(next(iter(table.values())))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(configs)
    for ax, key, which in (
        (axes[0], "speedup_batch1", "batch 1"),
        (axes[1], "speedup_batch", "full batch"),
    ):
        for c, name in enumerate(configs):
            entries = [table[w][name] for w in workloads]
            values = [e.get(key, 0.0) for e in entries]
            ranges = [e["ranges"].get(key, [v, v]) for e, v in zip(entries, values, strict=True)]
            errors = np.array(
                [[v - lo, hi - v] for v, (lo, hi) in zip(values, ranges, strict=True)]
            )
            x = np.arange(len(workloads)) + c * width
            ax.bar(x, values, width, yerr=errors.T, capsize=2, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(workloads)) + 0.4 - width / 2, workloads, rotation=20)
        ax.set_ylabel("tokens/s over plain (median, min-max of rounds)")
        ax.set_title(f"{title}, {which}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _same(entry: dict, p: str) -> str:
    same = entry.get(f"identical_{p}")
    if same is None:
        return "n/a"
    ok = same == entry["prompts"] if p == "batch1" else same
    return "yes" if ok else "NO"


#: A column of the printed tables: its header, its width, and its cell from a configuration's
#: entry of :func:`summarise` and the pass (``batch1``/``batch``).
Column = tuple[str, int, Callable[[dict, str], str]]


def number(value: float | None, digits: int = 2) -> str:
    """A table cell: ``-`` for None."""
    return "-" if value is None else f"{value:.{digits}f}"


def cell(key: str, section: str | None = None) -> Callable[[dict, str], str]:
    """A column's cell: ``per_step_<pass>[key]`` of an entry (within ``[section]`` when
    given; ``-`` where the configuration has none)."""

    def show(entry: dict, p: str) -> str:
        figures = entry[f"per_step_{p}"]
        if section is not None:
            figures = figures.get(section) or {}
        return number(figures.get(key))

    return show


def print_tables(
    table: dict,
    halves: dict,
    verdicts: dict,
    describe: Callable[[str], str],
    columns: Sequence[Column],
) -> None:
    """The summary of every workload: per pass, each configuration's tokens/s, speed-up
    (median [min-max] over rounds), the engine's ``columns`` and identical outputs; then the
    halves at batch 1 and the paired verdicts.

    Args:
        describe: a workload's heading (what ran on it).
    """
    for w, rows in table.items():
        rounds = next(iter(rows.values()))["rounds"]
        print(
            f"\n{w} ({describe(w)}; {rounds} round(s): median [min-max] of each round's ratio "
            "to its plain)"
        )
        for p, title in (("batch1", "batch 1"), ("batch", "full batch")):
            if f"speedup_{p}" not in rows[BASELINE]:
                continue
            head = "".join(f" {h:>{width}}" for h, width, _ in columns)
            print(f"  {title:16} {'tok/s':>7} {'x plain':>21}{head} {'same':>4}")
            for name, e in rows.items():
                low, high = e["ranges"][f"speedup_{p}"]
                fast = Spread(e[f"speedup_{p}"], low, high, rounds)
                cells = "".join(f" {cell(e, p):>{width}}" for _, width, cell in columns)
                print(f"  {name:16} {e[f'tok_s_{p}']:7.1f} {fast!s:>21}{cells} {_same(e, p):>4}")
        _print_capped(rows[BASELINE])
        _print_strays(rows)
        print(
            "  halves A/B at batch 1: "
            + ", ".join(
                f"{name} {halves[w]['A'][name]['speedup_batch1']:.2f}/"
                f"{halves[w]['B'][name]['speedup_batch1']:.2f}"
                for name in rows
            )
        )
        for name, by_pass in verdicts.get(w, {}).items():
            for p, items in by_pass.items():
                for v in items:
                    text = paired_text(v["ratio"])
                    print(f"  {name} vs {v['against']} ({p}): {v['verdict']} ({text})")
                    if "per_prompt" in v:
                        ratios = [x["ratio"] for x in v["per_prompt"]]
                        below = sum(r < 1.0 for r in ratios)
                        print(
                            f"    per prompt, below 1 on {below} of {len(ratios)}: "
                            + ", ".join(f"{r:.3f}" for r in ratios)
                        )
                    if "without_strays" in v:
                        left = v["without_strays"]
                        rounds_out = ", ".join(map(str, left["rounds"]))
                        print(
                            f"    without stray round(s) {rounds_out}: {left['verdict']} "
                            f"({paired_text(left['ratio'])})"
                        )


def _print_capped(plain: dict) -> None:
    """How many of plain's sequences ran to ``--max-new-tokens``, per pass; where all of a
    batch's did, why drafts there save so few engine steps."""
    shares: dict[str, float] = {
        title: plain[f"at_cap_{p}"]
        for p, title in (("batch1", "batch 1"), ("batch", "full"))
        if plain.get(f"at_cap_{p}") is not None
    }
    if not shares:
        return
    line = ", ".join(f"{t} {100 * s:.0f}%" for t, s in shares.items())
    print(f"  plain's sequences that ran to --max-new-tokens: {line}")
    if any(s >= 0.9 for s in shares.values()):
        print(
            "    (a batch of several sequences that all run to the cap is done with its slowest"
            " one:\n     an accepted draft token saves an engine step only when every slowest"
            " sequence accepts one then)"
        )


def _print_strays(rows: dict[str, dict]) -> None:
    """The trials that took over :data:`.rounds.STRAY_FACTOR` times their configuration's
    median, per pass, where there are any."""
    found = [
        f"{name} {title} round {s['round']} ({s['times']:.1f}x)"
        for p, title in (("batch1", "batch 1"), ("batch", "full batch"))
        for name, e in rows.items()
        for s in e.get(f"strays_{p}", ())
    ]
    if found:
        print(
            f"  stray trials (over {STRAY_FACTOR}x their configuration's median time a token): "
            + ", ".join(found)
        )


def print_costs(costs: dict[str, list[dict]]) -> None:
    """Each configuration's trials: wall and CPU seconds (start-up included), and the load."""
    loads = [c["load"] for cs in costs.values() for c in cs]
    print(
        f"\ntrials (median over rounds, engine start-up included; machine load as each trial "
        f"started: median {Spread.of(loads).median:.2f}, max {max(loads):.2f})"
    )
    for name, cs in costs.items():
        wall = Spread.of(c["wall_s"] for c in cs)
        cpu = Spread.of(c["cpu_s"] for c in cs)
        print(f"  {name:16} wall {wall.median:6.1f} s  CPU {cpu.median:6.1f} s")


def report(
    done: Sequence[tuple[Trial, dict, TrialCost]],
    *,
    per_step: Callable[[list[dict[str, float]], int], dict[str, Any]],
    engine_drafters: Sequence[str],
    pairs: Sequence[tuple[str, str]] = (),
    describe: Callable[[str], str],
    columns: Sequence[Column],
    args: dict[str, Any],
    json_path: str | None,
    plot_path: str | None,
    plot_title: str,
) -> dict[str, Any]:
    """Summarises a run's trials (from :func:`.rounds.run_rounds`), prints the tables and the
    trials' costs, writes the JSON and the plot when asked; returns what the JSON holds:
    ``table[workload][config]`` (both halves), ``halves[workload][A|B][config]``,
    ``versus[workload][config]`` (see :func:`versus`, which gets ``engine_drafters`` and
    ``pairs``), ``trials[config]`` (costs) and ``rounds`` (every result, outputs included)."""
    count = 1 + max(trial.round for trial, _, _ in done)
    rounds: list[dict[str, dict]] = [{} for _ in range(count)]
    costs: dict[str, list] = {}
    for trial, result, cost in done:
        rounds[trial.round][trial.config] = result
        costs.setdefault(trial.config, []).append(
            {"round": trial.round, "position": trial.position, **cost.as_dict()}
        )
    workloads = list(rounds[0][BASELINE]["workloads"])
    cap = args.get("max_new_tokens")
    table = {w: summarise(rounds, w, None, per_step, cap) for w in workloads}
    halves = {w: {h: summarise(rounds, w, h, per_step, cap) for h in "AB"} for w in workloads}
    verdicts = {w: versus(rounds, w, engine_drafters, pairs) for w in workloads}
    print_tables(table, halves, verdicts, describe, columns)
    print_costs(costs)
    out = {
        "args": args,
        "table": table,
        "halves": halves,
        "versus": verdicts,
        "trials": costs,
        "rounds": rounds,
    }
    if json_path:
        pathlib.Path(json_path).write_text(json.dumps(out, indent=1))
        print(f"json: {json_path}")
    if plot_path:
        plot(plot_path, table, plot_title)
        print(f"plot: {plot_path}")
    return out


def sum_counters(counters: Sequence[dict[str, float]]) -> dict[str, float]:
    """Counters summed key by key (a pass's counters over rounds)."""
    out: dict[str, float] = {}
    for c in counters:
        for k, v in c.items():
            out[k] = out.get(k, 0.0) + v
    return out


def add_engine_arguments(
    parser: argparse.ArgumentParser, configs: Sequence[str], also: str
) -> None:
    """The options every engine benchmark takes: workloads, configurations, rounds, prompt
    sets, lengths, the model folder, and where the JSON and the plot go."""
    parser.add_argument(
        "--workload", action="append", required=True, metavar="PATH", help="repeatable"
    )
    parser.add_argument(
        "--configs",
        default=",".join(configs),
        help=f"comma-separated (plain always runs){also}",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds; each runs every configuration once, in a rotated order (default 3)",
    )
    parser.add_argument(
        "--prompts-per-half",
        type=int,
        default=2,
        help="distinct prompts (with several engines: prompt groups) of each half, A and B, "
        "in a pass; a few prompts speak for themselves more than for their workload (default 2)",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=1024,
        help="longer prompts are passed over (default 1024)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="tokens generated a request (default 128)"
    )
    parser.add_argument(
        "--model-dir",
        default=MODEL_DIR,
        help="SmolLM2-135M-Instruct's Hugging Face folder, converted from the GGUF when "
        f"missing (default {MODEL_DIR})",
    )
    parser.add_argument("--json", metavar="OUT", help="write everything (outputs included) here")
    parser.add_argument("--plot", metavar="OUT.png", help="speed-up bars per workload")


def check_engine_arguments(args: argparse.Namespace) -> None:
    """Refuses counts of :func:`add_engine_arguments` that no run can use.

    Raises:
        InvalidArgumentError: ``--prompts-per-half``, ``--max-prompt-tokens`` or
            ``--max-new-tokens`` below 1 (``field`` names it).
    """
    for field in ("prompts_per_half", "max_prompt_tokens", "max_new_tokens"):
        value = getattr(args, field)
        if value < 1:
            flag = "--" + field.replace("_", "-")
            raise InvalidArgumentError(f"{flag}: at least 1, got {value}", field=field)


def run_trial_processes(
    module: str,
    trial: Trial,
    spec: dict[str, Any],
    env: dict[str, str],
    tmp: str,
    *,
    server_env: Callable[[str], dict[str, str]] | None = None,
    cluster: bool = False,
    members_env: Callable[[str, int], dict[str, str]] | None = None,
    engines: int = 1,
) -> list[dict[str, Any]]:
    """Runs ``python -m module --child SPEC`` for one trial (``spec`` plus the trial's name
    and where to write), ``engines`` processes at once, and returns the result each wrote.

    Args:
        server_env: for a trial drafting from a server: a ``lookahead-server`` on a Unix
            socket runs for the trial (one for all its processes), and this gives the
            variables that point the engines at its address.
        cluster: with ``server_env``, a sidecar per engine instead, the sidecars joined as a
            cluster through a NATS server (:class:`.cluster.LocalCluster`).
        members_env: for a trial whose embedded drafters join a cluster: a NATS server runs
            for the trial, and this gives engine ``e``'s variables from its URL.
        engines: processes at once, one engine each (``engine``, ``engines`` and a
            ``barrier`` folder added to each one's spec, the cores shared out between them).
    """
    stem = pathlib.Path(tmp, f"r{trial.round}-{trial.config.replace(':', '-')}")
    outs = [stem.with_name(f"{stem.name}-e{e}.out.json") for e in range(engines)]
    commands = []
    for e, out in enumerate(outs):
        spec_file = out.with_name(f"{stem.name}-e{e}.json")
        own = {**spec, "name": trial.config, "out": str(out)}
        if engines > 1:
            own.update(engine=e, engines=engines, barrier=str(stem.with_suffix(".barrier")))
        spec_file.write_text(json.dumps(own))
        commands.append([sys.executable, "-m", module, "--child", str(spec_file)])
    if engines > 1:
        # More threads than cores makes engines side by side spin and wait at every step.
        env = {**env, "OMP_NUM_THREADS": str(cores_per_engine(engines))}
    if members_env is not None:
        from lookahead_client.processes.nats import NatsServerProcess

        with NatsServerProcess() as nats:
            run_children(
                [(c, {**env, **members_env(nats.url, e)}) for e, c in enumerate(commands)],
                trial,
            )
    elif server_env is None:
        run_children([(c, env) for c in commands], trial)
    elif cluster:
        from .cluster import LocalCluster

        with LocalCluster(engines) as sidecars:
            targets = [s.unix_target for s in sidecars.servers]
            run_children(
                [(c, {**env, **server_env(t)}) for c, t in zip(commands, targets, strict=True)],
                trial,
            )
    else:
        from lookahead_client.processes.server import ServerProcess

        with ServerProcess(tcp=False) as server:
            served = {**env, **server_env(server.unix_target)}
            run_children([(c, served) for c in commands], trial)
    return [json.loads(out.read_text()) for out in outs]


def check_server_binary(configs: Sequence[str]) -> None:
    """Refuses a configuration drafting from ``lookahead-server`` without its binary (and
    ``lookahead-cluster`` without a NATS server) before any trial runs (rather than after the
    trials before it).

    Raises:
        InvalidArgumentError: no binary (``field="configs"``; the message says how to get one).
    """
    from lookahead_client.processes.nats import find_nats_server
    from lookahead_client.processes.server import find_server_binary

    needs = {"lookahead-server": [find_server_binary]}
    needs["lookahead-cluster"] = [find_server_binary, find_nats_server]
    needs["lookahead-members"] = [find_nats_server]
    for config in configs:
        for find in needs.get(config, []):
            try:
                find()
            except FileNotFoundError as e:
                message = f"configuration {config}: {e}"
                raise InvalidArgumentError(message, field="configs") from None


def config_names(text: str, known: Iterable[str] | None = None) -> list[str]:
    """``--configs``: comma-separated names, blanks and repeats dropped, in order.

    Raises:
        InvalidArgumentError: a name not in ``known`` (when given), ``field="configs"``.
    """
    names = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    if known is not None:
        known = list(known)
        unknown = [c for c in names if c not in known]
        if unknown:
            raise InvalidArgumentError(
                f"unknown configuration {', '.join(unknown)}; known: {', '.join(known)}",
                field="configs",
            )
    return names
