"""Whether the drafting server is reachable, when to try it again, and saying so once.

While the server is down every step falls back to empty drafts (the engine decodes normally)
without waiting on the network; the server is probed again after a backoff that doubles from
``min_backoff`` to ``max_backoff``. The transition to fallback is logged once (warning) and the
recovery once (info), never once per step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["Availability"]


class Availability:
    """The reachability state of one server, as seen by one client process."""

    def __init__(
        self,
        target: str,
        *,
        min_backoff: float = 0.05,
        max_backoff: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        self._target = target
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._clock = clock
        self._log = logger or logging.getLogger("lookahead_client.remote")
        self._up = True
        self._backoff = 0.0
        self._retry_at = 0.0
        self._down_since = 0.0
        #: Steps answered with empty drafts because the server was unreachable.
        self.fallback_steps = 0
        #: Times the server became unreachable.
        self.outages = 0

    @property
    def up(self) -> bool:
        """Whether the last contact with the server succeeded."""
        return self._up

    def should_try(self) -> bool:
        """Whether to contact the server now (always while it is up; after the backoff while
        it is down)."""
        return self._up or self._clock() >= self._retry_at

    def skipped(self) -> None:
        """A step fell back without contacting the server."""
        self.fallback_steps += 1

    def failed(self, reason: str) -> None:
        """A contact failed (unreachable, deadline, server error)."""
        self.fallback_steps += 1
        now = self._clock()
        if self._up:
            self._up = False
            self.outages += 1
            self._down_since = now
            self._backoff = self._min_backoff
            self._log.warning(
                "lookahead server %s unavailable (%s): steps get empty drafts until it answers",
                self._target,
                reason,
            )
        else:
            self._backoff = min(self._backoff * 2, self._max_backoff)
        self._retry_at = now + self._backoff

    def succeeded(self) -> None:
        """A contact succeeded."""
        if not self._up:
            self._up = True
            self._log.info(
                "lookahead server %s answers again after %.2f s; drafting resumed",
                self._target,
                self._clock() - self._down_since,
            )
