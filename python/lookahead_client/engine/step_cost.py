"""The engine's cost curve handed to the drafter's native step.

Engines measure their own step times; :class:`StepCostFeed` fits them with
:class:`~lookahead_client.cost.CostModel` and turns the fit into the compact
:class:`~lookahead_client.types.EngineCost` curve the core sizes drafts against (the core
picks the lengths; Python only measures). The curve is refitted every 32 steps (every step
while the model holds fewer), since the fit moves slowly and a refit (a non-negative
least-squares solve, 0.3-2 ms) costs more than many steps of drafting; a measurement far
above the last fit (a step that lost the CPU) is clipped against it by the model's outlier
rule, without a refit.

A step that verifies any draft token pays the engine's speculative path once on top of the
tokens (:attr:`CostModel.draft_seconds`), so the curve of a step depends on where its drafts
start: the feed hands out one per batch size, with a point at the batch's own tokens (no
draft) and one just after it (the first draft token, that overhead included).

An engine's feed refits in the background (``background=True``): measuring a step only queues
it, and a refit that falls due runs on the feed's own thread while the engine runs its next
forward pass, so the step that asks for a curve never waits for a solve. The curve it gets is
then the last finished refit's, a step behind the measurements: while the model is young that
is the refit started one step earlier.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from lookahead_client.cost import CostModel, check_measurement, token_knots
from lookahead_client.types import EngineCost

__all__ = ["StepCostFeed"]

# Steps between two refits of the curve handed to the core.
_REFRESH_EVERY = 32
# Every this many steps the core drafts one token beyond its choice (see EngineCost).
_EXPLORE_EVERY = 32
# A change of the curve's slope at a knot needs the evidence of about this many steps
# (CostModel's smoothing): the core's own choices leave some sizes with a step or two, and
# one slow step there (a 94 ms step among steps of 70 ms, docs/vllm-runs.md run 23) bent the
# curve, made short chains look as dear as long ones, and kept the core from measuring them.
_SMOOTHING = 4.0


class StepCostFeed:
    """Measured step times in, :class:`EngineCost` curves out.

    Args:
        padded: the engine verifies one width for the whole batch (else ragged lengths).
        max_tokens: the largest step (tokens verified) to describe.
        explore_every: see :class:`EngineCost` (0: never).
        background: refit on the feed's own thread (see the module docstring); else a refit
            that falls due runs inside :meth:`curve`, on the caller's thread.
    """

    def __init__(
        self,
        *,
        padded: bool = False,
        max_tokens: int = 4096,
        explore_every: int = _EXPLORE_EVERY,
        background: bool = False,
    ) -> None:
        #: The fitted model. With ``background`` only the refit thread touches it: read it
        #: after :meth:`settle`.
        self.model = CostModel(max_tokens=max_tokens, smoothing=_SMOOTHING)
        self.padded = padded
        self.explore_every = explore_every
        self._knots = token_knots(max_tokens).astype(np.int64)
        self._fit: _Fit | None = None  # the last refit
        # The last refit's curves by batch size, built as asked for.
        self._curves: dict[int, EngineCost] = {}
        self._age = 0
        self._observed = 0  # steps measured, all of them
        # Steps measured since the model last took them, and the shape of the last one.
        self._inbox: list[_Step] = []
        self._context = 0
        self._rows = 1
        self._refits = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="lookahead-cost")
            if background
            else None
        )
        self._refit: Future[_Fit | None] | None = None  # in flight on the refit thread

    def observe(
        self, tokens: int, seconds: float, *, rows: int = 1, context: int = 0, pairs: int = 0
    ) -> None:
        """One measured step of ``rows`` requests: ``tokens`` verified in ``seconds`` over
        ``context`` cached tokens (``pairs`` query-key pairs; see :class:`CostModel`); a step
        of more tokens than rows verified drafts. The curve describes steps like the last one
        measured.

        Raises:
            InvalidArgumentError: a value out of range (checked here, on the caller's thread).
        """
        check_measurement(tokens, seconds, context, pairs)
        rows = max(1, rows)
        self._inbox.append(_Step(tokens, seconds, context, pairs, tokens > rows))
        self._observed += 1
        self._context, self._rows = context, rows

    def curve(self, rows: int) -> EngineCost | None:
        """The current curve for a step of ``rows`` requests (its ``base_tokens``), or None
        while fewer than two step sizes were measured (the core then keeps whole drafts,
        which measures the larger sizes). Between refits the model is not read at all: a
        step pays for its measurement, not for the fit; while it holds fewer than 32 steps
        it is refitted every step, since a fit of a few steps can be far off (the first step
        of a full batch after warm-up steps of one request: the whole time put on the
        context, every draft token free) and would be kept for 32 steps. In the background
        a refit that falls due is started here and its curve handed out from the first call
        after it finished."""
        if self._refit is not None and self._refit.done():
            self.settle()
        young = self._observed < _REFRESH_EVERY
        if (self._fit is None or young or self._age >= _REFRESH_EVERY) and self._inbox:
            self._start_refit()
        self._age += 1
        if self._fit is None:
            return None
        rows = max(1, rows)
        curve = self._curves.get(rows)
        if curve is None:
            points, at = _points(self._fit, rows)
            curve = EngineCost(
                tuple(points),
                tuple(at),
                padded=self.padded,
                base_tokens=rows,
                explore_every=self.explore_every,
            )
            self._curves[rows] = curve
        return curve

    def settle(self) -> None:
        """Waits for the refit in flight, if any, and adopts it. A refit that failed raises
        here, once (its measurements are dropped; the next refit takes the later ones)."""
        refit, self._refit = self._refit, None
        if refit is not None:
            self._adopt(refit.result())

    def _start_refit(self) -> None:
        """Hands the measurements taken since the last refit to one: in the background, unless
        one is still running (the next step starts it); else here."""
        if self._refit is not None:
            return
        taken, self._inbox = self._inbox, []
        shape = (self._context, self._rows)
        if self._refits is None:
            self._adopt(self._refit_with(taken, *shape))
        else:
            self._refit = self._refits.submit(self._refit_with, taken, *shape)

    def _refit_with(self, taken: list[_Step], context: int, rows: int) -> _Fit | None:
        """The model with ``taken`` added, fitted for steps of that shape (None while it is
        not ready)."""
        for step in taken:
            self.model.observe(
                step.tokens,
                step.seconds,
                context=step.context,
                pairs=step.pairs,
                drafted=step.drafted,
            )
        if not self.model.ready:
            return None
        tokens = self._knots
        # query-key pairs of the batch, its tokens spread evenly over its rows
        pairs = tokens * (context + tokens) // rows
        seconds = self.model.predict(tokens, context, pairs)
        # the fit is non-decreasing in tokens; guard the floor against rounding
        seconds = np.maximum.accumulate(np.maximum(seconds, 1e-9))
        return _Fit(tokens.tolist(), seconds.tolist(), self.model.draft_seconds)

    def _adopt(self, fit: _Fit | None) -> None:
        """A finished refit's fit becomes the curves' (None: the model is not ready yet)."""
        if fit is not None:
            self._fit = fit
            self._curves.clear()
            self._age = 0

    @property
    def draft_seconds(self) -> float | None:
        """What a step pays once for verifying any draft token in the last fit (None before
        the first)."""
        return None if self._fit is None else self._fit.draft_seconds

    def seconds_at(self, tokens: Sequence[int], rows: int = 1) -> list[float] | None:
        """The last fit as the core sizes against it, for a step of ``rows`` requests,
        read at ``tokens`` verified; None before the first fit. Reading it changes nothing."""
        if self._fit is None:
            return None
        points, seconds = _points(self._fit, max(1, rows))
        return np.interp(tokens, points, seconds).tolist()

    def __repr__(self) -> str:
        fit = "no fit yet" if self._fit is None else f"{len(self._fit.knots)} knots fitted"
        return f"StepCostFeed(padded={self.padded}, steps={self._observed}, {fit})"


class _Step(NamedTuple):
    """A measured step, queued for the model (see :meth:`StepCostFeed.observe`)."""

    tokens: int
    seconds: float
    context: int
    pairs: int
    drafted: bool


@dataclass(frozen=True, slots=True)
class _Fit:
    """A refit as the curves are built from it: seconds at the knots without a draft, and
    what a step pays once for verifying any."""

    knots: list[int]
    seconds: list[float]
    draft_seconds: float


def _points(fit: _Fit, rows: int) -> tuple[list[int], list[float]]:
    """The fit's points for a step of ``rows`` requests: the knots, ``rows`` and ``rows + 1``,
    the draft overhead added from ``rows + 1`` on."""
    tokens = sorted({*fit.knots, rows, rows + 1})
    plain = np.interp(tokens, fit.knots, fit.seconds).tolist()
    extra = fit.draft_seconds
    return tokens, [s + extra if t > rows else s for t, s in zip(tokens, plain, strict=True)]
