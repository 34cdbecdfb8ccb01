"""Greedy and sampling verification: the issue's vector, a brute-force walk, losslessness."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from scipy.stats import chi2
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lookahead_client.errors import InvalidArgumentError
from lookahead_client.hf.verify import (
    SamplingParams,
    verify,
    verify_chain_sampling,
    verify_greedy,
    verify_sampling,
    verify_tree,
    warp_logits,
)
from lookahead_client.tree import pack_trees, tree_tensors
from lookahead_client.types import DraftTree
from test_tree import VECTOR_MASK, VECTOR_TOKENS, random_tree


def one_hot_logits(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def reference_walk(tokens, target, next_token, next_sibling) -> list[int]:
    """SGLang's greedy walk: follow first-child/next-sibling links to the child the target
    chose, until no child matches."""
    path, cur = [0], 0
    while True:
        child = next_token[cur]
        while child != -1 and tokens[child] != target[cur]:
            child = next_sibling[child]
        if child == -1:
            return path
        path.append(child)
        cur = child


def test_vector_greedy():
    t = tree_tensors(VECTOR_TOKENS, np.array(VECTOR_MASK, dtype=bool).reshape(-1), [100], 8)
    logits = one_hot_logits([44, 5, 55, 6, 66, 7, 99, 88], 128)
    r = verify_greedy(t, logits)
    assert r.accept_index.tolist() == [[0, 2, 4, 6, -1, -1, -1, -1]]
    assert r.accept_length.tolist() == [3]
    assert r.accept_tokens.tolist() == [[44, 55, 66, 99, -1, -1, -1, -1]]
    assert r.bonus.tolist() == [99]
    assert r.tokens() == [[44, 55, 66, 99]]
    # [bs, d, V] logits work too, and so does the dispatcher.
    assert verify(t, logits.view(1, 8, 128)).tokens() == [[44, 55, 66, 99]]


def test_greedy_matches_reference_walk_on_random_trees():
    rng = random.Random(5)
    for _ in range(300):
        d = rng.randrange(1, 12)
        vocab = rng.choice([3, 6, 40])  # small vocabularies make twin siblings
        trees = [random_tree(rng, rng.randrange(0, 14), vocab) for _ in range(rng.randrange(1, 5))]
        tokens, mask = pack_trees(trees, d)
        t = tree_tensors(tokens, mask, [0] * len(trees), d)
        # Targets that often pick one of the children, so paths get long.
        target = [
            tokens[rng.randrange(len(tokens))] if rng.random() < 0.8 else rng.randrange(vocab)
            for _ in range(len(tokens))
        ]
        r = verify_tree(t, torch.tensor(target))
        for b in range(len(trees)):
            sl = slice(b * d, (b + 1) * d)
            path = reference_walk(
                tokens[sl].tolist(),
                target[sl],
                t.retrive_next_token[b].tolist(),
                t.retrive_next_sibling[b].tolist(),
            )
            assert r.accept_index[b].tolist() == path + [-1] * (d - len(path))
            assert r.accept_length[b].item() == len(path) - 1
            assert r.tokens()[b] == [target[sl][s] for s in path]
            assert r.bonus[b].item() == target[sl][path[-1]]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(0.7, 0, 1.0),
        SamplingParams(1.0, 3, 1.0),
        SamplingParams(1.0, 0, 0.8),
        SamplingParams(1.3, 5, 0.9),
        SamplingParams(0.5, 40, 0.3),
    ],
)
def test_warp_matches_transformers(params):
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(64, 32, generator=g) * 3
    logits[:, 5] = logits[:, 6]  # ties at the cut
    ids = torch.zeros((64, 1), dtype=torch.int64)
    expected = logits.clone()
    if params.temperature != 1.0:
        expected = TemperatureLogitsWarper(params.temperature)(ids, expected)
    if params.top_k:
        expected = TopKLogitsWarper(params.top_k)(ids, expected)
    if params.top_p < 1.0:
        expected = TopPLogitsWarper(params.top_p)(ids, expected)
    got = warp_logits(logits, params)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.allclose(got.softmax(-1), expected.softmax(-1), atol=1e-6)


def test_top_k_one_and_zero_temperature_are_greedy():
    rng = random.Random(7)
    trees = [random_tree(rng, 9, 5) for _ in range(16)]
    tokens, mask = pack_trees(trees, 10)
    t = tree_tensors(tokens, mask, [0] * 16, 10)
    logits = torch.randn(160, 5, generator=torch.Generator().manual_seed(7))
    greedy = verify_greedy(t, logits).tokens()
    assert verify_sampling(t, logits, SamplingParams(0.9, top_k=1)).tokens() == greedy
    assert verify(t, logits, SamplingParams(0.0)).tokens() == greedy


def test_invalid_sampling_and_shapes():
    for kwargs, field in [
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            SamplingParams(**kwargs)
        assert err.value.field == field
    t = tree_tensors([1, 2], [True, False, True, True], [0], 2)
    with pytest.raises(InvalidArgumentError) as err:
        verify_greedy(t, torch.zeros(3, 8))
    assert err.value.field == "logits"
    with pytest.raises(InvalidArgumentError) as err:
        verify_tree(t, torch.zeros(3, dtype=torch.int64))
    assert err.value.field == "target_tokens"


# --- Losslessness against an exactly known target -------------------------------------------
#
# The target is an order-2 Markov chain over a small vocabulary (logits = TABLE[prev2, prev1]),
# so the probability of any continuation is known exactly. The drafter is deterministic: its
# tree depends on the last two tokens, mixes likely and unlikely tokens, repeats a sibling
# token and leaves padding slots. Speculative sampling must reproduce the joint distribution
# of the first three generated tokens.

VOCAB, SLOTS, NEW = 6, 9, 3
PARAMS = SamplingParams(temperature=0.8, top_k=5, top_p=0.95)


def markov_table() -> torch.Tensor:
    return torch.randn(VOCAB, VOCAB, VOCAB, generator=torch.Generator().manual_seed(8)) * 1.5


def markov_draft(table: torch.Tensor, a: int, b: int) -> DraftTree:
    order = table[a, b].argsort(descending=True).tolist()
    first, second, worst = order[0], order[1], order[-1]
    tokens = [first, second, worst, first]  # the second `first` is a twin: never accepted
    parents = [-1, -1, -1, -1]
    for parent, prev in ((0, first), (1, second)):
        nxt = table[b, prev].argsort(descending=True).tolist()
        tokens += nxt[:2]
        parents += [parent, parent]
    tokens.append(table[first, tokens[4]].argmax().item())  # depth 3 under the first path
    parents.append(4)
    return DraftTree(b, tuple(tokens), tuple(parents), (1.0,) * len(tokens))


def exact_distribution(table: torch.Tensor, prompt: tuple[int, int]) -> np.ndarray:
    probs = warp_logits(table, PARAMS).softmax(-1).numpy().astype(np.float64)
    out = np.zeros((VOCAB,) * NEW)
    for seq in itertools.product(range(VOCAB), repeat=NEW):
        ctx, p = list(prompt), 1.0
        for tok in seq:
            p *= probs[ctx[-2], ctx[-1], tok]
            ctx.append(tok)
        out[seq] = p
    return out.reshape(-1)


def speculative_samples(
    table: torch.Tensor, prompt: tuple[int, int], n: int
) -> tuple[np.ndarray, float]:
    """Runs ``n`` speculative samplers in one batch until each has ``NEW`` tokens.

    Returns the counts of each 3-token sequence and the mean accepted draft tokens per step.
    """
    contexts = list(itertools.product(range(VOCAB), repeat=2))
    ctx_tokens, ctx_mask = pack_trees([markov_draft(table, a, b) for a, b in contexts], SLOTS)
    ctx_tokens = torch.from_numpy(ctx_tokens).view(len(contexts), SLOTS)
    ctx_mask = torch.from_numpy(ctx_mask).view(len(contexts), SLOTS, SLOTS)
    hist = torch.zeros((n, 2 + NEW), dtype=torch.int64)
    hist[:, :2] = torch.tensor(prompt)
    lens = torch.full((n,), 2)
    g = torch.Generator().manual_seed(9)
    accepted, steps = 0, 0
    while (active := (lens < 2 + NEW).nonzero().squeeze(1)).numel():
        rows = torch.arange(active.numel())
        last2 = hist[active, lens[active] - 2]
        last1 = hist[active, lens[active] - 1]
        ctx = last2 * VOCAB + last1
        t = tree_tensors(
            ctx_tokens[ctx].reshape(-1), ctx_mask[ctx].reshape(-1), lens[active], SLOTS
        )
        slot_tokens = t.draft_tokens.view(-1, SLOTS)
        parent_tokens = slot_tokens.gather(1, t.parents.clamp(min=0))
        parent_tokens[:, 0] = last2  # the root's predecessor is the context's
        logits = table[parent_tokens, slot_tokens]
        r = verify_sampling(t, logits, PARAMS, generator=g)
        accepted, steps = accepted + int(r.accept_length.sum()), steps + active.numel()
        for k in range(SLOTS):  # write emitted tokens while there is room
            write = (k <= r.accept_length) & (lens[active] < 2 + NEW)
            hist[active[write], lens[active[write]]] = r.accept_tokens[rows[write], k]
            lens[active[write]] += 1
    codes = (hist[:, 2:] * torch.tensor([VOCAB**2, VOCAB, 1])).sum(1)
    return np.bincount(codes.numpy(), minlength=VOCAB**NEW), accepted / steps


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """Pearson's statistic of ``counts`` against ``probs`` and its 0.999 quantile.

    Cells expected below 5 are pooled; an impossible cell that was drawn fails at once.
    """
    expected = probs * counts.sum()
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was emitted"
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, float(chi2.ppf(0.999, int(keep.sum()) - 1))


def shifted(probs: np.ndarray, mass: float = 0.02) -> np.ndarray:
    """``probs`` with ``mass`` moved from the likeliest cell to the second likeliest."""
    top = np.argsort(probs)[::-1][:2]
    out = probs.copy()
    out[top[0]] -= mass
    out[top[1]] += mass
    return out


def assert_same_law(counts: np.ndarray, probs: np.ndarray) -> None:
    """The counts fit ``probs`` and would not fit it with a 2% error (the test has power)."""
    stat, critical = chi_square(counts, probs)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    biased_stat, biased_critical = chi_square(counts, shifted(probs))
    assert biased_stat > biased_critical, f"a 2% error would go unnoticed ({biased_stat:.1f})"


def test_sampling_is_lossless_for_the_first_tokens():
    table = markov_table()
    prompt = (0, 1)
    probs = exact_distribution(table, prompt)
    counts, accepted_per_step = speculative_samples(table, prompt, 40_000)
    assert_same_law(counts, probs)
    # The drafts were really used (about one accepted token per step), so accepted and
    # rejected paths both shaped the counts.
    assert probs.sum() == pytest.approx(1.0)
    assert accepted_per_step > 0.5, accepted_per_step


# --- Chains drawn from a draft distribution ---------------------------------------------------


def chain_batch(tokens: list[list[int]]):
    """The tree tensors of one chain per row (every row as long: padding is tested apart)."""
    trees = [DraftTree(0, tuple(t), tuple(range(-1, len(t) - 1)), (1.0,) * len(t)) for t in tokens]
    d = 1 + max(len(t) for t in tokens)
    flat, mask = pack_trees(trees, d)
    return tree_tensors(flat, mask, [0] * len(trees), d)


def test_chain_sampling_is_lossless_and_accepts_one_minus_tv():
    """One drafted position, x ~ q, against a target p: the emitted first token follows p
    exactly, and drafts are accepted with probability sum(min(p, q)) = 1 - TV(p, q)."""
    n, vocab = 60_000, 5
    g = torch.Generator().manual_seed(11)
    params = SamplingParams(temperature=1.0)
    p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.5, 0.0, 0.2, 0.2])  # drafts a token p never emits, too
    drafts = torch.multinomial(q.expand(n, vocab), 1, replacement=True, generator=g)
    t = chain_batch(drafts.tolist())
    logits = p.log().expand(n, 2, vocab).clone()
    draft_probs = torch.zeros(n, 2, vocab)
    draft_probs[:, 1] = q
    r = verify_chain_sampling(t, logits, params, draft_probs, generator=g)
    first = r.accept_tokens[:, 0].numpy()
    assert_same_law(np.bincount(first, minlength=vocab), p.double().numpy())
    accept_rate = r.accept_length.float().mean().item()
    expected = float(torch.minimum(p, q).sum())
    assert abs(accept_rate - expected) < 4 * (expected * (1 - expected) / n) ** 0.5
    # an accepted draft is the emitted token; the bonus follows it
    took = r.accept_length == 1
    assert torch.equal(r.accept_tokens[took, 0], drafts[took, 0])
    assert torch.equal(r.accept_tokens[took, 1], r.bonus[took])
    assert r.accept_index[took].tolist()[0] == [0, 1]


def test_chain_sampling_rejects_undrafted_slots_and_stops_there():
    """Slots whose draft distribution is all zeros (a chain shorter than the batch's width)
    are rejected, whatever their token: the token there is drawn from p."""
    vocab = 4
    t = chain_batch([[1, 2, 3], [1, 2, 3]])
    logits = torch.full((2, 4, vocab), -30.0)
    logits[:, 0, 1] = logits[:, 1, 2] = logits[:, 2, 3] = 30.0  # p agrees with every draft
    draft_probs = torch.zeros(2, 4, vocab)
    draft_probs[0, 1:, :] = torch.eye(vocab)[[1, 2, 3]]  # row 0: the whole chain drafted
    draft_probs[1, 1, 1] = 1.0  # row 1: only its first slot
    r = verify_chain_sampling(t, logits, SamplingParams(1.0), draft_probs)
    assert r.accept_length.tolist() == [3, 1]
    assert r.tokens()[1] == [1, 2]  # the second token drawn from p at slot 1


def test_chain_sampling_refuses_greedy_shapes_and_trees():
    t = chain_batch([[1, 2]])
    logits, probs = torch.zeros(3, 4), torch.zeros(1, 3, 4)
    for args, field in [
        ((SamplingParams(0.0), probs), "params"),
        ((SamplingParams(1.0), torch.zeros(1, 2, 4)), "draft_probs"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            verify_chain_sampling(t, logits, *args)
        assert err.value.field == field
    # two children of the root are a tree, not a chain
    flat, mask = pack_trees([DraftTree(0, (1, 2), (-1, -1), (1.0, 1.0))], 3)
    branched = tree_tensors(flat, mask, [0], 3)
    probs[0, 1:, :] = 0.25
    with pytest.raises(InvalidArgumentError) as err:
        verify_chain_sampling(branched, logits, SamplingParams(1.0), probs)
    assert err.value.field == "draft_probs"
