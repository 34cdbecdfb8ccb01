"""Calling a drafter from an engine step without ever failing or stalling the step.

:class:`DraftGuard` runs each ``drafter.step`` on its own thread and waits at most a deadline,
or inline for a drafter that bounds its own step (:func:`guard_for`). What can happen to a step:

* it answers in time: its :class:`~lookahead_client.types.DraftBatch` is used as it is;
* it refuses requests: the step gets the batch the refusal carries (empty trees for the
  refused) and learns which requests' drafter state is in doubt;
* it raises otherwise: the step gets no trees (the caller falls back to root-only trees, i.e.
  plain decoding) and every request's drafter state is in doubt;
* it is late: the step gets no trees; the call goes on, and its outcome is handed back by
  :meth:`DraftGuard.collect` once it ends. Until then later steps are not sent (they fall back
  at once instead of queueing behind a stuck drafter).

The switch to fallback is logged once as a warning and the recovery once as info, never once
per step.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lookahead_client.embedded import EmbeddedDrafter
from lookahead_client.engine.config import REMOTE_QUIET_EVERY, LookaheadConfig
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.types import DraftBatch, Drafter, EngineCost, StepRequest

__all__ = ["DraftGuard", "Outcome", "guard_for", "quiet_every_for"]

_log = logging.getLogger("lookahead_client.engine")


@dataclass(frozen=True)
class Outcome:
    """What became of one drafter step.

    Attributes:
        batch: one tree per request when the drafter answered (possibly only partly, see
            ``failed``: those have empty trees); None when it raised without trees or is
            late.
        failed: indices of the requests whose drafter state is in doubt (None: all of them).
            Empty on success.
        late: the deadline passed; the call goes on and :meth:`DraftGuard.collect` reports it.
        error: why the step failed, for logs.
    """

    batch: DraftBatch | None
    failed: frozenset[int] | None = frozenset()
    late: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The drafter answered and accepted every request."""
        return self.batch is not None and self.failed == frozenset()


class _Call:
    """One drafter call running on the guard's thread."""

    __slots__ = ("requests", "token", "cost", "done", "result", "error")

    def __init__(self, requests: list[StepRequest], token: Any, cost: EngineCost | None) -> None:
        self.requests = requests
        self.token = token
        self.cost = cost
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def step(self, drafter: Drafter) -> Any:
        """The drafter's step."""
        return drafter.step(self.requests, self.cost)


def _outcome_of(n: int, result: Any, failure: BaseException | None) -> Outcome:
    """The outcome of a finished call of ``n`` requests: what it returned, or raised."""
    if failure is None:
        if isinstance(result, list):  # a drafter of the earlier protocol: its trees
            try:
                result = DraftBatch.from_trees(result)
            except InvalidArgumentError as e:
                return Outcome(None, None, error=str(e))
        if isinstance(result, DraftBatch) and len(result) == n:
            return Outcome(result)
        got = len(result) if isinstance(result, DraftBatch) else type(result).__name__
        return Outcome(None, None, error=f"the drafter returned {got} trees for {n} requests")
    reason = f"{type(failure).__name__}: {failure}"
    # A refusal of some requests carries the step's batch (see Drafter.step).
    batch = getattr(failure, "batch", None)
    if isinstance(batch, DraftBatch) and len(batch) == n and batch.errors:
        reason = f"{len(batch.errors)} of {n} requests refused: {reason}"
        failed = frozenset(batch.errors)
        return Outcome(batch, failed, error=reason)
    return Outcome(None, None, error=reason)


