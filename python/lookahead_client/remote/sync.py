"""``RemoteDrafter``: the drafter of a ``lookahead-server``, over gRPC (synchronous client).

It offers what ``EmbeddedDrafter`` offers (``start``, ``step``, ``end``, ``stats``, ``draft``,
``append``, ``ingest``) and never lets the drafting service slow down or break the engine:

* every step has a deadline (``timeout``); when it passes, or the server is unreachable, the
  step returns empty drafts (the engine decodes normally) and the outage is logged once;
  while the server is down, steps do not wait on the network (it is probed with a backoff);
* the client remembers every token of its active requests, so when the server comes back
  (possibly restarted, with no memory of them) it re-sends them and drafting resumes
  (see :mod:`lookahead_client.remote.ledger`);
* it is fork-safe (a channel per process, rebuilt after ``fork``) and picklable (for
  ``spawn``: only the settings travel);
* bad input raises the typed exceptions of :mod:`lookahead_client.errors`, naming the field.

Targets: ``host:port`` or ``unix:///path/to/socket``. The asyncio twin is
:class:`lookahead_client.remote.aio.AsyncRemoteDrafter`.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import grpc

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client._proto.lookahead.v1.lookahead_pb2_grpc import LookaheadStub
from lookahead_client.errors import InvalidArgumentError, LookaheadError
from lookahead_client.remote.fallback import Availability
from lookahead_client.remote.ledger import Ledger, RemoteStep
from lookahead_client.remote.security import (
    TlsSettings,
    channel_credentials,
    tls_channel_options,
)
from lookahead_client.remote.wire import (
    StepTimeout,
    channel_options,
    error_from_rpc,
    ingest_messages,
    normalize_target,
    stats_dict,
    status_code,
)
from lookahead_client.types import DraftBatch, DraftTree, EngineCost, StepRequest

__all__ = ["RemoteDrafter", "RemoteSettings", "StepTimeout", "fork_generation"]

_fork_generation = 0
# Channels of a parent process, kept alive (unused) in a forked child: closing or collecting
# them there is not safe.
_abandoned: list[Any] = []


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation() -> int:
    """How many forks led to this process (changes in a forked child)."""
    return _fork_generation


def _this_process() -> str:
    """The default replica name: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def abandon(conn: object) -> None:
    """Keeps a parent's connection alive, unused, in a forked child."""
    if conn is not None:
        _abandoned.append(conn)


class RemoteSettings:
    """The settings shared by :class:`RemoteDrafter` and ``AsyncRemoteDrafter``, and their
    per-process state (what is rebuilt after fork or unpickling).

    Args:
        target: ``host:port`` or ``unix:///path/to/socket``.
        namespace: the server namespace (one per model / tokenizer; never mix them).
        timeout: the deadline of one step in seconds (``start``, ``append``, ``draft``,
            ``end`` are steps too). Past it the step returns empty drafts.
        connect_timeout: the deadline of the first step of a new channel, which also
            connects (a refused connection fails at once; this bounds a slow one).
        stream: step over one long-lived bidirectional stream instead of a call per step.
        call_timeout: the deadline of ``stats``, ``info`` and ``ingest`` (None: no deadline).
        max_message_bytes: the largest message sent or received.
        min_backoff, max_backoff: how soon an unreachable server is tried again (seconds,
            doubling from the first to the second).
        token: a bearer token for a server started with ``--auth-tokens`` (sent only over
            TLS or a local connection: a Unix socket or loopback TCP).
        tls: TLS settings (:class:`~lookahead_client.remote.security.TlsSettings`) for a
            server started with ``--tls-cert``; None: plaintext.
        replica: the name of the engine replica this client drafts for, the same for its
            whole life, so that the server can count the accepted draft tokens that came from
            other replicas' text (``accepted_cross_replica`` in :meth:`stats`). None: this
            host's name and process id.
    """

    #: The server's core cuts sized shapes against the engine's cost (see ``Drafter``).
    sizes_drafts = True

    _SETTINGS = (
        "target",
        "namespace",
        "timeout",
        "connect_timeout",
        "stream",
        "call_timeout",
        "max_message_bytes",
        "min_backoff",
        "max_backoff",
        "token",
        "tls",
        "replica",
    )

    def __init__(
        self,
        target: str,
        namespace: str = "default",
        timeout: float = 0.05,
        *,
        connect_timeout: float = 1.0,
        stream: bool = False,
        call_timeout: float | None = 60.0,
        max_message_bytes: int = 64 << 20,
        min_backoff: float = 0.05,
        max_backoff: float = 2.0,
        token: str | None = None,
        tls: TlsSettings | None = None,
        replica: str | None = None,
    ) -> None:
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if not value > 0:
                raise InvalidArgumentError(f"{name} must be > 0 seconds, got {value}", field=name)
        self.target = normalize_target(target)
        self.namespace = namespace
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.stream = stream
        self.call_timeout = call_timeout
        self.max_message_bytes = max_message_bytes
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.token = token
        self.tls = tls
        self.replica = replica
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._ledger = Ledger()
        self._step_ids = itertools.count(1)
        self._availability = self._new_availability()
        self._generation = _fork_generation
        self._replica = self.replica if self.replica is not None else _this_process()

    def _new_availability(self) -> Availability:
        return Availability(self.target, min_backoff=self.min_backoff, max_backoff=self.max_backoff)

    def _forked(self) -> bool:
        """True (once) in a forked child: the caller must drop the parent's connection."""
        if self._generation == _fork_generation:
            return False
        self._generation = _fork_generation
        self._availability = self._new_availability()
        if self.replica is None:
            self._replica = _this_process()
        return True

    def _plan(self, requests: Sequence[StepRequest], cost: EngineCost | None = None) -> RemoteStep:
        return self._ledger.plan(
            requests, self.namespace, next(self._step_ids), cost, replica=self._replica
        )

    def _step_timeout(self, fresh_channel: bool) -> float:
        """The step deadline: the first call of a channel also connects, and gets
        ``connect_timeout`` when that is longer."""
        return max(self.timeout, self.connect_timeout) if fresh_channel else self.timeout

    def _channel_options(self) -> list[tuple[str, int | str]]:
        return channel_options(self.target, self.max_message_bytes) + tls_channel_options(self.tls)

    def _credentials(self) -> grpc.ChannelCredentials | None:
        return channel_credentials(self.target, self.token, self.tls)

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._SETTINGS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r}, namespace={self.namespace!r})"

    def client_stats(self) -> dict[str, int | bool]:
        """This client's own counters: availability, fallbacks, resynchronised requests."""
        a = self._availability
        return {
            "available": a.up,
            "fallback_steps": a.fallback_steps,
            "outages": a.outages,
            "resyncs": self._ledger.resyncs,
            "active_requests": len(self._ledger.active),
            "owed_ends": len(self._ledger.pending_ends),
        }


