"""A measured cost model of the target model's verification forward pass.

:class:`CostModel` predicts the seconds one verify step takes from the shape of the step:

* ``tokens``: the query tokens of the whole batch (every request's root plus its tree slots,
  padding included when the engine pads trees to a common width);
* ``context``: the KV entries the batch attends to (the sum of the requests' cached lengths);
* ``pairs``: query-key pairs, the sum over requests of ``slots * (cached + slots)``;
* ``drafted``: whether the step verified any draft token. An engine's speculative path costs
  a step something once, whatever the number of draft tokens (vLLM runs its rejection
  sampler, computes logits at every draft position's row of the batch...): a batch of 16
  requests that verifies 17 tokens costs more than one of 16 by more than a token's worth.

The time is a piecewise-linear function of ``tokens`` (knots 1, 2, 3, 4, 6, 8, 12, 16, 24...,
linear beyond the last one) plus non-negative terms linear in ``context`` and ``pairs`` and a
non-negative step for ``drafted``.
Nothing about the shape is assumed beyond that: a CPU whose matrix kernels change at two
tokens, a GPU that is flat up to a few hundred tokens and then turns compute-bound, both fit.

It is learnt from measured steps (:meth:`CostModel.observe`): the engine's own step times
online, or a start-up profile, or the table of ``scripts/gpu_cost_curve.py``. The fit is a
penalised least-squares fit with exponential forgetting (a machine whose load changes is
followed), and knots without measurements are filled in by interpolation/extrapolation of
their neighbours (a penalty on the change of slope between knots).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["CostModel", "check_measurement", "token_knots"]

# Scales of the context features, so that every coefficient is a few milliseconds.
_CONTEXT_UNIT = 1024.0
_PAIRS_UNIT = 65536.0
# Features after the knots' values: context, pairs, drafted.
_EXTRA_FEATURES = 3
# Observations after which the outlier rule's reference fit is refitted.
_REFERENCE_AGE = 32


def token_knots(max_tokens: int) -> np.ndarray:
    """The knots of the piecewise-linear token curve: 1, 2, 3, 4, then x1.5 / x1.33 steps
    (6, 8, 12, 16, 24, 32, ...) up to at least ``max_tokens``."""
    knots = [1, 2, 3, 4]
    while knots[-1] < max_tokens:
        knots.append(knots[-1] * 3 // 2 if knots[-1] & (knots[-1] - 1) == 0 else knots[-2] * 2)
    return np.asarray(knots, dtype=np.float64)


def _hat(knots: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each token count: the two knots bracketing it and the weight of the upper one
    (beyond the last knot the weight exceeds 1: linear extrapolation)."""
    upper = np.clip(np.searchsorted(knots, tokens, side="left"), 1, len(knots) - 1)
    lower = upper - 1
    t = (tokens - knots[lower]) / (knots[upper] - knots[lower])
    return lower, upper, t