class DraftGuard:
    """Calls ``drafter.step`` with a deadline and turns every failure into an :class:`Outcome`.

    While the drafter fails, steps are not sent to it at all (they fall back at once) except for
    a probe after a backoff that doubles from ``min_backoff`` to ``max_backoff`` seconds.

    Args:
        drafter: any drafter following the ``Drafter`` protocol.
        deadline: seconds a step may wait for the drafter; None calls it inline (no thread,
            no deadline).
        describe: the drafter's name in log lines.
        min_backoff, max_backoff: how soon a failing drafter is tried again.
        clock: for tests.
    """

    def __init__(
        self,
        drafter: Drafter,
        deadline: float | None,
        *,
        describe: str = "drafter",
        min_backoff: float = 0.05,
        max_backoff: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.drafter = drafter
        self.deadline = deadline
        self._describe = describe
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._clock = clock
        self._pending: _Call | None = None
        self._queue: queue.SimpleQueue[_Call] | None = None
        self._healthy = True
        self._down_since = 0.0
        self._backoff = 0.0
        self._retry_at = 0.0
        #: Steps that got no drafts: failed, late, or skipped behind a late call.
        self.fallback_steps = 0
        #: Steps not sent because an earlier call was still running.
        self.skipped_steps = 0
        #: Steps whose deadline passed.
        self.late_steps = 0
        #: Times the drafter went from answering to failing.
        self.outages = 0

    # -- the drafter's thread ---------------------------------------------------------------

    def _worker(self) -> None:
        assert self._queue is not None
        while True:
            call = self._queue.get()
            try:
                call.result = call.step(self.drafter)
            except BaseException as e:  # noqa: BLE001 - every failure becomes an Outcome
                call.error = e
            call.done.set()

    def _submit(self, call: _Call) -> None:
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            threading.Thread(target=self._worker, name="lookahead-draft", daemon=True).start()
        self._queue.put(call)

    # -- steps ------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A late call is still running: a step now would not be sent."""
        return self._pending is not None and not self._pending.done.is_set()

    @property
    def ready(self) -> bool:
        """A step may be sent now: no late call is running and no backoff is in progress."""
        return not self.busy and (self._healthy or self._clock() >= self._retry_at)

    def collect(self) -> list[tuple[Any, Outcome]]:
        """The ``(token, outcome)`` of a late call that has ended since (at most one)."""
        call = self._pending
        if call is None or not call.done.is_set():
            return []
        self._pending = None
        outcome = _outcome_of(len(call.requests), call.result, call.error)
        self._record(outcome)
        return [(call.token, outcome)]

    def skip(self) -> None:
        """Counts a step that was not sent (not :attr:`ready`)."""
        self.skipped_steps += 1
        self.fallback_steps += 1

    def run(
        self, requests: Sequence[StepRequest], token: Any = None, cost: EngineCost | None = None
    ) -> Outcome:
        """One drafter step. Never raises (but see :attr:`busy`: the caller must not run a step
        while a late one is running, or the late one's outcome would be lost).

        Args:
            requests: the step's requests.
            token: handed back with the outcome by :meth:`collect` if the call is late.
            cost: the engine's cost, for sized shapes.
        """
        if self.busy:
            raise RuntimeError("DraftGuard.run while a late call is running; check busy first")
        deadline = self.deadline
        if deadline is None:  # inline: no call object, no event (this is every step's path)
            result: Any = None
            error: BaseException | None = None
            try:
                result = self.drafter.step(requests, cost)
            except Exception as e:  # noqa: BLE001 - every failure becomes an Outcome
                error = e
            outcome = _outcome_of(len(requests), result, error)
        else:
            call = _Call(list(requests), token, cost)
            self._submit(call)
            if not call.done.wait(deadline):
                self._pending = call
                self.late_steps += 1
                outcome = Outcome(
                    None, None, late=True, error=f"no answer within {deadline * 1e3:.0f} ms"
                )
                self._record(outcome)
                return outcome
            outcome = _outcome_of(len(call.requests), call.result, call.error)
        self._record(outcome)
        return outcome

    def _record(self, outcome: Outcome) -> None:
        """Counts the outcome and logs the transitions between answering and failing."""
        if outcome.batch is not None:
            if not self._healthy:
                self._healthy = True
                _log.info(
                    "%s answers again after %.2f s; drafting resumed",
                    self._describe,
                    self._clock() - self._down_since,
                )
            if outcome.failed:
                _log.debug("%s refused part of a step: %s", self._describe, outcome.error)
            return
        self.fallback_steps += 1
        now = self._clock()
        if self._healthy:
            self._healthy = False
            self.outages += 1
            self._down_since = now
            self._backoff = self._min_backoff
            _log.warning(
                "%s failed (%s): steps decode without drafts until it answers",
                self._describe,
                outcome.error,
            )
        else:
            self._backoff = min(self._backoff * 2, self._max_backoff)
        self._retry_at = now + self._backoff

    def stats(self) -> dict[str, int | bool]:
        """Counters: fallback, skipped and late steps, outages, current health."""
        return {
            "healthy": self._healthy,
            "fallback_steps": self.fallback_steps,
            "skipped_steps": self.skipped_steps,
            "late_steps": self.late_steps,
            "outages": self.outages,
        }


def guard_for(config: LookaheadConfig, drafter: Drafter) -> DraftGuard:
    """The guard an engine process puts around the drafter ``config`` built.

    The drafters the package builds are called inline, on the engine's thread, because each
    bounds its own step: the in-process Rust core
    (:class:`~lookahead_client.embedded.EmbeddedDrafter`) by the step's budgets (microseconds),
    the remote client (:class:`~lookahead_client.remote.RemoteDrafter`) by its gRPC deadline
    (``config.timeout``; its first call, which connects, has ``connect_timeout``), after which
    it answers with empty trees. Handing a step to a thread and waiting for it costs a thread
    switch and a GIL hand-over every step: more than the embedded core's whole step, and
    a remote step took 2.2 ms with it against 1.3 ms inline in vLLM (docs/vllm-runs.md, run 9).
    Any other drafter is called on the guard's thread with the deadline ``config.timeout``.
    """
    describe = f"lookahead {config.describe()}"
    if isinstance(drafter, EmbeddedDrafter) or _is_remote_client(drafter):
        return DraftGuard(drafter, None, describe=describe)
    return DraftGuard(drafter, config.timeout, describe=describe)


def quiet_every_for(config: LookaheadConfig, drafter: Drafter) -> int:
    """How often an engine calls ``drafter`` while its requests are quiet
    (:class:`~lookahead_client.engine.session.DraftSession`): ``config.quiet_every``, by
    default every :data:`~lookahead_client.engine.config.REMOTE_QUIET_EVERY`-th step for the
    remote client and every step for any other drafter."""
    if config.quiet_every is not None:
        return config.quiet_every
    return REMOTE_QUIET_EVERY if _is_remote_client(drafter) else 1


def _is_remote_client(drafter: Drafter) -> bool:
    """The drafter is the package's sync remote client (without importing gRPC where no
    remote client was ever built: the embedded default does not need it)."""
    sync = sys.modules.get("lookahead_client.remote.sync")
    return sync is not None and isinstance(drafter, sync.RemoteDrafter)
