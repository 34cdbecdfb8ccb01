"""One chain per request from a draft tree: vLLM verifies chains, not trees.

A tree's nodes carry the drafter's estimate that the path to them is accepted. The accepted
tokens of a chain are a prefix of it, and a node of the chain is accepted exactly when its
own path is, so the expected accepted length of a chain is the sum of its nodes' scores; the
best chain is the root-to-node path with the largest such sum.
"""

from __future__ import annotations

from lookahead_client.types import DraftTree

__all__ = ["best_chain"]


def best_chain(tree: DraftTree, max_len: int) -> DraftTree:
    """The path of at most ``max_len`` nodes whose scores sum highest, as a chain tree
    (node ``i``'s parent is ``i - 1``); ties go to the node listed first.

    Args:
        tree: the drafter's tree (parents before children).
        max_len: the most nodes the chain may have; 0 or less gives an empty chain.
    """
    if max_len <= 0 or not tree.tokens:
        return DraftTree.empty(tree.root)
    best, best_total = -1, float("-inf")
    totals: list[float] = []
    depths: list[int] = []
    for i, (parent, score) in enumerate(zip(tree.parents, tree.scores, strict=True)):
        depth = 1 if parent < 0 else depths[parent] + 1
        total = score + (0.0 if parent < 0 else totals[parent])
        depths.append(depth)
        totals.append(total)
        if depth <= max_len and total > best_total:
            best, best_total = i, total
    path: list[int] = []
    while best >= 0:
        path.append(best)
        best = tree.parents[best]
    return tree.select(path[::-1])
