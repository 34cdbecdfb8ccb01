"""Traffic for several engines at once (``lookahead-bench sglang --engines N``): what each
engine is sent and when, a barrier that keeps the engines in step, and one trial result made
of the engines' results.

Sharing a drafter between engines is only worth something on traffic where one engine's text
helps another. The plan here is made from a workload's *groups* (prompts about the same
document or source file, other questions or edits), every prompt sent twice:

* ``new``: the first prompt of a group, sent to one engine;
* ``sibling``: the group's other prompt, on another engine, one slot later (what the first
  engine generated about the same document is in a shared drafter by then, not in a private
  one);
* ``repeat``: every prompt again, two slots after its first time, on the next engine (a
  private drafter has never seen its output; a shared one has).

The engines run in *slots*: in a slot every engine generates its requests one at a time, at
batch 1, and no engine starts the next slot before all have finished this one (a file
barrier), so what each drafter can have seen at each request is the same in every run and
every configuration. Each request is timed alone; the waiting is not timed.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Sequence
from typing import Any

from .engine_bench import distinct_prompts, sum_counters

__all__ = ["KINDS", "SlotBarrier", "merge_engine_results", "plan_traffic", "pick_groups"]

#: The kinds of request, in the order they are reported.
KINDS = ("new", "sibling", "repeat")
#: Slots between a prompt's first time and its repeat.
REPEAT_AFTER = 2


def pick_groups(prompts: Sequence[dict[str, Any]], per_half: int) -> list[list[dict[str, Any]]]:
    """The first ``per_half`` groups of each half with at least two distinct prompts, each
    with its first two prompts, halves alternating (A, B, A, ...).

    Args:
        prompts: a workload's prompts in file order, each with ``group``, ``half`` and
            ``ids``.
    """
    by_group: dict[str, list[dict[str, Any]]] = {}
    for p in distinct_prompts(prompts):
        by_group.setdefault(p["group"], []).append(p)
    halves: dict[str, list[list[dict[str, Any]]]] = {"A": [], "B": []}
    for members in by_group.values():
        half = halves[members[0]["half"]]
        if len(members) >= 2 and len(half) < per_half:
            half.append(members[:2])
    return [halves[h][i] for i in range(per_half) for h in "AB" if i < len(halves[h])]


def plan_traffic(
    groups: Sequence[Sequence[dict[str, Any]]], engines: int
) -> list[list[list[dict[str, Any]]]]:
    """``plan[slot][engine]``: the requests an engine generates in a slot, in order; each a
    prompt (``id``, ``half``, ``ids``) with its ``kind`` (see the module docstring).

    Groups are taken ``engines`` at a time: in the first slot engine ``e`` gets the first
    prompt of the ``e``-th group, in the next slot engine ``e + 1`` (modulo ``engines``) gets
    that group's second prompt; every request is repeated ``REPEAT_AFTER`` slots later on the
    engine after the one that generated it.

    Raises:
        ValueError: fewer than 2 engines, or a group without two prompts.
    """
    if engines < 2:
        raise ValueError(f"traffic for several engines needs at least 2, got {engines}")
    if any(len(g) < 2 for g in groups):
        raise ValueError("every group needs two prompts")
    firsts: list[list[tuple[int, dict[str, Any]]]] = []  # per slot: (engine, prompt) sent
    for start in range(0, len(groups), engines):
        chunk = groups[start : start + engines]
        firsts.append([(e, {**g[0], "kind": "new"}) for e, g in enumerate(chunk)])
        firsts.append(
            [((e + 1) % engines, {**g[1], "kind": "sibling"}) for e, g in enumerate(chunk)]
        )
    plan: list[list[list[dict[str, Any]]]] = [
        [[] for _ in range(engines)] for _ in range(len(firsts) + REPEAT_AFTER)
    ]
    for slot, sent in enumerate(firsts):
        for engine, prompt in sent:
            plan[slot][engine].append(prompt)
            plan[slot + REPEAT_AFTER][(engine + 1) % engines].append({**prompt, "kind": "repeat"})
    return plan


class SlotBarrier:
    """Keeps engines in separate processes in step: :meth:`wait` returns once every engine
    has reached the slot. A file per engine and slot in a folder they share.

    Args:
        folder: shared by the engines of one trial (and only them).
        engines: how many take part.
        engine: this one's index.
        timeout_s: how long to wait for the others before giving up.
    """

    def __init__(
        self, folder: str | pathlib.Path, engines: int, engine: int, timeout_s: float = 1800.0
    ) -> None:
        self.folder = pathlib.Path(folder)
        self.engines = engines
        self.engine = engine
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"SlotBarrier({str(self.folder)!r}, engines={self.engines}, engine={self.engine})"

    def wait(self, slot: int) -> None:
        """Marks this engine at ``slot`` and waits for the others.

        Raises:
            TimeoutError: the others did not come within ``timeout_s`` (one failed).
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{slot}.{self.engine}").touch()
        deadline = time.monotonic() + self.timeout_s
        others = [self.folder / f"{slot}.{e}" for e in range(self.engines)]
        while not all(o.exists() for o in others):
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine {self.engine}: the others never reached slot {slot}")
            time.sleep(0.005)


def merge_engine_results(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One trial result (the layout of :mod:`.engine_bench`) from each engine's: per
    workload, the requests of every engine in plan order (slot, engine, place), the counters
    summed; ``startup_s`` the slowest engine's."""
    merged: dict[str, Any] = {
        "startup_s": max(r["startup_s"] for r in results),
        "workloads": {},
    }
    for name in results[0]["workloads"]:
        rows = [r["workloads"][name] for r in results]
        prompts = sorted(
            (p for row in rows for p in row["prompts"]),
            key=lambda p: (p["slot"], p["engine"], p["place"]),
        )
        merged["workloads"][name] = {
            **{k: v for k, v in rows[0].items() if k not in ("prompts", "counters_batch1")},
            "prompts": prompts,
            "counters_batch1": sum_counters([row["counters_batch1"] for row in rows]),
        }
    return merged
