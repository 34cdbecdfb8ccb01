"""The client of a ``lookahead-server``: the remote drafters and what they are built from.

* :class:`RemoteDrafter` (:mod:`.sync`) and :class:`AsyncRemoteDrafter` (:mod:`.aio`): the
  synchronous and asyncio clients, with the interface of ``EmbeddedDrafter``;
* :mod:`.ledger`: every token of the active requests, so that a restarted server is resynced,
  and the sans-IO plan of one step (retries, deadline, fallback) both clients follow;
* :mod:`.fallback`: when the server is down, steps return empty drafts without waiting on the
  network, and the outage is logged once;
* :mod:`.wire`: messages to and from the protocol, gRPC errors to typed exceptions;
* :mod:`.security`: TLS and token settings of the channel.
"""

from lookahead_client.remote.aio import AsyncRemoteDrafter
from lookahead_client.remote.security import TlsSettings
from lookahead_client.remote.sync import RemoteDrafter, RemoteSettings, StepTimeout, fork_generation

__all__ = [
    "AsyncRemoteDrafter",
    "RemoteDrafter",
    "RemoteSettings",
    "StepTimeout",
    "TlsSettings",
    "fork_generation",
]
