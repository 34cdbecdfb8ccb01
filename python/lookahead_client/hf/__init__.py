"""Lookahead in a Hugging Face ``transformers`` loop: speculative generation with draft trees
(or chains) verified in one forward pass per step, for models that run outside an engine.

* :mod:`.generate`: :func:`speculative_generate`, the loop;
* :mod:`.verify`: greedy and lossless-sampling verification of trees and chains;
* :mod:`.chains`: chains cut from draft trees (a chain-verifying engine's view);
* :mod:`.sizing`: how many draft nodes a step is worth, for drafters that do not size their
  own trees (lookahead's drafters size in the core, ``rust/lookahead-core/src/sizing.rs``).

Engines (SGLang, vLLM) use none of this: their integrations are :mod:`lookahead_client.sglang`
and :mod:`lookahead_client.vllm`. The loop is imported when first used, so that
:mod:`.sizing` and :mod:`.verify` import without the native extension (a bare GPU machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .generate import DRAFT_MODES, GenerationResult, default_policy, speculative_generate

__all__ = ["DRAFT_MODES", "GenerationResult", "default_policy", "speculative_generate"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'lookahead_client.hf' has no attribute {name!r}")
    value = getattr(importlib.import_module("lookahead_client.hf.generate"), name)
    globals()[name] = value
    return value
