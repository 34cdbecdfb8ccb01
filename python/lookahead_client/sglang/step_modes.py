"""Plain decode steps inside SGLang's NGRAM mode, where they are measured to be cheaper.

SGLang 0.5.23 verifies ``d`` slots per request on every NGRAM decode step, drafted or not (see
docs/sglang.md, "Cost-aware steps"). Where verifying ``d`` slots costs more than decoding
one token (a CPU; a GPU at large batches), a step that verifies little costs more than plain
decoding would. The worker can run a decode step as a plain one (one token per request,
SGLang's own decode forward) when the batch has no draft node at all; :class:`StepModes`
decides when, from the engine's own step times:

* it measures every decode step from its start to the start of the next forward (propose to
  propose: the forward, sampling and the scheduler's work around them), per kind (verify or
  plain) and batch size, and keeps the median of the last few of each (a step that lost the
  CPU, or an idle gap before the next request, moves a median little);
* :meth:`StepModes.cost` hands the drafter the step's cost as the core's padded
  :class:`~lookahead_client.types.EngineCost`: one unit for plain decoding (``bs`` tokens),
  ``verify / plain`` for any tree (``bs + 1`` tokens on), so that the core's sizing keeps a
  batch's trees only when their expected accepted tokens pay for the verify, and cuts them
  all otherwise. Where the verify time at the step's batch size is stale (never measured, or
  not in the last ``stale_after`` decode steps) the cost asks the core to explore (keep a
  width of one beyond its choice) until a verify step measures it again: an exploring verify
  costs what a whole one does, so it is spent where the estimate is old, not on a fixed
  rhythm. Until a plain step was measured the cost forbids every tree: the engine's first
  decode step runs plain and measures it;
* :meth:`StepModes.plain_pays` says whether a batch without draft nodes should run plain: when
  plain is measured cheaper, or not measured yet at any batch size (that step measures it),
  and every ``remeasure_every``-th time otherwise, so that a machine whose costs change is
  followed.

Only the ratio of the two times matters (tokens per second of either kind scale alike), so a
batch size measured in one kind only borrows the ratio of the nearest size measured in both.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque

from lookahead_client.errors import InvalidArgumentError
from lookahead_client.types import EngineCost

__all__ = ["StepModes"]

# Steps of one kind and batch size whose median is the estimate.
_WINDOW = 9
# Decode steps after which a batch size's verify time is stale and worth an exploring verify.
_STALE_AFTER = 256
# Batches without drafts between two plain steps taken to remeasure a dearer plain step.
_REMEASURE_EVERY = 64
# The verify / plain ratio before a plain step was measured: no tree pays for it.
_UNMEASURED = 1e6


class StepModes:
    """Measured step times of verify and plain decode steps; the choice between them.

    Args:
        slots: ``d``, SGLang's ``speculative_num_draft_tokens`` (the root included).
        remeasure_every: see the module's text (0: never remeasure a dearer plain step).
        stale_after: see the module's text (0: never explore).
    """

    def __init__(
        self,
        slots: int,
        *,
        remeasure_every: int = _REMEASURE_EVERY,
        stale_after: int = _STALE_AFTER,
    ) -> None:
        if slots < 2:
            raise InvalidArgumentError(f"slots must be >= 2, got {slots}", field="slots")
        if remeasure_every < 0:
            raise InvalidArgumentError(
                f"remeasure_every must be >= 0, got {remeasure_every}", field="remeasure_every"
            )
        if stale_after < 0:
            raise InvalidArgumentError(
                f"stale_after must be >= 0, got {stale_after}", field="stale_after"
            )
        self.slots = slots
        self.remeasure_every = remeasure_every
        self.stale_after = stale_after
        # (plain?, batch size) -> the last step times of that kind and size.
        self._times: dict[tuple[bool, int], deque[float]] = {}
        # The decode step under way: (its start, plain?, batch size).
        self._open: tuple[float, bool, int] | None = None
        # Batch size -> the decode step (of _decode_steps) that last measured a verify there.
        self._verified_at: dict[int, int] = {}
        self._empty = 0
        #: Decode steps run plain, and verified.
        self.plain_steps = 0
        self.verify_steps = 0
        #: Their measured seconds, summed (gaps before the next forward included).
        self.plain_seconds = 0.0
        self.verify_seconds = 0.0

    # -- measuring --------------------------------------------------------------------------

    def begin(self, now: float) -> None:
        """A forward (of any batch) starts at ``now``: the decode step before it, if any,
        took until now."""
        if self._open is not None:
            start, plain, bs = self._open
            if now > start:
                key = (plain, bs)
                times = self._times.get(key)
                if times is None:
                    times = self._times[key] = deque(maxlen=_WINDOW)
                times.append(now - start)
                if plain:
                    self.plain_seconds += now - start
                else:
                    self.verify_seconds += now - start
                    self._verified_at[bs] = self._decode_steps
            self._open = None

    def started(self, start: float, *, plain: bool, bs: int) -> None:
        """The decode step that began at ``start`` runs ``bs`` requests, plain or verified."""
        self._open = (start, plain, bs)
        if plain:
            self.plain_steps += 1
        else:
            self.verify_steps += 1

    def seconds(self, *, plain: bool, bs: int) -> float | None:
        """The median measured time of that kind of step at that batch size (None: none)."""
        times = self._times.get((plain, bs))
        return statistics.median(times) if times else None

    def ratio(self, bs: int) -> float | None:
        """Verify time over plain time at ``bs`` (from the nearest batch size measured both
        ways); None while no batch size was."""
        both = sorted(b for plain, b in self._times if plain and (False, b) in self._times)
        if not both:
            return None
        i = bisect.bisect_left(both, bs)
        near = min(both[max(i - 1, 0) : i + 1], key=lambda b: (abs(b - bs), b))
        verify = self.seconds(plain=False, bs=near)
        plain = self.seconds(plain=True, bs=near)
        assert verify is not None and plain is not None
        return verify / plain

    @property
    def _decode_steps(self) -> int:
        return self.plain_steps + self.verify_steps

    @property
    def _plain_measured(self) -> bool:
        return any(plain for plain, _ in self._times)

    def stale(self, bs: int) -> bool:
        """Whether the verify time at ``bs`` is worth an exploring verify: never measured at
        that batch size, or not in the last ``stale_after`` decode steps."""
        if self.stale_after == 0:
            return False
        at = self._verified_at.get(bs)
        return at is None or self._decode_steps - at >= self.stale_after

    # -- choosing ---------------------------------------------------------------------------

    def cost(self, bs: int) -> EngineCost | None:
        """The step's cost for the drafter's sizing: no tree pays before a plain step was
        measured; then whole trees (None) until a verify was measured too."""
        ratio = self.ratio(bs) if self._plain_measured else _UNMEASURED
        if ratio is None:
            return None
        verify = max(ratio, 1.0)  # the curve may not fall; a cheaper verify keeps every tree
        # plain decoding verifies bs tokens; any tree makes it a verify of bs * slots
        tokens = [bs, bs + 1] + ([bs * self.slots] if bs * self.slots > bs + 1 else [])
        seconds = [1.0] + [verify] * (len(tokens) - 1)
        # 1: this step explores; never before plain was measured (that step measures it)
        explore = 1 if self._plain_measured and self.stale(bs) else 0
        return EngineCost(tuple(tokens), tuple(seconds), padded=True, explore_every=explore)

    def plain_pays(self, bs: int) -> bool:
        """Whether a batch of ``bs`` requests with no draft node should decode plainly."""
        if not self._plain_measured:
            return True  # this step measures it
        ratio = self.ratio(bs)
        if ratio is None or ratio > 1.0:
            return True
        self._empty += 1
        return self.remeasure_every > 0 and self._empty % self.remeasure_every == 0

    def stats(self) -> dict[str, int | float]:
        """Decode steps run plain and verified, and their measured seconds."""
        return {
            "plain_steps": self.plain_steps,
            "verify_steps": self.verify_steps,
            "plain_seconds": round(self.plain_seconds, 6),
            "verify_seconds": round(self.verify_seconds, 6),
        }

    def __repr__(self) -> str:
        return (
            f"StepModes(slots={self.slots}, plain_steps={self.plain_steps}, "
            f"verify_steps={self.verify_steps})"
        )
