"""Batched, device-agnostic verification of draft trees against the target model's logits.

Both modes reduce to one vectorised walk (:func:`verify_tree`): every slot of the tree gets a
*target token*, the token the target model emits after the path from the root to that slot;
a node is accepted when its token equals its parent's target token and every node above it is
accepted; the emitted tokens are the target tokens along the accepted path, the last one being
the bonus token.

* Greedy: the target token of a slot is the argmax of its logits.
* Sampling: the target token of a slot is one sample from the target's distribution at that
  slot (temperature, top-k and top-p applied as Hugging Face ``generate`` applies them).
  With deterministic drafts this is exactly lossless: at a slot whose children carry the
  draft tokens ``C``, the child with token ``c`` is accepted with probability ``p(c)``, which
  is the rejection-sampling acceptance ``min(1, p(c) / q(c))`` for a draft that puts all its
  mass on ``c`` (and checking the children one after the other, each on the residual of the
  previous ones, gives the same total); when no child matches, the emitted token is
  distributed as ``p`` restricted to the tokens outside ``C`` and renormalised, which is the
  residual distribution ``norm(max(p - q, 0))`` left after rejecting every child. Samples at
  different slots are independent and each only depends on its own path, so the emitted
  sequence is distributed exactly as plain token-by-token sampling.

No Python loop runs over nodes or requests: the walk is a few ``[bs, d, d]`` tensor ops.

Chains drawn from a draft distribution ``q`` (:func:`lookahead_client.hf.chains.sample_chain`)
are verified by :func:`verify_chain_sampling`, the speculative sampling rule for a draft that
is not deterministic: the token ``x`` at a position is accepted with probability
``min(1, p(x) / q(x))``; at the first rejected position the emitted token is drawn from the
residual ``norm(max(p - q, 0))``, and after a fully accepted chain from ``p``. A position
without a draft has ``q = 0``, so it is rejected and its token drawn from ``p``: plain
sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

    from ..tree import TreeTensors

__all__ = [
    "SamplingParams",
    "VerifyResult",
    "warp_logits",
    "sample_tokens",
    "verify_tree",
    "verify_greedy",
    "verify_sampling",
    "verify_chain_sampling",
    "verify",
]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the target model's next token is chosen, as in plain decoding.

    Attributes:
        temperature: divides the logits; 0 means greedy (argmax).
        top_k: keep the ``top_k`` largest logits (ties kept); 0 turns it off.
        top_p: keep the smallest set of most likely tokens whose probability reaches
            ``top_p``; 1.0 turns it off.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise InvalidArgumentError(
                f"temperature must be >= 0, got {self.temperature}", field="temperature"
            )
        if self.top_k < 0:
            raise InvalidArgumentError(f"top_k must be >= 0, got {self.top_k}", field="top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p}", field="top_p")

    @property
    def greedy(self) -> bool:
        """Whether these parameters select the argmax."""
        return self.temperature == 0.0


@dataclass(frozen=True)
class VerifyResult:
    """What a verification step accepted, per request.

    Attributes:
        accept_index: int64 ``[bs, d]``, the slots of the root and the accepted nodes in path
            order, then -1. Add ``b * d`` for SGLang's flat indices.
        accept_length: int64 ``[bs]``, accepted draft nodes (root and bonus excluded).
        accept_tokens: int64 ``[bs, d]``, the emitted tokens: the accepted draft tokens then
            the bonus token (``accept_length + 1`` of them), then -1.
        bonus: int64 ``[bs]``, the token the target model emitted after the accepted path.
    """

    accept_index: torch.Tensor
    accept_length: torch.Tensor
    accept_tokens: torch.Tensor
    bonus: torch.Tensor

    def tokens(self) -> list[list[int]]:
        """The emitted tokens of each request as Python lists."""
        lengths = (self.accept_length + 1).tolist()
        return [row[:n] for row, n in zip(self.accept_tokens.tolist(), lengths, strict=True)]


def _slot_logits(tree: TreeTensors, logits: torch.Tensor) -> torch.Tensor:
    bs, d = tree.batch_size, tree.num_slots
    if logits.dim() not in (2, 3) or logits.shape[:-1].numel() != bs * d:
        raise InvalidArgumentError(
            f"logits must be [{bs}, {d}, V] or [{bs * d}, V], got {list(logits.shape)}",
            field="logits",
        )
    return logits.reshape(bs, d, logits.shape[-1])


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Applies temperature, then top-k, then top-p to the last dimension of ``logits``.

    The same order and tie rules as Hugging Face's ``TemperatureLogitsWarper``,
    ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (with ``min_tokens_to_keep=1``); removed
    tokens get ``-inf``. Computed in float32.
    """
    import torch

    scores = logits.float()
    if params.temperature not in (0.0, 1.0):
        scores = scores / params.temperature
    if params.top_k:
        k = min(params.top_k, scores.shape[-1])
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1.0 - params.top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row of ``logits[..., V]``: the argmax when greedy, else one sample."""
    import torch

    if params.greedy:
        return logits.argmax(-1)
    probs = warp_logits(logits, params).softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def verify_tree(tree: TreeTensors, target_tokens: torch.Tensor) -> VerifyResult:
    """Walks every tree along the target's token at each slot.

    Args:
        tree: the batch's tree tensors (see :func:`lookahead_client.tree.tree_tensors`).
        target_tokens: int ``[bs, d]`` (or ``[bs * d]``), the token the target model emits
            after each slot.

    Returns:
        The accepted path, its length, the emitted tokens and the bonus token per request.
        Among siblings carrying the same token only the first can be accepted.
    """
    import torch

    bs, d = tree.batch_size, tree.num_slots
    if target_tokens.numel() != bs * d:
        raise InvalidArgumentError(
            f"target_tokens has {target_tokens.numel()} entries, expected {bs}*{d}",
            field="target_tokens",
        )
    target = target_tokens.reshape(bs, d).to(torch.int64)
    tokens = tree.draft_tokens.view(bs, d)
    parents = tree.parents
    idx = torch.arange(d, device=tokens.device)
    has_parent = parents >= 0
    matches = has_parent & (tokens == target.gather(1, parents.clamp(min=0)))
    # Only the first child carrying a given token counts (duplicates share its KV and path).
    earlier_twin = (
        (parents[:, :, None] == parents[:, None, :])
        & (tokens[:, :, None] == tokens[:, None, :])
        & (idx[None, :] < idx[:, None])
    ).any(-1)
    good = (matches & ~earlier_twin) | ~has_parent
    # A slot is accepted when every slot on its path (itself included) is good.
    accepted = ~(tree.tree_mask.view(bs, d, d) & ~good[:, None, :]).any(-1)
    # At most one child per node is good, so the accepted slots form one chain from the root,
    # and sorting their slot numbers orders them along the path.
    accept_index = torch.where(accepted, idx, d).sort(-1).values
    accept_index = torch.where(accept_index < d, accept_index, -1)
    accept_length = accepted.sum(-1) - 1
    emitted = target.gather(1, accept_index.clamp(min=0))
    accept_tokens = torch.where(accept_index >= 0, emitted, -1)
    bonus = emitted.gather(1, accept_length[:, None]).squeeze(1)
    return VerifyResult(accept_index, accept_length, accept_tokens, bonus)


def verify_greedy(tree: TreeTensors, logits: torch.Tensor) -> VerifyResult:
    """Greedy verification: the target token of each slot is the argmax of its logits.

    Args:
        tree: the batch's tree tensors.
        logits: ``[bs, d, V]`` or ``[bs * d, V]`` target logits, one row per slot.
    """
    return verify_tree(tree, _slot_logits(tree, logits).argmax(-1))


def verify_sampling(
    tree: TreeTensors,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Lossless sampling verification for deterministic drafts (see the module docstring).

    Args:
        tree: the batch's tree tensors.
        logits: ``[bs, d, V]`` or ``[bs * d, V]`` target logits, one row per slot.
        params: temperature, top-k and top-p, applied as plain decoding applies them.
        generator: the random generator (on ``logits``'s device) for reproducible runs.
    """
    return verify_tree(tree, sample_tokens(_slot_logits(tree, logits), params, generator))


