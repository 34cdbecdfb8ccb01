"""Presenting replay results: result rows, the text table, the JSON file and the MAT plot."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .replay import ReplayResult, ReplaySettings

__all__ = [
    "COLUMNS",
    "check_plotting",
    "format_header",
    "format_row",
    "plot_mat",
    "result_row",
    "write_json",
]

#: Table columns: (title, row key, width, format).
COLUMNS = (
    ("workload", "workload", 16, "s"),
    ("drafter", "drafter", 20, "s"),
    ("B", "budget", 3, "d"),
    ("C", "concurrency", 3, "d"),
    ("R", "replicas", 2, "d"),
    ("sharing", "sharing", 7, "s"),
    ("admission", "admission", 10, "s"),
    ("requests", "requests", 8, "d"),
    ("steps", "steps", 9, "d"),
    ("accepted", "accepted", 9, "d"),
    ("MAT", "mat", 6, ".3f"),
    ("MAT 1st", "mat_first_half", 7, ".3f"),
    ("MAT 2nd", "mat_second_half", 7, ".3f"),
    ("tok/step", "tokens_per_step", 8, ".3f"),
    ("acc/exp", "accepted_over_expected", 7, ".2f"),
    ("wall s", "wall_s", 8, ".1f"),
)


def result_row(
    workload: str, path: str, drafter: str, settings: ReplaySettings, result: ReplayResult
) -> dict:
    """One JSON-ready row naming the run and holding its figures (``mat`` is the merit)."""
    return {
        "workload": workload,
        "workload_path": path,
        "drafter": drafter,
        "budget": settings.budget,
        "concurrency": settings.concurrency,
        "replicas": settings.replicas,
        "sharing": settings.sharing_label,
        "admission": settings.admission,
        "group_names": settings.group_names,
        "requests": result.requests,
        "steps": result.steps,
        "accepted": result.accepted,
        "mat": result.mat,
        "mat_first_half": result.phase_mat(0),
        "mat_second_half": result.phase_mat(1),
        "tokens_per_step": result.tokens_per_step,
        "expected": result.expected,
        "accepted_over_expected": result.accepted_over_expected,
        "engine_steps": result.engine_steps,
        "wall_s": result.wall_s,
        "drafter_s": result.drafter_s,
        "setup_s": result.setup_s,
        "drafter_stats": result.drafter_stats,
    }


def format_header() -> str:
    """The table's title line."""
    return "  ".join(
        f"{title:<{width}}" if fmt == "s" else f"{title:>{width}}"
        for title, _, width, fmt in COLUMNS
    )


def format_row(row: dict) -> str:
    """One table line (a figure that is None, such as ``acc/exp`` of a drafter without
    scores, shows as "-")."""
    return "  ".join(
        f"{row[key]:<{width}{fmt}}"
        if fmt == "s"
        else f"{'-' if row[key] is None else format(row[key], fmt):>{width}}"
        for _, key, width, fmt in COLUMNS
    )


def write_json(path: str | Path, rows: Sequence[dict], argv: Sequence[str]) -> None:
    """Writes the rows with a little context (command, time, Python, machine)."""
    doc = {
        "schema": "lookahead-bench.replay/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(argv),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": list(rows),
    }
    Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def check_plotting() -> None:
    """Raises ``ImportError`` with an install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "--plot needs matplotlib: pip install 'lookahead-client[bench]' "
            f"(or pip install matplotlib) ({exc})"
        ) from exc


def _setting_label(concurrency: int, replicas: int, sharing: str) -> str:
    label = f"C={concurrency} R={replicas}"
    return label + (f" {sharing}" if replicas > 1 else "")


def plot_mat(path: str | Path, rows: Sequence[dict]) -> None:
    """Draws MAT against budget: one panel per workload, a colour per drafter and a line
    style per setting (C, R, sharing), one legend for the figure."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    settings = list(dict.fromkeys((r["concurrency"], r["replicas"], r["sharing"]) for r in rows))
    colours = plt.get_cmap("tab10")
    styles = ["-", "--", ":", "-."]
    cols = min(len(workloads), 3)
    nrows = -(-len(workloads) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, workload in zip(axes.flat, workloads, strict=False):
        lines: dict[tuple[str, tuple], list[tuple[int, float]]] = {}
        for r in rows:
            if r["workload"] == workload:
                key = (r["drafter"], (r["concurrency"], r["replicas"], r["sharing"]))
                lines.setdefault(key, []).append((r["budget"], r["mat"]))
        for (drafter, setting), points in lines.items():
            points.sort()
            label = drafter
            if len(settings) > 1:
                label += " " + _setting_label(*setting)
            (line,) = ax.plot(
                [b for b, _ in points],
                [m for _, m in points],
                marker="o",
                color=colours(drafters.index(drafter) % 10),
                linestyle=styles[settings.index(setting) % len(styles)],
                label=label,
            )
            handles.setdefault(label, line)
        budgets = sorted({r["budget"] for r in rows if r["workload"] == workload})
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.minorticks_off()
        ax.set_title(workload)
        ax.set_xlabel("budget B (draft nodes)")
        ax.set_ylabel("MAT (accepted tokens / step)")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.set_visible(False)
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="outside lower center",
        ncols=min(len(handles), 4),
        fontsize="small",
    )
    fig.set_layout_engine("constrained")
    fig.savefig(path, dpi=110)
    plt.close(fig)
