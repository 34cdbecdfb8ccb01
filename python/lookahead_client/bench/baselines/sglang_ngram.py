"""SGLang 0.5.23's NGRAM drafter: its real ``NgramCorpus``, driven as its ``NGRAMWorker`` does.

What ``sglang/srt/speculative/ngram_worker.py`` does per decode step, reproduced here in one
``step`` call (one engine step):

1. ``synchronize()``, then ``batch_get(req_ids, tails, total_lens)`` where a tail is the last
   ``max_trie_depth`` tokens of prompt + output and ``total_lens`` the full lengths (the
   corpus keeps a per-request match state keyed by the request id);
2. after verification, ``batch_put(tails)`` with the *same* tails (in both the overlap and the
   synchronous scheduler the tokens accepted in this step are not in ``output_ids`` yet), so
   the tokens of a step reach the trie with the next step's tail, and a request's last tokens
   never do; the prompt body is never inserted (only its last ``max_trie_depth`` tokens, with
   the first tail);
3. ``erase_match_state`` for requests that left the batch.

Settings are the server defaults: ``num_draft_tokens = budget + 1`` (slot 0 is the root),
``max_trie_depth=18``, BFS breadth 1..10, match type ``BFS``, ``capacity=10_000_000`` nodes
(preallocated: 2-11 s and about 2 GB per corpus on this CPU). The trie evicts least recently
used leaves when full, so the capacity changes results on large workloads: the reference
figures of the issue were measured with ``NgramCorpus``'s own default, 1,000,000 nodes.

The output (flat tokens and ancestor masks) becomes a ``DraftTree``: slot 0 (the root) is
dropped. A tree with fewer real nodes than slots is padded by SGLang with token 0 under the
root, and SGLang's verification checks those slots like real nodes (a target token 0 is
accepted there). So the padding is reduced to one node (token 0 under the root) unless the
tree already has that node; the accepted lengths are the same as SGLang's.

``insert_prompt=True`` is the "SGLang + whole prompt inserted" variant: the whole prompt is
inserted (``batch_put([prompt])``) when the request starts, before its first draft.

The C++ core is compiled just in time (tvm-ffi, ``ninja`` and ``g++``) on first use, ~30 s.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

import numpy as np

from lookahead_client.errors import (
    InvalidArgumentError,
    RequestAlreadyActiveError,
    UnknownRequestError,
)
from lookahead_client.types import DraftBatch, DraftTree, EngineCost, StepRequest

__all__ = ["INSTALL_HINT", "SglangNgramDrafter"]

INSTALL_HINT = (
    "the 'sglang' drafters need sglang==0.5.23 (pip install sglang==0.5.23) and a C++ compiler "
    "(g++) plus ninja for its just-in-time build"
)


def _load_corpus_class():
    """Imports SGLang's ``NgramCorpus``, making sure its JIT build can find ninja and g++."""
    if shutil.which("ninja") is None:
        # The ninja wheel puts its binary next to the interpreter of the environment.
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    for tool in ("ninja", "g++"):
        if shutil.which(tool) is None:
            raise ImportError(f"{INSTALL_HINT}: {tool!r} is not on PATH")
    try:
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    return NgramCorpus


def trees_from_output(
    roots: Sequence[int], tokens: np.ndarray, mask: np.ndarray, slots: int
) -> list[DraftTree]:
    """Turns ``NgramCorpus.batch_get`` output into trees (root slot and padding dropped).

    Args:
        roots: the last token of each request.
        tokens: flat ``[bs * slots]`` draft tokens, slot 0 of each request being the root.
        mask: flat ``[bs * slots * slots]``; row i marks slot i and its ancestors.
        slots: ``num_draft_tokens``.
    """
    bs = len(roots)
    tok = tokens.reshape(bs, slots)
    anc = mask.reshape(bs, slots, slots).astype(bool) & np.tri(slots, k=-1, dtype=bool)
    # The parent is the deepest ancestor, the one with the largest slot number; slot s is node
    # s - 1 of the DraftTree, so the root (slot 0) becomes -1.
    parent = (anc * np.arange(slots)).argmax(-1) - 1
    padding = (tok == 0) & (parent == -1)
    padding[:, 0] = False
    out = []
    for b, root in enumerate(roots):
        row_tok, row_par, row_pad = tok[b].tolist(), parent[b].tolist(), padding[b].tolist()
        end = slots
        while end > 1 and row_pad[end - 1]:
            end -= 1
        nodes, parents = row_tok[1:end], row_par[1:end]
        if end < slots and not any(t == 0 and p == -1 for t, p in zip(nodes, parents, strict=True)):
            # SGLang verifies padding slots like real nodes: keep one (the rest are copies).
            nodes.append(0)
            parents.append(-1)
        out.append(DraftTree(root, tuple(nodes), tuple(parents), (1.0,) * len(nodes)))
    return out