def verify_chain_sampling(
    tree: TreeTensors,
    logits: torch.Tensor,
    params: SamplingParams,
    draft_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Lossless sampling verification of chains drawn from draft distributions.

    Args:
        tree: the batch's tree tensors; every slot ``i >= 1`` that carries a draft (a non-zero
            row of ``draft_probs``) hangs under slot ``i - 1``, and the drafted slots of a
            request are its first ones (slots after the first undrafted one are ignored).
        logits: ``[bs, d, V]`` or ``[bs * d, V]`` target logits, one row per slot.
        params: temperature (> 0), top-k and top-p, applied as plain decoding applies them.
        draft_probs: float ``[bs, d, V]``: row ``i`` is the distribution slot ``i``'s token
            was drawn from (row 0, the root, and undrafted slots are all zeros).
        generator: the random generator (on ``logits``'s device) for reproducible runs.

    Raises:
        InvalidArgumentError: greedy ``params``, ``draft_probs`` of the wrong shape, or a
            drafted slot that does not continue the chain.
    """
    import torch

    if params.greedy:
        raise InvalidArgumentError(
            "verify_chain_sampling needs temperature > 0 (verify_greedy checks greedy drafts)",
            field="params",
        )
    slot_logits = _slot_logits(tree, logits)
    bs, d, vocab = slot_logits.shape
    if tuple(draft_probs.shape) != (bs, d, vocab):
        raise InvalidArgumentError(
            f"draft_probs must be [{bs}, {d}, {vocab}], got {list(draft_probs.shape)}",
            field="draft_probs",
        )
    q = draft_probs.to(device=slot_logits.device, dtype=torch.float32)
    idx = torch.arange(d, device=q.device)
    drafted = q.sum(-1) > 0
    drafted[:, 0] = False
    if bool((drafted & (tree.parents != idx - 1)).any()):
        raise InvalidArgumentError(
            "a drafted slot of draft_probs does not hang under the slot before it: "
            "verify_chain_sampling verifies chains",
            field="draft_probs",
        )
    p = warp_logits(slot_logits, params).softmax(-1)
    tokens = tree.draft_tokens.view(bs, d)
    # Slot i's logits give the distribution of slot i + 1's token.
    p_token = p[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
    q_token = q[:, 1:].gather(-1, tokens[:, 1:, None]).squeeze(-1)
    u = torch.rand((bs, d - 1), generator=generator, device=q.device)
    # min(1, p/q) > u, written without a division; q = 0 (no draft) is always rejected
    ok = drafted[:, 1:] & (u * q_token < p_token)
    accept_length = ok.to(torch.int64).cumprod(-1).sum(-1)
    rows = torch.arange(bs, device=q.device)
    # The emitted token after the accepted path: the residual of the first rejected draft,
    # which is p itself where no draft follows.
    q_next = torch.cat([q[:, 1:], q.new_zeros((bs, 1, vocab))], dim=1)[rows, accept_length]
    p_here = p[rows, accept_length]
    residual = (p_here - q_next).clamp(min=0)
    # p <= q everywhere makes a rejection impossible; float rounding can still get here
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_here)
    bonus = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    on_path = idx[None, :] <= accept_length[:, None]
    accept_index = torch.where(on_path, idx, -1)
    emitted = torch.cat([tokens[:, 1:], tokens.new_zeros((bs, 1))], dim=1)
    emitted = emitted.scatter(1, accept_length[:, None], bonus[:, None])
    accept_tokens = torch.where(on_path, emitted, -1)
    return VerifyResult(accept_index, accept_length, accept_tokens, bonus)


def verify(
    tree: TreeTensors,
    logits: torch.Tensor,
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Greedy when ``params`` is None or has temperature 0, sampling otherwise."""
    if params is None or params.greedy:
        return verify_greedy(tree, logits)
    return verify_sampling(tree, logits, params, generator)
