"""Draft trees as the flat arrays and tensors that SGLang 0.5.23's NGRAM verification uses.

Layout (``d`` = ``num_slots`` = budget + 1, per request):

* slot 0 is the root, the last known token of the request (its KV entry is not cached yet);
* slots ``1..n`` are the tree's nodes in breadth-first order (parents precede children);
* unused slots hold token 0 hanging under the root (SGLang's padding);
* ``mask[i, j]`` is true when slot ``j`` is slot ``i`` itself or one of its ancestors.

:func:`pack_batch` (a step's columns) and :func:`pack_trees` (tree objects) build exactly the
flat ``(tokens, mask)`` arrays that SGLang's ``NgramCorpus.batch_get`` returns, in native code
(``lookahead_core::slots``, the layout's one home). :func:`tree_tensors` and
:func:`build_tree_tensors` derive, with torch on any device, the verify inputs that SGLang's
``reconstruct_indices_from_tree_mask`` kernel writes (positions, ``retrive_*`` links) plus the
flattened FlashInfer custom mask. Torch is an optional dependency: it is imported inside the
functions that need it, never when this module is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import _native
from .errors import InvalidArgumentError
from .types import DraftBatch, DraftTree

if TYPE_CHECKING:
    import torch

#: Every token id the core can hold (below its separator, 2**32 - 1): no vocabulary check.
_ANY_TOKEN = 2**32 - 1

__all__ = [
    "PackedSlots",
    "pack_batch",
    "pack_trees",
    "parents_from_mask",
    "unpack_tree",
    "TreeTensors",
    "tree_tensors",
    "build_tree_tensors",
    "flashinfer_custom_mask",
]


class PackedSlots(NamedTuple):
    """A step's trees in the slot layout (see the module's docstring), from :func:`pack_batch`.

    Attributes:
        tokens: int64 ``[bs * d]``.
        mask: int64 ``[bs * d * d]`` (SGLang's corpus dtype; 1 marks an ancestor or itself).
        placed: uint32 ``[bs]``, the draft nodes placed per request.
        depths: uint32 ``[bs]``, the levels they span (the most tokens one verification can
            accept).
        expected: float64 ``[bs]``, the placed nodes' scores summed (the draft tokens the
            drafter expects the verification to accept).
        problems: ``(index, kind, message)`` for each tree laid out root-only instead:
            ``kind`` is ``"root"`` (it hangs under another token than the request's last: the
            drafter's copy of the request is wrong), ``"vocab"`` (token ids outside the
            model's vocabulary: a wrong namespace?) or ``"tree"`` (a parent after its child).
    """

    tokens: np.ndarray
    mask: np.ndarray
    placed: np.ndarray
    depths: np.ndarray
    expected: np.ndarray
    problems: list[tuple[int, str, str]]


def pack_batch(
    batch: DraftBatch,
    num_slots: int,
    roots: Sequence[int] | np.ndarray,
    vocab_size: int,
    rows: Sequence[int] | np.ndarray | None = None,
) -> PackedSlots:
    """A step's trees as SGLang's flat arrays, laid out and checked in native code.

    Each tree is checked (its root ``-1`` or the request's last token, its ids below
    ``vocab_size``, parents before children) on the nodes that fit; one that fails is laid
    out root-only and named in ``problems``. Nodes are put level by level (a drafter may list
    them best-first); a tree larger than ``num_slots - 1`` nodes keeps its first ones.

    Args:
        batch: the step's trees (an unknown root is ``-1``).
        num_slots: ``d``, the slots per request (the root included), at least 1.
        roots: each request's last token, for slot 0.
        vocab_size: draft token ids must be below it.
        rows: the tree of ``batch`` each request gets (``-1``: none, a root-only row); by
            default tree ``i`` for request ``i``.

    Raises:
        InvalidArgumentError: ``num_slots`` < 1 or columns of the wrong lengths (naming the
            field).
    """
    if rows is None:
        rows = np.arange(len(batch), dtype=np.int64)
    return PackedSlots(
        *_native.pack_slots(
            np.ascontiguousarray(batch.roots, dtype=np.int64),
            np.ascontiguousarray(batch.sizes, dtype=np.uint32),
            np.ascontiguousarray(batch.tokens, dtype=np.int64),
            np.ascontiguousarray(batch.parents, dtype=np.int32),
            np.ascontiguousarray(batch.scores, dtype=np.float32),
            np.ascontiguousarray(rows, dtype=np.int64),
            np.ascontiguousarray(roots, dtype=np.int64),
            num_slots,
            vocab_size,
        )
    )


def pack_trees(
    trees: Sequence[DraftTree],
    num_slots: int,
    roots: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Packs draft trees into SGLang's flat ``(tokens, mask)`` arrays.

    The output is what ``NgramCorpus.batch_get`` returns: the root in slot 0, the nodes level
    by level, padding token 0 under the root, and mask row ``i`` marking ``i`` and its
    ancestors. A tree with more than ``num_slots - 1`` nodes is cut to its first
    ``num_slots - 1`` nodes, which is still a tree because parents precede children.

    Args:
        trees: one tree per request.
        num_slots: ``d``, the slots per request (the root included), at least 1.
        roots: the root token of each request; defaults to each tree's ``root``. Needed when a
            drafter did not know the context (``root == -1``).

    Returns:
        ``tokens``: int64 ``[bs * d]``; ``mask``: bool ``[bs * d * d]``.

    Raises:
        InvalidArgumentError: ``num_slots`` < 1, ``roots`` of the wrong length, a negative
            root token, or a tree whose parent follows its child.
    """
    if roots is not None and len(roots) != len(trees):
        raise InvalidArgumentError(
            f"roots has {len(roots)} entries for {len(trees)} trees", field="roots"
        )
    batch = DraftBatch.from_trees(trees)
    if roots is None:
        used: Sequence[int] | np.ndarray = batch.roots
    else:  # the given roots stand for the trees' own
        used = roots
        batch.roots[:] = -1
    for b, root in enumerate(used):
        if root < 0:
            raise InvalidArgumentError(
                f"tree {b} has no root token ({root}); pass roots=", field="roots"
            )
    packed = pack_batch(batch, num_slots, used, _ANY_TOKEN)
    if packed.problems:
        index, _, message = packed.problems[0]
        raise InvalidArgumentError(f"tree {index}: {message}", field="trees")
    return packed.tokens, packed.mask.astype(bool)


def parents_from_mask(mask: np.ndarray) -> np.ndarray:
    """The parent slot of every slot (``-1`` when none), as SGLang's kernel derives it.

    Args:
        mask: bool ``[..., d, d]`` ancestor masks.

    Returns:
        int64 ``[..., d]``: the largest ``j < i`` with ``mask[..., i, j]``, else ``-1``.
    """
    d = mask.shape[-1]
    order = np.arange(d)
    strict = mask & (order[None, :] < order[:, None])
    return np.where(strict, order, -1).max(axis=-1).astype(np.int64)


def unpack_tree(
    tokens: Sequence[int] | np.ndarray,
    mask: Sequence[bool] | np.ndarray,
    num_nodes: int | None = None,
    score: float = 1.0,
) -> DraftTree:
    """Rebuilds one request's :class:`DraftTree` from its ``(tokens, mask)`` rows.

    Args:
        tokens: the request's ``d`` slot tokens (slot 0 is the root).
        mask: its ``d * d`` (or ``[d, d]``) ancestor mask.
        num_nodes: keep only slots ``1..num_nodes`` (drops SGLang's padding); all by default.
        score: the score given to every node (the arrays carry no scores).

    Raises:
        InvalidArgumentError: sizes that do not match, or a mask that is not a tree's ancestor
            mask (each row must be its parent's row plus itself, every node under the root).
    """
    tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
    d = tok.shape[0]
    if d == 0:
        raise InvalidArgumentError("tokens is empty: slot 0 (the root) is required", field="tokens")
    m = np.asarray(mask, dtype=bool)
    if m.size != d * d:
        raise InvalidArgumentError(f"mask has {m.size} entries, expected {d}*{d}", field="mask")
    m = m.reshape(d, d)
    n = d - 1 if num_nodes is None else num_nodes
    if not 0 <= n <= d - 1:
        raise InvalidArgumentError(f"num_nodes must be in [0, {d - 1}], got {n}", field="num_nodes")
    parents = parents_from_mask(m)
    # An ancestor mask: row 0 is the root alone, every other row its parent's row (an
    # earlier slot) plus itself.
    expected = m[np.maximum(parents, 0)]
    expected[0] = False
    np.fill_diagonal(expected, True)
    slots = np.arange(d)
    if not np.array_equal(expected, m) or ((parents[1:] < 0) | (parents[1:] >= slots[1:])).any():
        raise InvalidArgumentError("mask is not the ancestor mask of a rooted tree", field="mask")
    return DraftTree(
        root=int(tok[0]),
        tokens=tuple(int(t) for t in tok[1 : n + 1]),
        parents=tuple(int(p) - 1 for p in parents[1 : n + 1]),
        scores=(float(score),) * n,
    )


@dataclass(frozen=True)
class TreeTensors:
    """The verify inputs of a batch of draft trees, with SGLang 0.5.23's names and semantics.

    Attributes:
        draft_tokens: int64 ``[bs * d]``, the slot tokens.
        tree_mask: bool ``[bs * d * d]``; row ``i`` of a request marks ``i`` and its ancestors.
        positions: int64 ``[bs * d]``, ``seq_len + depth`` (the root has depth 0).
        retrive_index: int64 ``[bs, d]``, ``b * d + i``.
        retrive_next_token: int64 ``[bs, d]``, the first child of each slot or -1.
        retrive_next_sibling: int64 ``[bs, d]``, the next slot with the same parent or -1
            (-1 for the root).
        parents: int64 ``[bs, d]``, the parent slot of each slot (-1 for the root); not an
            SGLang input, used by :mod:`lookahead_client.hf.verify`.
        seq_lens: int64 ``[bs]``, the tokens already in each request's KV cache.
        num_slots: ``d``.
    """

    draft_tokens: torch.Tensor
    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    parents: torch.Tensor
    seq_lens: torch.Tensor
    num_slots: int

    @property
    def batch_size(self) -> int:
        """The number of requests."""
        return self.retrive_index.shape[0]

    def custom_mask(self) -> torch.Tensor:
        """The flattened FlashInfer custom mask (see :func:`flashinfer_custom_mask`)."""
        return flashinfer_custom_mask(self.tree_mask, self.seq_lens, self.num_slots)


def _as_tensor(x, dtype: torch.dtype, device) -> torch.Tensor:
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device=device if device is not None else x.device, dtype=dtype)
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


