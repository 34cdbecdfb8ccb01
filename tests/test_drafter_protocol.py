"""Every drafter the package ships honours the ``Drafter`` protocol as written: ``step`` takes
the engine's ``cost``, and each says whether it cuts sized shapes itself (``sizes_drafts``),
which is how the HF loop tells lookahead's drafters from the baselines (no signature sniffing)."""

from __future__ import annotations

import inspect

import pytest

from lookahead_client import AsyncRemoteDrafter, Drafter, EmbeddedDrafter, RemoteDrafter
from lookahead_client.bench.baselines import (
    SglangNgramDrafter,
    SuffixDecodingDrafter,
    VllmNgramDrafter,
)
from lookahead_client.bench.baselines.prompt_lookup import PromptLookupDrafter

SIZING = (EmbeddedDrafter, RemoteDrafter, AsyncRemoteDrafter)
WHOLE_TREES = (PromptLookupDrafter, VllmNgramDrafter, SuffixDecodingDrafter, SglangNgramDrafter)


@pytest.mark.parametrize("cls", SIZING + WHOLE_TREES, ids=lambda c: c.__name__)
def test_every_drafter_takes_the_protocols_step_arguments(cls):
    protocol = inspect.signature(Drafter.step).parameters
    own = inspect.signature(cls.step).parameters
    assert list(own) == list(protocol), cls
    assert own["cost"].default is None
    for name in ("start", "end", "stats"):
        assert callable(getattr(cls, name)), (cls, name)


@pytest.mark.parametrize("cls", SIZING + WHOLE_TREES, ids=lambda c: c.__name__)
def test_every_drafter_says_whether_it_sizes(cls):
    assert cls.sizes_drafts is (cls in SIZING)


def test_a_baseline_is_a_drafter_and_ignores_the_cost():
    from lookahead_client import EngineCost, StepRequest

    d = PromptLookupDrafter(1, 3)
    assert isinstance(d, Drafter)
    prompt = [5, 6, 7, 5, 6]
    plain = d.step([StepRequest("a", prompt=prompt, budget=4)])
    e = PromptLookupDrafter(1, 3)
    costed = e.step([StepRequest("a", prompt=prompt, budget=4)], EngineCost((1, 64), (0.01, 0.02)))
    assert plain == costed and plain[0].tokens  # 5 6 -> 7 drafted
