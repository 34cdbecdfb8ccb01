"""Traffic for several engines at once (``lookahead-bench sglang|vllm --engines N``): what
each engine is sent and when, the loop an engine runs it with, a barrier that keeps the
engines in step, and one trial result made of the engines' results.

Sharing a drafter between engines is only worth something on traffic where one engine's text
helps another. The plan here is made from a workload's *groups* (prompts about the same
document or source file, other questions or edits), every prompt sent twice:

* ``new``: the first prompt of a group, sent to one engine;
* ``sibling``: the group's other prompt, on another engine, one slot later (what the first
  engine generated about the same document is in a shared drafter by then, not in a private
  one);
* ``repeat``: every prompt again, two slots after its first time, on the next engine (a
  private drafter has never seen its output; a shared one has).

Rollouts (:func:`plan_samples`) are sampled instead: each prompt's n samples go out as n
requests with the same prompt, then every prompt again with new samples, each on another
engine than the first time. The samples of a prompt are either spread over the engines (a
load balancer dealing requests) or kept together on one engine, a prompt per engine (an RL
framework splitting its batch, each prompt repeated n times in a row, into contiguous chunks,
one per replica, as verl's synchronous rollout does). ``lookahead-bench replicas`` names the
two passes of both plans ``first`` and ``repeat`` (:func:`as_passes`).

The engines run in *slots*: in a slot every engine generates its requests one at a time, at
batch 1, and no engine starts the next slot before all have finished this one (a file
barrier), so what each drafter can have seen at each request is the same in every run and
every configuration. Each request is timed alone; the waiting is not timed.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lookahead_client.errors import InvalidArgumentError

from .engine_bench import (
    cores_per_engine,
    distinct_prompts,
    workload_prompts_by_stem,
)

__all__ = [
    "KINDS",
    "PASSES",
    "EngineRun",
    "as_passes",
    "SlotBarrier",
    "describe_kind",
    "merge_engine_results",
    "pick_groups",
    "plan_groups",
    "plan_samples",
    "plan_traffic",
    "plan_workloads",
    "requests_per_engine",
    "serve_share",
]

#: A workload's plan: ``plan[slot][engine]``, the requests an engine generates in a slot.
Plan = list[list[list[dict[str, Any]]]]

#: The kinds of request, in the order they are reported.
KINDS = ("new", "sibling", "repeat")
#: The passes of ``lookahead-bench replicas``: every prompt once, then again elsewhere.
PASSES = ("first", "repeat")
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


def plan_traffic(groups: Sequence[Sequence[dict[str, Any]]], engines: int) -> Plan:
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
    plan: Plan = [[[] for _ in range(engines)] for _ in range(len(firsts) + REPEAT_AFTER)]
    for slot, sent in enumerate(firsts):
        for engine, prompt in sent:
            plan[slot][engine].append(prompt)
            plan[slot + REPEAT_AFTER][(engine + 1) % engines].append({**prompt, "kind": "repeat"})
    return plan


def plan_samples(
    prompts: Sequence[dict[str, Any]],
    n: int,
    engines: int,
    temperature: float,
    *,
    together: bool = False,
) -> Plan:
    """Rollouts: ``plan[slot][engine]``, every prompt's ``n`` samples as ``n`` requests with
    the same prompt (``first``); then every prompt again, ``n`` new samples, each on the
    engine after the one that took it the first time (``repeat``). Each request carries its
    ``temperature`` and a ``seed`` of its own; at temperature 0 (greedy rollouts, an
    evaluation harness sending a prompt ``n`` times) the ``n`` requests are the same
    generation.

    Spread (the default): one prompt per slot, its samples dealt round robin over the
    engines. ``together``: ``engines`` prompts per slot, each prompt's samples all on one
    engine, a prompt per engine (so the repeat brings every prompt to an engine that has not
    generated it).

    Raises:
        ValueError: fewer than 2 engines, fewer than 2 samples when spread (1 together), or
            a negative temperature.
    """
    least = 1 if together else 2  # samples: spread needs one for each of two engines
    if engines < 2 or n < least:
        raise ValueError(f"rollouts need 2 engines and {least} samples, got {engines} and {n}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    chunks = (
        [prompts[i : i + engines] for i in range(0, len(prompts), engines)]
        if together
        else [[p] for p in prompts]
    )
    plan: Plan = []
    for shift, kind in enumerate(PASSES):
        for chunk in chunks:
            slot: list[list[dict[str, Any]]] = [[] for _ in range(engines)]
            for j, prompt in enumerate(chunk):
                for i in range(n):
                    sample = {"kind": kind, "temperature": temperature, "seed": shift * n + i}
                    engine = j if together else i
                    slot[(engine + shift) % engines].append({**prompt, **sample})
            plan.append(slot)
    return plan


def as_passes(plan: Plan) -> Plan:
    """A plan of :func:`plan_traffic` with its kinds named as passes: ``new`` and
    ``sibling`` are the ``first`` pass, ``repeat`` the ``repeat`` pass."""
    pass_of = {"new": "first", "sibling": "first", "repeat": "repeat"}
    return [[[{**p, "kind": pass_of[p["kind"]]} for p in e] for e in s] for s in plan]


def plan_workloads(
    prompts_by_stem: Mapping[str, Sequence[dict[str, Any]]],
    per_half: int,
    engines: int,
    max_prompt_tokens: int,
) -> dict[str, Plan]:
    """Per workload (by stem), the plan of :func:`plan_traffic` for ``per_half`` groups of
    each half.

    Raises:
        InvalidArgumentError: a workload without a group of two distinct prompts (of at most
            ``max_prompt_tokens`` tokens, the limit the prompts were read with).
    """
    why = f" (of at most {max_prompt_tokens} tokens): --engines needs groups"
    return {
        stem: plan_groups(stem, prompts, per_half, engines, why)
        for stem, prompts in prompts_by_stem.items()
    }


def plan_groups(
    stem: str, prompts: Sequence[dict[str, Any]], per_half: int, engines: int, why: str
) -> Plan:
    """The plan of :func:`plan_traffic` for ``per_half`` groups of each half of one workload.

    Raises:
        InvalidArgumentError: the workload has no group of two distinct prompts (``why``
            ends the message).
    """
    groups = pick_groups(prompts, per_half)
    if not groups:
        raise InvalidArgumentError(
            f"workload {stem} has no group of two distinct prompts{why}", field="workload"
        )
    return plan_traffic(groups, engines)


def requests_per_engine(traffic: Mapping[str, Plan], engines: int) -> int:
    """The most requests one engine generates over every workload's plan."""
    return max(sum(len(s[e]) for plan in traffic.values() for s in plan) for e in range(engines))


