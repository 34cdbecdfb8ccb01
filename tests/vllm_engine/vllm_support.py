"""What the vLLM engine tests share: a tiny random Llama made here, prompts, engines."""

from __future__ import annotations

import gc
import os

VOCAB = 1024
#: max_tokens patterns (alternating, so that requests finish at different steps).
SHORT = (48, 80)
LONG = (160, 200)
EOS = 2


def save_tiny_model(path) -> str:
    """Saves a 2-layer Llama with random weights at ``path`` (head_dim 64: vLLM's CPU
    attention refuses 16) and returns the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=EOS,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def make_llm(model: str, speculative_config=None, **kwargs):
    """A vLLM engine on the tiny model with the settings every test shares."""
    from vllm import LLM

    settings = dict(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=4,  # fewer rows than prompts: requests come, go and move rows
        max_num_batched_tokens=128,  # the long prompt is prefilled in chunks
        enforce_eager=True,
        disable_log_stats=False,
        kv_cache_memory_bytes=256 << 20,
        seed=0,
        speculative_config=speculative_config,
    )
    settings.update(kwargs)
    return LLM(**settings)


def expand_as_shipped(monkeypatch) -> None:
    """vLLM's own ``expand_batch_to_tokens`` for this test (an earlier in-process engine's
    proposer may have repaired it, see ``lookahead_client.vllm.cpu_sampling``)."""
    import vllm.v1.sample.rejection_sampler as sampler

    current = sampler.expand_batch_to_tokens
    monkeypatch.setattr(sampler, "expand_batch_to_tokens", getattr(current, "__wrapped__", current))


def lookahead_spec(k: int = 4) -> dict:
    from lookahead_client.vllm import PROPOSER_PATH

    return {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": k}


def greedy(llm, prompts, max_tokens=SHORT):
    """Greedy outputs, max_tokens alternating so that requests finish at different steps."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [
        SamplingParams(temperature=0.0, max_tokens=max_tokens[i % len(max_tokens)], ignore_eos=True)
        for i in range(len(prompts))
    ]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def greedy_stepwise(llm, prompts, max_tokens, at_step: int, action) -> list[list[int]]:
    """:func:`greedy` through vLLM's engine step by step, calling ``action()`` after the
    ``at_step``-th engine step (so that it happens mid-generation, whatever the timing)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens[i % len(max_tokens)], ignore_eos=True
        )
        engine.add_request(f"stepwise-{i}", TokensPrompt(prompt_token_ids=p), params)
    outputs: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
        if steps == at_step:
            action()
    assert steps > at_step, f"the generation ended after {steps} steps"
    return [outputs[f"stepwise-{i}"] for i in range(len(prompts))]


def counter(llm, name: str) -> float:
    return sum(float(m.value) for m in llm.get_metrics() if m.name == name)


def close(llm) -> None:
    """Shuts an engine down so that the next one can start in this process."""
    from vllm.distributed import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def in_process_outputs(model: str, prompts, max_tokens) -> list[list[int]]:
    """vLLM's own greedy outputs, without speculation, from an in-process engine."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        llm = make_llm(model)
        out = greedy(llm, prompts, max_tokens)
        close(llm)
        return out
    finally:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)


def tensor_parallel_outputs(
    model: str, speculative_config, prompts, max_tokens, stats, monkeypatch
):
    """Greedy outputs of two engines with tensor parallel size 2 (worker processes), plain and
    with ``speculative_config``; returns (plain outputs, speculative outputs, ``stats`` of
    each rank of the speculative engine, its accepted draft tokens)."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)
    # vLLM compiles its vocab-parallel embedding (TP > 1 only) with torch.compile, which
    # cannot build kernels on these CPU builds: eager instead
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    # by default vLLM's CPU backend gives each worker a NUMA node of its own: one machine
    # here may have a single node
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    tp = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    llm = make_llm(model, **tp)
    try:
        plain = greedy(llm, prompts, max_tokens)
    finally:
        close(llm)
    llm = make_llm(model, speculative_config, **tp)
    try:
        drafted = greedy(llm, prompts, max_tokens)
        return (
            plain,
            drafted,
            llm.collective_rpc(stats),
            counter(llm, "vllm:spec_decode_num_accepted_tokens"),
        )
    finally:
        close(llm)
