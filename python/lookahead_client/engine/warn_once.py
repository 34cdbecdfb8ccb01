"""Problems an engine integration meets every step, logged once instead of every step."""

from __future__ import annotations

import logging

__all__ = ["WarnOnce"]


class WarnOnce:
    """Logs each kind of problem once as a warning, then at debug level, and counts them.

    Args:
        log: where the lines go.
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._seen: set[str] = set()
        #: How often each kind of problem happened.
        self.counts: dict[str, int] = {}

    def __call__(self, kind: str, message: str, *args: object) -> None:
        """Counts a problem of ``kind`` and logs ``message % args``."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind in self._seen:
            self._log.debug(message, *args)
        else:
            self._seen.add(kind)
            self._log.warning(message + " (logged once)", *args)
