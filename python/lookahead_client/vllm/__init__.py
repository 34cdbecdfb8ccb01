"""Lookahead drafting for vLLM.

On vLLM >= 0.34 it is a registered speculative method (this package's ``vllm.general_plugins``
entry point registers it; see :mod:`.method`)::

    LLM(model=M, speculative_config={"method": "lookahead", "num_speculative_tokens": 8})

On vLLM 0.32/0.33 it is the ``custom_class`` speculative proposer, from ``LLM(...)`` or
``vllm serve``::

    LLM(model=M, speculative_config={
        "method": "custom_class",
        "model": "lookahead_client.vllm.LookaheadProposer",
        "num_speculative_tokens": 8,
    })

The drafter is configured by the ``LOOKAHEAD_VLLM`` environment variable (the JSON of
:class:`~lookahead_client.engine.config.LookaheadConfig`; unset or ``{}``: embedded,
``{"target": "unix:///run/la.sock"}``: a ``lookahead-server``). See docs/vllm.md.

vLLM is an optional dependency: :class:`LookaheadProposer` imports it only when vLLM builds
one (this package's top level imports neither vLLM nor torch).
"""

from __future__ import annotations

from typing import Any

from lookahead_client.engine.config import VLLM_ENV

__all__ = ["VLLM_ENV", "LookaheadProposer", "PROPOSER_PATH", "proposer_stats", "speculator_stats"]

#: The value of ``speculative_config["model"]`` that selects lookahead.
PROPOSER_PATH = "lookahead_client.vllm.LookaheadProposer"


def proposer_stats(worker: Any) -> dict[str, Any] | None:
    """The counters of a vLLM worker's lookahead proposer (None: it has none).

    For ``LLM.collective_rpc(proposer_stats)``, which runs it in every worker process.
    """
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    stats = getattr(drafter, "stats", None)
    return stats() if callable(stats) and hasattr(drafter, "scheduled") else None


def speculator_stats(worker: Any) -> dict[str, Any] | None:
    """The counters of a vLLM 0.34 worker's lookahead speculator (None: it has none).

    For ``LLM.collective_rpc(speculator_stats)``, which runs it in every worker process.
    """
    speculator = getattr(getattr(worker, "model_runner", None), "speculator", None)
    stats = getattr(speculator, "stats", None)
    return stats() if callable(stats) and hasattr(speculator, "drafting") else None


def __getattr__(name: str) -> Any:
    """Resolves :class:`LookaheadProposer` on first use."""
    if name == "LookaheadProposer":
        from lookahead_client.vllm.proposer import LookaheadProposer

        return LookaheadProposer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
