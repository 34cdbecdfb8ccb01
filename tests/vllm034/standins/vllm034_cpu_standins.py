"""PyTorch stand-ins for the vLLM 0.34 kernels that the tests' tiny float32 Llama calls, for
CPUs that cannot load the shared build's ``vllm._C`` (compiled for AVX-512: on a CPU with AVX2
only it dies with SIGILL, and vLLM looks for a ``vllm._C_AVX2`` the build does not have).

The tests run with vLLM's real engine, scheduler, model runner and speculator interface;
only these kernels are replaced, each by the same computation in PyTorch:

- ``rotary_embedding``: vLLM's own PyTorch rotary (``RotaryEmbedding.forward_static``), in place;
- ``cpu_attn_reshape_and_cache``: each token's key and value into its cache slot;
- ``cpu_attention_with_kv_cache``: causal attention of each request's queries over its cached
  keys (``torch.nn.functional.scaled_dot_product_attention``);
- ``get_scheduler_metadata``: the real kernel's work plan, which the stand-in attention needs
  none of (an empty tensor);
- ``init_cpu_memory_env``: binds memory to a NUMA node; nothing to do here.

Anything else vLLM may ask of these kernels (sliding windows, ALiBi, soft caps, sinks,
quantised caches, non-causal attention) is refused by name rather than computed wrongly.
The tensor-parallel shared-memory ops are left out on purpose: without them vLLM's CPU
communicator uses ``torch.distributed`` (gloo). ``tests/vllm034/test_standins.py`` checks these
functions against the real kernels on a CPU that can run them.

Armed by ``sitecustomize.py`` beside this file (so in every process vLLM starts);
``LOOKAHEAD_VLLM034_STANDINS`` says when: ``auto`` (the default) on a CPU without AVX-512,
``1`` always (AVX-512 is then hidden from vLLM, so that it takes the path of such a CPU and
never loads ``vllm._C``), ``0`` never.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

ENV = "LOOKAHEAD_VLLM034_STANDINS"


def wanted() -> bool:
    """Whether this process should use the stand-ins, from ``LOOKAHEAD_VLLM034_STANDINS``."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"{ENV} must be auto, 0 or 1, not {mode!r}")
    if mode == "auto":
        return not torch.cpu._is_avx512_supported()
    return mode == "1"


def _refuse(name: str, value: object, supported: object) -> None:
    """Raises unless ``value`` is the one setting the stand-ins compute (None: absent)."""
    if (value is not None) if supported is None else (value != supported):
        raise NotImplementedError(
            f"the vLLM 0.34 CPU stand-ins support {name}={supported!r} only, not {value!r}"
        )


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    """Rotates ``query`` and ``key`` in place by their positions."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    _refuse("rope_dim_offset", rope_dim_offset, 0)
    _refuse("inverse", inverse, False)
    rotary_dim = cos_sin_cache.shape[-1]
    rotated_query, rotated_key = RotaryEmbedding.forward_static(
        positions, query, key, head_size, rotary_dim, cos_sin_cache, is_neox
    )
    query.copy_(rotated_query)
    if key is not None and rotated_key is not None:
        key.copy_(rotated_key)


def get_scheduler_metadata(
    num_reqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_lens: torch.Tensor,
    dtype: torch.dtype,
    query_start_loc: torch.Tensor,
    causal: bool,
    sliding_window_size: int,
    isa: str,
    enable_kv_split: bool,
    dynamic_causal: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
) -> torch.Tensor:
    """The real kernel's work plan; the stand-in attention needs none."""
    return torch.empty(0, dtype=torch.uint8)


