"""``"method": "lookahead"`` on vLLM >= 0.34: the registered speculative method's config.

vLLM imports this module in every process (its config layer reads it), so it imports no
speculator, no torch and nothing of lookahead's drafting; :mod:`.plugin` registers it.
The drafter's settings are the method's own options::

    --speculative-config '{"method": "lookahead", "num_speculative_tokens": 8,
                           "speculator_options": {"target": "unix:///run/la.sock"}}'

(the keys of :class:`~lookahead_client.engine.config.LookaheadConfig`; without
``speculator_options`` the ``LOOKAHEAD_VLLM`` environment variable, else embedded).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

from lookahead_client.engine.config import VLLM_ENV, LookaheadConfig

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig

__all__ = ["LookaheadSpeculatorConfig", "METHOD", "config_of"]

#: The name of the method in vLLM's speculative config.
METHOD = "lookahead"


def config_of(options: dict[str, Any] | None) -> LookaheadConfig:
    """The drafter's settings from the method's ``speculator_options`` (None: the
    ``LOOKAHEAD_VLLM`` variable, else embedded defaults).

    Raises:
        InvalidArgumentError: an unknown key or a bad value, naming it.
    """
    if options is None:
        return LookaheadConfig.from_env(VLLM_ENV) or LookaheadConfig()
    return LookaheadConfig.from_json(json.dumps(options), source="speculator_options")


class LookaheadSpeculatorConfig(SpeculatorConfig):
    """Lookahead as a model-free vLLM speculator (see the module docstring)."""

    speculator_class: ClassVar[str | None] = "lookahead_client.vllm.speculator.LookaheadSpeculator"
    supported_options: ClassVar[frozenset[str]] = frozenset({"speculator_options"})
    # The drafter reads each request's whole history.
    prefer_dense_token_history: ClassVar[bool] = True
    # Confidences are the core's calibrated probabilities, not draft logits.
    adaptive_verification_uses_draft_logits: ClassVar[bool] = False

    @classmethod
    def configure(cls, spec: SpeculativeConfig) -> None:
        super().configure(spec)
        if spec.num_speculative_tokens is None:
            spec.num_speculative_tokens = 8

    @classmethod
    def apply_options(cls, spec: SpeculativeConfig) -> None:
        """Refuses bad drafter settings at start, naming the key."""
        config_of(spec.speculator_options)
