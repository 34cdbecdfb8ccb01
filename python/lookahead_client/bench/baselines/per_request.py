"""What the pure-Python per-request drafters share (prompt lookup, the benchmark's baselines):
request bookkeeping and chain trees."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from lookahead_client.errors import (
    InvalidArgumentError,
    RequestAlreadyActiveError,
    UnknownRequestError,
)
from lookahead_client.types import DraftBatch, DraftTree, EngineCost, StepRequest

__all__ = ["PerRequestDrafter", "chain_tree"]


def chain_tree(
    root: int,
    tokens: Sequence[int],
    probs: Sequence[float] | None = None,
    parents: Sequence[int] | None = None,
) -> DraftTree:
    """A tree from flat lists: a chain unless ``parents`` is given (-1 = the root).

    Scores are ``probs`` made non-increasing along every path (1.0 when not given).
    """
    k = len(tokens)
    par = tuple(range(-1, k - 1)) if parents is None else tuple(int(p) for p in parents)
    if probs is None:
        scores: tuple[float, ...] = (1.0,) * k
    else:
        out: list[float] = []
        for p, prob in zip(par, probs, strict=True):
            out.append(min(float(prob), 1.0 if p < 0 else out[p]))
        scores = tuple(out)
    return DraftTree(root, tuple(int(t) for t in tokens), par, scores)


class PerRequestDrafter(ABC):
    """A ``Drafter`` that handles the requests of a step one after the other.

    Subclasses implement :meth:`_start`, :meth:`_append`, :meth:`_draft` and :meth:`_end`;
    this class checks the protocol (known ids, budgets) and counts steps and draft tokens.
    """

    def __init__(self) -> None:
        self._active: set[str] = set()
        self._steps = 0
        self._drafted = 0

    @abstractmethod
    def _start(self, request_id: str, prompt: Sequence[int]) -> None: ...

    @abstractmethod
    def _append(self, request_id: str, tokens: Sequence[int]) -> None: ...

    @abstractmethod
    def _draft(self, request_id: str, budget: int) -> DraftTree: ...

    @abstractmethod
    def _end(self, request_id: str) -> None: ...

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        """Begins a request with its prompt."""
        if request_id in self._active:
            raise RequestAlreadyActiveError(
                f"request {request_id!r} is already active", field="request_id"
            )
        if len(prompt) == 0:
            raise InvalidArgumentError("prompt must not be empty", field="prompt")
        self._start(request_id, prompt)
        self._active.add(request_id)

    def _check_active(self, request_id: str) -> None:
        if request_id not in self._active:
            raise UnknownRequestError(f"request {request_id!r} is not active", field="request_id")

    #: Whole trees whatever the shape: the caller cuts them (see ``Drafter``).
    sizes_drafts = False

    def step(self, requests: Sequence[StepRequest], cost: EngineCost | None = None) -> DraftBatch:
        """Feeds each request its new tokens and drafts one tree each (none when finished);
        ``cost`` is not used (whole trees)."""
        out = []
        for req in requests:
            if req.budget < 0:
                raise InvalidArgumentError(f"budget must be >= 0, got {req.budget}", field="budget")
            if req.prompt is not None:
                self.start(req.request_id, req.prompt)
            self._check_active(req.request_id)
            if req.new_tokens:
                self._append(req.request_id, req.new_tokens)
            if req.finished:
                self.end(req.request_id)
                out.append(DraftTree.empty())
                continue
            self._steps += 1
            tree = self._draft(req.request_id, req.budget) if req.budget else DraftTree.empty()
            self._drafted += len(tree)
            out.append(tree)
        return DraftBatch.from_trees(out)

    def end(self, request_id: str) -> None:
        """Ends a request."""
        self._check_active(request_id)
        self._active.discard(request_id)
        self._end(request_id)

    def stats(self) -> dict[str, int | float]:
        """Active requests, steps drafted and draft tokens proposed."""
        return {
            "active_requests": len(self._active),
            "steps": self._steps,
            "draft_tokens": self._drafted,
        }
