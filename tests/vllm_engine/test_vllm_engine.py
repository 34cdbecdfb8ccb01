"""lookahead as vLLM's drafter in real vLLM engines: identical greedy output, accepted drafts
in vLLM's own counters, exact request identity, sampling and n > 1, a lookahead-server on a
Unix socket from vLLM's default multiprocess engine, a server killed mid-generation, and one
drafter per tensor-parallel group."""

from __future__ import annotations

import pytest
from vllm_support import (
    LONG,
    SHORT,
    close,
    counter,
    expand_as_shipped,
    greedy,
    greedy_stepwise,
    lookahead_spec,
    make_llm,
    tensor_parallel_outputs,
)

from lookahead_client.processes.server import ServerProcess
from lookahead_client.vllm import proposer_stats
from lookahead_client.vllm.cpu_sampling import expand_works

ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


class Recording:
    """Wraps the proposer's drafter and records what every drafter id was fed."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.fed: dict[str, list[int]] = {}
        self.ended: set[str] = set()

    def _record(self, requests) -> None:
        for r in requests:
            seq = self.fed.setdefault(r.request_id, [])
            if r.prompt is not None:
                assert not seq, f"{r.request_id} started twice"
                seq.extend(r.prompt)
            seq.extend(r.new_tokens)
            if r.finished:
                self.ended.add(r.request_id)

    def step(self, requests, cost=None):
        self._record(requests)
        return self.drafter.step(requests, cost)

    def __getattr__(self, name):
        return getattr(self.drafter, name)


def test_embedded_greedy_output_is_vllms_and_each_request_is_fed_once(
    tiny_model, prompts, plain_outputs, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # to reach the proposer
    monkeypatch.delenv("LOOKAHEAD_VLLM", raising=False)
    expand_as_shipped(monkeypatch)
    k = 4
    llm = make_llm(tiny_model, lookahead_spec(k))
    try:
        # The worker registered vLLM's CPU kernels, then the proposer repaired the broken one
        # (see test_cpu_sampling): the sampled requests below are verified right.
        assert expand_works()
        [proposer] = llm.collective_rpc(lambda worker: worker.model_runner.drafter)
        recording = Recording(proposer.guard.drafter)
        proposer.guard.drafter = recording
        outputs = greedy(llm, prompts)
        assert outputs == plain_outputs[SHORT]
        accepted = counter(llm, ACCEPTED)
        assert accepted > 0.2 * sum(map(len, outputs)), accepted

        # Each request has one drafter id, fed its prompt and outputs in order, once (plus
        # at most K tokens vLLM accepted past max_tokens before it stopped the request).
        ids = {}
        for drafter_id, seq in recording.fed.items():
            for i, p in enumerate(prompts):
                if seq[: len(p)] == p and len(seq) >= len(p) + len(outputs[i]):
                    assert i not in ids, f"prompt {i} was started twice"
                    ids[i] = drafter_id
                    whole = p + outputs[i]
                    assert seq[: len(whole)] == whole and len(seq) - len(whole) <= k
        assert sorted(ids) == list(range(len(prompts)))
        assert proposer.book.resyncs == 0

        # Sampling with n > 1 (each prompt's samples are one group, no flag) runs; the
        # requests of the first call are ended in the drafter by then.
        params = SamplingParams(temperature=0.8, top_p=0.95, n=3, max_tokens=32, seed=1)
        sampled = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts[:3]], params, use_tqdm=False
        )
        assert [len(o.outputs) for o in sampled] == [3, 3, 3]
        assert all(
            len(c.token_ids) == 32 or c.finish_reason == "stop" for o in sampled for c in o.outputs
        )
        assert set(ids.values()) <= recording.ended
        stats = proposer.stats()
        assert stats["fallback_steps"] == 0 and not any(k.startswith("problems") for k in stats)
    finally:
        close(llm)


def test_a_server_from_the_multiprocess_engine_and_killed_mid_generation(
    tiny_model, prompts, plain_outputs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)  # vLLM's default
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)
    with ServerProcess(tcp=False) as server:
        monkeypatch.setenv("LOOKAHEAD_VLLM", f'{{"target": "{server.unix_target}"}}')
        llm = make_llm(tiny_model, lookahead_spec())
        try:
            assert greedy(llm, prompts) == plain_outputs[SHORT]
            assert counter(llm, ACCEPTED) > 0
            [stats] = llm.collective_rpc(proposer_stats)
            assert stats["drafted_requests"] > 0 and stats["fallback_steps"] == 0, stats

            # kill -9 of the server while vLLM generates: the same output, no error.
            outputs = greedy_stepwise(llm, prompts, LONG, at_step=20, action=server.kill)
            assert outputs == plain_outputs[LONG]
            assert not server.alive()
            [after] = llm.collective_rpc(proposer_stats)
            # the remote client answered empty trees from the kill on, mid-generation
            assert after["client"]["fallback_steps"] > 0, after
            # and a whole call with the server gone
            assert greedy(llm, prompts) == plain_outputs[SHORT]
        finally:
            close(llm)


def test_tensor_parallel_builds_one_drafter(tiny_model, prompts, monkeypatch) -> None:
    """TP = 2: vLLM takes rank 0's drafts (and sends them to every rank), so rank 1 builds
    no drafter (nor talks to a server); the output is a plain TP = 2 engine's."""
    plain, drafted, (rank0, rank1), accepted = tensor_parallel_outputs(
        tiny_model, lookahead_spec(), prompts, SHORT, proposer_stats, monkeypatch
    )
    assert drafted == plain
    assert accepted > 0
    assert rank0["rank"] == 0 and rank0["drafted_requests"] > 0, rank0
    assert rank1 == {"rank": 1, "drafter": None}, rank1
