"""vLLM 0.34's engine computes the tiny model, whichever kernels it runs on (the build's own, or
the stand-ins of ``standins/`` on a CPU without AVX-512): the log-probability it reports for
each greedy token equals what transformers computes for the same sequence. So the engine
tests' "output identical to plain" compares two correct engines, not two that err alike."""

from __future__ import annotations

import torch
from vllm_support import close, make_llm

# long enough that the longest prompt's sequence crosses a 128-position cache block
MAX_TOKENS = 100


def test_reported_logprobs_are_the_models(tiny_model, prompts, monkeypatch) -> None:
    from transformers import LlamaForCausalLM
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = make_llm(tiny_model)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
    finally:
        close(llm)

    model = LlamaForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert max(len(p) for p in prompts) + MAX_TOKENS > 128
    for prompt, out in zip(prompts, outs, strict=True):
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        assert len(tokens) == MAX_TOKENS
        reported = torch.tensor(
            [step[t].logprob for step, t in zip(completion.logprobs, tokens, strict=True)]
        )
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0]
        # the logits at position i predict token i + 1
        predicted = logits[len(prompt) - 1 : -1].log_softmax(-1)
        expected = predicted.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        torch.testing.assert_close(reported, expected, atol=1e-4, rtol=1e-4)
