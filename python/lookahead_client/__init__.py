"""lookahead: a shared trie/n-gram drafter for lookahead speculative decoding.

The embedded drafter (:class:`EmbeddedDrafter`) runs in-process; :class:`RemoteDrafter` talks
to a ``lookahead-server`` over gRPC. Both follow the :class:`Drafter` protocol and return
:class:`DraftTree` objects.
"""

from lookahead_client.aio import AsyncRemoteDrafter
from lookahead_client.embedded import EmbeddedDrafter
from lookahead_client.errors import LookaheadError
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import Drafter, DraftTree, StepRequest

__all__ = [
    "AsyncRemoteDrafter",
    "Drafter",
    "DraftTree",
    "EmbeddedDrafter",
    "LookaheadError",
    "RemoteDrafter",
    "StepRequest",
]
__version__ = "0.1.0"
