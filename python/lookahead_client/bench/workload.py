"""Loading and checking replay workloads: JSON lines of recorded requests.

One line is one request (see ``shared/workloads/FORMAT.md``)::

    {"id": "...", "group": "...", "prompt": [ids...], "response": [ids...], "after": "..."}

``after`` is optional and names an earlier request that must finish before this one starts.
Every problem is reported as a :class:`WorkloadError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lookahead_client.errors import InvalidArgumentError

__all__ = ["DEMO_WORKLOAD", "Request", "Workload", "WorkloadError", "load_workload", "parse_lines"]

#: The small workload shipped inside the package (see ``lookahead_client/data/README.md``).
DEMO_WORKLOAD = Path(__file__).resolve().parent.parent / "data" / "demo.jsonl"

_FIELDS = ("id", "group", "prompt", "response", "after")


class WorkloadError(InvalidArgumentError):
    """A workload file cannot be read or breaks the format.

    Attributes:
        field: the offending field (``None`` for a line that is not JSON at all).
        line: the 1-based line number, or ``None`` for a problem with the whole file.
    """

    def __init__(self, message: str, *, field: str | None = None, line: int | None = None):
        super().__init__(message, field=field)
        self.line = line


@dataclass(frozen=True, slots=True)
class Request:
    """One recorded request.

    Attributes:
        id: unique within the workload.
        group: requests sharing a conversation or a prompt.
        prompt: the token ids the engine prefills.
        response: the token ids the model produced (the first comes from prefill).
        after: the id of an earlier request that must finish first, or ``None``.
    """

    id: str
    group: str
    prompt: tuple[int, ...]
    response: tuple[int, ...]
    after: str | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A named list of requests in arrival order."""

    name: str
    requests: tuple[Request, ...]

    @property
    def response_tokens(self) -> int:
        """The total number of response tokens (what a replay advances through)."""
        return sum(len(r.response) for r in self.requests)

    def half(self, which: str) -> Workload:
        """One half of the workload split by group, for held-out checks: ``"a"`` keeps the
        groups that appear 1st, 3rd, 5th... in the file, ``"b"`` the 2nd, 4th... (a group's
        requests, and the earlier turns its requests wait for, stay together). Named
        ``<name>-a`` or ``<name>-b``.

        Raises:
            WorkloadError: ``which`` is neither "a" nor "b".
        """
        if which not in ("a", "b"):
            raise WorkloadError(f"split must be 'a' or 'b', got {which!r}", field="split")
        order = list(dict.fromkeys(r.group for r in self.requests))
        keep = set(order[0 if which == "a" else 1 :: 2])
        kept = tuple(r for r in self.requests if r.group in keep)
        return Workload(name=f"{self.name}-{which}", requests=kept)


def _token_list(value: object, where: str, field: str, line: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise WorkloadError(
            f"{where}: field {field!r} must be a non-empty list of token ids",
            field=field,
            line=line,
        )
    # ``type(t) is int`` also rejects booleans; checked in one pass for speed.
    if not all(type(t) is int and t >= 0 for t in value):
        bad = next(i for i, t in enumerate(value) if not (type(t) is int and t >= 0))
        raise WorkloadError(
            f"{where}: field {field!r}[{bad}] = {value[bad]!r} is not a token id "
            "(a non-negative integer)",
            field=field,
            line=line,
        )
    return tuple(value)


def _optional_text(record: dict, key: str, where: str, line: int) -> str | None:
    value = record.get(key)
    return None if value is None else _required_text(value, key, where, line)


def _required_text(value: object, key: str, where: str, line: int) -> str:
    if not isinstance(value, str) or not value:
        raise WorkloadError(
            f"{where}: field {key!r} must be a non-empty string, got {value!r}",
            field=key,
            line=line,
        )
    return value


def parse_lines(lines: Iterable[str], source: str = "<workload>", limit: int | None = None):
    """Parses JSON lines into requests, checking every field.

    Args:
        lines: the lines of a workload file (blank lines are skipped).
        source: the name used in error messages (the file path).
        limit: keep only the first ``limit`` requests.

    Returns:
        The requests in order.

    Raises:
        WorkloadError: a line is not a JSON object, a field is missing or has a bad value,
            an id repeats, or ``after`` does not name an earlier request.
    """
    if limit is not None and limit < 1:
        raise WorkloadError(f"limit must be >= 1, got {limit}", field="limit")
    requests: list[Request] = []
    seen: set[str] = set()
    for number, text in enumerate(lines, start=1):
        if limit is not None and len(requests) >= limit:
            break
        if not text.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not valid JSON ({exc.msg})", line=number) from None
        if not isinstance(record, dict):
            raise WorkloadError(f"{where}: a line must be a JSON object", line=number)
        for key in ("id", "group", "prompt", "response"):
            if key not in record:
                raise WorkloadError(f"{where}: missing field {key!r}", field=key, line=number)
        unknown = sorted(set(record) - set(_FIELDS))
        if unknown:
            raise WorkloadError(
                f"{where}: unknown field {unknown[0]!r} (expected {', '.join(_FIELDS)})",
                field=unknown[0],
                line=number,
            )
        rid = _required_text(record.get("id"), "id", where, number)
        if rid in seen:
            raise WorkloadError(f"{where}: id {rid!r} repeats", field="id", line=number)
        after = _optional_text(record, "after", where, number)
        if after is not None and after not in seen:
            raise WorkloadError(
                f"{where}: field 'after' = {after!r} does not name an earlier request",
                field="after",
                line=number,
            )
        requests.append(
            Request(
                id=rid,
                group=_required_text(record.get("group"), "group", where, number),
                prompt=_token_list(record["prompt"], where, "prompt", number),
                response=_token_list(record["response"], where, "response", number),
                after=after,
            )
        )
        seen.add(rid)
    if not requests:
        raise WorkloadError(f"{source}: no requests", field="requests")
    return requests


def load_workload(path: str | Path, limit: int | None = None) -> Workload:
    """Reads and checks a workload file; its name is the file name without ``.jsonl``.

    Raises:
        WorkloadError: the file cannot be read or breaks the format (see :func:`parse_lines`).
    """
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as handle:
            requests = parse_lines(handle, source=str(path), limit=limit)
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc.strerror}", field="path") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason})", field="path") from None
    name = path.name.removesuffix(".jsonl")
    return Workload(name=name, requests=tuple(requests))
