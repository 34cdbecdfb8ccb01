"""Speculative generation with draft trees for Hugging Face ``transformers`` causal LMs.

:func:`speculative_generate` runs the loop an engine runs:

1. prefill every prompt; the logits after its last token give the first new token (as in
   ``generate``), which becomes the first tree's root (the root is always the last known token,
   the one token of the context whose KV entry is not cached yet);
2. per step, ask the drafter for one tree per request (:class:`~lookahead_client.types.Drafter`
   protocol), pack the trees (:mod:`lookahead_client.tree`) and run them in **one** forward
   pass over the KV cache, with a 4D tree attention mask and tree position ids;
3. verify (:mod:`lookahead_client.hf.verify`, greedy or lossless sampling), keep only the KV
   entries of the root and the accepted nodes, and tell the drafter the emitted tokens.

By default each step's trees are cut to the width that maximises expected tokens per second,
down to plain decoding when drafts do not pay for their verification (``sizing=False``
verifies whole trees up to ``budget``). With lookahead's own drafters (embedded or remote)
the drafter's core does the cut in its step (``DraftShape.SIZED_TREE``, one width for the
padded batch) against a curve of this model's measured step times
(:class:`~lookahead_client.engine.step_cost.StepCostFeed`), with its scores calibrated at the
sampling temperature. Other drafters (any :class:`~lookahead_client.types.Drafter`) are cut by
a :class:`~lookahead_client.hf.sizing.SizingPolicy` instead. What is learnt (step times, the
policy's calibration) is kept for later calls with the same model and drafter.

With ``draft_mode`` the loop verifies one chain per request instead, cut from the drafter's
tree (:mod:`lookahead_client.hf.chains`), as a chain-verifying engine (vLLM) does:
``"best-chain"``, its most likely path; ``"sampled-chain"`` (temperature > 0), a path drawn
from the tree's own next-token distributions and verified with them
(:func:`~lookahead_client.hf.verify.verify_chain_sampling`).

Requests of a batch advance by different amounts, so the KV cache is a common array of slots
with a per-request validity mask: a request's slots that another request needed hold garbage
and are masked out forever (there are none with a batch of one). Written against
``transformers`` 5.x: a 4D ``attention_mask`` is passed to the attention as it is (additive
float mask, shape ``[bs, 1, q, kv]``) and ``DynamicCache.layers[i].keys/values`` are
``[bs, heads, seq, head_dim]`` tensors that can be rewritten between forward passes.
"""

from __future__ import annotations

import itertools
import random
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..cost import CostModel
from ..engine.step_cost import StepCostFeed
from ..errors import InvalidArgumentError
from ..tree import TreeTensors, build_tree_tensors
from ..types import Drafter, DraftShape, StepRequest
from .chains import best_chain, draft_probs_tensor, sample_chain
from .sizing import AcceptanceCalibration, SizingPlan, SizingPolicy
from .verify import SamplingParams, VerifyResult, sample_tokens, verify, verify_chain_sampling

if TYPE_CHECKING:
    import torch

__all__ = ["DRAFT_MODES", "GenerationResult", "default_policy", "speculative_generate"]

#: What each step verifies: the drafter's trees, or one chain per request cut from them.
DRAFT_MODES = ("tree", "best-chain", "sampled-chain")

_request_counter = itertools.count()

# What the default sizing has learnt: step times per model (for the core's sizing and for the
# policy), acceptance per drafter (the policy's).
_model_feeds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_model_costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_drafter_calibrations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _remembered(store: weakref.WeakKeyDictionary, key: object, make):
    try:
        value = store.get(key)
        if value is None:
            value = store[key] = make()
        return value
    except TypeError:  # not weakly referenceable: nothing is kept between calls
        return make()


def _sizes_natively(drafter: Drafter) -> bool:
    """Whether the drafter cuts sized shapes itself against an
    :class:`~lookahead_client.types.EngineCost` (lookahead's own drafters: their core does)."""
    return bool(getattr(drafter, "sizes_drafts", False))


def default_policy(model, drafter: Drafter) -> SizingPolicy:
    """The sizing policy ``speculative_generate`` uses by default for ``model`` and ``drafter``:
    padded layout, a cost model of ``model``'s steps and a calibration of ``drafter``'s scores,
    both learnt online and kept (weakly referenced) for later calls with the same objects."""
    return SizingPolicy(
        _remembered(_model_costs, model, CostModel),
        _remembered(_drafter_calibrations, drafter, AcceptanceCalibration),
    )


