"""One vLLM step of lookahead drafting, whichever vLLM interface calls it.

vLLM 0.32/0.33 call a ``custom_class`` proposer (:mod:`.proposer`), vLLM 0.34 a registered
speculator (:mod:`.speculator`); both show the drafter rows of requests and want a chain of
draft tokens per row. :class:`ChainDrafting` is what they share: request identity through the
:class:`~lookahead_client.engine.book.RequestBook` (each request's tokens fed exactly once),
the deadline guard (slow, down or wrong: empty chains, never an error), the request's
temperature, and the engine's measured step times handed to the core, which sizes the chains
(zero where drafting does not pay).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lookahead_client.engine.book import RequestBook, RequestView
from lookahead_client.engine.checks import draft_problem
from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.engine.guard import DraftGuard, guard_for, quiet_every_for
from lookahead_client.engine.session import DraftSession
from lookahead_client.engine.step_cost import StepCostFeed
from lookahead_client.engine.warn_once import WarnOnce
from lookahead_client.types import DraftShape

__all__ = ["ChainDrafting", "Chain", "Row"]

_log = logging.getLogger("lookahead_client.vllm")


@dataclass(slots=True)
class Row:
    """One decoding request of a vLLM step.

    Attributes:
        index: its row in the engine's batch.
        rid: vLLM's request id.
        prompt: its prompt tokens (empty in a tail).
        output: its tokens after the prompt, or after ``start`` in a tail, up to the token
            just sampled.
        temperature: its sampling temperature (0: greedy).
        room: the most draft tokens that fit before the model's length limit.
        start: 0, or a tail's first position (at most :meth:`ChainDrafting.needs_from`).
    """

    index: int
    rid: str
    prompt: Sequence[int] | np.ndarray
    output: Sequence[int] | np.ndarray
    temperature: float
    room: int
    start: int = 0


@dataclass(slots=True)
class Chain:
    """The draft of one row: its tokens and each token's conditional probability of being
    accepted given the ones before it (the core's calibrated scores)."""

    row: int
    tokens: list[int]
    confidence: list[float]


class ChainDrafting:
    """Chains of at most ``k`` tokens for the rows of each vLLM step.

    Args:
        config: where drafts come from and whether chains are sized.
        k: vLLM's ``num_speculative_tokens``.
        vocab_size: the target model's vocabulary size.
        max_model_len: the model's context length.
    """

    def __init__(self, config: LookaheadConfig, *, k: int, vocab_size: int, max_model_len: int):
        self.config = config
        self.k = k
        self.vocab_size = vocab_size
        drafter = config.build_drafter(
            num_slots=k + 1, vocab_size=vocab_size, context_len=max_model_len
        )
        shape = DraftShape.SIZED_CHAIN if config.sizing else DraftShape.CHAIN
        self.session = DraftSession(
            guard_for(config, drafter),
            RequestBook(budget=k, shape=shape),
            _log,
            quiet_every=quiet_every_for(config, drafter),
        )
        #: The engine's step times, fitted on the feed's own thread (off the step's path);
        #: the core sizes chains against them.
        self.cost = StepCostFeed(background=True) if config.sizing else None
        # The requests that came out of the last step decoding (see observe).
        self._decoding: frozenset[str] = frozenset()
        #: Steps not measured because they held (part of) a prefill.
        self.prefill_steps = 0
        self.drafted_requests = 0
        self.draft_tokens = 0

    @property
    def guard(self) -> DraftGuard:
        """The drafter behind its deadline."""
        return self.session.guard

    @property
    def book(self) -> RequestBook:
        """The requests as the drafter holds them."""
        return self.session.book

    @property
    def warn(self) -> WarnOnce:
        """Problems, logged once per kind and counted."""
        return self.session.warn

    def end(self, rids: Iterable[str]) -> None:
        """The requests left vLLM (finished or aborted): ended in the drafter next step."""
        for rid in rids:
            self.book.forget(rid)

    def observe(
        self,
        tokens: int,
        seconds: float | None,
        *,
        rows: int,
        context: int = 0,
        pairs: int = 0,
        scheduled: Iterable[str] = (),
        decoding: Iterable[str] = (),
    ) -> None:
        """One engine step, called for every step (see :class:`StepCostFeed`).

        Only decode steps are measured: a step that ran a request which was not decoding
        after the step before it (it started, resumed or is still being prefilled) held a
        prefill, whose time says nothing about what a draft token costs.

        Args:
            tokens, rows, context, pairs: the step's shape (see :class:`StepCostFeed`).
            seconds: how long the whole step took; None when it was not timed.
            scheduled: the request ids the step ran.
            decoding: those that came out of it decoding (a token sampled, no prefill left).
        """
        decode_only = all(rid in self._decoding for rid in scheduled)
        self._decoding = frozenset(decoding)
        if self.cost is None or seconds is None or tokens <= 0 or seconds <= 0:
            return
        if not decode_only:
            self.prefill_steps += 1
            return
        self.cost.observe(tokens, seconds, rows=rows, context=context, pairs=pairs)

    def begin(self) -> bool:
        """Starts a step (:meth:`DraftSession.begin`): False when the drafter is still busy
        with an earlier one (the step has no drafts); else :meth:`step` follows, and
        :meth:`needs_from` holds until it does."""
        return self.session.begin()

    def needs_from(self, rid: str) -> int | None:
        """The position from which this step needs ``rid``'s tokens (0: all of them; None:
        none, it is not drafted); a row may be a tail that starts there or earlier."""
        return self.book.needs_from(rid)

    def step(self, rows: Sequence[Row]) -> list[Chain]:
        """The chain of each row that gets one (rows without a chain decode plainly); after
        :meth:`begin` returned True."""
        views = [RequestView(r.rid, r.prompt, r.output, (), r.temperature, r.start) for r in rows]
        cost = None if self.cost is None else self.cost.curve(len(views))
        drafts = self.session.draft(views, cost)
        if drafts is None:
            return []
        batch = drafts.batch
        # the columns as lists once: a step reads a few nodes of each row
        roots, starts, sizes = batch.roots.tolist(), batch.offsets.tolist(), batch.sizes.tolist()
        tokens, scores = batch.tokens.tolist(), batch.scores.tolist()
        chains = []
        for j, row in enumerate(rows):
            index = drafts.tree_of(j)
            if index < 0:
                self.session.fed(drafts, j, -1)
                continue
            a = starts[index]
            problem = draft_problem(
                roots[index], int(row.output[-1]), tokens[a : a + sizes[index]], self.vocab_size
            )
            if problem is not None:
                self.session.refused(row.rid, *problem)
                self.session.fed(drafts, j, -1)
                continue
            n = min(self.k, row.room, sizes[index])
            path = scores[a : a + n]  # each node's probability that the path to it is accepted
            self.session.fed(drafts, j, n, sum(path))
            if n == 0:
                continue
            # each token's probability given the ones before it
            parents = [1.0, *path[:-1]]
            confidence = [min(s / max(p, 1e-12), 1.0) for s, p in zip(path, parents, strict=True)]
            chains.append(Chain(row.index, tokens[a : a + n], confidence))
            self.drafted_requests += 1
            self.draft_tokens += n
        return chains

    def stats(self) -> dict[str, Any]:
        """Whether chains are sized, and the step times in ms the core sizes against now for
        a step verifying 1 to K + 1 tokens (``cost_curve_ms``: one request and its draft,
        for steps like the last one measured; None before the first fit) and what a step
        pays once for verifying any draft (``draft_overhead_ms``, in that fit); counters: steps,
        drafts, steps left out of the cost curve for a prefill, the session's (the request
        book, the guard, what other replicas' text gave), a remote client's own fallbacks,
        the draft nodes the core sized away (in-process)."""
        curve = overhead = None
        if self.cost is not None:
            seconds = self.cost.seconds_at(range(1, self.k + 2))
            curve = None if seconds is None else [round(1e3 * s, 2) for s in seconds]
            overhead = self.cost.draft_seconds
        out: dict[str, Any] = {
            "sizing": self.cost is not None,
            "cost_curve_ms": curve,
            "draft_overhead_ms": None if overhead is None else round(1e3 * overhead, 2),
            "drafted_requests": self.drafted_requests,
            "draft_tokens": self.draft_tokens,
            "prefill_steps": self.prefill_steps,
        }
        out.update(self.session.stats())
        drafter = self.guard.drafter
        client_stats = getattr(drafter, "client_stats", None)
        if callable(client_stats):  # a remote drafter's own fallbacks and outages
            out["client"] = client_stats()
        elif self.cost is not None:  # in-process: no call
            out["sized_away"] = self.session.drafter_stats().get("sized_away")
        return out
