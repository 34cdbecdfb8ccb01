"""The pure-Python prompt-lookup drafter."""

from __future__ import annotations

import pytest

from lookahead_client.bench.baselines.prompt_lookup import PromptLookupDrafter
from lookahead_client.errors import (
    InvalidArgumentError,
    RequestAlreadyActiveError,
    UnknownRequestError,
)
from lookahead_client.types import Drafter, StepRequest


def test_drafts_the_continuation_of_the_latest_match():
    d = PromptLookupDrafter(max_ngram=3)
    assert isinstance(d, Drafter)
    # "1 2 3" occurs twice earlier; the latest occurrence (followed by 7 8) wins.
    [tree] = d.step([StepRequest("a", prompt=[1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3], budget=4)])
    assert (tree.root, tree.tokens, tree.parents) == (3, (7, 8, 9, 1), (-1, 0, 1, 2))
    # New tokens extend the context; the budget cuts the chain.
    [tree] = d.step([StepRequest("a", new_tokens=[7], budget=2)])
    assert (tree.root, tree.tokens) == (7, (8, 9))


def test_falls_back_to_shorter_suffixes_and_to_nothing():
    d = PromptLookupDrafter(min_ngram=1, max_ngram=3)
    d.start("a", [5, 6, 9, 6])
    [tree] = d.step([StepRequest("a", budget=8)])
    assert tree.tokens == (9, 6)  # only the last token "6" matched
    d.start("b", [1, 2, 3])
    [tree] = d.step([StepRequest("b", budget=8)])
    assert len(tree) == 0 and tree.root == 3
    strict = PromptLookupDrafter(min_ngram=2, max_ngram=2)
    [tree] = strict.step([StepRequest("c", prompt=[5, 6, 9, 6], budget=8)])
    assert len(tree) == 0


def test_lifecycle_and_errors():
    d = PromptLookupDrafter()
    d.start("a", [1, 2, 1])
    with pytest.raises(RequestAlreadyActiveError):
        d.start("a", [1])
    [tree] = d.step([StepRequest("a", new_tokens=[2], finished=True)])
    assert len(tree) == 0
    assert d.stats()["active_requests"] == 0
    with pytest.raises(UnknownRequestError) as err:
        d.step([StepRequest("a", new_tokens=[1])])
    assert err.value.field == "request_id"
    with pytest.raises(UnknownRequestError):
        d.end("a")
    with pytest.raises(InvalidArgumentError) as err:
        d.step([StepRequest("b", prompt=[1], budget=-1)])
    assert err.value.field == "budget"
    for kwargs, field in [({"min_ngram": 0}, "min_ngram"), ({"max_ngram": 0}, "max_ngram")]:
        with pytest.raises(InvalidArgumentError) as err:
            PromptLookupDrafter(**kwargs)
        assert err.value.field == field