def rename_ingest_field(error: LookaheadError) -> LookaheadError:
    """For a one-document ingest, names the field as ``EmbeddedDrafter.ingest`` does."""
    if error.field and error.field.startswith("documents["):
        error.field = "tokens"
    return error


class _StreamStepper:
    """Steps over one long-lived StepStream: gRPC consumes a queue of requests, a reader
    thread moves answers to a queue that a step waits on with its deadline."""

    _CLOSE = object()

    def __init__(self, stub: LookaheadStub) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._call = stub.StepStream(iter(self._requests.get, self._CLOSE))
        self.broken = False
        threading.Thread(target=self._read, name="lookahead-stream-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            for answer in self._call:
                self._answers.put(answer)
            self._answers.put(StepTimeout("the server closed the step stream"))
        except grpc.RpcError as e:
            self._answers.put(e)

    def step(self, message: pb.StepRequest, timeout: float) -> pb.StepResponse:
        self._requests.put(message)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise queue.Empty
                answer = self._answers.get(timeout=remaining)
            except queue.Empty:
                raise StepTimeout() from None
            if isinstance(answer, BaseException):
                self.broken = True
                raise answer
            if answer.step_id == message.step_id:
                return answer
            # The late answer of a step this client gave up on: drop it.

    def close(self) -> None:
        self._requests.put(self._CLOSE)
        self._call.cancel()


class _Connection:
    """The channel of one process."""

    def __init__(
        self,
        target: str,
        options: list[tuple[str, int | str]],
        stream: bool,
        credentials: grpc.ChannelCredentials | None = None,
        forked: bool = False,
    ) -> None:
        if credentials is None:
            self.channel = grpc.insecure_channel(target, options=options)
        else:
            self.channel = grpc.secure_channel(target, credentials, options=options)
        self.stub = LookaheadStub(self.channel)
        self._stream = stream
        self._stepper: _StreamStepper | None = None
        #: No call has succeeded yet: the first one may include connecting.
        self.fresh = True
        #: The channel of a forked child whose first step has not been tried yet.
        self.forked_first = forked

    def step(self, message: pb.StepRequest, timeout: float) -> pb.StepResponse:
        if self.forked_first:
            # In a child forked while gRPC's threads were busy, a new channel's first call
            # can fail inside this process ("Wrong file descriptor generation") before
            # anything is sent: it is tried once more, within the same deadline.
            self.forked_first = False
            deadline = time.monotonic() + timeout
            try:
                return self.step(message, timeout)
            except grpc.RpcError as e:
                if status_code(e) != grpc.StatusCode.UNAVAILABLE:
                    raise
                return self.step(message, max(deadline - time.monotonic(), 1e-3))
        if not self._stream:
            return self.stub.Step(message, timeout=timeout)
        if self._stepper is None or self._stepper.broken:
            if self._stepper is not None:
                self._stepper.close()
            self._stepper = _StreamStepper(self.stub)
        return self._stepper.step(message, timeout)

    def close(self) -> None:
        if self._stepper is not None:
            self._stepper.close()
        self.channel.close()


class RemoteDrafter(RemoteSettings):
    """The drafter of a ``lookahead-server`` namespace, with the interface of
    ``EmbeddedDrafter`` (the ``Drafter`` protocol plus ``draft``, ``append`` and ``ingest``).

    Arguments: see :class:`RemoteSettings`. Thread-safe (calls are serialised). Each process
    (forked or spawned) gets its own channel and its own view of its requests.
    """

    def _init_process_state(self) -> None:
        super()._init_process_state()
        self._lock = threading.Lock()
        self._conn: _Connection | None = None

    def _connection(self) -> _Connection:
        forked = self._forked()
        if forked:
            # The parent's channel must not be used (nor closed) here.
            abandon(self._conn)
            self._conn = None
        if self._conn is None:
            self._conn = _Connection(
                self.target,
                self._channel_options(),
                self.stream,
                self._credentials(),
                forked=forked or fork_generation() > 0,
            )
        return self._conn

    def close(self) -> None:
        """Closes the channel (a later call opens a new one)."""
        with self._lock:
            if self._conn is not None and not self._forked():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> RemoteDrafter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- steps ----------------------------------------------------------------------------

    def step(self, requests: Sequence[StepRequest], cost: EngineCost | None = None) -> DraftBatch:
        """One engine step: one tree per request, in order (empty trees if the server is
        unavailable or too slow); sized shapes are cut against ``cost``.

        Raises:
            LookaheadError: a request was refused (the subclass names the field), after the
                whole step: the exception's ``batch`` holds the step's trees (every refusal
                in its ``errors``) and ``index`` the request's index (-1: the whole step was
                refused).
        """
        with self._lock:
            return self._drive(self._plan(requests, cost))

    def _drive(self, plan: RemoteStep) -> DraftBatch:
        conn = self._connection()
        exchanges = plan.exchanges(self._availability, self._step_timeout(conn.fresh))
        try:
            message, remaining = next(exchanges)
            while True:
                try:
                    response = conn.step(message, remaining)
                except grpc.RpcError as e:
                    message, remaining = exchanges.throw(e)
                else:
                    conn.fresh = False
                    message, remaining = exchanges.send(response)
        except StopIteration as done:
            return done.value

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        """Begins a request with its prompt."""
        self.step([StepRequest(request_id, prompt=prompt, budget=0)])

    def append(self, request_id: str, tokens: Sequence[int]) -> None:
        """Appends tokens to an active request."""
        self.step([StepRequest(request_id, new_tokens=tokens, budget=0)])

    def draft(self, request_id: str, budget: int = 8) -> DraftTree:
        """A draft tree of at most ``budget`` nodes for an active request."""
        return self.step([StepRequest(request_id, budget=budget)])[0]

    def end(self, request_id: str) -> None:
        """Ends a request; its text stays available to later requests."""
        self.step([StepRequest(request_id, budget=0, finished=True)])

    # -- other calls ----------------------------------------------------------------------

    def _call(self, what: str, method: str, request: Any, *, missing_ok: bool = False) -> Any:
        """A plain call with ``call_timeout``; None for NOT_FOUND when ``missing_ok``."""
        with self._lock:
            stub = self._connection().stub
        try:
            return getattr(stub, method)(request, timeout=self.call_timeout)
        except grpc.RpcError as e:
            if missing_ok and status_code(e) == grpc.StatusCode.NOT_FOUND:
                return None
            raise error_from_rpc(e, what) from None

    def ingest(self, tokens: Sequence[int]) -> None:
        """Bulk-loads one finished text into the namespace's shared statistics."""
        try:
            self.ingest_many([tokens])
        except LookaheadError as e:
            raise rename_ingest_field(e) from None

    def ingest_many(
        self, documents: Iterable[Sequence[int]], *, batch_tokens: int = 1 << 18
    ) -> dict[str, int]:
        """Bulk-loads finished texts (streamed in messages of about ``batch_tokens`` tokens).

        Returns:
            ``{"documents": n, "tokens": n}`` ingested by this call.
        """
        problems: list[LookaheadError] = []
        messages = ingest_messages(self.namespace, documents, batch_tokens, problems)
        response = self._call("ingest", "Ingest", messages)
        if problems:
            raise problems[0]
        return {"documents": response.documents, "tokens": response.tokens}

    def stats(self) -> dict[str, int | float]:
        """The namespace's counters (all zero while the server has not created it), and
        this client's replica's own (``replica_*``, see ``replica``)."""
        request = pb.StatsRequest(namespace=self.namespace)
        response = self._call("stats", "Stats", request, missing_ok=True)
        return stats_dict(response if response is not None else pb.StatsResponse(), self._replica)

    def info(self) -> dict[str, Any]:
        """The server's version, limits and namespaces."""
        response = self._call("info", "Info", pb.InfoRequest())
        out = {f.name: getattr(response, f.name) for f in response.DESCRIPTOR.fields}
        out["namespaces"] = list(response.namespaces)
        return out

    def client_stats(self) -> dict[str, int | bool]:
        """This client's own counters: availability, fallbacks, resynchronised requests."""
        with self._lock:
            return super().client_stats()