@dataclass
class GenerationResult:
    """The outcome of :func:`speculative_generate`.

    Attributes:
        tokens: the generated tokens of each prompt (prompt excluded, stop token included).
        accepted: the draft tokens accepted for each prompt.
        steps: the verification forward passes each prompt took part in.
        forward_passes: model calls of the decode loop (the prefill excluded).
        draft_nodes: draft nodes verified, over all prompts and steps.
        plain_passes: forward passes that verified no draft node (plain decoding steps).
    """

    tokens: list[list[int]]
    accepted: list[int]
    steps: list[int]
    forward_passes: int = 0
    draft_nodes: int = 0
    plain_passes: int = 0

    @property
    def tokens_per_step(self) -> float:
        """Generated tokens per verification step, over all prompts (1.0 without drafts)."""
        steps = sum(self.steps)
        return sum(len(t) for t in self.tokens) / steps if steps else 0.0


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[bs, q, kv]`` booleans to the ``[bs, 1, q, kv]`` additive mask attention layers add."""
    import torch

    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


@dataclass
class _Batch:
    """The running requests: their KV cache and where each one stands.

    ``valid[b, s]`` tells whether cache slot ``s`` holds one of request ``b``'s tokens;
    ``lengths[b]`` is how many tokens of ``b`` are cached (its next position); ``roots[b]`` its
    last known token (not cached); ``rows[b]`` its index among the prompts.
    """

    cache: Any
    valid: torch.Tensor
    lengths: torch.Tensor
    roots: torch.Tensor
    rows: list[int] = field(default_factory=list)

    def keep_accepted(self, result: VerifyResult) -> None:
        """Keeps the KV entries of the root and accepted nodes; the bonus becomes the root."""
        import torch

        bs = result.accept_index.shape[0]
        width = int(result.accept_length.max()) + 1
        keep = result.accept_index[:, :width]
        start = self.valid.shape[1]
        src = (keep.clamp(min=0) + start)[:, None, :, None]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                kv = getattr(layer, name)
                picked = kv.gather(2, src.expand(bs, kv.shape[1], width, kv.shape[3]))
                kv[:, :, start : start + width] = picked
                setattr(layer, name, kv[:, :, : start + width])
        self.valid = torch.cat([self.valid, keep >= 0], dim=1)
        self.lengths = self.lengths + result.accept_length + 1
        self.roots = result.bonus.clone()

    def select(self, keep: list[int]) -> None:
        """Keeps only the requests at positions ``keep`` and drops slots nobody uses."""
        import torch

        idx = torch.tensor(keep, dtype=torch.int64, device=self.valid.device)
        self.valid, self.lengths, self.roots = self.valid[idx], self.lengths[idx], self.roots[idx]
        self.rows = [self.rows[i] for i in keep]
        used = self.valid.any(0)
        columns = None if bool(used.all()) else used.nonzero().squeeze(1)
        if columns is not None:
            self.valid = self.valid[:, columns]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                kv = getattr(layer, name)[idx]
                setattr(layer, name, kv if columns is None else kv[:, :, columns])


def _new_cache(model):
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise InvalidArgumentError(
                f"layer {i} uses {type(layer).__name__}; only full-attention layers "
                "(DynamicLayer) can be pruned to the accepted path",
                field="model",
            )
    return cache


def _prefill(model, prompts: Sequence[Sequence[int]]) -> tuple[_Batch, torch.Tensor]:
    """Caches every prompt and returns the logits after each one's last token (``[n, V]``).

    Prompts are left-padded (padding is masked out), so that every prompt ends in the last
    column and the LM head runs on that column only, as ``generate``'s prefill does: the
    first new token comes from the prefill, and the first tree hangs under it.
    """
    import torch

    device = model.device
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
    n, width = len(prompts), int(lengths.max())
    cache = _new_cache(model)
    slot = torch.arange(width, device=device)
    start = width - lengths  # the first slot of each prompt
    valid = slot[None, :] >= start[:, None]
    ids = torch.zeros((n, width), dtype=torch.int64, device=device)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.int64)
    mask = None  # prompts of one length: the model's own causal attention, as in generate
    if not bool(valid.all()):
        causal = slot[None, :] <= slot[:, None]
        # Padding queries see themselves only, so no softmax row is empty.
        eye = torch.eye(width, dtype=torch.bool, device=device)
        mask = _additive_mask((causal[None] & valid[:, None, :]) | eye[None], model.dtype)
    out = model(
        input_ids=ids,
        position_ids=(slot[None, :] - start[:, None]).clamp(min=0),
        attention_mask=mask,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    roots = torch.zeros(n, dtype=torch.int64, device=device)  # set from the first tokens
    return _Batch(cache, valid, lengths, roots, list(range(n))), out.logits[:, -1]


def _forward_tree(model, batch: _Batch, tree: TreeTensors) -> torch.Tensor:
    """One forward pass over all slots of all trees; returns ``[bs, d, V]`` logits."""
    import torch

    bs, d = tree.batch_size, tree.num_slots
    if d == 1 and bool(batch.valid.all()):
        # A plain step over a cache without foreign slots needs no mask: the model's own
        # attention then runs exactly as in ``generate`` (with a mask, SDPA layers copy the
        # grouped KV heads, which makes a plain step ~10% slower on a CPU).
        mask = None
    else:
        prefix = batch.valid[:, None, :].expand(bs, d, batch.valid.shape[1])
        allowed = torch.cat([prefix, tree.tree_mask.view(bs, d, d)], dim=2)
        mask = _additive_mask(allowed, model.dtype)
    out = model(
        input_ids=tree.draft_tokens.view(bs, d),
        position_ids=tree.positions.view(bs, d),
        attention_mask=mask,
        past_key_values=batch.cache,
        use_cache=True,
    )
    return out.logits


def _stop_tokens(model, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset((eos_token_id,))
    return frozenset(int(t) for t in eos_token_id)


def _record(
    result: GenerationResult,
    rows: list[int],
    emitted: list[list[int]],
    accepted: list[int],
    request_ids: Sequence[str],
    stops: frozenset[int],
    budget: int,
    max_new_tokens: int,
    prompts: Sequence[Sequence[int]] | None = None,
    shape: DraftShape = DraftShape.TREE,
    temperature: float = 0.0,
) -> tuple[list[StepRequest], list[int]]:
    """Appends each request's emitted tokens (cut at a stop token or the token limit).

    Args:
        accepted: the draft tokens each request accepted (-1 for the prefill's token,
            which comes from no tree and is no step).
        prompts: given for the prefill's tokens: the drafter's first step starts each
            request with its prompt.

    Returns the drafter's next step requests and the batch positions still running.
    """
    pending, keep = [], []
    for j, (row, tokens) in enumerate(zip(rows, emitted, strict=True)):
        out = result.tokens[row]
        new = tokens[: max_new_tokens - len(out)]
        stop_at = next((k for k, t in enumerate(new) if t in stops), None)
        if stop_at is not None:
            new = new[: stop_at + 1]
        out.extend(new)
        if accepted[j] >= 0:
            result.accepted[row] += min(accepted[j], len(new))
            result.steps[row] += 1
        done = stop_at is not None or len(out) >= max_new_tokens
        pending.append(
            StepRequest(
                request_ids[row],
                new_tokens=new,
                # a tree can be no deeper than the tokens the request may still emit
                budget=0 if done else min(budget, max_new_tokens - len(out)),
                prompt=None if prompts is None else list(prompts[row]),
                accepted_last=accepted[j],
                finished=done,
                shape=shape,
                temperature=temperature,
            )
        )
        if not done:
            keep.append(j)
    return pending, keep


def _plan(
    policy: SizingPolicy,
    trees: list,
    batch: _Batch,
    result: GenerationResult,
    max_new_tokens: int,
    budget: int,
    keys: list[str],
) -> SizingPlan:
    """The policy's cut of the step's trees: every query attends to the whole cache width,
    and a request can use no node deeper than the tokens it may still emit."""
    width = int(batch.valid.shape[1])
    remaining = [max_new_tokens - len(result.tokens[r]) for r in batch.rows]
    return policy.plan(
        trees, [width] * len(trees), max_nodes=budget, remaining=remaining, requests=keys
    )


def _check_draft_mode(
    draft_mode: str, chain_length: int, sizing: object, params: SamplingParams
) -> None:
    if draft_mode not in DRAFT_MODES:
        raise InvalidArgumentError(
            f"unknown draft_mode {draft_mode!r}: one of {', '.join(DRAFT_MODES)}",
            field="draft_mode",
        )
    if draft_mode == "tree":
        return
    if chain_length < 0:
        raise InvalidArgumentError(
            f"chain_length must be >= 0, got {chain_length}", field="chain_length"
        )
    if sizing is not False:
        raise InvalidArgumentError(
            f"draft_mode {draft_mode!r} verifies whole chains: pass sizing=False",
            field="sizing",
        )
    if draft_mode == "sampled-chain" and params.greedy:
        raise InvalidArgumentError(
            "draft_mode 'sampled-chain' draws its drafts at random: it needs sampling with "
            "temperature > 0",
            field="draft_mode",
        )


def speculative_generate(
    model,
    prompts: Sequence[Sequence[int]],
    drafter: Drafter,
    *,
    max_new_tokens: int = 128,
    budget: int = 8,
    sampling: SamplingParams | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    request_ids: Sequence[str] | None = None,
    sizing: SizingPolicy | StepCostFeed | bool = True,
    draft_mode: str = "tree",
    chain_length: int = 8,
) -> GenerationResult:
    """Generates from ``prompts`` with draft trees verified in one forward pass per step.

    Greedy output equals ``model.generate(do_sample=False)`` token for token (up to float
    rounding between differently shaped kernels); with ``sampling`` the output is distributed
    exactly as plain sampling with the same temperature, top-k and top-p.

    Args:
        model: a ``transformers`` causal LM with full-attention layers only.
        prompts: token ids of each prompt (each non-empty); they run as one batch.
        drafter: any :class:`~lookahead_client.types.Drafter`; requests start through
            ``step`` with their prompt and end through ``step`` with ``finished=True``.
        max_new_tokens: tokens to generate per prompt at most.
        budget: draft nodes per tree at most (the root excluded); 0 decodes plainly.
            With sizing, the policy verifies fewer when more would not pay.
        sampling: None or temperature 0 for greedy, else the sampling parameters.
        eos_token_id: stop token(s); None takes the model's generation config, ``[]`` none.
        generator: random generator for sampling (on the model's device).
        request_ids: drafter request ids, one per prompt; unique ones by default.
        sizing: True: lookahead's own drafters size their trees in their core against this
            model's measured step times, other drafters are cut by :func:`default_policy`; a
            :class:`SizingPolicy` (padded layout) to cut every drafter's trees by that one; a
            :class:`StepCostFeed` (padded) for lookahead's drafters to size against that one
            (it goes on learning from the steps); False to verify whole trees (up to
            ``budget`` nodes) every step.
        draft_mode: ``"tree"`` verifies the drafter's trees; ``"best-chain"`` and
            ``"sampled-chain"`` (temperature > 0) one chain of at most ``chain_length`` tokens
            per request, cut from a tree of ``budget`` nodes (module docstring). Chains are
            verified whole: they need ``sizing=False``.
        chain_length: the most draft tokens of a chain.

    Raises:
        InvalidArgumentError: an empty prompt, a negative budget or token count, ids of the
            wrong length, a model whose cache cannot be pruned, an unknown ``draft_mode``, or
            a chain mode with sizing (or ``"sampled-chain"`` without sampling).
    """
    import torch

    if any(len(p) == 0 for p in prompts):
        raise InvalidArgumentError("every prompt needs at least one token", field="prompts")
    if budget < 0:
        raise InvalidArgumentError(f"budget must be >= 0, got {budget}", field="budget")
    if isinstance(sizing, SizingPolicy) and sizing.layout != "padded":
        raise InvalidArgumentError(
            "speculative_generate pads every tree to the step's width: it needs a "
            f"'padded' sizing policy, got {sizing.layout!r}",
            field="sizing",
        )
    if max_new_tokens < 0:
        raise InvalidArgumentError(
            f"max_new_tokens must be >= 0, got {max_new_tokens}", field="max_new_tokens"
        )
    params = sampling if sampling is not None else SamplingParams(temperature=0.0)
    _check_draft_mode(draft_mode, chain_length, sizing, params)
    if request_ids is None:
        request_ids = [f"hf-{next(_request_counter)}" for _ in prompts]
    elif len(request_ids) != len(prompts):
        raise InvalidArgumentError(
            f"{len(request_ids)} request_ids for {len(prompts)} prompts", field="request_ids"
        )
    n = len(prompts)
    result = GenerationResult([[] for _ in range(n)], [0] * n, [0] * n)
    if n == 0 or max_new_tokens == 0:
        return result
    stops = _stop_tokens(model, eos_token_id)
    if isinstance(sizing, StepCostFeed) and not (sizing.padded and _sizes_natively(drafter)):
        raise InvalidArgumentError(
            "a StepCostFeed sizes the trees of lookahead's own drafters (whose step takes a "
            "cost) and must be padded: speculative_generate pads every tree to the step's width",
            field="sizing",
        )
    native = isinstance(sizing, StepCostFeed) or (sizing is True and _sizes_natively(drafter))
    feed = None
    if native:
        feed = (
            sizing
            if isinstance(sizing, StepCostFeed)
            else _remembered(_model_feeds, model, lambda: StepCostFeed(padded=True))
        )
    policy: SizingPolicy | None = None
    if sizing is True and not native:
        policy = default_policy(model, drafter)
    elif isinstance(sizing, SizingPolicy):
        policy = sizing
    # what the step requests ask the drafter for (the core's sizing, at the temperature)
    asked: dict[str, Any] = {
        "shape": DraftShape.SIZED_TREE if native else DraftShape.TREE,
        "temperature": float(params.temperature),
    }
    # the chains' draws: reproducible with a seeded generator
    chain_rng = (
        random.Random(generator.initial_seed() if generator is not None else None)
        if draft_mode == "sampled-chain"
        else None
    )
    with torch.inference_mode():
        batch, first_logits = _prefill(model, prompts)
        first = sample_tokens(first_logits, params, generator)
        batch.roots = first
        rows = batch.rows
        pending, keep = _record(
            result,
            rows,
            [[t] for t in first.tolist()],
            [-1] * n,
            request_ids,
            stops,
            budget,
            max_new_tokens,
            prompts,
            **asked,
        )
        if len(keep) < len(rows):
            batch.select(keep)
        while batch.rows:
            started = policy.clock() if policy is not None else 0.0
            cost = feed.curve(len(batch.rows)) if feed is not None else None
            drafted = drafter.step(pending, cost)
            trees = [t for t, req in zip(drafted, pending, strict=True) if not req.finished]
            sampled = None
            if draft_mode == "best-chain":
                trees = [best_chain(t, chain_length) for t in trees]
            elif chain_rng is not None:  # sampled-chain
                sampled = [sample_chain(t, chain_length, chain_rng) for t in trees]
                trees = [c.chain for c in sampled]
            plan = None
            if policy is not None:
                keys = [request_ids[r] for r in batch.rows]
                plan = _plan(policy, trees, batch, result, max_new_tokens, budget, keys)
                trees, d = plan.trees, plan.num_slots
            else:
                d = 1 + min(budget, max(len(t) for t in trees))
            nodes = sum(min(len(t), d - 1) for t in trees)
            result.draft_nodes += nodes
            result.plain_passes += nodes == 0
            tree = build_tree_tensors(trees, d, batch.lengths, batch.roots.tolist(), model.device)
            forward_started = time.perf_counter()
            rows_now, width = len(batch.rows), int(batch.valid.shape[1])
            logits = _forward_tree(model, batch, tree)
            result.forward_passes += 1
            if sampled is None:
                verdict = verify(tree, logits, sampling, generator)
            else:
                q = draft_probs_tensor(sampled, d, logits.shape[-1], logits.device)
                verdict = verify_chain_sampling(tree, logits, params, q, generator)
            batch.keep_accepted(verdict)
            lengths = verdict.accept_length.tolist()  # waits for the device
            if feed is not None:  # the step's time: forward pass and verification
                feed.observe(
                    rows_now * d,
                    time.perf_counter() - forward_started,
                    rows=rows_now,
                    context=rows_now * width,
                    pairs=rows_now * d * (width + d),
                )
            rows = batch.rows
            pending, keep = _record(
                result,
                rows,
                verdict.tokens(),
                lengths,
                request_ids,
                stops,
                budget,
                max_new_tokens,
                **asked,
            )
            if len(keep) < len(rows):
                batch.select(keep)
            if plan is not None and policy is not None:
                # Slot s of a tree holds node s - 1; the accepted slots follow the root.
                accepted = [
                    [s - 1 for s in index[1 : k + 1]]
                    for index, k in zip(verdict.accept_index.tolist(), lengths, strict=True)
                ]
                policy.observe(plan, accepted, policy.clock() - started)
                for req in pending:
                    if req.finished:
                        policy.end(req.request_id)
        drafter.step(pending)  # tells the drafter the last tokens of the finished requests
    return result
