"""Drafter names for ``lookahead-bench --drafter NAME``: each maps to a factory.

A factory gets :class:`DrafterOptions` (the budget of the run, the server address) and returns
a fresh object following the ``Drafter`` protocol. Optional engines are imported inside the
factories and checks, so naming a drafter whose package is missing fails with an install hint
and nothing else is affected.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from lookahead_client.types import Drafter

__all__ = ["DRAFTERS", "DrafterOptions", "DrafterSpec", "UnknownDrafterError", "get_spec"]


class UnknownDrafterError(ValueError):
    """No drafter has that name."""


@dataclass(frozen=True, slots=True)
class DrafterOptions:
    """What a factory may need.

    Attributes:
        budget: the run's draft budget (SGLang sizes its output by it).
        target: the server address for ``remote`` (e.g. ``unix:///tmp/lookahead.sock``).
        sglang_capacity: trie nodes preallocated by the ``sglang`` drafters (SGLang's
            ``--speculative-ngram-capacity``; the server default is 10,000,000, the
            ``NgramCorpus`` class default 1,000,000).
    """

    budget: int
    target: str | None = None
    sglang_capacity: int = 10_000_000


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    """A named drafter.

    Attributes:
        name: the ``--drafter`` value.
        summary: one line for ``--help`` and the docs.
        factory: makes a fresh drafter.
        check: raises ``ImportError`` (with an install hint) or ``ValueError`` when the drafter
            cannot be made here; cheap enough to call before a run.
    """

    name: str
    summary: str
    factory: Callable[[DrafterOptions], Drafter]
    check: Callable[[DrafterOptions], None]


def _lookahead(_: DrafterOptions) -> Drafter:
    from lookahead_client import EmbeddedDrafter

    return EmbeddedDrafter()


def _check_lookahead(_: DrafterOptions) -> None:
    try:
        from lookahead_client import EmbeddedDrafter  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the 'lookahead' drafter needs the native extension (maturin develop): {exc}"
        ) from exc


def _prompt_lookup(_: DrafterOptions) -> Drafter:
    from .baselines import VllmNgramDrafter

    return VllmNgramDrafter(min_n=1, max_n=5)


def _prompt_lookup_recent(_: DrafterOptions) -> Drafter:
    from lookahead_client.bench.baselines.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter(min_ngram=1, max_ngram=3)


def _suffix(_: DrafterOptions) -> Drafter:
    from .baselines import SuffixDecodingDrafter

    return SuffixDecodingDrafter()


def _check_suffix(_: DrafterOptions) -> None:
    from .baselines.suffix import INSTALL_HINT

    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc


def _sglang(options: DrafterOptions) -> Drafter:
    from .baselines import SglangNgramDrafter

    return SglangNgramDrafter(options.budget, capacity=options.sglang_capacity)


def _sglang_prompt(options: DrafterOptions) -> Drafter:
    from .baselines import SglangNgramDrafter

    return SglangNgramDrafter(options.budget, insert_prompt=True, capacity=options.sglang_capacity)


def _check_sglang(_: DrafterOptions) -> None:
    from .baselines.sglang_ngram import _load_corpus_class

    _load_corpus_class()


def _remote_class() -> type:
    """``lookahead_client.RemoteDrafter`` (from its module while the package does not export it)."""
    try:
        from lookahead_client import RemoteDrafter
    except ImportError:
        try:
            from lookahead_client.remote import RemoteDrafter
        except ImportError as exc:
            raise ImportError(
                f"the 'remote' drafter needs lookahead_client.RemoteDrafter: {exc}"
            ) from exc
    return RemoteDrafter


def _remote(options: DrafterOptions) -> Drafter:
    # A fresh namespace per drafter: private replicas must not share, and one run must not
    # learn from the last. A generous deadline: the replay measures acceptance, and a step that
    # fell back to an empty tree would silently lower MAT.
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    return _remote_class()(options.target, namespace=namespace, timeout=30.0)


def _check_remote(options: DrafterOptions) -> None:
    _remote_class()
    if not options.target:
        raise ValueError("the 'remote' drafter needs --target (e.g. unix:///tmp/lookahead.sock)")


def _no_check(_: DrafterOptions) -> None:
    return None


DRAFTERS: dict[str, DrafterSpec] = {
    spec.name: spec
    for spec in (
        DrafterSpec(
            "lookahead",
            "lookahead's embedded drafter (EmbeddedDrafter() defaults)",
            _lookahead,
            _check_lookahead,
        ),
        DrafterSpec(
            "prompt-lookup",
            "vLLM's ngram proposer: prompt_lookup_min=1, max=5, earliest occurrence, one chain",
            _prompt_lookup,
            _no_check,
        ),
        DrafterSpec(
            "prompt-lookup-recent",
            "the workloads README's sanity drafter: n=3..1, most recent occurrence, one chain",
            _prompt_lookup_recent,
            _no_check,
        ),
        DrafterSpec(
            "suffix",
            "ArcticInference suffix decoding (arctic-inference 0.3.0) with vLLM's settings",
            _suffix,
            _check_suffix,
        ),
        DrafterSpec(
            "sglang",
            "SGLang 0.5.23 NGRAM corpus as its worker drives it (server defaults)",
            _sglang,
            _check_sglang,
        ),
        DrafterSpec(
            "sglang-prompt",
            "SGLang NGRAM plus the whole prompt inserted when a request starts",
            _sglang_prompt,
            _check_sglang,
        ),
        DrafterSpec(
            "remote",
            "lookahead-server over gRPC (RemoteDrafter(--target))",
            _remote,
            _check_remote,
        ),
    )
}


def get_spec(name: str) -> DrafterSpec:
    """The drafter called ``name``.

    Raises:
        UnknownDrafterError: no such name (the message lists the known ones).
    """
    try:
        return DRAFTERS[name]
    except KeyError:
        raise UnknownDrafterError(
            f"unknown drafter {name!r}; known: {', '.join(DRAFTERS)}"
        ) from None
