"""How the proposer learns which request each row is, and which requests ended.

vLLM's ``custom_class`` proposers get rows of a token table, not request ids, and rows move
as requests come and go; nor are they told when a request finishes. No supported interface
hands a proposer those facts (``vllm.general_plugins`` entry points only run code at start),
so :func:`install` wraps the model runner's ``execute_model``, the one call that sees every
step's ``SchedulerOutput`` (finished and preempted ids, tokens scheduled per request), empty
steps included, and its persistent ``InputBatch`` (the request id of each row). The wrapper
hands both to the runner's drafter when that drafter has a ``scheduled`` method and changes
nothing else; vLLM's own proposers are untouched.

It is installed by :class:`~lookahead_client.vllm.proposer.LookaheadProposer` itself when
vLLM builds it, inside the runner's ``__init__`` and so before the runner's first step, in
whatever process the runner lives (vLLM's engine-core process by default).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

__all__ = ["install"]

_log = logging.getLogger("lookahead_client.vllm")

_MARK = "__lookahead_hook__"


_warned = False


def _warn_once(error: Exception) -> None:
    """Logs the first failure of the hook (the proposer then drafts what it can)."""
    global _warned
    if not _warned:
        _warned = True
        _log.warning(
            "lookahead: the execute_model hook failed: %s: %s", type(error).__name__, error
        )


def install() -> bool:
    """Wraps ``GPUModelRunner.execute_model`` (the CPU runner inherits it) once per process.

    Returns:
        True when the hook is in place; False when this vLLM has no such method (the proposer
        then drafts nothing, and says so once).
    """
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError as e:
        _log.warning("lookahead: vLLM's model runner is not importable (%s); no drafts", e)
        return False
    original = getattr(GPUModelRunner, "execute_model", None)
    if original is None:
        _log.warning("lookahead: this vLLM's model runner has no execute_model; no drafts")
        return False
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        scheduled = getattr(getattr(self, "drafter", None), "scheduled", None)
        if scheduled is not None:
            try:
                scheduled(self.input_batch, scheduler_output, time.perf_counter())
            except Exception as e:  # noqa: BLE001 - never fail vLLM's step for the drafter
                _warn_once(e)
        return original(self, scheduler_output, *args, **kwargs)

    setattr(execute_model, _MARK, True)
    GPUModelRunner.execute_model = execute_model
    return True
