"""vLLM's plugin hook (the ``vllm.general_plugins`` entry point of this package).

vLLM runs it in every process at start. On vLLM >= 0.34 it registers ``"method":
"lookahead"``; older vLLMs have no registry and take lookahead as a ``custom_class``
proposer instead (:mod:`.proposer`), so there it does nothing.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """Registers the ``lookahead`` speculative method where vLLM has the registry."""
    try:
        from vllm.v1.worker.gpu.spec_decode.speculator_config import (
            register_speculative_method,
        )
    except ImportError:
        return  # vLLM < 0.34: custom_class
    register_speculative_method(
        "lookahead", "lookahead_client.vllm.method.LookaheadSpeculatorConfig"
    )
