"""``lookahead-bench sizing``: the sizing policy against fixed budgets and plain decoding in
simulated time, at every batch size.

The acceptance is replayed (the recorded responses of a workload, FORMAT.md semantics, one
engine of ``C`` slots); the time of each engine step comes from a measured cost curve, the
JSON that ``scripts/gpu_cost_curve.py`` writes, fitted by
:class:`~lookahead_client.cost.CostModel`. Every step is charged as if each request had the
curve's context length cached (the curve was measured at that one length). Three ways to run
each step:

* ``plain``: no draft, one token per request;
* ``fixed``: the drafter's whole tree (up to the budget), padded to the widest tree;
* ``policy``: the tree cut by :class:`~lookahead_client.hf.sizing.SizingPolicy` with the fitted
  cost model, its score calibration learning from the replayed acceptance as it goes.

The figure of merit is response tokens per simulated second (prefill excluded: the first
response token comes from it and costs no step here).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lookahead_client.cost import CostModel
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.hf.sizing import SizingPlan, SizingPolicy
from lookahead_client.types import Drafter, DraftTree

from .replay import ReplaySettings, replay
from .workload import Workload

__all__ = ["MODES", "MeasuredCurve", "TimedSteps", "SweepRow", "sweep"]

#: The ways a step is run.
MODES = ("plain", "fixed", "policy")


@dataclass(frozen=True)
class MeasuredCurve:
    """A GPU's measured step times (``scripts/gpu_cost_curve.py``), fitted: the model, the
    context it was measured at, its source. (Not the core's ``CostCurve``, the compact curve
    a drafter sizes against: this one times the sweep's simulated steps.)

    Attributes:
        cost: the fitted model.
        context: cached tokens per request during the measurement.
        label: where it comes from (model shape and device).
    """

    cost: CostModel
    context: int
    label: str

    @classmethod
    def load(cls, path: str | Path, model: str | None = None) -> MeasuredCurve:
        """Reads ``scripts/gpu_cost_curve.py``'s JSON; ``model`` picks a shape (the first
        one by default).

        Raises:
            InvalidArgumentError: a file without that model or without measurements.
        """
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        models = doc.get("models") or {}
        name = model or next(iter(models), None)
        if name not in models or not models[name].get("points"):
            raise InvalidArgumentError(
                f"{path}: no measurements of model {name!r} (has: {', '.join(models) or 'none'})",
                field="cost_curve",
            )
        cost = CostModel.from_measurements(models[name]["points"])
        return cls(cost, int(doc["context"]), f"{name} on {doc.get('device', '?')}")


class TimedSteps:
    """A replay step hook that runs steps as ``mode`` says and adds up their simulated time.

    Args:
        curve: the step-time model and its context length.
        mode: one of :data:`MODES`.
        budget: the most draft nodes per tree.
        layout: how the batch is verified: ``padded`` (every request gets the widest tree's
            slots) or ``ragged`` (each request its own).
    """

    def __init__(
        self, curve: MeasuredCurve, mode: str, budget: int, layout: str = "padded"
    ) -> None:
        if mode not in MODES:
            raise InvalidArgumentError(f"mode must be one of {MODES}, got {mode!r}", field="mode")
        self.curve = curve
        self.mode = mode
        self.budget = budget
        self.layout = layout
        self.policy = (
            SizingPolicy(curve.cost, layout=layout, learn_cost=False, explore=False)
            if mode == "policy"
            else None
        )
        self._plan: SizingPlan | None = None
        self.seconds = 0.0
        self.steps = 0
        self.plain_steps = 0
        self.slots = 0  # verified slots (root included), summed over requests and steps
        self.requests = 0  # requests verified, summed over steps

    def before(
        self, trees: list[DraftTree], cached: list[int], remaining: list[int]
    ) -> list[DraftTree]:
        """Cuts (or drops) the trees and charges the step's time."""
        bs = len(trees)
        context = self.curve.context
        if self.mode == "plain":
            trees = [DraftTree.empty(t.root) for t in trees]
        elif self.mode == "policy":
            assert self.policy is not None
            self._plan = self.policy.plan(
                trees, [context] * bs, max_nodes=self.budget, remaining=remaining
            )
            trees = self._plan.trees
        else:
            trees = [t if len(t) <= self.budget else _prefix(t, self.budget) for t in trees]
        if self.layout == "padded":
            widths = [1 + max(len(t) for t in trees)] * bs
        else:
            widths = [1 + len(t) for t in trees]
        tokens = sum(widths)
        pairs = sum(w * (context + w) for w in widths)
        self.seconds += float(self.curve.cost.predict(tokens, bs * context, pairs)[0])
        self.steps += 1
        self.plain_steps += all(len(t) == 0 for t in trees)
        self.slots += tokens
        self.requests += bs
        return trees

    def after(self, trees: list[DraftTree], accepted: list[list[int]]) -> None:
        """Feeds the accepted nodes to the policy's calibration."""
        if self.policy is not None and self._plan is not None:
            self.policy.observe(self._plan, accepted, None)