def cpu_attn_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    isa: str,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    kv_cache_dtype: str = "auto",
) -> None:
    """Writes token ``t``'s key and value ([tokens, kv heads, head size]) into the caches
    ([blocks, kv heads, block size, head size]) at slot ``slot_mapping[t]``; slot -1 is
    padding."""
    _refuse("kv_cache_dtype", kv_cache_dtype, "auto")
    slots = slot_mapping[: key.shape[0]].long()
    kept = slots >= 0
    slots = slots[kept]
    block_size = key_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    # advanced indices on dims 0 and 2 put their dimension first: [tokens, kv heads, head size]
    key_cache[blocks, :, offsets] = key[kept].to(key_cache.dtype)
    value_cache[blocks, :, offsets] = value[kept].to(value_cache.dtype)


def cpu_attention_with_kv_cache(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    causal: bool,
    alibi_slopes: torch.Tensor | None,
    sliding_window: int,
    block_table: torch.Tensor,
    softcap: float,
    scheduler_metadata: torch.Tensor,
    s_aux: torch.Tensor | None,
    dynamic_causal: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    kv_cache_dtype: str = "auto",
) -> None:
    """Causal attention of each request's queries (rows ``query_start_loc[i]`` to
    ``query_start_loc[i + 1]``, the last of its ``seq_lens[i]`` positions) over its cached keys
    (blocks ``block_table[i]``), written into ``output`` ([tokens, heads, head size])."""
    _refuse("causal", causal, True)
    _refuse("alibi_slopes", alibi_slopes, None)
    _refuse("sliding_window", sliding_window, -1)
    _refuse("softcap", softcap, 0.0)
    _refuse("s_aux", s_aux, None)
    _refuse("dynamic_causal", dynamic_causal, None)
    _refuse("kv_cache_dtype", kv_cache_dtype, "auto")
    block_size = key_cache.shape[2]
    heads_per_kv_head = query.shape[1] // key_cache.shape[1]
    starts = query_start_loc.tolist()
    for request, seq_len in enumerate(seq_lens.tolist()):
        start, end = starts[request], starts[request + 1]
        if end <= start:
            continue
        blocks = block_table[request, : -(-seq_len // block_size)].long()
        keys, values = (
            _history(cache, blocks, seq_len, heads_per_kv_head).to(query.dtype)
            for cache in (key_cache, value_cache)
        )
        # the queries are the last end - start positions; each sees itself and what precedes it
        query_positions = torch.arange(seq_len - (end - start), seq_len)
        visible = torch.arange(seq_len)[None, :] <= query_positions[:, None]
        attended = F.scaled_dot_product_attention(
            query[start:end].transpose(0, 1),
            keys,
            values,
            attn_mask=visible,
            scale=scale,
        )
        output[start:end] = attended.transpose(0, 1)


def _history(
    cache: torch.Tensor, blocks: torch.Tensor, seq_len: int, heads_per_kv_head: int
) -> torch.Tensor:
    """A request's first ``seq_len`` cached positions, from [blocks, kv heads, block size, head
    size] to [heads, positions, head size] (each kv head repeated for its query heads)."""
    flat = cache[blocks].transpose(0, 1).flatten(1, 2)[:, :seq_len]
    return flat.repeat_interleave(heads_per_kv_head, dim=0)


def init_cpu_memory_env(nodes: list[int]) -> None:
    """Binds memory to a NUMA node in the real build; nothing to do here."""


_MUTATES = {
    "rotary_embedding": ("query", "key"),
    "get_scheduler_metadata": (),
    "cpu_attn_reshape_and_cache": ("key_cache", "value_cache"),
    "cpu_attention_with_kv_cache": ("output",),
    "init_cpu_memory_env": (),
}


def install() -> None:
    """Registers the stand-ins as ``torch.ops._C.*`` and hides AVX-512 from vLLM, whose CPU
    platform then looks for kernels built for AVX2 (``vllm._C_AVX2``), finds none and goes on
    with these."""
    for probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        setattr(torch.cpu, probe, lambda: False)
    for name, mutates in _MUTATES.items():
        torch.library.custom_op(f"_C::{name}", globals()[name], mutates_args=mutates)
