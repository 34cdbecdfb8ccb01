"""lookahead: a shared trie/n-gram drafter for lookahead speculative decoding.

The embedded drafter (:class:`EmbeddedDrafter`) runs in-process; :class:`RemoteDrafter` talks
to a ``lookahead-server`` over gRPC. Both follow the :class:`Drafter` protocol and return
:class:`DraftTree` objects.

The drafters are imported when first used, so that the pure-Python parts (tree tensors,
verification, the cost model and sizing policy) can be imported where the native extension
or gRPC is not installed (``scripts/gpu_cost_curve.py`` on a bare GPU machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from lookahead_client.errors import LookaheadError
from lookahead_client.types import (
    DraftBatch,
    Drafter,
    DraftShape,
    DraftTree,
    EngineCost,
    StepRequest,
)

if TYPE_CHECKING:
    from lookahead_client.embedded import EmbeddedDrafter
    from lookahead_client.remote import AsyncRemoteDrafter, RemoteDrafter

__all__ = [
    "AsyncRemoteDrafter",
    "DraftBatch",
    "DraftShape",
    "Drafter",
    "DraftTree",
    "EngineCost",
    "EmbeddedDrafter",
    "LookaheadError",
    "RemoteDrafter",
    "StepRequest",
]
__version__ = "0.1.0"

_LAZY = {
    "AsyncRemoteDrafter": "lookahead_client.remote",
    "EmbeddedDrafter": "lookahead_client.embedded",
    "RemoteDrafter": "lookahead_client.remote",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lookahead_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
