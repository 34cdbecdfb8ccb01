"""The remote drafter's wire layer: targets, channel options, messages and error mapping.

Everything here is free of I/O; the synchronous (:mod:`.sync`) and asyncio (:mod:`.aio`)
clients share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import grpc
import numpy as np

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client.errors import (
    InvalidArgumentError,
    LookaheadError,
    PermissionDeniedError,
    RequestAlreadyActiveError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnknownRequestError,
)

__all__ = [
    "FIELD_METADATA_KEY",
    "Columns",
    "TRANSIENT_CODES",
    "StepTimeout",
    "channel_options",
    "describe",
    "ingest_messages",
    "stats_dict",
    "status_code",
    "error_from_request_error",
    "error_from_rpc",
    "is_transient",
    "normalize_target",
]

#: The trailing-metadata key in which the server names the offending field of a failed call.
FIELD_METADATA_KEY = "lookahead-field"

#: Status codes after which a step falls back to empty drafts instead of raising: the server
#: is unreachable, too slow, restarting, or broke on its side.
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)

_REQUEST_ERRORS: dict[int, type[LookaheadError]] = {
    pb.ERROR_CODE_INVALID_ARGUMENT: InvalidArgumentError,
    pb.ERROR_CODE_UNKNOWN_REQUEST: UnknownRequestError,
    pb.ERROR_CODE_REQUEST_ALREADY_ACTIVE: RequestAlreadyActiveError,
    pb.ERROR_CODE_RESOURCE_EXHAUSTED: ResourceExhaustedError,
}

_STATUS_ERRORS: dict[grpc.StatusCode, type[LookaheadError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: ResourceExhaustedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidArgumentError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


class StepTimeout(grpc.RpcError):
    """No answer to a step within its deadline (a transient failure: the step falls back)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no answer within the step deadline"


def normalize_target(target: str) -> str:
    """Checks a target and returns it as gRPC expects it.

    Accepted: ``host:port`` (``tcp://host:port`` too), ``[v6]:port``, ``unix:///abs/path``,
    ``unix:/abs/path`` and ``unix:relative/path``.

    Raises:
        InvalidArgumentError: the target is neither form (field ``target``).
    """
    if not isinstance(target, str) or not target:
        raise InvalidArgumentError(
            f"target must be host:port or unix:///path, got {target!r}", field="target"
        )
    if target.startswith("unix:"):
        path = target[len("unix:") :]
        if path.startswith("//") and not path.startswith("///"):
            raise InvalidArgumentError(
                f"target {target!r}: unix:// needs an absolute path (unix:///path)", field="target"
            )
        if not path.lstrip("/"):
            raise InvalidArgumentError(f"target {target!r}: empty socket path", field="target")
        return target
    hostport = target.removeprefix("tcp://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(
            f"target {target!r}: expected host:port or unix:///path", field="target"
        )
    return hostport