def _nonnegative_least_squares(
    gram: np.ndarray, moment: np.ndarray, start: np.ndarray | None = None
) -> np.ndarray:
    """``argmin x'Gx - 2 m'x`` over ``x >= 0`` (Lawson and Hanson's active set method, on the
    normal equations). Within the free set the solve is least squares, so what the data
    leaves open gets the minimum-norm answer.

    Args:
        start: a solution of a nearby problem (the previous fit): its positive entries are
            the first free set, which usually leaves one or two solves instead of one per
            free variable.
    """
    n = len(moment)
    tol = 1e-12 * max(1.0, float(np.abs(moment).max(initial=0.0)))
    x = np.zeros(n) if start is None else np.where(start > tol, start, 0.0)
    free = x > 0.0

    def settle(x: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # The least-squares solve on the free set; where it leaves the feasible region, step
        # from x towards it as far as every variable stays >= 0, drop those that reached
        # zero from the free set, and solve again.
        for _ in range(3 * n):
            idx = np.flatnonzero(free)
            z = np.zeros(n)
            z[idx] = _solve_free(gram[np.ix_(idx, idx)], moment[idx])
            blocked = idx[z[idx] <= tol]
            if len(blocked) == 0:
                return z, free
            step = np.min(x[blocked] / np.maximum(x[blocked] - z[blocked], tol))
            x = x + step * (z - x)
            free = free & (x > tol)
            x[~free] = 0.0
            if not free.any():
                break
        return x, free

    if free.any():
        x, free = settle(x, free)
    for _ in range(3 * n):
        gradient = moment - gram @ x
        candidates = ~free & (gradient > tol)
        if not candidates.any():
            break
        free = free.copy()
        free[int(np.argmax(np.where(candidates, gradient, -np.inf)))] = True
        x, free = settle(x, free)
    return x


def _solve_free(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """``gram x = moment``: a plain solve where ``gram`` is positive definite (the usual case,
    a tenth of the time of a least-squares solve), else least squares (minimum norm)."""
    try:
        np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(gram, moment, rcond=None)[0]
    return np.linalg.solve(gram, moment)


def check_measurement(tokens: int, seconds: float, context: int = 0, pairs: int = 0) -> None:
    """Refuses a measured step that no model can learn from (see :meth:`CostModel.observe`).

    Raises:
        InvalidArgumentError: a value out of range, naming it.
    """
    if tokens < 1:
        raise InvalidArgumentError(f"tokens must be >= 1, got {tokens}", field="tokens")
    if not (math.isfinite(seconds) and seconds > 0.0):
        raise InvalidArgumentError(f"seconds must be > 0, got {seconds}", field="seconds")
    if context < 0 or pairs < 0:
        raise InvalidArgumentError("context and pairs must be >= 0", field="context")


class CostModel:
    """Seconds of one verification step, learnt from measured steps.

    Args:
        max_tokens: the largest batch (query tokens) expected; larger ones are extrapolated.
        forgetting: each observation multiplies the weight of the earlier ones by this
            (1.0 never forgets; 0.998 keeps roughly the last 500 steps).
        smoothing: weight of the penalty on slope changes between knots, relative to one
            observation; it only decides knots with no measurement near them.
        outlier_factor: a measurement above this multiple of the last fit's prediction is
            clipped to it (a step that lost the CPU to another process), where that fit had
            measurements (elsewhere a measurement is news, not an outlier); the reference
            fit is at most 32 observations old. ``math.inf`` keeps every measurement.

    Raises:
        InvalidArgumentError: a setting out of range (``field`` names it).
    """

    def __init__(
        self,
        *,
        max_tokens: int = 4096,
        forgetting: float = 0.998,
        smoothing: float = 0.01,
        outlier_factor: float = 3.0,
    ) -> None:
        if max_tokens < 1:
            raise InvalidArgumentError(
                f"max_tokens must be >= 1, got {max_tokens}", field="max_tokens"
            )
        if not 0.0 < forgetting <= 1.0:
            raise InvalidArgumentError(
                f"forgetting must be in (0, 1], got {forgetting}", field="forgetting"
            )
        if not smoothing > 0.0:
            raise InvalidArgumentError(f"smoothing must be > 0, got {smoothing}", field="smoothing")
        if not outlier_factor > 1.0:  # inf allowed
            raise InvalidArgumentError(
                f"outlier_factor must be > 1, got {outlier_factor}", field="outlier_factor"
            )
        self.knots = token_knots(max(max_tokens, 4))
        self.forgetting = forgetting
        self.smoothing = smoothing
        self.outlier_factor = outlier_factor
        n = len(self.knots) + _EXTRA_FEATURES
        self._gram = np.zeros((n, n))
        self._moment = np.zeros(n)
        self._knot_weight = np.zeros(len(self.knots))
        # Sum of the observations' weights and their number (forgetting applied): the
        # penalty is scaled to the mean weight, i.e. relative to one observation.
        self._weights = np.zeros(2)
        # Measurements not yet folded into the sums above: an engine observes every step,
        # so observing only appends, and the numpy work is done in one go when the model is
        # read (see _fold), off the step's path.
        self._pending: list[tuple[float, float, float, float, float]] = []
        #: Measured steps, all of them.
        self.observations = 0
        self._coef: np.ndarray | None = None
        self._increments: np.ndarray | None = None  # the last solve's, to start the next
        # The last solve's coefficients and knot weights as floats: the outlier rule's
        # reference, read in pure Python by every observation (a solve per observation would
        # cost milliseconds), and the observation count when it was made.
        self._reference: list[float] | None = None
        self._reference_weight: list[float] = []
        self._reference_at = 0
        self._knot_list: list[float] = [float(k) for k in self.knots]
        self._penalty = self._penalty_matrix()

    # -- features ---------------------------------------------------------------------------

    def _features(
        self, tokens: np.ndarray, context: np.ndarray, pairs: np.ndarray, drafted: np.ndarray
    ) -> np.ndarray:
        m = len(self.knots)
        x = np.zeros((len(tokens), m + _EXTRA_FEATURES))
        lower, upper, t = _hat(self.knots, tokens)
        rows = np.arange(len(tokens))
        x[rows, lower] += 1.0 - t
        x[rows, upper] += t
        x[:, m] = context / _CONTEXT_UNIT
        x[:, m + 1] = pairs / _PAIRS_UNIT
        x[:, m + 2] = drafted
        return x

    def _penalty_matrix(self) -> np.ndarray:
        """Rows penalising the change of slope at each inner knot, scaled by the knot
        spacing so that the penalty is in seconds whatever the spacing, and a row penalising
        the draft overhead as much as a jump of the curve at a knot: otherwise the overhead
        would be the free way to fit one slow step at a size seldom drafted (where it and a
        jump of the curve are one and the same, at one request a step)."""
        k = self.knots
        m = len(k)
        rows = np.zeros((max(m - 2, 0) + 1, m + _EXTRA_FEATURES))
        rows[-1, m + 2] = 1.0
        for j in range(1, m - 1):
            h1, h2 = k[j] - k[j - 1], k[j + 1] - k[j]
            h = (h1 + h2) / 2.0
            rows[j - 1, j - 1] = h / h1
            rows[j - 1, j] = -h / h1 - h / h2
            rows[j - 1, j + 1] = h / h2
        return rows.T @ rows

    # -- learning ---------------------------------------------------------------------------

    def observe(
        self,
        tokens: int,
        seconds: float,
        *,
        context: int = 0,
        pairs: int = 0,
        drafted: bool = False,
    ) -> None:
        """Adds one measured step.

        Args:
            tokens: query tokens of the step (>= 1).
            seconds: how long it took (> 0; ``nan`` or ``inf`` are refused).
            context: KV entries the batch attended to.
            pairs: query-key pairs (sum over requests of ``slots * (cached + slots)``).
            drafted: the step verified draft tokens.

        Raises:
            InvalidArgumentError: a value out of range.
        """
        check_measurement(tokens, seconds, context, pairs)
        if math.isfinite(self.outlier_factor):
            reference = self._outlier_reference(tokens)
            if reference is not None:
                predicted = self._predict_one(reference, tokens, context, pairs, drafted)
                if predicted > 0:
                    seconds = min(seconds, self.outlier_factor * predicted)
        self._pending.append(
            (float(tokens), float(seconds), float(context), float(pairs), float(drafted))
        )
        self.observations += 1
        self._coef = None

    def _outlier_reference(self, tokens: int) -> list[float] | None:
        """The fit a measurement of ``tokens`` is checked against: the last solve's, refitted
        when older than ``_REFERENCE_AGE`` observations; None while the model is not ready or
        had no measurement near ``tokens`` then."""
        stale = self.observations - self._reference_at >= _REFERENCE_AGE
        if (self._reference is None or stale) and self.observations and self.ready:
            self._solve()
        if self._reference is None:
            return None
        knots = self._knot_list
        i = min(max(bisect.bisect_left(knots, tokens), 1), len(knots) - 1)
        weight = self._reference_weight
        if weight[i - 1] + weight[i] < 1.0:
            return None
        return self._reference

    def _predict_one(
        self, coef: list[float], tokens: int, context: int, pairs: int, drafted: bool
    ) -> float:
        """:meth:`predict` of one step under the coefficients ``coef``, without numpy."""
        knots, m = self._knot_list, len(self._knot_list)
        i = bisect.bisect_left(knots, tokens)
        if i == 0:
            base = coef[0]
        else:
            i = min(i, m - 1)  # beyond the last knot: the last segment's line, extended
            lo, hi = knots[i - 1], knots[i]
            base = coef[i - 1] + (coef[i] - coef[i - 1]) * (tokens - lo) / (hi - lo)
        extra = coef[m] * context / _CONTEXT_UNIT + coef[m + 1] * pairs / _PAIRS_UNIT
        return base + extra + (coef[m + 2] if drafted else 0.0)

    def _fold(self) -> None:
        """Folds the pending measurements into the sums, as if each had been added when it
        was observed: with forgetting ``f``, the ``j``-th of ``k`` pending counts ``f**(k-1-j)``
        and what was there before ``f**k``."""
        if not self._pending:
            return
        tok, sec, ctx, prs, drf = np.asarray(self._pending, dtype=np.float64).T
        self._pending.clear()
        x = self._features(tok, ctx, prs, drf)
        decay = self.forgetting ** np.arange(len(tok) - 1, -1, -1, dtype=np.float64)
        before = self.forgetting ** len(tok)
        # Relative errors count: a step of 30 ms and one of 3 s are fitted equally well
        # (absolute errors would let the large batches decide the small ones).
        weighted = decay / sec**2
        self._gram = before * self._gram + (x * weighted[:, None]).T @ x
        self._moment = before * self._moment + (weighted * sec) @ x
        self._knot_weight = before * self._knot_weight + decay @ np.abs(x[:, : len(self.knots)])
        self._weights = before * self._weights + np.array([weighted.sum(), decay.sum()])

    @property
    def knot_weight(self) -> np.ndarray:
        """Weight of the measurements near each knot (forgetting applied)."""
        self._fold()
        return self._knot_weight

    def samples(self, tokens) -> np.ndarray:
        """The weight of measurements at each token count (interpolated between the two
        knots around it): about the number of recent steps measured at that size."""
        return np.interp(np.asarray(tokens, dtype=np.float64), self.knots, self.knot_weight)

    @property
    def ready(self) -> bool:
        """Whether measurements at two different sizes at least exist (so a slope is known)."""
        return int(np.count_nonzero(self.knot_weight > 0.5)) >= 2

    def _solve(self) -> np.ndarray:
        if self._coef is not None:
            return self._coef
        self._fold()
        m = len(self.knots)
        n = m + _EXTRA_FEATURES
        mean_weight = self._weights[0] / max(self._weights[1], 1e-300)
        a = self._gram + self.smoothing * mean_weight * self._penalty
        # A step never gets faster with more tokens or more context: the token curve is
        # fitted as its value at one token plus non-negative increments between knots, and
        # the context and draft terms are non-negative (noisy measurements, a step that lost
        # the CPU, would otherwise bend the curve below zero or make wide trees look cheap).
        cumulative = np.eye(n)
        cumulative[:m, :m] = np.tril(np.ones((m, m)))
        increments = _nonnegative_least_squares(
            cumulative.T @ a @ cumulative, cumulative.T @ self._moment, self._increments
        )
        self._increments = increments
        self._coef = cumulative @ increments
        self._reference = self._coef.tolist()
        self._reference_weight = self._knot_weight.tolist()
        self._reference_at = self.observations
        return self._coef

    # -- prediction -------------------------------------------------------------------------

    def predict(self, tokens, context=0, pairs=0, drafted=False) -> np.ndarray:
        """Predicted seconds of steps of these shapes (arrays broadcast against ``tokens``).

        Raises:
            InvalidArgumentError: nothing was measured yet.
        """
        if self.observations == 0:
            raise InvalidArgumentError("the cost model has no measurement yet", field="cost")
        coef = self._solve()
        k, m = self.knots, len(self.knots)
        tok = np.asarray(tokens, dtype=np.float64)
        base = np.interp(tok, k, coef[:m])
        slope = (coef[m - 1] - coef[m - 2]) / (k[-1] - k[-2])
        base = base + np.maximum(tok - k[-1], 0.0) * slope  # linear beyond the last knot
        ctx = np.asarray(context, dtype=np.float64) / _CONTEXT_UNIT
        prs = np.asarray(pairs, dtype=np.float64) / _PAIRS_UNIT
        drf = np.asarray(drafted, dtype=np.float64)
        return np.atleast_1d(base + coef[m] * ctx + coef[m + 1] * prs + coef[m + 2] * drf)

    @property
    def draft_seconds(self) -> float:
        """What a step pays once for verifying any draft token, over the same step without
        (0 until measured).

        Raises:
            InvalidArgumentError: nothing was measured yet.
        """
        if self.observations == 0:
            raise InvalidArgumentError("the cost model has no measurement yet", field="cost")
        return float(self._solve()[len(self.knots) + 2])

    def curve(self, tokens: Iterable[int], context: int = 0) -> list[tuple[int, float]]:
        """``(tokens, seconds)`` at the given sizes, for reports (``pairs`` and ``drafted``
        as one request would have them: every token after the first is a draft token)."""
        sizes = [int(t) for t in tokens]
        pairs = [t * (context + t) for t in sizes]
        drafted = [t > 1 for t in sizes]
        seconds = self.predict(sizes, context, pairs, drafted)
        return [(t, float(s)) for t, s in zip(sizes, seconds, strict=True)]

    # -- persistence ------------------------------------------------------------------------

    @classmethod
    def from_measurements(cls, rows: Iterable[Mapping[str, float]], **settings: Any) -> CostModel:
        """A model fitted to measured steps (without forgetting between them).

        Args:
            rows: mappings with ``tokens`` and ``seconds``, optionally ``context``,
                ``pairs`` and ``drafted`` (``scripts/gpu_cost_curve.py`` writes the first four
                under ``"points"``: forward passes, no draft verified).
            settings: :class:`CostModel` arguments (``max_tokens`` defaults to the largest
                measured size).
        """
        rows = list(rows)
        if not rows:
            raise InvalidArgumentError("no measurement given", field="rows")
        settings.setdefault("max_tokens", max(int(r["tokens"]) for r in rows))
        forgetting = settings.pop("forgetting", 0.998)
        outlier_factor = settings.pop("outlier_factor", 3.0)
        model = cls(forgetting=1.0, outlier_factor=math.inf, **settings)
        for r in rows:
            model.observe(
                int(r["tokens"]),
                float(r["seconds"]),
                context=int(r.get("context", 0)),
                pairs=int(r.get("pairs", 0)),
                drafted=bool(r.get("drafted", False)),
            )
        model._fold()  # before the forgetting changes: these rows never decay
        model.forgetting, model.outlier_factor = forgetting, outlier_factor
        return model

    def __repr__(self) -> str:
        if not self.ready:
            return f"CostModel(observations={self.observations}, not ready)"
        pts = ", ".join(f"{t}:{s * 1e3:.1f}ms" for t, s in self.curve([1, 2, 4, 8, 16]))
        return f"CostModel(observations={self.observations}, {pts})"
