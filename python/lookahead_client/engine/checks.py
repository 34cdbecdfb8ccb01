"""Whether a drafter's tree can be handed to an engine as it is."""

from __future__ import annotations

from typing import Any

from lookahead_client.types import DraftTree

__all__ = ["tree_problem"]


def tree_problem(
    tree: Any, root: int, vocab_size: int, nodes: int | None = None
) -> tuple[str, str] | None:
    """Why ``tree`` must not be proposed under the last token ``root``, or None when it may.

    Args:
        tree: what the drafter returned for the request.
        root: the request's last token (the tree's root must be it, or -1: unknown).
        vocab_size: draft token ids must be below it.
        nodes: only the first ``nodes`` nodes are checked (the engine uses no more); None:
            all.

    Returns:
        ``(kind, message)``: ``"tree"`` (not a DraftTree), ``"root"`` (it hangs under another
        token: the drafter's copy of the request is wrong) or ``"vocab"`` (ids outside the
        model's vocabulary: a wrong namespace?), with a sentence for logs.
    """
    if not isinstance(tree, DraftTree):
        return "tree", f"the drafter returned {type(tree).__name__}, not a DraftTree"
    if tree.root not in (-1, root):
        return "root", f"a tree hangs under {tree.root}, not under the last token {root}"
    if any(not 0 <= t < vocab_size for t in tree.tokens[:nodes]):
        return "vocab", (
            f"the drafter proposed token ids outside the model's vocabulary ({vocab_size}); "
            "wrong namespace?"
        )
    return None
