"""Helpers of the remote-drafter tests: texts with repeated phrases (so that drafts are not
empty), greedy verification of a tree, and a synchronous face for the asyncio drafter."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from lookahead_client.types import DraftTree

#: The memory budget of each namespace of the test servers (the embedded reference gets the
#: same).
SERVER_NAMESPACE_BUDGET = 128 << 20


def repetitive_texts(n: int, length: int, seed: int = 0, vocab: int = 300) -> list[list[int]]:
    """``n`` token lists of ``length`` tokens made of a few shared phrases, so that n-grams
    recur within and across texts."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(1, vocab) for _ in range(rng.randrange(4, 12))] for _ in range(10)]
    texts = []
    for _ in range(n):
        text: list[int] = []
        while len(text) < length:
            text.extend(rng.choice(phrases))
            if rng.random() < 0.2:
                text.append(rng.randrange(1, vocab))
        texts.append(text[:length])
    return texts


def greedy_accept(tree: DraftTree | None, continuation: Sequence[int]) -> int:
    """How many draft tokens greedy verification accepts: the longest root-to-node path whose
    tokens equal the start of ``continuation``."""
    if tree is None or not tree.tokens:
        return 0
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    node, accepted = -1, 0
    while accepted < len(continuation):
        nxt = [c for c in children.get(node, []) if tree.tokens[c] == continuation[accepted]]
        if not nxt:
            break
        node = nxt[0]
        accepted += 1
    return accepted


class SyncFacade:
    """Runs the coroutine methods of an asyncio drafter on a private event loop, so that
    synchronous test code can drive it like the others."""

    def __init__(self, drafter: Any) -> None:
        self._drafter = drafter
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._drafter, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(attr(*args, **kwargs))

        return call

    def close(self) -> None:
        """Closes the drafter's channel and the loop."""
        self._loop.run_until_complete(self._drafter.close())
        self._loop.close()
