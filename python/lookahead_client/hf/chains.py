"""Draft chains cut from draft trees, for engines that verify one chain per request.

A chain verifier (vLLM's K slots) checks one draft token per position. Two ways to pick the
chain from a drafter's tree:

* :func:`best_chain`: the most likely path (each step the child of highest score), a
  deterministic ("one-hot") draft: at temperature > 0 a token ``x`` is accepted with the
  target's probability ``p(x)``;
* :func:`sample_chain`: a path drawn from the tree's own next-token distribution ``q`` (at
  each node, its children weighted by their scores), handed to the verifier together with
  ``q`` (:func:`lookahead_client.hf.verify.verify_chain_sampling`): a token drawn from ``q`` is
  accepted with probability ``min(1, p(x) / q(x))``, so a position is accepted with
  probability ``1 - TV(p, q)`` instead of ``p(x)``. Rollouts that sample one prompt many
  times are draws from the same policy, and the tree's counts estimate it.

A node's score is the drafter's probability that the path to it is accepted, so a child's
share among its siblings is the drafter's conditional probability of that token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from ..types import DraftTree

if TYPE_CHECKING:
    import torch

__all__ = ["SampledChain", "best_chain", "sample_chain", "draft_probs_tensor"]


@dataclass(frozen=True, slots=True)
class SampledChain:
    """A chain drawn from a tree's next-token distributions, with those distributions.

    Attributes:
        chain: the drawn path as a tree whose node ``i`` is the parent of node ``i + 1``.
        support: per chain node, the tokens its draw could have given (its parent's children).
        probs: per chain node, the probability of each token of ``support`` (they sum to 1).
    """

    chain: DraftTree
    support: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]


def _children(tree: DraftTree) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    return children


def _check_length(length: int) -> None:
    if length < 0:
        raise InvalidArgumentError(f"length must be >= 0, got {length}", field="length")


def _as_chain(tree: DraftTree, nodes: list[int]) -> DraftTree:
    return DraftTree(
        tree.root,
        tuple(tree.tokens[i] for i in nodes),
        tuple(range(-1, len(nodes) - 1)),
        tuple(tree.scores[i] for i in nodes),
    )


def best_chain(tree: DraftTree, length: int) -> DraftTree:
    """The tree's most likely path of at most ``length`` nodes: from the root, each step the
    child of highest score (the first of equals)."""
    _check_length(length)
    children = _children(tree)
    nodes: list[int] = []
    parent = -1
    while len(nodes) < length and parent in children:
        parent = max(children[parent], key=lambda i: tree.scores[i])
        nodes.append(parent)
    return _as_chain(tree, nodes)


def sample_chain(tree: DraftTree, length: int, rng: random.Random) -> SampledChain:
    """A path of at most ``length`` nodes drawn from the tree: from the root, each step one
    child drawn with probability proportional to its score (uniformly among children whose
    scores are all 0), until ``length`` nodes or a leaf.

    Args:
        tree: the drafter's tree (scores as :class:`~lookahead_client.types.DraftTree` says).
        length: the most chain nodes.
        rng: the source of the draws (seed it for reproducible drafts).
    """
    _check_length(length)
    children = _children(tree)
    nodes: list[int] = []
    support: list[tuple[int, ...]] = []
    probs: list[tuple[float, ...]] = []
    parent = -1
    while len(nodes) < length and parent in children:
        kids = children[parent]
        weights = [max(float(tree.scores[i]), 0.0) for i in kids]
        total = sum(weights)
        shares = [w / total for w in weights] if total > 0 else [1.0 / len(kids)] * len(kids)
        parent = rng.choices(kids, weights=shares)[0]
        nodes.append(parent)
        support.append(tuple(tree.tokens[i] for i in kids))
        probs.append(tuple(shares))
    return SampledChain(_as_chain(tree, nodes), tuple(support), tuple(probs))


def draft_probs_tensor(
    chains: Sequence[SampledChain], num_slots: int, vocab_size: int, device=None
) -> torch.Tensor:
    """The ``draft_probs`` of :func:`lookahead_client.hf.verify.verify_chain_sampling`: float32
    ``[bs, num_slots, vocab_size]``, row ``i`` of request ``b`` the distribution its chain node
    ``i - 1`` was drawn from (zeros for the root and for slots past the chain).

    Raises:
        InvalidArgumentError: a chain longer than ``num_slots - 1`` or a token outside the
            vocabulary.
    """
    import torch

    rows: list[int] = []
    slots: list[int] = []
    tokens: list[int] = []
    probs: list[float] = []
    for b, sampled in enumerate(chains):
        if len(sampled.support) >= num_slots:
            raise InvalidArgumentError(
                f"chain {b} has {len(sampled.support)} nodes for {num_slots} slots",
                field="num_slots",
            )
        for i, (support, shares) in enumerate(zip(sampled.support, sampled.probs, strict=True)):
            rows += [b] * len(support)
            slots += [i + 1] * len(support)
            tokens += support
            probs += shares
    if any(not 0 <= t < vocab_size for t in tokens):
        raise InvalidArgumentError(
            f"a chain drafts a token outside the vocabulary of {vocab_size}", field="vocab_size"
        )
    out = torch.zeros((len(chains), num_slots, vocab_size), dtype=torch.float32, device=device)
    index = torch.tensor([rows, slots, tokens], dtype=torch.int64, device=device)
    # equal sibling tokens (possible in merged trees) add up
    values = torch.tensor(probs, dtype=torch.float32, device=device)
    return out.index_put_(tuple(index), values, accumulate=True)
