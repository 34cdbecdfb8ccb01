"""Lookahead drafting for SGLang 0.5.23's NGRAM speculative decoding.

SGLang's ``NGRAMWorker`` keeps its own n-gram corpus; here a lookahead drafter (embedded, or a
``lookahead-server``) takes its place and hands SGLang the arrays its corpus would, so SGLang's
tree construction, FlashInfer verification, sampling, CUDA graphs, grammar and overlap
scheduling are untouched. Start it with::

    python -m lookahead_client.sglang.launch_server --model-path M [SGLang flags] \\
        [--lookahead-target unix:///run/lookahead.sock]

or ``lookahead_client.sglang.Engine(model_path=M, lookahead=LookaheadConfig(...))``.

SGLang is an optional dependency: it is imported by the submodules that need it (and by the
lazily resolved ``Engine``), never by this package's top level nor by ``lookahead_client``.
"""

from __future__ import annotations

from typing import Any

from lookahead_client.engine.config import SGLANG_ENV as ENV_VAR
from lookahead_client.engine.config import LookaheadConfig

__all__ = [
    "ENV_VAR",
    "Engine",
    "LookaheadConfig",
    "LookaheadNGRAMWorker",
    "install",
    "scheduler_process_func",
]

_LAZY = {
    "Engine": ("lookahead_client.sglang.engine", "Engine"),
    "LookaheadNGRAMWorker": ("lookahead_client.sglang.worker", "LookaheadNGRAMWorker"),
    "install": ("lookahead_client.sglang.activate", "install"),
    "scheduler_process_func": ("lookahead_client.sglang.activate", "scheduler_process_func"),
}


def __getattr__(name: str) -> Any:
    """Resolves the names that import SGLang on first use."""
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    import importlib

    return getattr(importlib.import_module(module), attr)
