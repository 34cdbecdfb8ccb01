"""Switching SGLang's NGRAM worker to lookahead inside the scheduler processes.

SGLang spawns its scheduler processes (``multiprocessing`` "spawn"), so nothing patched in the
launching process reaches them. Two of SGLang's own extension points do:

* ``run_scheduler_process_func``: ``sgl.Engine`` (a class attribute the docs invite private
  forks to override) and ``http_server.launch_server`` (a parameter) take the function each
  scheduler process runs. :func:`scheduler_process_func` returns a picklable
  ``functools.partial`` of :func:`run_scheduler_process` carrying the config; in the child it
  installs the hook below, then runs SGLang's ``run_scheduler_process``. This is what the
  launcher (:mod:`.launch_server`) and :class:`.engine.Engine` use.
* SGLang's plugin entry points (group ``sglang.srt.plugins``, loaded by ``load_plugins()`` at
  the start of every scheduler process): :func:`lookahead_client.sglang.plugin.register`
  installs the hook when the ``LOOKAHEAD_SGLANG`` environment variable holds a config.

The hook itself is an AROUND hook, registered with SGLang's ``HookRegistry``, on
``SpeculativeAlgorithm.create_worker``: when SGLang picks ``NGRAMWorker`` it gets
:class:`.worker.LookaheadNGRAMWorker` configured for lookahead instead. Any other algorithm,
or an out-of-tree platform's own worker, is left alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from lookahead_client.engine.config import LookaheadConfig

__all__ = ["install", "installed_config", "run_scheduler_process", "scheduler_process_func"]

_log = logging.getLogger("lookahead_client.sglang")

HOOK_TARGET = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"

_active: LookaheadConfig | None = None
_registered = False


def _create_worker(original: Callable[..., type], algorithm: Any, server_args: Any) -> type:
    """SGLang's ``create_worker``, with ``NGRAMWorker`` swapped for the lookahead worker."""
    cls = original(algorithm, server_args)
    config = _active
    if config is None:
        return cls
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    if cls is not NGRAMWorker:
        if algorithm.is_ngram():
            _log.warning(
                "lookahead not active: NGRAM uses the platform worker %s", cls.__qualname__
            )
        return cls
    from lookahead_client.sglang.worker import LookaheadNGRAMWorker

    return LookaheadNGRAMWorker.with_config(config)


def install(config: LookaheadConfig, *, apply: bool = True) -> None:
    """Makes this process's NGRAM worker draft with lookahead as ``config`` says.

    Idempotent; a later call replaces the config (for workers built afterwards).

    Args:
        config: where drafts come from.
        apply: apply SGLang's registered hooks now. Pass False from a plugin function:
            SGLang's ``load_plugins()`` applies them after every plugin has registered.
    """
    global _active, _registered
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _active = config
    if not _registered:
        HookRegistry.register(HOOK_TARGET, _create_worker, HookType.AROUND)
        _registered = True
    if apply:
        HookRegistry.apply_hooks()


def installed_config() -> LookaheadConfig | None:
    """The config installed in this process, if any."""
    return _active


def run_scheduler_process(
    config: LookaheadConfig,
    inner: Callable[..., Any] | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """A scheduler process with lookahead: installs the hook, then runs ``inner``.

    Args:
        config: where drafts come from.
        inner: the scheduler entry to run (None: SGLang's ``run_scheduler_process``).
        args, kwargs: what SGLang passes to its scheduler entry.
    """
    import sglang.srt.plugins as plugins

    if inner is None:
        from sglang.srt.managers.scheduler import run_scheduler_process as sglang_entry

        inner = sglang_entry
    # SGLang's entry starts with load_plugins(), which applies every registered hook (ours
    # included) once all plugins have registered theirs; apply now only if that already ran.
    install(config, apply=bool(getattr(plugins, "_plugins_loaded", True)))
    return inner(*args, **kwargs)


def scheduler_process_func(
    config: LookaheadConfig, inner: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """The ``run_scheduler_process_func`` to hand SGLang: picklable, so spawned schedulers
    receive it (and ``config``) by reference to this module."""
    return functools.partial(run_scheduler_process, config, inner)
