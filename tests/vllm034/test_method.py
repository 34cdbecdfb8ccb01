"""``"method": "lookahead"`` in real vLLM 0.34 engines: registered by the package's entry
point, greedy output identical to no speculation, accepted drafts in vLLM's counters, every
request started and ended once, n > 1 at temperature 0.8, a lookahead-server on a Unix socket
from vLLM's default multiprocess engine killed mid-generation, one drafter per tensor-parallel
group whose drafts every rank verifies, bad options refused at start."""

from __future__ import annotations

import os

import pytest
from vllm_support import (
    close,
    counter,
    greedy,
    greedy_stepwise,
    make_llm,
    tensor_parallel_outputs,
)

from lookahead_client.processes.server import ServerProcess
from lookahead_client.vllm import speculator_stats

ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
TOKENS = (40, 56)


def spec(k: int = 4, **options) -> dict:
    out: dict = {"method": "lookahead", "num_speculative_tokens": k}
    if options:
        out["speculator_options"] = options
    return out


@pytest.fixture(scope="module")
def plain(tiny_model: str, prompts: list[list[int]]) -> list[list[int]]:
    """vLLM's own greedy outputs without speculation."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm = make_llm(tiny_model)
    try:
        return greedy(llm, prompts, TOKENS)
    finally:
        close(llm)


def test_embedded_greedy_output_is_vllms(tiny_model, prompts, plain, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)
    llm = make_llm(tiny_model, spec())
    try:
        assert greedy(llm, prompts, TOKENS) == plain
        assert counter(llm, ACCEPTED) > 0
        [stats] = llm.collective_rpc(speculator_stats)
        assert stats["rank"] == 0 and stats["drafted_requests"] > 0, stats
        assert stats["resyncs"] == 0 and stats["fallback_steps"] == 0, stats
        # without adaptive verification every row verifies K slots: chains are not cut
        assert stats["sizing"] is False, stats
        # each request's history crossed to the host whole once; then only K + 1 tokens a step
        assert len(prompts) <= stats["whole_reads"] < stats["tail_reads"], stats

        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(n=3, temperature=0.8, max_tokens=24, seed=1)
        [out] = llm.generate([TokensPrompt(prompt_token_ids=prompts[2])], params)
        assert [len(o.token_ids) for o in out.outputs] == [24, 24, 24]
        # vLLM reports a finish with its next step: the first batch's all came by now
        [stats] = llm.collective_rpc(speculator_stats)
        assert len(prompts) <= stats["ended"] <= len(prompts) + 3, stats
        assert stats["tracked_requests"] <= 3, "the drafter's book let go of the ended"
    finally:
        close(llm)


def test_a_server_from_the_multiprocess_engine_killed_mid_generation(
    tiny_model, prompts, plain, monkeypatch
) -> None:
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)  # vLLM's default
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    with ServerProcess(tcp=False) as server:
        llm = make_llm(tiny_model, spec(target=server.unix_target))
        try:
            assert greedy(llm, prompts, TOKENS) == plain
            assert counter(llm, ACCEPTED) > 0
            [stats] = llm.collective_rpc(speculator_stats)
            assert stats["drafted_requests"] > 0 and stats["fallback_steps"] == 0, stats
            outputs = greedy_stepwise(llm, prompts, TOKENS, at_step=10, action=server.kill)
            assert outputs == plain
            assert not server.alive()
            [after] = llm.collective_rpc(speculator_stats)
            assert after["client"]["fallback_steps"] > 0, after
        finally:
            close(llm)


def test_tensor_parallel_ranks_share_rank_0s_drafts(tiny_model, prompts, monkeypatch) -> None:
    """TP = 2: one drafter (rank 0), and the output is a plain TP = 2 engine's. Each rank feeds
    its own drafts to its own shard, so a rank verifying other drafts breaks the output (it
    did before rank 0 broadcast its drafts)."""
    plain, drafted, (rank0, rank1), accepted = tensor_parallel_outputs(
        tiny_model, spec(), prompts, TOKENS, speculator_stats, monkeypatch
    )
    assert drafted == plain
    assert accepted > 0
    assert rank0["rank"] == 0 and rank0["drafted_requests"] > 0, rank0
    assert rank1 == {"rank": 1, "drafter": None}, rank1


def test_bad_options_are_refused_at_start_naming_the_key(tiny_model, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(Exception, match="targte"):
        make_llm(tiny_model, spec(targte="unix:///x"))
