"""Whether a drafter's tree can be handed to an engine as it is (vLLM's chains; SGLang's slot
arrays are checked by the native packing, with the same kinds of problem)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["draft_problem"]


def draft_problem(
    root: int, last: int, tokens: Sequence[int], vocab_size: int
) -> tuple[str, str] | None:
    """Why a tree must not be proposed, or None when it may.

    Args:
        root: the tree's root (-1: unknown).
        last: the request's last token (the root must be it, unless unknown).
        tokens: the tree's draft tokens.
        vocab_size: draft token ids must be below it.

    Returns:
        ``(kind, message)``: ``"root"`` (the tree hangs under another token: the drafter's
        copy of the request is wrong) or ``"vocab"`` (ids outside the model's vocabulary: a
        wrong namespace?), with a sentence for logs.
    """
    if root not in (-1, last):
        return "root", f"a tree hangs under {root}, not under the last token {last}"
    if any(not 0 <= t < vocab_size for t in tokens):
        return "vocab", (
            f"the drafter proposed token ids outside the model's vocabulary ({vocab_size}); "
            "wrong namespace?"
        )
    return None
