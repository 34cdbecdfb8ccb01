"""The remote drafter's memory of its requests, and the plan of one step (no I/O).

Why a ledger: the server may lose a request (it restarted), or the client may not know what
the server applied (a step timed out, the server was unreachable). The ledger keeps, for every
active request, how many of its tokens the server is known to hold and the tokens it may not
hold. Every step of a tracked request says where its tokens start (``offset``), so a step
whose fate is unknown is simply sent again with the next one: the server skips what it already
holds. A request whose start is in doubt is re-sent as a prompt with ``reset`` (the server
drops whatever it holds and restarts the request from it).

A request the server lost (UNKNOWN_REQUEST, or an offset past what it holds) needs its whole
text again. A caller that sends ``offset`` with its steps (the engines' request book) keeps
that text itself: the ledger keeps only the tokens the server has not confirmed, and hands the
refusal back (the caller starts the request again from its own tokens). For a caller that
sends no offsets (the Hugging Face loop, a replay, a script) the ledger keeps a copy of every
token and re-sends the request as a prompt with ``reset`` itself, within the same step.
Finishes that did not reach the server are sent again with a later step, so the server does not
keep requests the engine ended.

A step runs as a :class:`RemoteStep`: ``first_message()``, then ``on_response()`` (which may
return a follow-up message re-sending lost requests) or ``on_unavailable()``, then
``result()``. The sync and the asyncio clients drive the same plan with their own I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client.errors import InvalidArgumentError, LookaheadError
from lookahead_client.remote.fallback import Availability
from lookahead_client.remote.wire import (
    Columns,
    StepTimeout,
    describe,
    error_from_request_error,
    error_from_rpc,
    is_transient,
    response_columns,
)
from lookahead_client.types import DraftBatch, EngineCost, StepRequest

__all__ = ["Exchange", "Ledger", "RemoteStep"]

#: One call of a step: the message to send and the seconds left before the step's deadline.
Exchange = tuple[pb.StepRequest, float]
#: Where one request's tree is in an answer: its columns, the row, the nodes' start and stop.
_Answered = tuple[Columns, int, int, int]

_log = logging.getLogger("lookahead_client.remote")


@dataclass(slots=True)
class _Tracked:
    """One active request as the client knows it."""

    #: Its tokens from position ``start`` on: the prompt and every token since while the
    #: caller sends no offsets, else only those the server has not confirmed.
    tokens: list[int]
    #: The server holds a copy that steps can go on from (else: restart it with ``reset``).
    synced: bool
    prompt_len: int
    group: str | None
    #: How many tokens of the request the server is known to hold (the rest went out in
    #: steps whose answer never came; they are sent again, with their offset, next step).
    held: int = 0
    #: The position of ``tokens[0]``: 0 while the ledger keeps the whole text.
    start: int = 0

    def unconfirmed(self) -> list[int]:
        """The tokens the server may not hold."""
        return self.tokens[self.held - self.start :]

    def confirm(self, keep_text: bool) -> None:
        """The server holds every token; a caller that keeps the text (sends offsets) lets
        the ledger drop its copy."""
        self.held = self.start + len(self.tokens)
        if not keep_text:
            self.tokens.clear()
            self.start = self.held


class Ledger:
    """The active requests of one client, and the finishes still owed to the server."""

    def __init__(self, max_pending_ends: int = 4096) -> None:
        self.active: dict[str, _Tracked] = {}
        #: Request ids whose finish may not have reached the server (insertion-ordered).
        self.pending_ends: dict[str, None] = {}
        self.max_pending_ends = max_pending_ends
        #: Requests re-sent as a prompt after the server lost them or their state was in doubt.
        self.resyncs = 0

    def owe_end(self, request_id: str) -> None:
        """Remembers to finish ``request_id`` on the server with a later step."""
        self.pending_ends[request_id] = None
        while len(self.pending_ends) > self.max_pending_ends:
            dropped = next(iter(self.pending_ends))
            del self.pending_ends[dropped]
            _log.debug("dropping the owed finish of %r (too many owed)", dropped)

    def plan(
        self,
        requests: Sequence[StepRequest],
        namespace: str,
        step_id: int,
        cost: EngineCost | None = None,
        *,
        replica: str = "",
    ) -> RemoteStep:
        """The plan of one step over ``requests`` (sized shapes cut against ``cost``) from the
        engine replica named ``replica``."""
        return RemoteStep(self, requests, namespace, step_id, cost, replica=replica)


# What an entry of a step message is (plain ints: this is the per-request hot path).
_START = 0  # the caller gave a prompt
_TRACKED = 1  # known here, and the server holds what we hold
_RESYNC = 2  # known here, the server's copy in doubt or lost: re-sent as prompt + reset
_FOREIGN = 3  # not known here (the server decides)
_OWED_END = 4  # the finish of an earlier request that may not have reached the server


class _Entry:
    """One request of a step message."""

    __slots__ = (
        "kind",
        "index",
        "request_id",
        "new_tokens",
        "budget",
        "accepted_last",
        "finished",
        "prompt",
        "tracked",
        "group",
        "shape",
        "temperature",
        "offset",
        "fresh",
        "caller_offset",
    )

    def __init__(
        self,
        kind: int,
        index: int,
        request_id: str,
        new_tokens: list[int],
        budget: int,
        accepted_last: int,
        finished: bool,
        prompt: list[int] | None,
        tracked: _Tracked | None,
        group: str | None = None,
        shape: int = 0,
        temperature: float = 0.0,
        offset: int | None = None,
    ) -> None:
        self.kind = kind
        self.index = index  # the caller's index; -1 for _OWED_END
        self.request_id = request_id
        self.new_tokens = new_tokens
        self.budget = budget
        self.accepted_last = accepted_last
        self.finished = finished
        self.prompt = prompt
        self.tracked = tracked
        self.group = group
        self.shape = shape
        self.temperature = temperature
        self.offset = offset
        #: This step's own new tokens (``new_tokens`` may also re-send unconfirmed ones).
        self.fresh = new_tokens
        #: The caller sent an offset: it keeps the request's text (see the module's doc).
        self.caller_offset = offset is not None


def _root(tokens: list[int]) -> int:
    """The last token as an int (-1 when there is none or it is not an int: the message
    encoding then refuses it, naming the field)."""
    try:
        return int(tokens[-1]) if tokens else -1
    except (TypeError, ValueError):
        return -1


class RemoteStep:
    """One step: the messages to send and what their answers mean for the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        requests: Sequence[StepRequest],
        namespace: str,
        step_id: int,
        cost: EngineCost | None = None,
        *,
        replica: str = "",
    ) -> None:
        self._ledger = ledger
        self._cost = cost
        self._replica = replica
        self._namespace = namespace
        self._step_id = step_id
        # Where each request's tree is in the server's answers; None until answered (an empty
        # tree under the request's last token).
        self._trees: list[_Answered | None] = [None] * len(requests)
        self._roots: list[int] = []
        self._errors: list[tuple[int, LookaheadError]] = []
        self._in_flight: list[_Entry] = []
        entries: list[_Entry] = []
        active_get = ledger.active.get
        for index, r in enumerate(requests):
            new = list(r.new_tokens)
            prompt = r.prompt
            tracked = active_get(r.request_id)
            if prompt is not None:
                kind = _START
                prompt = list(prompt)
                last = new or prompt
            elif tracked is not None:
                kind = _TRACKED if tracked.synced else _RESYNC
                last = new or tracked.tokens
            else:
                kind = _FOREIGN
                last = new
            self._roots.append(_root(last))
            entry = _Entry(
                kind,
                index,
                r.request_id,
                new,
                r.budget,
                r.accepted_last,
                r.finished,
                prompt,
                tracked,
                r.group,
                int(r.shape),
                float(r.temperature),
                r.offset,
            )
            if kind == _TRACKED and tracked is not None:
                # the ledger knows where the tokens start; unconfirmed ones go out again
                entry.offset = tracked.held
                entry.new_tokens = tracked.unconfirmed() + new
            elif kind == _RESYNC:
                entry.offset = None  # restarted from its prompt
            entries.append(entry)
        if ledger.pending_ends:
            ids = {e.request_id for e in entries}
            entries.extend(
                _Entry(_OWED_END, -1, rid, [], 0, -1, True, None, None)
                for rid in ledger.pending_ends
                if rid not in ids
            )
        self._first = entries

    @property
    def empty(self) -> bool:
        """Nothing to send: no request and no finish owed."""
        return not self._first

    def exchanges(
        self, availability: Availability, timeout: float
    ) -> Generator[Exchange, pb.StepResponse, DraftBatch]:
        """The step's conversation with the server, free of I/O, for the sync and the asyncio
        client alike: yields each message with the seconds left before the step's deadline
        (``timeout`` from the first message) and is sent the answer, or has the call's
        ``grpc.RpcError`` thrown in.

        Returns the step's batch: empty trees when the server is known down, too slow or
        failing transiently (``availability`` is told).

        Raises:
            LookaheadError: as :meth:`result`, or the server refused the whole step.
        """
        if self.empty:
            return self.result()
        if not availability.should_try():
            self.unavailable_without_trying()
            availability.skipped()
            return self.result()
        message: pb.StepRequest | None = self.first_message()
        deadline = time.monotonic() + timeout
        while message is not None:
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StepTimeout()
                response = yield message, remaining
            except grpc.RpcError as e:
                if not is_transient(e):
                    raise self.refused(error_from_rpc(e, "step")) from None
                self.on_unavailable()
                availability.failed(describe(e))
                return self.result()
            availability.succeeded()
            message = self.on_response(response)
        return self.result()

    # -- messages -------------------------------------------------------------------------

    def first_message(self) -> pb.StepRequest:
        """The message carrying the step (and any finishes still owed).

        Raises:
            InvalidArgumentError: a value cannot be encoded (not an integer, beyond int64 for
                a token or int32 for a budget); nothing is sent.
        """
        return self._message(self._first)

    def _message(self, entries: list[_Entry]) -> pb.StepRequest:
        self._in_flight = entries
        message = pb.StepRequest(
            namespace=self._namespace, step_id=self._step_id, replica=self._replica
        )
        cost = self._cost
        if cost is not None:
            try:
                message.cost.tokens.extend(cost.tokens)
                message.cost.seconds.extend(cost.seconds)
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(f"cost: {exc}", field="cost") from exc
            message.cost.padded = cost.padded
            message.cost.base_tokens = cost.base_tokens
            message.cost.explore_every = cost.explore_every
            message.cost.acceptance = cost.acceptance
        add = message.requests.add
        pending_ends = self._ledger.pending_ends
        for e in entries:
            item = add()
            field = "request_id"
            try:
                item.request_id = e.request_id
                field = "budget"
                item.budget = e.budget
                if e.shape:
                    field = "shape"
                    item.shape = e.shape
                if e.temperature:
                    field = "temperature"
                    item.temperature = e.temperature
                if e.finished:
                    item.finished = True
                if e.kind == _RESYNC:
                    if not e.finished:  # a request that ends needs no resynchronising
                        # Restarted from its prompt, with its output as new tokens: it stays
                        # in its group, and its output stays an output.
                        tracked = e.tracked
                        assert tracked is not None and tracked.start == 0
                        field = "prompt"
                        item.prompt.tokens.extend(tracked.tokens[: tracked.prompt_len])
                        field = "new_tokens"
                        item.new_tokens.extend(tracked.tokens[tracked.prompt_len :])
                        item.new_tokens.extend(e.new_tokens)
                        field = "group"
                        if tracked.group:
                            item.group = tracked.group
                        item.reset = True
                else:
                    if e.offset is not None:
                        field = "offset"
                        item.offset = e.offset
                    if e.prompt is not None:
                        field = "prompt"
                        item.prompt.tokens.extend(e.prompt)
                        if e.group:
                            field = "group"
                            item.group = e.group
                        # A finish we owe for this id may not have reached the server.
                        if e.request_id in pending_ends:
                            item.reset = True
                    if e.new_tokens:
                        field = "new_tokens"
                        item.new_tokens.extend(e.new_tokens)
                if e.accepted_last >= 0:
                    field = "accepted_last"
                    item.accepted_last = e.accepted_last
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(
                    f"requests[{e.index}] ({e.request_id!r}): {field}: {exc}", field=field
                ) from exc
        return message

    # -- outcomes -------------------------------------------------------------------------

    def on_response(self, response: pb.StepResponse) -> pb.StepRequest | None:
        """Applies an answer; returns a follow-up message when requests must be re-sent."""
        entries = self._in_flight
        self._in_flight = []
        if response.HasField("error"):
            # The whole step was refused; nothing of it was applied.
            self._errors.append((-1, error_from_request_error(response.error)))
            return None
        columns = response_columns(response, len(entries))
        if columns is None:
            _log.error(
                "the server's answer does not describe %d trees; treating it as unavailable",
                len(entries),
            )
            self._in_flight = entries
            self.on_unavailable()
            return None
        sizes = columns.sizes.tolist()
        errors = {e.index: e for e in response.errors} if len(response.errors) else None
        trees = self._trees
        resend: list[_Entry] = []
        offset = 0
        for i, e in enumerate(entries):
            start = offset
            offset += sizes[i]
            error = errors.get(i) if errors else None
            if error is not None:
                self._failed(e, error, resend)
                continue
            tracked = e.tracked
            if e.kind == _TRACKED and tracked is not None and not e.finished:  # the usual case
                tracked.tokens.extend(e.fresh)
                tracked.confirm(keep_text=not e.caller_offset)
            else:
                self._applied(e)
            if e.index >= 0:
                trees[e.index] = (columns, i, start, offset)
        return self._message(resend) if resend else None

    def _applied(self, e: _Entry) -> None:
        """The server applied an entry that is not a plain step of a tracked request."""
        ledger = self._ledger
        if e.kind == _OWED_END:
            ledger.pending_ends.pop(e.request_id, None)
            return
        if e.kind == _START:
            ledger.pending_ends.pop(e.request_id, None)
            if not e.finished:
                assert e.prompt is not None
                tokens = e.prompt + e.new_tokens
                ledger.active[e.request_id] = _Tracked(
                    tokens, True, len(e.prompt), e.group, len(tokens)
                )
        elif e.tracked is not None:  # _TRACKED or _RESYNC
            e.tracked.tokens.extend(e.fresh)
            e.tracked.synced = True
            e.tracked.confirm(keep_text=not e.caller_offset)
            if e.kind == _RESYNC and not e.finished:
                ledger.resyncs += 1
        if e.finished:
            ledger.active.pop(e.request_id, None)

    def _failed(self, e: _Entry, error: pb.RequestError, resend: list[_Entry]) -> None:
        """The server refused an entry; its state there is unchanged."""
        ledger = self._ledger
        lost = error.code == pb.ERROR_CODE_UNKNOWN_REQUEST
        if e.kind == _OWED_END:
            ledger.pending_ends.pop(e.request_id, None)  # unknown or not: nothing to end
        elif lost and e.kind in (_TRACKED, _RESYNC) and e.finished:
            # Lost by the server, and over anyway.
            ledger.pending_ends.pop(e.request_id, None)
            ledger.active.pop(e.request_id, None)
        elif (lost or error.field == "offset") and e.kind == _TRACKED and e.tracked is not None:
            # The server lost a request we track (it restarted), or holds less of it than
            # we thought.
            if e.tracked.start > 0:  # the caller keeps its text: it starts it again
                ledger.active.pop(e.request_id, None)
                self._errors.append((e.index, error_from_request_error(error)))
                return
            # Re-sent as a prompt now, from the ledger's copy.
            e.kind = _RESYNC
            e.new_tokens, e.offset = e.fresh, None
            resend.append(e)
        else:
            self._errors.append((e.index, error_from_request_error(error)))

    def on_unavailable(self) -> None:
        """The message in flight may or may not have been applied: its steps go out again
        with the next step, at their offsets (starts in doubt are re-sent as prompts with
        reset)."""
        entries = self._in_flight
        self._in_flight = []
        ledger = self._ledger
        for e in entries:
            if e.kind == _START:
                if e.finished:
                    ledger.owe_end(e.request_id)
                else:
                    assert e.prompt is not None
                    ledger.active[e.request_id] = _Tracked(
                        e.prompt + e.new_tokens, False, len(e.prompt), e.group
                    )
            elif e.kind in (_TRACKED, _RESYNC) and e.tracked is not None:
                # held stays what the server is known to hold; a restart in doubt stays one
                e.tracked.tokens.extend(e.fresh)
                if e.finished:
                    ledger.active.pop(e.request_id, None)
                    ledger.owe_end(e.request_id)

    def unavailable_without_trying(self) -> None:
        """The server is known to be down: the step is recorded without sending anything."""
        self._in_flight = self._first
        self.on_unavailable()

    def refused(self, error: LookaheadError) -> LookaheadError:
        """``error`` (the whole step, or its follow-up message, was refused and not applied)
        with the step's ``batch`` (the trees answered before it, the others empty) and
        ``index`` -1 attached."""
        error.batch = self._batch({})  # type: ignore[attr-defined]
        error.index = -1  # type: ignore[attr-defined]
        return error

    def result(self) -> DraftBatch:
        """The step's trees, one per request (empty for requests without an answer).

        Raises:
            LookaheadError: the first request that failed (a subclass naming the field),
                with the step's ``batch`` (every refusal in its ``errors``) and the request's
                ``index`` attached (-1: the whole step was refused, every tree empty).
        """
        errors: dict[int, LookaheadError] = {}
        for index, error in self._errors:
            errors.setdefault(index, error)
        whole = errors.pop(-1, None)
        if whole is not None:
            raise self.refused(whole)
        batch = self._batch(errors)
        batch.raise_first_error()
        return batch

    def _batch(self, errors: dict[int, LookaheadError]) -> DraftBatch:
        """The step's trees as one batch: the first answer's columns as they are when it
        answered every request (the usual step), else gathered tree by tree. ``held`` is
        the server's when every request was answered with it, else None."""
        trees, n = self._trees, len(self._trees)
        first = trees[0] if n else None
        if (
            first is not None
            and first[1] == 0
            and all(t is not None and t[0] is first[0] for t in trees)
        ):
            c, stop = first[0], trees[-1][3]  # type: ignore[index]
            return DraftBatch(
                c.roots[:n],
                c.sizes[:n],
                c.tokens[:stop],
                c.parents[:stop],
                c.scores[:stop],
                None if c.held is None else c.held[:n],
                errors=dict(errors),
            )
        roots = np.array(self._roots, dtype=np.int64)
        sizes = np.zeros(n, dtype=np.uint32)
        held: np.ndarray | None = np.zeros(n, dtype=np.uint64)
        pieces: list[tuple[Columns, int, int]] = []
        for index, t in enumerate(trees):
            if t is None:
                if index not in errors:
                    held = None  # unanswered: what the server holds is not known
                continue  # refused: the batch's held is 0 there, as the server's
            c, row, start, stop = t
            roots[index] = c.roots[row]
            sizes[index] = stop - start
            pieces.append((c, start, stop))
            if held is not None:
                if c.held is None:
                    held = None
                else:
                    held[index] = c.held[row]
        return DraftBatch(
            roots,
            sizes,
            _gather(pieces, "tokens", np.int64),
            _gather(pieces, "parents", np.int32),
            _gather(pieces, "scores", np.float32),
            held,
            errors=dict(errors),
        )


def _gather(pieces: list[tuple[Columns, int, int]], column: str, dtype: type) -> np.ndarray:
    """One column of the trees in ``pieces`` (answer, start, stop), end to end."""
    if not pieces:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([getattr(c, column)[a:b] for c, a, b in pieces])
