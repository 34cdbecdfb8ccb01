"""Prompt lookup with vLLM's ``ngram`` proposer semantics (``prompt_lookup_min/max``).

vLLM (``vllm/v1/spec_decode/ngram_proposer.py``, ``_find_longest_matched_ngram_and_propose_tokens``)
reverses the context and runs a KMP scan capped at ``max_n``: it finds the longest ``n``
(``min_n <= n <= max_n``) such that the context's last ``n`` tokens occur earlier, and among
the occurrences of that ``n``-gram it keeps the one found last in the reversed scan (its
``prev_lps >= longest_ngram`` update), that is the **earliest** occurrence in the context. The
proposal is the up to ``k`` tokens that follow it, cut at the end of the context. The context
is the request's own tokens (prompt + output so far); nothing is shared between requests.

Here the same answer comes from an index instead of an O(n) scan per step: for each n-gram
that has a continuation, the position after its first occurrence (kept with ``setdefault``,
so it never moves). Building the index for a prompt is a few dict updates done in C.
"""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_client.bench.baselines.per_request import PerRequestDrafter, chain_tree
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.types import DraftTree

__all__ = ["VllmNgramDrafter"]


class _Context:
    """One request's tokens and, per n-gram with a continuation, the first continuation."""

    __slots__ = ("tokens", "first", "sizes")

    def __init__(self, prompt: Sequence[int], sizes: range) -> None:
        toks = [int(t) for t in prompt]
        self.tokens = toks
        self.sizes = sizes
        self.first: dict[tuple[int, ...], int] = {}
        last = len(toks) - 1  # n-grams must end before the last token to have a continuation
        for n in sizes:
            if n > last:
                continue
            grams = list(zip(*(toks[i:last] for i in range(n)), strict=False))
            # Reversed, so that the first occurrence is written last and wins.
            self.first.update(zip(reversed(grams), range(last, n - 1, -1), strict=True))

    def extend(self, new: Sequence[int]) -> None:
        toks, first = self.tokens, self.first
        for t in new:
            end = len(toks)  # the n-grams ending at toks[end - 1] now get a continuation
            for n in self.sizes:
                if n <= end:
                    first.setdefault(tuple(toks[end - n : end]), end)
            toks.append(int(t))

    def propose(self, k: int) -> list[int]:
        toks = self.tokens
        total = len(toks)
        for n in reversed(self.sizes):
            if n > total:
                continue
            start = self.first.get(tuple(toks[total - n :]))
            if start is not None:
                return toks[start : start + k]
        return []


class VllmNgramDrafter(PerRequestDrafter):
    """vLLM's n-gram (prompt lookup) proposer as a ``Drafter``: one chain of <= budget tokens.

    Args:
        min_n: ``prompt_lookup_min`` (>= 1).
        max_n: ``prompt_lookup_max`` (>= ``min_n``).
    """

    def __init__(self, min_n: int = 1, max_n: int = 5) -> None:
        super().__init__()
        if min_n < 1:
            raise InvalidArgumentError(f"min_n must be >= 1, got {min_n}", field="min_n")
        if max_n < min_n:
            raise InvalidArgumentError(f"max_n ({max_n}) must be >= min_n ({min_n})", field="max_n")
        self._sizes = range(min_n, max_n + 1)
        self._contexts: dict[str, _Context] = {}

    def _start(self, request_id: str, prompt: Sequence[int]) -> None:
        self._contexts[request_id] = _Context(prompt, self._sizes)

    def _append(self, request_id: str, tokens: Sequence[int]) -> None:
        self._contexts[request_id].extend(tokens)

    def _draft(self, request_id: str, budget: int) -> DraftTree:
        ctx = self._contexts[request_id]
        return chain_tree(ctx.tokens[-1], ctx.propose(budget))

    def _end(self, request_id: str) -> None:
        del self._contexts[request_id]