def tree_tensors(
    draft_tokens,
    tree_mask,
    seq_lens,
    num_slots: int,
    device=None,
) -> TreeTensors:
    """Derives the verify inputs from flat ``(tokens, mask)`` arrays, like SGLang's kernel.

    Reproduces ``reconstructIndicesFromTreeMask`` (positions, ``retrive_index``,
    ``retrive_next_token``, ``retrive_next_sibling``) with batched tensor operations, on the
    device of the inputs (or ``device``).

    Args:
        draft_tokens: ``[bs * d]`` slot tokens (numpy array, sequence or tensor).
        tree_mask: ``[bs * d * d]`` ancestor masks.
        seq_lens: ``[bs]`` tokens already in each request's KV cache.
        num_slots: ``d``.
        device: where the tensors go; defaults to ``draft_tokens``'s device (CPU for arrays);
            the other inputs follow it.

    Raises:
        InvalidArgumentError: sizes that do not agree with ``num_slots`` and ``seq_lens``.
    """
    import torch

    if device is None and isinstance(draft_tokens, torch.Tensor):
        device = draft_tokens.device
    tokens = _as_tensor(draft_tokens, torch.int64, device).reshape(-1)
    dev = tokens.device
    mask = _as_tensor(tree_mask, torch.bool, dev).reshape(-1)
    lens = _as_tensor(seq_lens, torch.int64, dev).reshape(-1)
    d, bs = num_slots, lens.shape[0]
    if d < 1:
        raise InvalidArgumentError(f"num_slots must be >= 1, got {d}", field="num_slots")
    if tokens.numel() != bs * d:
        raise InvalidArgumentError(
            f"draft_tokens has {tokens.numel()} entries, expected {bs}*{d}", field="draft_tokens"
        )
    if mask.numel() != bs * d * d:
        raise InvalidArgumentError(
            f"tree_mask has {mask.numel()} entries, expected {bs}*{d}*{d}", field="tree_mask"
        )
    idx = torch.arange(d, device=dev)
    # ancestors[b, i, j]: j is a strict ancestor of i (the kernel only reads j < i).
    ancestors = mask.view(bs, d, d) & (idx[None, :] < idx[:, None])
    depth = ancestors.sum(-1)
    parents = torch.where(ancestors, idx, -1).amax(-1)
    # First child of j: the smallest i > j having j as an ancestor (BFS or not, the smallest
    # descendant is always a child, since a grandchild's parent comes before it).
    first_child = torch.where(ancestors, idx[:, None], d).amin(1)
    next_token = torch.where(first_child < d, first_child, -1)
    # Next sibling of j: the smallest k > j with the same parent; none for the root.
    same_parent = (parents[:, :, None] == parents[:, None, :]) & (idx[:, None] > idx[None, :])
    first_sibling = torch.where(same_parent, idx[:, None], d).amin(1)
    next_sibling = torch.where((parents >= 0) & (first_sibling < d), first_sibling, -1)
    return TreeTensors(
        draft_tokens=tokens,
        tree_mask=mask,
        positions=(depth + lens[:, None]).reshape(-1),
        retrive_index=torch.arange(bs, device=dev)[:, None] * d + idx,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        parents=parents,
        seq_lens=lens,
        num_slots=d,
    )


