"""Cost-aware sizing of draft trees: how many draft nodes each step is worth verifying.

A tree's expected accepted length is the sum of its nodes' path-acceptance probabilities (the
accepted nodes are one path, and a node is on it exactly when its own path is accepted), so
the value of any sub-tree is known before verification. :class:`SizingPolicy` cuts every
request's tree, each step, to the size that maximises the batch's expected tokens per second:

    (sum over requests of 1 + expected accepted nodes) / predicted step seconds

over every size from zero nodes for everyone (plain decoding) to whole trees, with the step
time from a :class:`~lookahead_client.cost.CostModel`. Trees are cut best-scoring nodes first;
scores do not increase along a path, so what is kept stays a tree (ties go to the earlier
node, which a parent always is).

The drafter's scores are not taken at their word: :class:`AcceptanceCalibration` compares
them with what verification accepts (each node's acceptance given its parent's, per band of
the drafter's figure and depth), and :class:`RequestCorrection` scales each running
request's probabilities by how its own drafts fared; the policy uses the corrected figures,
and verifies drafts only when they are predicted to beat plain decoding by a ``margin``.
With ``learn_cost`` the cost model learns from the measured step times, and a size not
measured recently is tried now and then (``explore``) so that the model knows every size it
chooses among.

Two layouts: ``padded`` engines verify every request with the same number of slots (a
``[batch, slots]`` forward pass, as :mod:`lookahead_client.hf` and SGLang do), so the policy
picks one width for the step; ``ragged`` engines verify each request with its own number of
slots, so the policy picks nodes across the batch by score.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..cost import CostModel
from ..errors import InvalidArgumentError
from ..types import DraftTree

__all__ = ["AcceptanceCalibration", "RequestCorrection", "SizingPlan", "SizingPolicy", "LAYOUTS"]

#: The values of ``SizingPolicy(layout=...)``.
LAYOUTS = ("padded", "ragged")

# Depth buckets of the calibration: depth 1, 2, ..., 6-7, 8-10, 11-15, 16+.
_DEPTH_EDGES = np.asarray([1, 2, 3, 4, 5, 6, 8, 11, 16])


def _check_prior(prior_weight: float, forgetting: float) -> None:
    """Refuses a prior weight or a forgetting factor out of range, naming the field."""
    if not prior_weight > 0:
        raise InvalidArgumentError(
            f"prior_weight must be > 0, got {prior_weight}", field="prior_weight"
        )
    if not 0.0 < forgetting <= 1.0:
        raise InvalidArgumentError(
            f"forgetting must be in (0, 1], got {forgetting}", field="forgetting"
        )


class AcceptanceCalibration:
    """Realised versus predicted acceptance of draft nodes, learnt online.

    What is calibrated is each node's *conditional* acceptance, the probability that it is
    accepted when its parent is (the root always is): the drafter's own figure for it is the
    ratio of its score to its parent's, and a node's path probability is the product of the
    conditionals along its path, so a correction at one depth carries to every node below
    (and deep nodes, rarely reached, cannot be worth more than the path above them).

    Nodes are grouped by that ratio (``score_bins`` equal bands of [0, 1]) and by depth. A
    node's calibrated conditional is its group's acceptance rate among the nodes whose parent
    was accepted, shrunk by ``prior_weight`` pseudo-nodes towards its band's rate over all
    depths, itself shrunk the same way towards the node's own ratio:
    ``(accepted + w * band) / (reached + w)`` with ``band = (accepted_b + w * ratio) /
    (reached_b + w)``. So a depth seldom reached borrows what the other depths showed about
    the drafter's figures. Old steps fade (``forgetting`` per step), so a group that is no
    longer verified drifts back to the drafter's figures: a drafter judged too weak to verify
    is tried again now and then.

    Args:
        score_bins: bands of the ratio.
        prior_weight: pseudo-nodes at the drafter's own figure in every group.
        forgetting: weight kept by the past at each step (1.0 never forgets).

    Raises:
        InvalidArgumentError: a setting out of range.
    """

    def __init__(
        self, *, score_bins: int = 20, prior_weight: float = 4.0, forgetting: float = 0.995
    ) -> None:
        if score_bins < 1:
            raise InvalidArgumentError(
                f"score_bins must be >= 1, got {score_bins}", field="score_bins"
            )
        _check_prior(prior_weight, forgetting)
        self.score_bins = score_bins
        self.prior_weight = prior_weight
        self.forgetting = forgetting
        shape = (score_bins, len(_DEPTH_EDGES))
        self._reached = np.zeros(shape)
        self._accepted = np.zeros(shape)
        self._band_reached = np.zeros(score_bins)
        self._band_accepted = np.zeros(score_bins)
        #: Totals since the start (no forgetting): nodes verified, the sum of their scores,
        #: of their calibrated path probabilities when they were chosen, and of acceptances.
        self.nodes = 0
        self.expected_raw = 0.0
        self.expected = 0.0
        self.realised = 0

    def _cells(self, ratios: np.ndarray, depths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bins = np.minimum((ratios * self.score_bins).astype(np.int64), self.score_bins - 1)
        buckets = np.searchsorted(_DEPTH_EDGES, depths, side="right") - 1
        return bins, np.maximum(buckets, 0)

    def conditional(self, ratios: np.ndarray, depths: np.ndarray) -> np.ndarray:
        """Calibrated probability that each node is accepted given that its parent is.

        Args:
            ratios: the drafter's figure: the node's score over its parent's (1.0 for the
                root), clipped to [0, 1].
            depths: each node's depth (1 for children of the root).
        """
        r = np.minimum(np.maximum(np.asarray(ratios, dtype=np.float64), 0.0), 1.0)
        bins, buckets = self._cells(r, np.asarray(depths))
        w = self.prior_weight
        band = (self._band_accepted[bins] + w * r) / (self._band_reached[bins] + w)
        return (self._accepted[bins, buckets] + w * band) / (self._reached[bins, buckets] + w)

    def observe(
        self,
        ratios: np.ndarray,
        depths: np.ndarray,
        accepted: np.ndarray,
        reached: np.ndarray,
        *,
        scores: float = 0.0,
        expected: float = 0.0,
    ) -> None:
        """Adds one step's verified nodes (one call per step: the past fades once).

        Args:
            ratios: each node's score over its parent's.
            depths: each node's depth.
            accepted: whether each node was accepted.
            reached: whether each node's parent was accepted (always, under the root).
            scores: the sum of the nodes' scores (for :meth:`stats`).
            expected: the sum of their calibrated path probabilities (for :meth:`stats`).
        """
        r = np.minimum(np.maximum(np.asarray(ratios, dtype=np.float64), 0.0), 1.0)
        acc = np.asarray(accepted, dtype=bool)
        seen = np.asarray(reached, dtype=bool)
        for counts in (self._reached, self._accepted, self._band_reached, self._band_accepted):
            counts *= self.forgetting
        if seen.any():
            bins, buckets = self._cells(r[seen], np.asarray(depths)[seen])
            hits = acc[seen].astype(np.float64)
            np.add.at(self._reached, (bins, buckets), 1.0)
            np.add.at(self._accepted, (bins, buckets), hits)
            np.add.at(self._band_reached, bins, 1.0)
            np.add.at(self._band_accepted, bins, hits)
        self.nodes += len(r)
        self.expected_raw += float(scores)
        self.expected += float(expected)
        self.realised += int(acc.sum())

    def stats(self) -> dict[str, float | int]:
        """Nodes verified, accepted, and what the raw and calibrated scores predicted."""
        return {
            "nodes": self.nodes,
            "accepted": self.realised,
            "expected_raw": round(self.expected_raw, 2),
            "expected_calibrated": round(self.expected, 2),
        }


class RequestCorrection:
    """How much better or worse each running request's drafts do than the calibration says.

    Drafts are better for some requests than for others (a code edit copying its input, a
    chat answer with nothing to copy) in ways the drafter's scores may miss. For each request
    this keeps the acceptances of its nodes whose parent was accepted and the calibrated
    conditionals they had, fading by ``forgetting`` per step, and scales the request's
    conditionals by ``(accepted + w) / (expected + w)`` (``w = prior_weight``: a new request
    starts at 1).

    Args:
        prior_weight: pseudo-nodes at factor 1.
        forgetting: weight kept by a request's past at each of its steps.
        max_requests: the most requests tracked; the least recently seen go first (an
            engine that never calls :meth:`end` cannot make it grow without bound).

    Raises:
        InvalidArgumentError: a setting out of range.
    """

    def __init__(
        self, *, prior_weight: float = 2.0, forgetting: float = 0.9, max_requests: int = 65536
    ) -> None:
        _check_prior(prior_weight, forgetting)
        if max_requests < 1:
            raise InvalidArgumentError(
                f"max_requests must be >= 1, got {max_requests}", field="max_requests"
            )
        self.prior_weight = prior_weight
        self.forgetting = forgetting
        self.max_requests = max_requests
        self._seen: OrderedDict[Hashable, list[float]] = OrderedDict()

    def factors(self, keys: Sequence[Hashable]) -> np.ndarray:
        """The factor of each request (1.0 for one not seen yet)."""
        w = self.prior_weight
        out = np.ones(len(keys))
        for i, key in enumerate(keys):
            counts = self._seen.get(key)
            if counts is not None:
                out[i] = (counts[0] + w) / (counts[1] + w)
        return out

    def observe(self, key: Hashable, accepted: float, expected: float) -> None:
        """One step of one request: its reached nodes' acceptances and calibrated sum."""
        counts = self._seen.pop(key, None) or [0.0, 0.0]
        counts[0] = self.forgetting * counts[0] + accepted
        counts[1] = self.forgetting * counts[1] + expected
        self._seen[key] = counts
        while len(self._seen) > self.max_requests:
            self._seen.popitem(last=False)

    def end(self, key: Hashable) -> None:
        """Forgets a finished request."""
        self._seen.pop(key, None)

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(frozen=True)
class SizingPlan:
    """One step's sizing decision.

    Attributes:
        trees: the cut trees, one per request (nodes in their original order).
        num_slots: the widest tree plus its root: the slots of a padded step.
        tokens: the query tokens the step verifies (what the cost model is asked about).
        context: the KV entries the step attends to.
        pairs: query-key pairs of the step.
        expected_tokens: tokens the step is expected to emit, over the batch.
        predicted_seconds: the cost model's time for the step (None when it had none).
        probe: the size was chosen to measure it, not because it was predicted best.
    """

    trees: list[DraftTree]
    num_slots: int
    tokens: int
    context: int
    pairs: int
    expected_tokens: float
    predicted_seconds: float | None
    probe: bool
    # Flat per-node arrays of the kept nodes, tree by tree in tree order (for
    # SizingPolicy.observe); _parents indexes these arrays (-1 under the root).
    _scores: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    _ratios: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    _depths: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))
    _probs: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    _parents: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))
    _conds: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    _owners: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))
    _requests: tuple = ()


