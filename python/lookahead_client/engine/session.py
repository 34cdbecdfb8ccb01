"""One engine's drafting loop, shared by the SGLang corpus and the vLLM drafting.

Every engine step goes the same way, whichever engine asks:

1. :meth:`DraftSession.begin` settles the drafter's answers to earlier steps (the guard's late
   outcomes are committed to the request book); while the drafter is still busy with one, the
   step has no drafts.
2. :meth:`DraftSession.draft` plans the step from the engine's views of its requests (the book
   sends each request's tokens once), runs it behind the deadline guard and commits what the
   drafter now holds; ``None`` when there is nothing to use (no request to draft, too late, the
   drafter failed as a whole, or a quiet step that did not call it).
3. The engine lays the trees out in its own arrays, and tells the session what each request got
   (:meth:`DraftSession.fed`), so the next step can check the drafter's expectations against
   what the engine accepted; a tree the engine cannot use is :meth:`DraftSession.refused`.

Only step 3 differs between engines (SGLang's slot arrays, vLLM's chains).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lookahead_client.engine.book import RequestBook, RequestView, StepPlan
from lookahead_client.engine.guard import DraftGuard
from lookahead_client.engine.warn_once import WarnOnce
from lookahead_client.errors import InvalidArgumentError, LookaheadError
from lookahead_client.types import DraftBatch, EngineCost

__all__ = ["DraftSession", "Drafts"]

# The drafter's call time (DraftSession.call_seconds) is a moving mean over about the last
# 20 calls: a server's round trip changes with its host's load.
_CALL_TIME_MEMORY = 0.95


@dataclass(frozen=True, slots=True)
class Drafts:
    """The drafter's answer to one step, and which of the step's views got which tree.

    Attributes:
        plan: the step as the book planned it.
        batch: the drafter's trees, indexed by the plan's requests.
        failed: indices into ``plan.requests`` the drafter refused (their trees are empty).
    """

    plan: StepPlan
    batch: DraftBatch
    failed: frozenset[int]

    def tree_of(self, view: int) -> int:
        """The tree of the ``view``-th view in ``batch``: its index, -1 when it has none (not
        drafted this step, or refused by the drafter)."""
        index = self.plan.live[view]
        return -1 if index < 0 or index in self.failed else index


class DraftSession:
    """The request book and the deadline guard of one engine, stepped together.

    Args:
        guard: the drafter behind its deadline.
        book: the engine's requests as the drafter holds them.
        log: where problems are logged (once per kind, then counted).
        quiet_every: while every request of a step is quiet (:meth:`RequestBook.quiet`:
            nothing accepted for a while, nothing to verify), the drafter may be called only
            every ``quiet_every``-th step, the tokens of the steps between going with that
            call; 1 calls it every step. For a drafter whose call costs more than it is
            likely to give (a server's round trip at temperature 1). A quiet step is skipped
            only while the call costs more than it is worth: its measured time
            (:attr:`call_seconds`) against what the engine's quiet requests have made of
            their trees (:attr:`RequestBook.quiet_yield`) times a token's time on the step's
            cost curve. Without a curve every quiet step but each ``quiet_every``-th is
            skipped.
    """

    def __init__(
        self, guard: DraftGuard, book: RequestBook, log: logging.Logger, quiet_every: int = 1
    ) -> None:
        if quiet_every < 1:
            raise InvalidArgumentError(
                f"quiet_every must be >= 1, got {quiet_every}", field="quiet_every"
            )
        self.guard = guard
        self.book = book
        self.warn = WarnOnce(log)
        self.quiet_every = quiet_every
        #: Engine steps begun.
        self.steps = 0
        #: Steps that did not call the drafter because their requests were quiet.
        self.quiet_steps = 0
        self._quiet_run = 0  # quiet steps since the drafter was last called
        #: The drafter's recent time per call, seconds (None before the first call).
        self.call_seconds: float | None = None

    def begin(self) -> bool:
        """Starts a step: commits the answers that came in late. False when the drafter is
        still busy (a skip is counted; the step decodes plainly)."""
        self.steps += 1
        for plan, outcome in self.guard.collect():
            self.book.commit(plan, outcome.failed, _held(outcome.batch))
        if not self.guard.ready:
            self.guard.skip()
            return False
        return True

    def draft(self, views: Sequence[RequestView], cost: EngineCost | None = None) -> Drafts | None:
        """The drafter's trees for ``views`` (after :meth:`begin` returned True), or None when
        the step has none to use. A ``cost`` goes to the drafter with the measured acceptance
        of the scores of these requests (:meth:`RequestBook.acceptance_of`)."""
        if self._skips(views, cost):
            self._quiet_run += 1
            self.quiet_steps += 1
            self.book.pass_step()
            return None
        self._quiet_run = 0
        plan = self.book.plan(views)
        if not plan.requests:
            return None
        if cost is not None:
            plan.acceptance = self.book.acceptance_of(views)
            cost = dataclasses.replace(cost, acceptance=plan.acceptance)
        started = time.perf_counter()
        outcome = self.guard.run(plan.requests, token=plan, cost=cost)
        self._timed(time.perf_counter() - started)
        if outcome.late:
            return None  # committed by a later begin(), when it comes in
        self.book.commit(plan, outcome.failed, _held(outcome.batch))
        if outcome.batch is None:
            return None
        return Drafts(plan, outcome.batch, outcome.failed or frozenset())

    def _skips(self, views: Sequence[RequestView], cost: EngineCost | None) -> bool:
        """This step goes without a drafter call: its requests are quiet, the drafter was
        called less than ``quiet_every`` steps ago, and the call costs more than it is worth.
        Its worth: each of the batch's ``n`` requests expects the quiet yield in accepted
        tokens, and an accepted token saves its request a ``1/n`` share of a plain step, so
        the call is worth the yield times one plain step."""
        if self._quiet_run + 1 >= self.quiet_every or not self.book.quiet(views):
            return False
        if cost is None or self.call_seconds is None:
            return True  # nothing to weigh the call against
        plain = max(cost.base_tokens, len(views))
        step = float(np.interp(plain, cost.tokens, cost.seconds))
        return self.book.quiet_yield * step < self.call_seconds

    def _timed(self, seconds: float) -> None:
        """Counts one drafter call's time into :attr:`call_seconds`."""
        last = self.call_seconds
        self.call_seconds = (
            seconds
            if last is None
            else _CALL_TIME_MEMORY * last + (1 - _CALL_TIME_MEMORY) * seconds
        )

    def fed(self, drafts: Drafts, view: int, depth: int, expected: float = 0.0) -> None:
        """The engine verifies, for the ``view``-th view, a draft of ``depth`` levels (-1:
        none) whose scores sum to ``expected``."""
        self.book.fed(drafts.plan, view, depth, expected)

    def refused(self, rid: str, kind: str, message: str) -> None:
        """The engine cannot use ``rid``'s tree (see :func:`~.checks.draft_problem`): logged;
        a tree on the wrong root means the drafter's copy of the request is wrong, so the
        request is started again."""
        self.warn(kind, "request %s: %s", rid, message)
        if kind == "root":
            self.book.resync(rid)

    def drafter_stats(self) -> dict[str, Any]:
        """The drafter's own counters (a remote drafter asks its server); empty when it keeps
        none or cannot be reached (logged once)."""
        read = getattr(self.guard.drafter, "stats", None)  # a stand-in drafter may keep none
        try:
            return read() if callable(read) else {}
        except LookaheadError as e:
            self.warn("stats", "the drafter's counters are unavailable: %s", e)
            return {}

    def stats(self) -> dict[str, Any]:
        """Counters of the loop: steps (those that were quiet, and what quiet requests made
        of their trees), the book's requests and calibration counts, problems by kind, the
        guard's own (deadlines, skips, fallbacks, proposer time), and the draft tokens this
        engine accepted as its drafter counted them, with those drafted from other replicas'
        text (``replica_accepted``, ``cross_replica_accepted``)."""
        book = self.book
        out: dict[str, Any] = {
            "steps": self.steps,
            "quiet_steps": self.quiet_steps,
            "quiet_draws": book.quiet_draws,
            "quiet_accepted": book.quiet_accepted,
            "tracked_requests": len(book),
            "resyncs": book.resyncs,
            "accepted_drafts": book.accepted_drafts,
            "expected_drafts": round(book.expected_drafts, 2),
            "weighted_expected_drafts": round(book.weighted_expected_drafts, 2),
            "disabled_requests": book.disabled,
            "owed_ends": book.owed_ends,
        }
        drafter = self.drafter_stats()
        out["replica_accepted"] = drafter.get("replica_accepted_reported")
        out["cross_replica_accepted"] = drafter.get("replica_accepted_cross_replica")
        for kind, count in self.warn.counts.items():
            out[f"problems_{kind}"] = count
        out.update(self.guard.stats())
        return out


def _held(batch: DraftBatch | None) -> list[int] | None:
    """The tokens the drafter says it holds of each request, when it says."""
    return None if batch is None or batch.held is None else batch.held.tolist()