def describe_kind(traffic: Mapping[str, Plan], engines: int, name: str, extra: str) -> str:
    """The table heading of a ``WORKLOAD/KIND`` row: its requests and how they ran."""
    stem, _, kind = name.rpartition("/")
    count = sum(p["kind"] == kind for s in traffic[stem] for e in s for p in e)
    return (
        f"{count} requests, {kind} (see lookahead_client.bench.sharing), spread over "
        f"{engines} engines running at once, each at batch 1{extra}"
    )


@dataclass(frozen=True)
class EngineRun:
    """What an engine benchmark's ``--engines N`` run sends, sized for its start-up and its
    up-front cost.

    Attributes:
        traffic: per workload, its plan (:func:`plan_traffic`).
        engines: how many run at once.
        longest: the longest prompt of any plan, in tokens.
        tokens: the most tokens one engine generates (its requests one at a time).
    """

    traffic: dict[str, Plan]
    engines: int
    longest: int
    tokens: int

    @classmethod
    def of(cls, traffic: dict[str, Plan], engines: int, max_new_tokens: int) -> EngineRun:
        """The run that sends ``traffic`` to ``engines`` engines, each request generating up
        to ``max_new_tokens`` tokens."""
        prompts = [p for plan in traffic.values() for s in plan for e in s for p in e]
        longest = max(len(p["ids"]) for p in prompts)
        tokens = requests_per_engine(traffic, engines) * max_new_tokens
        return cls(traffic, engines, longest, tokens)

    @classmethod
    def plan(cls, args: argparse.Namespace, folder: pathlib.Path) -> EngineRun:
        """The run of an engine benchmark's options (``--workload``, ``--engines``,
        ``--prompts-per-half``, ``--max-prompt-tokens``, ``--max-new-tokens``) for the model
        in ``folder``.

        Raises:
            InvalidArgumentError: a workload without groups (see :func:`plan_workloads`).
        """
        traffic = plan_workloads(
            workload_prompts_by_stem(args.workload, folder, args.max_prompt_tokens),
            args.prompts_per_half,
            args.engines,
            args.max_prompt_tokens,
        )
        return cls.of(traffic, args.engines, args.max_new_tokens)

    def estimate_s(self, startup_s: float, tok_s: float) -> float:
        """A trial's guessed seconds, from one engine's start-up and its tokens/s alone on
        this machine (the engines start side by side; each generates on its share of the
        cores)."""
        share = min(1.0, cores_per_engine(self.engines) / 2)
        return self.engines * startup_s / 2 + self.tokens / (tok_s * share)

    def describe(self, name: str, extra: str) -> str:
        """The table heading of a ``WORKLOAD/KIND`` row (:func:`describe_kind`)."""
        return describe_kind(self.traffic, self.engines, name, extra)


def serve_share(
    spec: Mapping[str, Any], serve: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """An engine's share of the traffic (``spec``: ``traffic``, ``engine``, ``engines`` and
    the ``barrier`` folder), slot by slot in step with the other engines.

    Args:
        serve: generates one prompt alone: its record (``id``, ``half``, ``seconds``,
            ``tokens``, ``outputs``, and the engine's ``counters`` over it).

    Returns:
        Per workload and kind of request (``WORKLOAD/KIND``) the layout of
        :mod:`.engine_bench`: the requests (each with its ``slot``, ``engine`` and ``place``
        in the slot) in ``prompts``.
    """
    me = spec["engine"]
    barrier = SlotBarrier(spec["barrier"], spec["engines"], me)
    slot = 0
    barrier.wait(slot)  # every engine started and warmed up
    out: dict[str, Any] = {}
    for workload, plan in spec["traffic"].items():
        rows: dict[str, dict[str, Any]] = {}
        for prompt in (p for s in plan for e in s for p in e):  # the kinds in plan order
            row = rows.setdefault(
                prompt["kind"],
                {
                    "n": 1,
                    "temperature": 0.0,
                    "prompts": [],
                    "batch": {"seconds": 0.0, "tokens": 0, "outputs": []},
                    "counters_batch": {},
                },
            )
            row["temperature"] = max(row["temperature"], prompt.get("temperature", 0.0))
        for per_engine in plan:
            slot += 1
            for place, prompt in enumerate(per_engine[me]):
                record = serve(prompt)
                rows[prompt["kind"]]["prompts"].append(
                    {**record, "slot": slot, "engine": me, "place": place}
                )
            barrier.wait(slot)
        out.update({f"{workload}/{kind}": row for kind, row in rows.items()})
    return out


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
    workload, the requests of every engine in plan order (slot, engine, place);
    ``startup_s`` the slowest engine's."""
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
            **{k: v for k, v in rows[0].items() if k != "prompts"},
            "prompts": prompts,
        }
    return merged
