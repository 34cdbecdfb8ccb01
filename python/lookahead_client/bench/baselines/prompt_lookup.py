"""A pure-Python prompt-lookup drafter: the baseline used until the embedded drafter is there.

For each request it keeps the context (prompt plus generated tokens) and an index from every
n-gram (``min_ngram <= n <= max_ngram``) to the position after its most recent occurrence that
has a continuation. A draft is the continuation of the most recent earlier occurrence of the
context's last ``max_ngram`` tokens (else ``max_ngram - 1`` ... else ``min_ngram``), cut to
the budget, as one chain. This is the "prompt-lookup" sanity drafter of the shared workloads'
README. Nothing is shared between requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_client.errors import InvalidArgumentError
from lookahead_client.types import DraftTree

from .per_request import PerRequestDrafter

__all__ = ["PromptLookupDrafter"]


class _Context:
    """One request's tokens and its n-gram index."""

    def __init__(self, min_ngram: int, max_ngram: int) -> None:
        self.tokens: list[int] = []
        self.sizes = range(min_ngram, max_ngram + 1)
        # (n-gram) -> the position right after its most recent occurrence with a continuation.
        self.index: dict[tuple[int, ...], int] = {}

    def extend(self, new: Sequence[int]) -> None:
        toks = self.tokens
        for t in new:
            # The n-grams ending at the current last token get a continuation (``t``).
            end = len(toks)
            for n in self.sizes:
                if n <= end:
                    self.index[tuple(toks[end - n : end])] = end
            toks.append(int(t))

    def draft(self, budget: int) -> DraftTree:
        toks = self.tokens
        root = toks[-1] if toks else -1
        for n in reversed(self.sizes):
            if n > len(toks):
                continue
            start = self.index.get(tuple(toks[len(toks) - n :]))
            if start is not None:
                chain = tuple(toks[start : start + budget])
                k = len(chain)
                return DraftTree(root, chain, tuple(range(-1, k - 1)), (1.0,) * k)
        return DraftTree.empty(root)


class PromptLookupDrafter(PerRequestDrafter):
    """Prompt-lookup drafting (one chain per step), following the ``Drafter`` protocol.

    Args:
        min_ngram: the shortest suffix that is looked up (>= 1).
        max_ngram: the longest suffix that is looked up (>= ``min_ngram``).
    """

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3) -> None:
        if min_ngram < 1:
            raise InvalidArgumentError(
                f"min_ngram must be >= 1, got {min_ngram}", field="min_ngram"
            )
        if max_ngram < min_ngram:
            raise InvalidArgumentError(
                f"max_ngram ({max_ngram}) must be >= min_ngram ({min_ngram})", field="max_ngram"
            )
        super().__init__()
        self._min, self._max = min_ngram, max_ngram
        self._contexts: dict[str, _Context] = {}

    def __repr__(self) -> str:
        return f"PromptLookupDrafter(min_ngram={self._min}, max_ngram={self._max})"

    def _start(self, request_id: str, prompt: Sequence[int]) -> None:
        ctx = _Context(self._min, self._max)
        ctx.extend(prompt)
        self._contexts[request_id] = ctx

    def _append(self, request_id: str, tokens: Sequence[int]) -> None:
        self._contexts[request_id].extend(tokens)

    def _draft(self, request_id: str, budget: int) -> DraftTree:
        return self._contexts[request_id].draft(budget)

    def _end(self, request_id: str) -> None:
        del self._contexts[request_id]
