"""``NullProposer``: vLLM's ``custom_class`` proposer that never proposes a draft.

The ``null`` configuration of ``lookahead-bench vllm``: speculative decoding on, every step's
drafts empty. What it costs against plain decoding is vLLM's own price of its speculative path,
the floor any drafter starts from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["NullProposer"]


class NullProposer:
    """A proposer with no drafts (see the module docstring).

    Args:
        vllm_config: vLLM's ``VllmConfig`` (unused).
    """

    def __init__(self, vllm_config: Any) -> None:
        del vllm_config

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], *args: Any, **kwargs: Any):
        """No draft for any row."""
        return [[] for _ in sampled_token_ids]

    def __repr__(self) -> str:
        return "NullProposer()"
