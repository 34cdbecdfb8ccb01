"""``AsyncRemoteDrafter``: the asyncio twin of :class:`lookahead_client.remote.RemoteDrafter`.

Same settings, same behaviour (deadline per step with fallback to empty drafts, logging an
outage once, resynchronising requests after a server restart, typed exceptions), with
coroutine methods. The channel belongs to the event loop and the process that opened it: it
is rebuilt when either changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
import grpc.aio

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client._proto.lookahead.v1.lookahead_pb2_grpc import LookaheadStub
from lookahead_client.errors import LookaheadError
from lookahead_client.remote.ledger import RemoteStep
from lookahead_client.remote.sync import RemoteSettings, abandon, rename_ingest_field
from lookahead_client.remote.wire import (
    StepTimeout,
    error_from_rpc,
    ingest_messages,
    stats_dict,
    status_code,
)
from lookahead_client.types import DraftBatch, DraftTree, EngineCost, StepRequest

__all__ = ["AsyncRemoteDrafter"]


class _AsyncStreamStepper:
    """Steps over one long-lived StepStream; a reader task queues the answers."""

    def __init__(self, stub: LookaheadStub) -> None:
        self._call = stub.StepStream()
        self._answers: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.broken = False

    async def _read(self) -> None:
        try:
            while True:
                answer = await self._call.read()
                if answer is grpc.aio.EOF:
                    self._answers.put_nowait(StepTimeout("the server closed the step stream"))
                    return
                self._answers.put_nowait(answer)
        except grpc.RpcError as e:
            self._answers.put_nowait(e)

    async def step(self, message: pb.StepRequest, timeout: float) -> pb.StepResponse:
        deadline = time.monotonic() + timeout
        try:
            await asyncio.wait_for(self._call.write(message), timeout)
        except grpc.RpcError:
            self.broken = True
            raise
        except (TimeoutError, asyncio.InvalidStateError):
            self.broken = True
            raise StepTimeout("the step stream does not take messages") from None
        while True:
            try:
                answer = await asyncio.wait_for(self._answers.get(), deadline - time.monotonic())
            except TimeoutError:
                raise StepTimeout() from None
            if isinstance(answer, BaseException):
                self.broken = True
                raise answer
            if answer.step_id == message.step_id:
                return answer
            # The late answer of a step this client gave up on: drop it.

    def close(self) -> None:
        self._reader.cancel()
        self._call.cancel()


class _AsyncConnection:
    """The channel of one process and event loop."""

    def __init__(
        self,
        target: str,
        options: list[tuple[str, int | str]],
        stream: bool,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self.channel = grpc.aio.secure_channel(target, credentials, options=options)
        self.stub = LookaheadStub(self.channel)
        self._stream = stream
        self._stepper: _AsyncStreamStepper | None = None
        self.fresh = True

    async def step(self, message: pb.StepRequest, timeout: float) -> pb.StepResponse:
        if not self._stream:
            return await self.stub.Step(message, timeout=timeout)
        if self._stepper is None or self._stepper.broken:
            if self._stepper is not None:
                self._stepper.close()
            self._stepper = _AsyncStreamStepper(self.stub)
        return await self._stepper.step(message, timeout)

    async def close(self) -> None:
        if self._stepper is not None:
            self._stepper.close()
        await self.channel.close()


class AsyncRemoteDrafter(RemoteSettings):
    """The drafter of a ``lookahead-server`` namespace for asyncio code: the methods of
    ``RemoteDrafter`` as coroutines (``client_stats`` stays a plain method).

    Arguments: see :class:`lookahead_client.remote.RemoteSettings`. Calls on one instance
    are serialised.
    """

    def _init_process_state(self) -> None:
        super()._init_process_state()
        self._conn: _AsyncConnection | None = None
        self._lock: asyncio.Lock | None = None

    def _connection(self) -> _AsyncConnection:
        loop = asyncio.get_running_loop()
        if self._forked() or (self._conn is not None and self._conn.loop is not loop):
            abandon(self._conn)
            self._conn = None
            self._lock = None
        if self._conn is None:
            self._conn = _AsyncConnection(
                self.target, self._channel_options(), self.stream, self._credentials()
            )
        return self._conn

    def _serial(self) -> asyncio.Lock:
        self._connection()  # rebinds to this process and loop first (which drops the lock)
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def close(self) -> None:
        """Closes the channel (a later call opens a new one)."""
        if self._conn is not None and not self._forked():
            await self._conn.close()
        self._conn = None

    async def __aenter__(self) -> AsyncRemoteDrafter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- steps ----------------------------------------------------------------------------

    async def step(
        self, requests: Sequence[StepRequest], cost: EngineCost | None = None
    ) -> DraftBatch:
        """One engine step: one tree per request (empty trees if the server is unavailable
        or too slow). Raises like ``RemoteDrafter.step``."""
        async with self._serial():
            return await self._drive(self._plan(requests, cost))

    async def _drive(self, plan: RemoteStep) -> DraftBatch:
        conn = self._connection()
        exchanges = plan.exchanges(self._availability, self._step_timeout(conn.fresh))
        try:
            message, remaining = next(exchanges)
            while True:
                try:
                    response = await conn.step(message, remaining)
                except grpc.RpcError as e:
                    message, remaining = exchanges.throw(e)
                else:
                    conn.fresh = False
                    message, remaining = exchanges.send(response)
        except StopIteration as done:
            return done.value

    async def start(self, request_id: str, prompt: Sequence[int]) -> None:
        """Begins a request with its prompt."""
        await self.step([StepRequest(request_id, prompt=prompt, budget=0)])

    async def append(self, request_id: str, tokens: Sequence[int]) -> None:
        """Appends tokens to an active request."""
        await self.step([StepRequest(request_id, new_tokens=tokens, budget=0)])

    async def draft(self, request_id: str, budget: int = 8) -> DraftTree:
        """A draft tree of at most ``budget`` nodes for an active request."""
        return (await self.step([StepRequest(request_id, budget=budget)]))[0]

    async def end(self, request_id: str) -> None:
        """Ends a request; its text stays available to later requests."""
        await self.step([StepRequest(request_id, budget=0, finished=True)])

    # -- other calls ----------------------------------------------------------------------

    async def _call(self, what: str, method: str, request: Any, *, missing_ok: bool = False) -> Any:
        stub = self._connection().stub
        try:
            return await getattr(stub, method)(request, timeout=self.call_timeout)
        except grpc.RpcError as e:
            if missing_ok and status_code(e) == grpc.StatusCode.NOT_FOUND:
                return None
            raise error_from_rpc(e, what) from None

    async def ingest(self, tokens: Sequence[int]) -> None:
        """Bulk-loads one finished text into the namespace's shared statistics."""
        try:
            await self.ingest_many([tokens])
        except LookaheadError as e:
            raise rename_ingest_field(e) from None

    async def ingest_many(
        self, documents: Iterable[Sequence[int]], *, batch_tokens: int = 1 << 18
    ) -> dict[str, int]:
        """Bulk-loads finished texts; returns ``{"documents": n, "tokens": n}``."""
        problems: list[LookaheadError] = []
        messages = ingest_messages(self.namespace, documents, batch_tokens, problems)
        response = await self._call("ingest", "Ingest", messages)
        if problems:
            raise problems[0]
        return {"documents": response.documents, "tokens": response.tokens}

    async def stats(self) -> dict[str, int | float]:
        """The namespace's counters (all zero while the server has not created it), and
        this client's replica's own (``replica_*``, see ``replica``)."""
        request = pb.StatsRequest(namespace=self.namespace)
        response = await self._call("stats", "Stats", request, missing_ok=True)
        return stats_dict(response if response is not None else pb.StatsResponse(), self._replica)

    async def info(self) -> dict[str, Any]:
        """The server's version, limits and namespaces."""
        response = await self._call("info", "Info", pb.InfoRequest())
        out = {f.name: getattr(response, f.name) for f in response.DESCRIPTOR.fields}
        out["namespaces"] = list(response.namespaces)
        return out