class SglangNgramDrafter:
    """SGLang's NGRAM corpus as a ``Drafter`` (see the module docstring).

    Args:
        budget: draft nodes per tree; SGLang's ``num_draft_tokens`` is ``budget + 1``. A step
            may ask for less (the tree is cut, breadth-first) but not for more.
        insert_prompt: insert each whole prompt when its request starts.
        max_trie_depth, min_bfs_breadth, max_bfs_breadth, match_type, capacity: SGLang's
            ``--speculative-ngram-*`` settings (server defaults).

    Raises:
        ImportError: SGLang, ninja or g++ is missing (the message says what to install).
    """

    def __init__(
        self,
        budget: int,
        *,
        insert_prompt: bool = False,
        max_trie_depth: int = 18,
        min_bfs_breadth: int = 1,
        max_bfs_breadth: int = 10,
        match_type: str = "BFS",
        capacity: int = 10_000_000,
    ) -> None:
        if budget < 1:
            raise InvalidArgumentError(f"budget must be >= 1, got {budget}", field="budget")
        corpus_class = _load_corpus_class()
        self._corpus = corpus_class(
            max_trie_depth=max_trie_depth,
            min_bfs_breadth=min_bfs_breadth,
            max_bfs_breadth=max_bfs_breadth,
            draft_token_num=budget + 1,
            match_type=match_type,
            capacity=capacity,
        )
        self._budget = budget
        self._capacity = capacity
        self._depth = max_trie_depth
        self._insert_prompt = insert_prompt
        self._tokens: dict[str, list[int]] = {}
        self._steps = 0
        self._drafted = 0

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        """Begins a request (and inserts its prompt when ``insert_prompt`` is set)."""
        if request_id in self._tokens:
            raise RequestAlreadyActiveError(
                f"request {request_id!r} is already active", field="request_id"
            )
        if len(prompt) == 0:
            raise InvalidArgumentError("prompt must not be empty", field="prompt")
        tokens = [int(t) for t in prompt]
        self._tokens[request_id] = tokens
        if self._insert_prompt:
            self._corpus.batch_put([tokens])

    def end(self, request_id: str) -> None:
        """Ends a request: its match state is erased (its tokens stay in the trie)."""
        if self._tokens.pop(request_id, None) is None:
            raise UnknownRequestError(f"request {request_id!r} is not active", field="request_id")
        self._corpus.erase_match_state([request_id])

    #: Whole trees whatever the shape: the caller cuts them (see ``Drafter``).
    sizes_drafts = False

    def step(self, requests: Sequence[StepRequest], cost: EngineCost | None = None) -> DraftBatch:
        """One engine step: ``batch_get`` for every drafting request, then ``batch_put``;
        ``cost`` is not used (whole trees)."""
        out: list[DraftTree | None] = []
        ids: list[str] = []
        tails: list[list[int]] = []
        lens: list[int] = []
        budgets: list[int] = []
        for req in requests:
            if not 0 <= req.budget <= self._budget:
                raise InvalidArgumentError(
                    f"budget must be in 0..{self._budget} (set at construction), got {req.budget}",
                    field="budget",
                )
            if req.prompt is not None:
                self.start(req.request_id, req.prompt)
            tokens = self._tokens.get(req.request_id)
            if tokens is None:
                raise UnknownRequestError(
                    f"request {req.request_id!r} is not active", field="request_id"
                )
            tokens.extend(int(t) for t in req.new_tokens)
            if req.finished:
                self.end(req.request_id)
                out.append(DraftTree.empty(tokens[-1]))
                continue
            self._steps += 1
            if req.budget == 0:
                out.append(DraftTree.empty(tokens[-1]))
                continue
            out.append(None)
            ids.append(req.request_id)
            tails.append(tokens[-self._depth :])
            lens.append(len(tokens))
            budgets.append(req.budget)
        if ids:
            self._corpus.synchronize()
            flat_tokens, flat_mask = self._corpus.batch_get(ids, tails, lens)
            trees = trees_from_output(
                [t[-1] for t in tails], flat_tokens, flat_mask, self._budget + 1
            )
            self._corpus.batch_put(tails)
            it = iter(zip(trees, budgets, strict=True))
            for i, slot in enumerate(out):
                if slot is None:
                    tree, budget = next(it)
                    if len(tree) > budget:
                        tree = DraftTree(
                            tree.root,
                            tree.tokens[:budget],
                            tree.parents[:budget],
                            tree.scores[:budget],
                        )
                    self._drafted += len(tree)
                    out[i] = tree
        return DraftBatch.from_trees(out)  # type: ignore[arg-type]

    def stats(self) -> dict[str, int | float]:
        """Active requests, steps drafted, draft tokens proposed and the trie capacity."""
        return {
            "active_requests": len(self._tokens),
            "steps": self._steps,
            "draft_tokens": self._drafted,
            "capacity": self._capacity,
        }