def _climb(parent: np.ndarray, value: np.ndarray, combine) -> np.ndarray:
    """``combine`` of every node's value with all its ancestors' values, by pointer jumping
    (a node's reach doubles each round: ~log2(depth) vectorised rounds)."""
    up = parent.copy()
    while (has := up >= 0).any():
        safe = np.where(has, up, 0)
        value = np.where(has, combine(value, value[safe]), value)
        up = np.where(has, up[safe], -1)
    return value


class _StepNodes:
    """The nodes of a step's trees as flat arrays (tree by tree, nodes in tree order)."""

    __slots__ = ("owner", "index", "parent", "depth", "score", "ratio", "prob", "count")

    def __init__(self, trees: Sequence[DraftTree]) -> None:
        self.count = np.fromiter((len(t) for t in trees), np.int64, len(trees))
        starts = np.repeat(np.cumsum(self.count) - self.count, self.count)
        self.owner = np.repeat(np.arange(len(trees)), self.count)
        self.index = np.arange(len(starts)) - starts
        local = np.asarray([p for t in trees for p in t.parents], dtype=np.int64)
        self.parent = np.where(local >= 0, local + starts, -1)
        self.score = np.asarray([x for t in trees for x in t.scores], dtype=np.float64)
        self.depth = _climb(self.parent, np.ones(len(starts), dtype=np.int64), np.add)
        above = np.where(self.parent >= 0, self.score[np.maximum(self.parent, 0)], 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.ratio = np.where(above > 0, self.score / above, 0.0)
        self.prob = np.zeros(len(starts))

    def path_products(self, conditional: np.ndarray) -> None:
        """Sets ``prob`` to the product of the conditionals along each node's path.

        Pointer jumping groups the factors differently for a node and its parent, so a
        child could come out an ulp above its parent; the minimum over the path (exact)
        restores the order that keeps a cut connected."""
        product = _climb(self.parent, conditional, np.multiply)
        self.prob = _climb(self.parent, product, np.minimum)

    def ranks(self) -> np.ndarray:
        """Each node's rank within its tree, best probability first (ties: tree order)."""
        order = np.lexsort((self.index, -self.prob, self.owner))
        rank = np.empty(len(order), dtype=np.int64)
        starts = np.repeat(np.cumsum(self.count) - self.count, self.count)
        rank[order] = np.arange(len(order)) - starts
        return rank


def _kept_parents(parent: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The parents of the kept nodes as positions among the kept nodes (-1: the root)."""
    position = np.cumsum(kept) - 1
    p = parent[kept]
    return np.where(p >= 0, position[np.maximum(p, 0)], -1)


def _cut(tree: DraftTree, keep: np.ndarray) -> DraftTree:
    """``tree`` with only the nodes at the (ancestor-closed) indices ``keep``, in order."""
    if len(keep) == len(tree):
        return tree
    return tree.select([int(i) for i in np.sort(keep)])


class SizingPolicy:
    """Chooses, each step, the draft nodes worth verifying (see the module docstring).

    Args:
        cost: the step-time model; a fresh one (learnt from this engine's steps) by default.
        calibration: the score calibration; a fresh one by default.
        correction: the per-request correction (used when :meth:`plan` gets request keys);
            a fresh one by default.
        layout: ``"padded"`` (one width for every request of a step) or ``"ragged"``.
        learn_cost: feed measured step times to ``cost`` (off for a fixed, profiled model).
        explore: try sizes the cost model has too few measurements of (``min_samples``).
        margin: how much faster than plain decoding (0.1: 10%) a step with drafts must be
            predicted to be to be chosen. The predictions are noisy, and choosing the best of
            noisy estimates favours the over-estimated ones; plain decoding is the safe side.
        min_samples: the weight of recent measurements (about their number) below which a
            size is measured again; a size that is never chosen is re-measured when its old
            measurements have faded below it.
        clock: the timer engines use to measure steps for :meth:`observe`.

    Raises:
        InvalidArgumentError: an unknown layout or a setting out of range.
    """

    def __init__(
        self,
        cost: CostModel | None = None,
        calibration: AcceptanceCalibration | None = None,
        correction: RequestCorrection | None = None,
        *,
        layout: str = "padded",
        learn_cost: bool = True,
        explore: bool = True,
        margin: float = 0.1,
        min_samples: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if layout not in LAYOUTS:
            raise InvalidArgumentError(
                f"layout must be one of {LAYOUTS}, got {layout!r}", field="layout"
            )
        if not margin >= 0:
            raise InvalidArgumentError(f"margin must be >= 0, got {margin}", field="margin")
        if not min_samples > 0:
            raise InvalidArgumentError(
                f"min_samples must be > 0, got {min_samples}", field="min_samples"
            )
        self.cost = cost if cost is not None else CostModel()
        self.calibration = calibration if calibration is not None else AcceptanceCalibration()
        self.correction = correction if correction is not None else RequestCorrection()
        self.layout = layout
        self.learn_cost = learn_cost
        self.explore = explore
        self.min_samples = min_samples
        self.margin = margin
        self.clock = clock
        self.steps = 0
        self.plain_steps = 0
        self.probe_steps = 0
        self.draft_nodes = 0
        #: How many steps chose each width (padded) or each node count per request (ragged,
        #: rounded down).
        self.width_histogram: dict[int, int] = {}

    # -- planning ---------------------------------------------------------------------------

    def plan(
        self,
        trees: Sequence[DraftTree],
        cached: Sequence[int],
        *,
        max_nodes: int,
        remaining: Sequence[int] | None = None,
        requests: Sequence[Hashable] | None = None,
    ) -> SizingPlan:
        """Cuts one step's trees.

        Args:
            trees: the drafter's tree of each request.
            cached: the KV entries each request's queries attend to (its cached length; for
                a padded cache, the cache's width).
            max_nodes: the most nodes a tree may keep (the engine's budget).
            remaining: the tokens each request may still emit; deeper nodes are dropped.
            requests: a key per request (its id), for the per-request correction; call
                :meth:`end` when a request finishes. None: no per-request correction.

        Raises:
            InvalidArgumentError: ``cached`` or ``remaining`` of the wrong length, or a
                negative ``max_nodes``.
        """
        bs = len(trees)
        if any(x is not None and len(x) != bs for x in (cached, remaining, requests)):
            raise InvalidArgumentError(
                f"cached/remaining/requests need one entry per tree ({bs})", field="cached"
            )
        if max_nodes < 0:
            raise InvalidArgumentError(
                f"max_nodes must be >= 0, got {max_nodes}", field="max_nodes"
            )
        nodes = _StepNodes(trees)
        conds = self.calibration.conditional(nodes.ratio, nodes.depth)
        adjusted = conds
        if requests is not None:
            factor = self.correction.factors(requests)[nodes.owner]
            adjusted = np.minimum(conds * factor, 1.0)
        nodes.path_products(adjusted)
        if remaining is not None:
            room = np.asarray(remaining, dtype=np.int64)[nodes.owner] - 1
            nodes.prob[nodes.depth > room] = 0.0
        rank = nodes.ranks()
        usable = (nodes.prob > 0) & (rank < max_nodes)
        ctx = np.asarray(cached, dtype=np.float64)
        if self.layout == "padded":
            keep_rank, tokens, pairs, expected, predicted, probe = self._padded(
                nodes, rank, usable, ctx
            )
        else:
            keep_rank, tokens, pairs, expected, predicted, probe = self._ragged(
                nodes, rank, usable, ctx
            )
        kept = usable & (rank < keep_rank[nodes.owner])
        cut = []
        for b, tree in enumerate(trees):
            cut.append(_cut(tree, nodes.index[kept & (nodes.owner == b)]))
        width = 1 + max((len(t) for t in cut), default=0)
        return SizingPlan(
            trees=cut,
            num_slots=width,
            tokens=tokens,
            context=int(ctx.sum()),
            pairs=pairs,
            expected_tokens=expected,
            predicted_seconds=predicted,
            probe=probe,
            _scores=nodes.score[kept],
            _ratios=nodes.ratio[kept],
            _depths=nodes.depth[kept],
            _probs=nodes.prob[kept],
            _parents=_kept_parents(nodes.parent, kept),
            _conds=conds[kept],
            _owners=nodes.owner[kept],
            _requests=tuple(requests) if requests is not None else (),
        )

    def _choose(
        self, tokens: np.ndarray, ctx_sum: float, pairs: np.ndarray, expected: np.ndarray
    ) -> tuple[int, float | None, bool]:
        """Index of the best candidate (or of a probe), its predicted time, whether a probe."""
        if self.explore and len(tokens) > 1:
            unmeasured = np.flatnonzero(self.cost.samples(tokens) < self.min_samples)
            if len(unmeasured):
                return int(unmeasured[-1]), None, True
        if not self.cost.ready:
            return len(tokens) - 1, None, False
        seconds = self.cost.predict(tokens, ctx_sum, pairs)
        rate = expected / np.maximum(seconds, 1e-12)
        best = int(np.argmax(rate))  # the first (smallest) of equal rates
        # Candidate 0 is plain decoding: drafts must beat it by the margin.
        if rate[best] < (1.0 + self.margin) * rate[0]:
            best = 0
        return best, float(seconds[best]), False

    def _padded(self, nodes: _StepNodes, rank: np.ndarray, usable: np.ndarray, ctx: np.ndarray):
        bs = len(ctx)
        widest = int(np.bincount(nodes.owner[usable], minlength=bs).max(initial=0)) if bs else 0
        # gain[b, k]: expected accepted nodes of request b with its k best nodes.
        gain = np.zeros((bs, widest + 1))
        gain[nodes.owner[usable], rank[usable] + 1] = nodes.prob[usable]
        gain = np.cumsum(gain, axis=1)
        slots = np.arange(1, widest + 2)
        expected = bs + gain.sum(axis=0)
        tokens = bs * slots
        pairs = (slots[:, None] * (ctx[None, :] + slots[:, None])).sum(axis=1)
        best, predicted, probe = self._choose(tokens, float(ctx.sum()), pairs, expected)
        keep = np.full(bs, best, dtype=np.int64)
        return keep, int(tokens[best]), int(pairs[best]), float(expected[best]), predicted, probe

    def _ragged(self, nodes: _StepNodes, rank: np.ndarray, usable: np.ndarray, ctx: np.ndarray):
        bs = len(ctx)
        idx = np.flatnonzero(usable)
        # Across the batch, best first; within a tree its own rank order (parents first).
        order = idx[np.lexsort((rank[idx], -nodes.prob[idx]))]
        owner, r = nodes.owner[order], rank[order]
        expected = bs + np.concatenate([[0.0], np.cumsum(nodes.prob[order])])
        tokens = bs + np.arange(len(order) + 1)
        # The b-th request's (k+1)-th node adds (cached + k + 2)(k + 2) - (cached + k + 1)(k + 1)
        # = cached + 2k + 3 query-key pairs.
        pairs0 = float((ctx + 1).sum())
        pairs = pairs0 + np.concatenate([[0.0], np.cumsum(ctx[owner] + 2 * r + 3)])
        best, predicted, probe = self._choose(tokens, float(ctx.sum()), pairs, expected)
        keep = np.zeros(bs, dtype=np.int64)
        np.maximum.at(keep, owner[:best], r[:best] + 1)
        return keep, int(tokens[best]), int(pairs[best]), float(expected[best]), predicted, probe

    # -- feedback ---------------------------------------------------------------------------

    def observe(
        self, plan: SizingPlan, accepted: Sequence[Sequence[int]], seconds: float | None
    ) -> None:
        """Feeds back what verification accepted and how long the step took.

        Args:
            plan: the step's plan.
            accepted: for each request, the indices (in its cut tree) of the accepted nodes;
                others (a padding slot whose token happened to be right) are ignored.
            seconds: the measured step time (None: not measured, the cost model is not fed).
        """
        flags = []
        for tree, acc in zip(plan.trees, accepted, strict=True):
            f = np.zeros(len(tree), dtype=bool)
            f[[i for i in acc if 0 <= i < len(tree)]] = True
            flags.append(f)
        hit = np.concatenate(flags) if flags else np.zeros(0, dtype=bool)
        reached = np.where(plan._parents >= 0, hit[np.maximum(plan._parents, 0)], True)
        self.calibration.observe(
            plan._ratios,
            plan._depths,
            hit,
            reached,
            scores=float(plan._scores.sum()),
            expected=float(plan._probs.sum()),
        )
        if plan._requests:
            bs = len(plan.trees)
            got = np.bincount(plan._owners[reached], hit[reached], minlength=bs)
            want = np.bincount(plan._owners[reached], plan._conds[reached], minlength=bs)
            for key, a, e in zip(plan._requests, got, want, strict=True):
                self.correction.observe(key, float(a), float(e))
        if self.learn_cost and seconds is not None and seconds > 0:
            self.cost.observe(plan.tokens, seconds, context=plan.context, pairs=plan.pairs)
        self.steps += 1
        self.probe_steps += plan.probe
        n = len(plan._scores)
        self.draft_nodes += n
        self.plain_steps += n == 0
        width = plan.num_slots if self.layout == "padded" else 1 + n // max(len(plan.trees), 1)
        self.width_histogram[width] = self.width_histogram.get(width, 0) + 1

    def end(self, request: Hashable) -> None:
        """A request finished: its per-request correction is dropped."""
        self.correction.end(request)

    def stats(self) -> dict[str, float | int | dict[int, int]]:
        """Steps, plain steps, probes, draft nodes, widths, and realised vs expected
        acceptance."""
        out: dict[str, float | int | dict[int, int]] = {
            "steps": self.steps,
            "plain_steps": self.plain_steps,
            "probe_steps": self.probe_steps,
            "draft_nodes": self.draft_nodes,
            "widths": dict(sorted(self.width_histogram.items())),
        }
        out.update(self.calibration.stats())
        return out