def build_tree_tensors(
    trees: Sequence[DraftTree],
    num_slots: int,
    seq_lens,
    roots: Sequence[int] | None = None,
    device=None,
) -> TreeTensors:
    """:func:`pack_trees` then :func:`tree_tensors` (the tensors land on ``device``)."""
    tokens, mask = pack_trees(trees, num_slots, roots)
    return tree_tensors(tokens, mask, seq_lens, num_slots, device=device)


def flashinfer_custom_mask(tree_mask, seq_lens, num_slots: int) -> torch.Tensor:
    """The flattened custom mask SGLang's NGRAM worker hands FlashInfer (``USE_FULL_MASK``).

    For each request ``b`` a ``[d, seq_lens[b] + d]`` block: every prefix column true, then
    the request's ``[d, d]`` tree mask; the blocks are flattened and concatenated.

    Args:
        tree_mask: bool ``[bs * d * d]`` tensor.
        seq_lens: int ``[bs]`` tensor (or sequence) of cached tokens per request.
        num_slots: ``d``.

    Returns:
        bool ``[sum_b d * (seq_lens[b] + d)]`` on ``tree_mask``'s device.
    """
    import torch

    d = num_slots
    mask = _as_tensor(tree_mask, torch.bool, None)
    dev = mask.device
    lens = _as_tensor(seq_lens, torch.int64, dev).reshape(-1)
    bs = lens.shape[0]
    tree = mask.view(bs, d, d)
    width = lens + d
    sizes = d * width
    total = int(sizes.sum())
    owner = torch.repeat_interleave(torch.arange(bs, device=dev), sizes, output_size=total)
    starts = torch.cumsum(sizes, 0) - sizes
    k = torch.arange(total, device=dev) - starts[owner]
    row, col = k // width[owner], k % width[owner]
    tree_col = col - lens[owner]
    in_tree = tree[owner, row, tree_col.clamp(min=0)]
    return (tree_col < 0) | in_tree
