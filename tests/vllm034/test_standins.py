"""The kernel stand-ins of ``standins/vllm034_cpu_standins.py`` compute what vLLM 0.34's real
CPU kernels compute, on random inputs of the shapes the engine tests give them: rotary
embeddings in both styles, and attention over a paged KV cache for requests in prefill, in
plain decoding and verifying drafts, grouped-query heads included. Needs the real kernels:
on a CPU that cannot load them (where the engine tests run on the stand-ins) it says so and
skips, which scripts/test.sh prints."""

from __future__ import annotations

import pytest
import torch
import vllm034_cpu_standins as standins  # on PYTHONPATH (conftest.py)

if standins.wanted():
    pytest.skip(
        "the stand-ins are armed here (this CPU cannot run vLLM 0.34's kernels, or "
        f"{standins.ENV}=1): there are no real kernels to compare them with",
        allow_module_level=True,
    )

from vllm import _cpu_ops as cpu_ops  # noqa: E402  (loads the real kernels)
from vllm import _custom_ops as custom_ops  # noqa: E402
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # noqa: E402


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding(is_neox: bool) -> None:
    torch.manual_seed(0)
    tokens, heads, kv_heads, head_size, max_position = 11, 4, 2, 64, 256
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_size, 2).float() / head_size)
    angles = torch.outer(torch.arange(max_position).float(), inv_freq)
    cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    positions = torch.randint(0, max_position, (tokens,))
    query = torch.randn(tokens, heads * head_size)
    key = torch.randn(tokens, kv_heads * head_size)

    real_query, real_key = query.clone(), key.clone()
    custom_ops.rotary_embedding(positions, real_query, real_key, head_size, cos_sin_cache, is_neox)
    unrotated = query.clone()
    standins.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)

    assert not torch.allclose(query, unrotated), "the stand-in rotated nothing"
    torch.testing.assert_close(query, real_query)
    torch.testing.assert_close(key, real_key)


# (query length, context length): a prefill, a decode step, a step verifying 4 drafts
REQUESTS = [(37, 37), (1, 70), (5, 133)]


@pytest.mark.parametrize(("heads", "kv_heads", "head_size"), [(2, 2, 64), (4, 2, 32), (2, 1, 80)])
@pytest.mark.parametrize("block_size", [32, 128])
def test_paged_attention(heads: int, kv_heads: int, head_size: int, block_size: int) -> None:
    torch.manual_seed(1)
    num_blocks = 16
    isa = _get_attn_isa(torch.float32, block_size, head_size)
    query_lens = [q for q, _ in REQUESTS]
    seq_lens = torch.tensor([s for _, s in REQUESTS], dtype=torch.int32)
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    query_start_loc = query_start_loc.to(torch.int32)
    tokens = int(query_start_loc[-1])
    # each request's blocks, shuffled over the cache so that its blocks are not adjacent
    order = torch.randperm(num_blocks).to(torch.int32)
    max_blocks = max(-(-s // block_size) for _, s in REQUESTS)
    block_table = torch.zeros(len(REQUESTS), max_blocks, dtype=torch.int32)
    used = 0
    for row, (_, seq_len) in enumerate(REQUESTS):
        count = -(-seq_len // block_size)
        block_table[row, :count] = order[used : used + count]
        used += count

    def slots(row: int, positions: range) -> list[int]:
        return [
            int(block_table[row, p // block_size]) * block_size + p % block_size for p in positions
        ]

    # the history before this step, then this step's tokens (a -1 slot is padding)
    history = [s for row, (q, s) in enumerate(REQUESTS) for s in slots(row, range(s - q))]
    step = [s for row, (q, s) in enumerate(REQUESTS) for s in slots(row, range(s - q, s))]
    step_slots = torch.tensor(step + [-1, -1])
    query = torch.randn(tokens, heads, head_size)
    key, value = (torch.randn(len(history), kv_heads, head_size) for _ in range(2))
    step_key, step_value = (torch.randn(tokens + 2, kv_heads, head_size) for _ in range(2))

    def attend(reshape_and_cache, attention, scheduler_metadata) -> torch.Tensor:
        # the backend's cache: [blocks, kv heads, block size, 2 * head size], halves by view
        cache = torch.zeros(num_blocks, kv_heads, block_size, 2 * head_size)
        key_cache, value_cache = cache.view(num_blocks, kv_heads, 2 * block_size, -1).chunk(
            2, dim=2
        )
        reshape_and_cache(key, value, key_cache, value_cache, torch.tensor(history), isa)
        reshape_and_cache(step_key, step_value, key_cache, value_cache, step_slots, isa)
        output = torch.full_like(query, float("nan"))
        metadata = scheduler_metadata(
            len(REQUESTS), heads, kv_heads, head_size, seq_lens, torch.float32,
            query_start_loc, True, -1, isa, False,
        )  # fmt: skip
        attention(
            query, key_cache, value_cache, output, query_start_loc, seq_lens,
            head_size**-0.5, True, None, -1, block_table, 0.0, metadata, None,
        )  # fmt: skip
        return output

    real = attend(
        cpu_ops.cpu_attn_reshape_and_cache,
        cpu_ops.cpu_attention_with_kv_cache,
        cpu_ops.cpu_attn_get_scheduler_metadata,
    )
    stand_in = attend(
        standins.cpu_attn_reshape_and_cache,
        standins.cpu_attention_with_kv_cache,
        standins.get_scheduler_metadata,
    )
    assert not real.isnan().any()
    torch.testing.assert_close(stand_in, real, atol=2e-5, rtol=1e-4)


def test_what_the_stand_ins_do_not_compute_is_refused_by_name() -> None:
    with pytest.raises(NotImplementedError, match="sliding_window"):
        standins.cpu_attention_with_kv_cache(
            *(torch.zeros(1),) * 6, 1.0, True, None, 128, torch.zeros(1), 0.0,
            torch.zeros(0), None,
        )  # fmt: skip
    with pytest.raises(NotImplementedError, match="inverse"):
        standins.rotary_embedding(*(torch.zeros(1),) * 3, 64, torch.zeros(1), True, 0, True)
