"""Baseline drafters for the replay benchmark, each following the ``Drafter`` protocol.

* :class:`VllmNgramDrafter`: vLLM's n-gram (prompt lookup) proposer.
* :class:`SuffixDecodingDrafter`: ArcticInference's suffix decoding as vLLM drives it.
* :class:`SglangNgramDrafter`: SGLang's NGRAM corpus as its worker drives it.

The last two import their engines lazily (they are optional dependencies).
"""

from .sglang_ngram import SglangNgramDrafter
from .suffix import SuffixDecodingDrafter
from .vllm_ngram import VllmNgramDrafter

__all__ = ["SglangNgramDrafter", "SuffixDecodingDrafter", "VllmNgramDrafter"]
