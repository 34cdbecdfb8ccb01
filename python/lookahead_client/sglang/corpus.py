"""A lookahead drafter behind the face of SGLang's ``NgramCorpus``.

:class:`DrafterCorpus` offers the methods SGLang 0.5.23's ``NGRAMWorker`` calls on its corpus
(``batch_get``, ``batch_put``, ``synchronize``, ``reset``, ``erase_match_state`` and the
external-corpus ones) and answers ``batch_get`` with exactly the arrays the C++ corpus returns:
flat int64 ``tokens`` ``[bs * d]`` (slot 0 the last context token, nodes in BFS order,
padding token 0 under the root) and flat int64 ``mask`` ``[bs * d * d]`` (row ``i`` marks
``i`` and its ancestors). SGLang's tree construction, FlashInfer verification and sampling use
them unchanged.

Unlike the C++ corpus it drafts from the whole request: the worker attaches the batch's
``Req`` objects before each ``batch_get`` (see :mod:`.worker`), and :class:`.book.RequestBook`
turns them into drafter steps. Nothing here raises into SGLang: every drafter failure, deadline
or inconsistency gives root-only trees (plain decoding) for the requests concerned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lookahead_client.engine.book import RequestBook, RequestView
from lookahead_client.engine.guard import DraftGuard
from lookahead_client.engine.session import DraftSession
from lookahead_client.engine.warn_once import WarnOnce
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.tree import PackedSlots, pack_batch
from lookahead_client.types import DraftBatch, DraftShape, EngineCost

__all__ = ["DrafterCorpus", "Share", "StepContext", "broadcast_share"]

_log = logging.getLogger("lookahead_client.sglang")

#: A batch without trees, for steps where every request decodes plainly.
_NO_TREES = DraftBatch.from_trees([])

#: Moves one step's ``(tokens, mask)`` from the drafting rank to the others: called with the
#: arrays on the drafting rank, with None on the others; returns the arrays on every rank.
Share = Callable[[tuple[np.ndarray, np.ndarray] | None], tuple[np.ndarray, np.ndarray]]


def broadcast_share(rank: int, src: int, cpu_group: Any) -> Share:
    """A :data:`Share` over a ``torch.distributed`` CPU (gloo) group.

    Args:
        rank: this process's global rank.
        src: the global rank that drafts (the group's first).
        cpu_group: the process group (SGLang's TP ``cpu_group``).
    """
    import torch.distributed as dist

    drafts_here = rank == src

    def share(arrays: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
        box = [arrays if drafts_here else None]
        dist.broadcast_object_list(box, src=src, group=cpu_group)
        shared = box[0]
        assert shared is not None  # the drafting rank always sends its arrays
        return shared

    return share


class StepContext:
    """What the worker knows at ``batch_get`` time that the corpus API does not carry.

    Args:
        reqs: the batch's SGLang ``Req`` objects, in batch order.
        spliced: returns SGLang's staging of the previous round's accepted tokens
            (``NGRAMWorker.prev_token_ids``, ``stride`` entries per request), which the worker
            fills in during the lookup, hence read when needed.
        stride: ``speculative_num_draft_tokens``.
        cost: the step's cost for sized trees (see :class:`~.step_modes.StepModes`); None:
            whole trees.
    """

    __slots__ = ("cost", "reqs", "spliced", "stride")

    def __init__(
        self,
        reqs: Sequence[Any],
        spliced: Callable[[], Sequence[int]],
        stride: int,
        cost: EngineCost | None = None,
    ) -> None:
        self.reqs = reqs
        self.spliced = spliced
        self.stride = stride
        self.cost = cost


class DrafterCorpus:
    """SGLang's ``NgramCorpus`` interface over a lookahead drafter.

    Args:
        num_slots: ``d``, SGLang's ``speculative_num_draft_tokens`` (the root included).
        guard: the drafter behind its deadline; None on tensor-parallel ranks that receive
            their drafts from the drafting rank (``share``).
        vocab_size: drafts with a token id outside ``[0, vocab_size)`` are dropped.
        share: for tensor parallelism, see :data:`Share`; None with one rank.
        shape: the drafts asked for (:attr:`DraftShape.SIZED_TREE`: cut against each step's
            cost, see :class:`StepContext`).
        quiet_every: how often the drafter is called while the batch is quiet (see
            :class:`~lookahead_client.engine.session.DraftSession`).
    """

    def __init__(
        self,
        *,
        num_slots: int,
        guard: DraftGuard | None,
        vocab_size: int,
        share: Share | None = None,
        shape: DraftShape = DraftShape.TREE,
        quiet_every: int = 1,
    ) -> None:
        if num_slots < 1:
            raise InvalidArgumentError(
                f"num_slots must be >= 1, got {num_slots}", field="num_slots"
            )
        if guard is None and share is None:
            raise InvalidArgumentError(
                "a corpus needs a drafter or a rank to share with", field="guard"
            )
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self._share = share
        #: The drafting loop; None on ranks that receive their drafts (``share``).
        self.session = (
            None
            if guard is None
            else DraftSession(guard, RequestBook(num_slots - 1, shape), _log, quiet_every)
        )
        self._context: StepContext | None = None
        self._corpora: dict[str, int] = {}
        self.drafted_requests = 0
        self.draft_nodes = 0
        self.fallback_requests = 0
        #: Draft nodes of the last lookup's trees (0: every request decodes plainly).
        self.last_nodes = 0

    @property
    def guard(self) -> DraftGuard | None:
        """The drafter behind its deadline (None on ranks that receive their drafts)."""
        return None if self.session is None else self.session.guard

    # -- per-step context (set by the worker) ---------------------------------------------

    def attach(self, context: StepContext | None) -> None:
        """Sets (or clears, with None) the batch the next ``batch_get`` is about."""
        self._context = context

    # -- NgramCorpus's interface ------------------------------------------------------------

    def batch_get(
        self,
        req_ids: Sequence[str],
        batch_tokens: Sequence[Sequence[int]],
        total_lens: Sequence[int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """One step's drafts as SGLang's flat ``(tokens, mask)`` int64 arrays.

        Args:
            req_ids: the batch's request ids.
            batch_tokens: the last tokens of each request (what SGLang's corpus matches on);
                the last one is the root of the request's tree.
            total_lens: the number of tokens of each request, spliced tokens included.
        """
        if self.session is None:
            assert self._share is not None
            return self._share(None)
        roots = np.fromiter(
            (int(t[-1]) if len(t) else 0 for t in batch_tokens),
            dtype=np.int64,
            count=len(batch_tokens),
        )
        try:
            arrays = self._draft(self.session, req_ids, batch_tokens, total_lens, roots)
        except Exception as e:  # noqa: BLE001 - a bug here must not fail the generation
            self.session.warn("internal", "lookahead drafting failed: %s: %s", type(e).__name__, e)
            arrays = self._root_only(roots)
        return self._share(arrays) if self._share is not None else arrays

    def batch_put(self, batch_tokens: Sequence[Sequence[int]]) -> None:
        """Nothing: the drafter gets each request's new tokens with the next ``batch_get``."""

    def synchronize(self) -> None:
        """Nothing: there is no background insertion to wait for."""

    def reset(self) -> None:
        """SGLang flushed its cache: every request is finished (the shared statistics stay)."""
        if self.session is not None:
            self.session.book.forget_all()

    def erase_match_state(self, req_ids: Sequence[str]) -> None:
        """Requests left the decode batch: they are finished with the next step."""
        if self.session is not None:
            for rid in req_ids:
                self.session.book.forget(rid)

    # -- external corpora (SGLang's /add_external_corpus...) --------------------------------

    def load_external_corpus_named(self, corpus_id: str, chunks) -> int:
        """Ingests token chunks into the drafter's shared statistics; returns the tokens read.

        Raises:
            ValueError: ``corpus_id`` was loaded already.
        """
        if corpus_id in self._corpora:
            raise ValueError(f"External corpus '{corpus_id}' already exists.")
        drafter = self.guard.drafter if self.guard is not None else None
        loaded = 0
        for chunk in chunks:
            tokens = [int(t) for t in chunk]
            if drafter is not None and tokens:
                drafter.ingest(tokens)  # type: ignore[attr-defined]
            loaded += len(tokens)
        return loaded

    def commit_external_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        """Remembers a loaded corpus (for :meth:`list_external_corpora`)."""
        self._corpora[corpus_id] = loaded_token_count

    def remove_external_corpus(self, corpus_id: str) -> None:
        """Refused: text ingested into lookahead's shared statistics cannot be taken out.

        Raises:
            ValueError: always (SGLang reports it to the caller).
        """
        raise ValueError(
            f"cannot remove external corpus '{corpus_id}': lookahead keeps ingested text in "
            "its shared statistics (restart the drafter, or use a fresh namespace)"
        )

    def list_external_corpora(self) -> dict[str, int]:
        """The corpora loaded through this corpus, with their token counts."""
        return dict(self._corpora)

    # -- drafting ---------------------------------------------------------------------------

    def _views(
        self,
        warn: WarnOnce,
        req_ids: Sequence[str],
        batch_tokens: Sequence[Sequence[int]],
        total_lens: Sequence[int],
    ) -> list[RequestView | None]:
        """Each request's whole token sequence, checked against what SGLang passed (None
        where they disagree)."""
        context = self._context
        bs = len(req_ids)
        if context is None or len(context.reqs) != bs:
            warn("context", "lookahead got no batch for a corpus lookup; no drafts")
            return [None] * bs
        spliced = context.spliced() or ()
        views: list[RequestView | None] = []
        for i, req in enumerate(context.reqs):
            prompt, output = req.origin_input_ids_unpadded, req.output_ids
            k = int(total_lens[i]) - len(prompt) - len(output)
            base = i * context.stride
            available = max(0, min(context.stride, len(spliced) - base))
            if req.rid != req_ids[i] or not 0 <= k <= available:
                views.append(None)
                continue
            view = RequestView(req.rid, prompt, output, spliced[base : base + k])
            tail = batch_tokens[i]
            if view.tokens_from(view.total - len(tail)) != [int(t) for t in tail]:
                views.append(None)
                continue
            views.append(view)
        return views

    def _draft(
        self,
        session: DraftSession,
        req_ids: Sequence[str],
        batch_tokens: Sequence[Sequence[int]],
        total_lens: Sequence[int],
        roots: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The step's arrays: each request's tree, root-only where there is no usable draft."""
        if not session.begin():
            return self._root_only(roots)
        views = self._views(session.warn, req_ids, batch_tokens, total_lens)
        for i, view in enumerate(views):
            if view is None:
                session.warn(
                    "mismatch",
                    "request %s: SGLang's tokens do not match lookahead's "
                    "view of the request; it is started again",
                    req_ids[i],
                )
                session.book.resync(req_ids[i])
        known = [i for i, v in enumerate(views) if v is not None]
        cost = None if self._context is None else self._context.cost
        # in the order of known
        drafts = session.draft([v for v in views if v is not None], cost)
        if drafts is None:
            return self._root_only(roots)
        # The drafter's tree of each request of the batch (-1: none, a root-only row).
        rows = np.full(len(roots), -1, dtype=np.int64)
        for j, i in enumerate(known):
            rows[i] = drafts.tree_of(j)
        packed = self._pack(drafts.batch, roots, rows)
        refused = set()
        for i, kind, message in packed.problems:
            refused.add(i)
            session.refused(req_ids[i], kind, message)
        for j, i in enumerate(known):
            if rows[i] < 0 or i in refused:
                session.fed(drafts, j, -1)
            else:
                session.fed(drafts, j, int(packed.depths[i]), float(packed.expected[i]))
        return packed.tokens, packed.mask

    def _root_only(self, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Arrays with no draft for any request (plain decoding)."""
        packed = self._pack(_NO_TREES, roots, np.full(len(roots), -1, dtype=np.int64))
        return packed.tokens, packed.mask

    def _pack(self, batch: DraftBatch, roots: np.ndarray, rows: np.ndarray) -> PackedSlots:
        """SGLang's flat arrays: request ``i`` gets tree ``rows[i]`` of ``batch`` (-1: none),
        checked and laid out natively; counted."""
        packed = pack_batch(batch, self.num_slots, roots, self.vocab_size, rows)
        drafted = int(np.count_nonzero(packed.placed))
        self.last_nodes = int(packed.placed.sum())
        self.draft_nodes += self.last_nodes
        self.drafted_requests += drafted
        self.fallback_requests += len(roots) - drafted
        return packed

    # -- observability ----------------------------------------------------------------------

    def stats(self) -> dict[str, int | float | bool]:
        """Counters of this process's drafting (steps, drafts, fallbacks, resyncs...)."""
        out: dict[str, int | float | bool] = {
            "drafted_requests": self.drafted_requests,
            "draft_nodes": self.draft_nodes,
            "empty_requests": self.fallback_requests,
        }
        if self.session is not None:
            out.update(self.session.stats())
        return out
