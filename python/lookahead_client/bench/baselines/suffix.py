"""Suffix decoding: ArcticInference's ``SuffixDecodingCache`` driven as vLLM's ``suffix`` method.

vLLM (``vllm/v1/spec_decode/suffix_decoding.py``, ``SuffixDecodingProposer.propose``), for
each request of a step that sampled tokens:

1. if the request is not active: evict a cached response with the same id, then
   ``start_request(req_id, prompt)`` (builds the request's prompt tree);
2. ``add_active_response(req_id, sampled_ids)`` (the first time: the token from prefill);
3. ``speculate(req_id, last max_tree_depth tokens of prompt + output, max_spec_tokens=k,
   max_spec_factor, min_token_prob)``: a chain (``use_tree_spec`` left at False);

and requests no longer in the batch are stopped (their responses stay in the global tree).
vLLM also feeds the tokens of a request's last step before it notices the request finished,
so here a finished request's last tokens are added before ``stop_request``. Defaults are
vLLM's: ``max_tree_depth=24``, ``max_cached_requests=10000``, ``max_spec_factor=1.0``,
``min_token_prob=0.1``; ``k`` is the step's budget (vLLM's ``num_speculative_tokens``).

Needs ``arctic-inference==0.3.0`` (an sdist; see ``docs/benchmarks-replay.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_client.bench.baselines.per_request import PerRequestDrafter, chain_tree
from lookahead_client.types import DraftTree

__all__ = ["INSTALL_HINT", "SuffixDecodingDrafter"]

INSTALL_HINT = (
    "the 'suffix' drafter needs arctic-inference==0.3.0 (an sdist whose build imports torch): "
    "pip install wheel cmake nanobind==2.9.2 && "
    "PATH=$VIRTUAL_ENV/bin:$PATH pip install --no-build-isolation --no-deps "
    "arctic-inference==0.3.0"
)


class SuffixDecodingDrafter(PerRequestDrafter):
    """Suffix decoding (per-request prompt trees + a global tree of past responses).

    Args:
        max_tree_depth: vLLM's ``suffix_decoding_max_tree_depth``.
        max_cached_requests: vLLM's ``suffix_decoding_max_cached_requests``.
        max_spec_factor: vLLM's ``suffix_decoding_max_spec_factor``.
        min_token_prob: vLLM's ``suffix_decoding_min_token_prob``.

    Raises:
        ImportError: arctic-inference is not installed (the message says how to install it).
    """

    def __init__(
        self,
        max_tree_depth: int = 24,
        max_cached_requests: int = 10000,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> None:
        super().__init__()
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError as exc:
            raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
        self._cache = SuffixDecodingCache(
            max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests
        )
        self._depth = max_tree_depth
        self._factor = max_spec_factor
        self._min_prob = min_token_prob
        self._tokens: dict[str, list[int]] = {}

    def _start(self, request_id: str, prompt: Sequence[int]) -> None:
        if request_id in self._cache.cached_requests:
            self._cache.evict_cached_response(request_id)
        tokens = [int(t) for t in prompt]
        self._cache.start_request(request_id, tokens)
        self._tokens[request_id] = tokens

    def _append(self, request_id: str, tokens: Sequence[int]) -> None:
        new = [int(t) for t in tokens]
        self._cache.add_active_response(request_id, new)
        self._tokens[request_id].extend(new)

    def _draft(self, request_id: str, budget: int) -> DraftTree:
        tokens = self._tokens[request_id]
        draft = self._cache.speculate(
            request_id,
            tokens[-self._depth :],
            max_spec_tokens=budget,
            max_spec_factor=self._factor,
            min_token_prob=self._min_prob,
        )
        return chain_tree(tokens[-1], draft.token_ids, draft.probs, draft.parents)

    def _end(self, request_id: str) -> None:
        self._cache.stop_request(request_id)
        del self._tokens[request_id]

    def stats(self) -> dict[str, int | float]:
        """Base counters plus the responses held in the global tree."""
        out = super().stats()
        out["cached_responses"] = len(self._cache.cached_requests)
        return out
