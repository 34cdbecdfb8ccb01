"""Chains cut from draft trees: the best path, paths drawn from the tree, their draft_probs."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from lookahead_client.errors import InvalidArgumentError
from lookahead_client.hf.chains import best_chain, draft_probs_tensor, sample_chain
from lookahead_client.types import DraftTree

# root -> 10 (0.6) -> 12 (0.5), 13 (0.1); root -> 11 (0.3) -> 14 (0.3); root -> 15 (0.0)
TREE = DraftTree(7, (10, 11, 15, 12, 13, 14), (-1, -1, -1, 0, 0, 1), (0.6, 0.3, 0.0, 0.5, 0.1, 0.3))


def test_best_chain_follows_the_likeliest_child():
    chain = best_chain(TREE, 8)
    assert (chain.root, chain.tokens, chain.parents) == (7, (10, 12), (-1, 0))
    assert chain.scores == (0.6, 0.5)
    assert best_chain(TREE, 1).tokens == (10,)
    assert best_chain(TREE, 0).tokens == ()
    assert best_chain(DraftTree.empty(7), 8).tokens == ()


def test_sampled_chains_are_drawn_in_proportion_to_the_scores():
    rng = random.Random(3)
    n = 20_000
    draws = [sample_chain(TREE, 8, rng) for _ in range(n)]
    paths = Counter(d.chain.tokens for d in draws)
    # P(10, 12) = 0.6/0.9 * 0.5/0.6; P(10, 13) = 0.6/0.9 * 0.1/0.6; P(11, 14) = 0.3/0.9
    for path, prob in [((10, 12), 5 / 9), ((10, 13), 1 / 9), ((11, 14), 1 / 3)]:
        assert abs(paths[path] / n - prob) < 4 * (prob * (1 - prob) / n) ** 0.5, path
    assert paths[(15,)] == 0  # a score of 0 is never drawn beside positive ones
    first = next(d for d in draws if d.chain.tokens == (10, 13))
    assert first.chain.parents == (-1, 0)
    assert first.support == ((10, 11, 15), (12, 13))
    assert first.probs[0] == pytest.approx((2 / 3, 1 / 3, 0.0))
    assert first.probs[1] == pytest.approx((5 / 6, 1 / 6))
    assert sample_chain(TREE, 1, rng).chain.tokens in {(10,), (11,)}


def test_draft_probs_tensor_places_each_draw_under_its_slot():
    rng = random.Random(4)
    twins = DraftTree(7, (5, 5, 6), (-1, -1, 0), (0.5, 0.25, 0.5))  # equal siblings add up
    draws = [sample_chain(TREE, 8, rng), sample_chain(twins, 8, rng)]
    probs = draft_probs_tensor(draws, 4, 16)
    assert probs.shape == (2, 4, 16)
    assert torch.equal(probs[:, 0], torch.zeros(2, 16))  # the root is not drafted
    assert probs[0, 1, [10, 11, 15]].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert probs[1, 1, 5].item() == pytest.approx(1.0)
    assert probs[:, 1].sum(-1).tolist() == pytest.approx([1.0, 1.0])
    assert torch.equal(probs[:, 3], torch.zeros(2, 16))  # past both chains
    with pytest.raises(InvalidArgumentError) as err:
        draft_probs_tensor(draws, 2, 16)
    assert err.value.field == "num_slots"
    with pytest.raises(InvalidArgumentError) as err:
        draft_probs_tensor(draws, 4, 12)
    assert err.value.field == "vocab_size"
    with pytest.raises(InvalidArgumentError) as err:
        best_chain(TREE, -1)
    assert err.value.field == "length"