def channel_options(target: str, max_message_bytes: int) -> list[tuple[str, int | str]]:
    """Channel settings: reconnect quickly after a server restart, no transparent retries
    (the client resynchronises requests itself), and the message size limits. On Unix
    sockets the HTTP/2 authority is set to ``localhost``: gRPC's default for them (the
    percent-encoded path) is refused by the server's HTTP/2 stack."""
    unix: list[tuple[str, int | str]] = (
        [("grpc.default_authority", "localhost")] if target.startswith("unix:") else []
    )
    return unix + [
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.enable_retries", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def status_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    """The status code of a failed call (sync or asyncio), None when it has none."""
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def is_transient(error: grpc.RpcError) -> bool:
    """Whether a failed call means "the server is unavailable" rather than "bad input"."""
    code = status_code(error)
    return code is None or code in TRANSIENT_CODES


def describe(error: grpc.RpcError) -> str:
    """A short description of a failed call, for the log."""
    code = status_code(error)
    if code is None:
        return str(error) or type(error).__name__
    return f"{code.name}: {error.details()}"  # type: ignore[attr-defined]


def _field_of(error: grpc.RpcError) -> str | None:
    metadata = getattr(error, "trailing_metadata", None)
    for key, value in (metadata() if callable(metadata) else None) or ():
        if key == FIELD_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return None


def error_from_rpc(error: grpc.RpcError, what: str) -> LookaheadError:
    """The typed exception for a failed call (``what`` names the call in the message)."""
    code = status_code(error)
    if code is None:
        return UnavailableError(f"{what}: {error}")
    details = error.details() or code.name  # type: ignore[attr-defined]
    cls = _STATUS_ERRORS.get(code, UnavailableError)
    return cls(f"{what}: {details} ({code.name})", field=_field_of(error))


def error_from_request_error(error: pb.RequestError) -> LookaheadError:
    """The typed exception for a per-request (or per-step) error of a StepResponse."""
    cls = _REQUEST_ERRORS.get(error.code, LookaheadError)
    return cls(error.message, field=error.field or None)


class Columns(NamedTuple):
    """A StepResponse's trees as columns (see ``DraftBatch``)."""

    roots: np.ndarray
    sizes: np.ndarray
    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    #: The tokens each request holds after the step (None: the server did not say).
    held: np.ndarray | None


def response_columns(response: pb.StepResponse, requests: int) -> Columns | None:
    """The roots, sizes, tokens, parents and scores of a StepResponse as NumPy arrays (the
    dtypes of :class:`~lookahead_client.types.DraftBatch`), or None when they do not describe
    ``requests`` trees (a broken server)."""
    # np.array reads the protobuf containers' buffers: a copy, no Python int per token
    columns = Columns(
        np.array(response.roots, dtype=np.int64),
        np.array(response.sizes, dtype=np.uint32),
        np.array(response.tokens, dtype=np.int64),
        np.array(response.parents, dtype=np.int32),
        np.array(response.scores, dtype=np.float32),
        np.array(response.held, dtype=np.uint64) if len(response.held) == requests else None,
    )
    nodes = int(columns.sizes.sum())
    if (
        len(columns.roots) != requests
        or len(columns.sizes) != requests
        or not nodes == len(columns.tokens) == len(columns.parents) == len(columns.scores)
    ):
        return None
    return columns


def stats_dict(response: pb.StatsResponse, replica: str) -> dict[str, int | float]:
    """A StatsResponse as the ``stats()`` dict of a drafter whose engine replica is named
    ``replica``: the namespace's counters, and that replica's own (``replica_*``: what its
    engine accepted, and of that what other replicas' text gave; zero when the server does
    not tell it apart, see ``StatsResponse.replicas``)."""
    out: dict[str, int | float] = {
        f.name: getattr(response, f.name)
        for f in response.DESCRIPTOR.fields
        if f.name not in ("namespace", "replicas")
    }
    mine = next((r for r in response.replicas if r.replica == replica), pb.ReplicaStats())
    out["replica_accepted_reported"] = mine.accepted_reported
    out["replica_accepted_cross_replica"] = mine.accepted_cross_replica
    return out


def ingest_messages(
    namespace: str,
    documents: Iterable[Sequence[int]],
    batch_tokens: int,
    problems: list[LookaheadError],
) -> Iterator[pb.IngestRequest]:
    """IngestRequests of about ``batch_tokens`` tokens. A document that cannot be encoded
    ends the stream and is reported in ``problems`` (gRPC would hide the exception)."""
    batch = pb.IngestRequest(namespace=namespace)
    size = 0
    sent = False
    for i, document in enumerate(documents):
        try:
            batch.documents.add().tokens.extend(document)
        except (TypeError, ValueError) as e:
            field = f"documents[{i}].tokens"
            problems.append(InvalidArgumentError(f"{field}: {e}", field=field))
            break
        size += len(batch.documents[-1].tokens)
        if size >= batch_tokens:
            yield batch
            sent = True
            batch = pb.IngestRequest(namespace=namespace)
            size = 0
    if batch.documents or not sent:
        yield batch
