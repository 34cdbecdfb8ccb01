"""vLLM's tensor-parallel group, as the two interfaces see it: only rank 0 of a group builds a
drafter (one drafter per group, one copy of each request's traffic to a server)."""

from __future__ import annotations

from typing import Any

__all__ = ["tensor_parallel_group", "tensor_parallel_rank"]


def tensor_parallel_group() -> Any | None:
    """vLLM's tensor-parallel ``GroupCoordinator`` of this process; None outside a group or
    in a group of one."""
    try:
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
    except (AssertionError, ImportError, RuntimeError):  # no group initialised
        return None
    return group if group.world_size > 1 else None


def tensor_parallel_rank(group: Any | None) -> int:
    """This process's rank in ``group`` (0 without one)."""
    return 0 if group is None else int(group.rank_in_group)