def _prefix(tree: DraftTree, n: int) -> DraftTree:
    return DraftTree(tree.root, tree.tokens[:n], tree.parents[:n], tree.scores[:n])


@dataclass
class SweepRow:
    """One (concurrency, mode, budget) of a sweep."""

    workload: str
    curve: str
    concurrency: int
    mode: str
    budget: int
    layout: str
    tokens: int
    seconds: float
    engine_steps: int
    plain_step_fraction: float
    slots_per_request: float
    tokens_per_step: float
    speedup: float = 1.0
    extra: dict = field(default_factory=dict)

    @property
    def tok_per_s(self) -> float:
        """Response tokens per simulated second."""
        return self.tokens / self.seconds if self.seconds else 0.0


def sweep(
    workload: Workload,
    drafter_factory: Callable[[], Drafter],
    curve: MeasuredCurve,
    concurrencies: Sequence[int],
    budgets: Sequence[int],
    layout: str = "padded",
    log=None,
) -> list[SweepRow]:
    """Plain, every fixed budget and the policy (at the largest budget), at each concurrency.

    Args:
        workload: the replayed requests.
        drafter_factory: makes a fresh drafter (one per run).
        curve: the measured cost curve.
        concurrencies: engine slots ``C`` (the batch size while the engine is full).
        budgets: fixed budgets; the policy may use up to the largest.
        layout: ``padded`` or ``ragged`` (see :class:`TimedSteps`).
        log: called with each row as it is done.
    """
    rows: list[SweepRow] = []
    top = max(budgets)
    for c in concurrencies:
        runs = [("plain", top)] + [("fixed", b) for b in budgets] + [("policy", top)]
        plain_rate = None
        for mode, budget in runs:
            hook = TimedSteps(curve, mode, budget, layout)
            result = replay(workload, drafter_factory, ReplaySettings(budget, c), hook=hook)
            tokens = workload.response_tokens - result.requests  # the first comes from prefill
            row = SweepRow(
                workload=workload.name,
                curve=curve.label,
                concurrency=c,
                mode=mode,
                budget=budget,
                layout=layout,
                tokens=tokens,
                seconds=round(hook.seconds, 4),
                engine_steps=hook.steps,
                plain_step_fraction=round(hook.plain_steps / max(hook.steps, 1), 3),
                slots_per_request=round(hook.slots / max(hook.requests, 1), 2),
                tokens_per_step=round(tokens / max(result.steps, 1), 3),
            )
            if hook.policy is not None:
                row.extra = hook.policy.stats()
            plain_rate = row.tok_per_s if mode == "plain" else plain_rate
            row.speedup = round(row.tok_per_s / plain_rate, 3) if plain_rate else 1.0
            rows.append(row)
            if log is not None:
                log(row)
    return rows
