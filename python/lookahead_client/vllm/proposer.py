"""``LookaheadProposer``: vLLM's ``custom_class`` speculative proposer, drafting with lookahead.

vLLM builds it in the process of its model runner (the engine-core process by default) from
``speculative_config={"method": "custom_class", "model":
"lookahead_client.vllm.LookaheadProposer", "num_speculative_tokens": K}``, and calls
:meth:`LookaheadProposer.propose` after every step with the rows of its token table. Each
step it:

1. ends in the drafter the requests vLLM finished or aborted (see :mod:`.hook`);
2. feeds the drafter every drafted request's new tokens, exactly once, through the shared
   :class:`~lookahead_client.engine.book.RequestBook` (rows are mapped to vLLM's request ids,
   so a row that changes hands never mixes two requests; a preempted request keeps its
   drafter state and resumes it);
3. asks the drafter for a chain of at most ``K`` tokens per request, at the request's
   temperature, behind a deadline (:class:`~lookahead_client.engine.guard.DraftGuard`): slow,
   down or wrong gives empty drafts for that step, never an error. With ``sizing`` on (the
   default) the core cuts the chains to the lengths that maximise the batch's expected tokens
   per second against this engine's own measured step times
   (:class:`~lookahead_client.engine.step_cost.StepCostFeed`): zero where drafting does not
   pay.

Which drafter: the ``LOOKAHEAD_VLLM`` environment variable, the JSON of
:class:`~lookahead_client.engine.config.LookaheadConfig` (unset or ``{}``: embedded).

Tensor parallel: vLLM builds a proposer on every rank of the last stage, but the scheduler
takes the drafts of rank 0 only and sends them to every rank with the next step; so only
tensor-parallel rank 0 builds a drafter (and talks to a server), the other ranks propose
nothing.
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lookahead_client.engine.book import RequestBook
from lookahead_client.engine.config import VLLM_ENV, LookaheadConfig
from lookahead_client.engine.guard import DraftGuard
from lookahead_client.engine.step_cost import StepCostFeed
from lookahead_client.vllm import hook
from lookahead_client.vllm.cpu_sampling import repair_expand
from lookahead_client.vllm.drafting import ChainDrafting, Row
from lookahead_client.vllm.parallel import tensor_parallel_group, tensor_parallel_rank
from lookahead_client.vllm.versions import check_version

__all__ = ["LookaheadProposer"]

_log = logging.getLogger("lookahead_client.vllm")

# Batch sizes of the proposer's timing histogram: 1, 2-3, 4-7, 8-15, ...
_BS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _Timing:
    """The proposer's own seconds per call, and the engine's step seconds, by batch size;
    with the median and 99th percentile of the proposer's calls (a mean hides whether a few
    long calls or every call make it up), over the last calls of each size."""

    #: Calls kept per batch size for the percentiles.
    KEPT = 4096

    def __init__(self) -> None:
        # plain lists: a call adds to them on the engine's step
        self.calls = [0] * len(_BS_BUCKETS)
        self.proposer = [0.0] * len(_BS_BUCKETS)
        self.engine = [0.0] * len(_BS_BUCKETS)
        self.recent: list[collections.deque[float]] = [
            collections.deque(maxlen=self.KEPT) for _ in _BS_BUCKETS
        ]

    def add(self, rows: int, proposer: float, engine: float | None) -> None:
        b = max(0, bisect.bisect_right(_BS_BUCKETS, rows) - 1)
        self.calls[b] += 1
        self.proposer[b] += proposer
        self.engine[b] += engine or 0.0
        self.recent[b].append(proposer)

    def stats(self) -> dict[str, dict[str, float]]:
        out = {}
        for b, n in enumerate(self.calls):
            if n:
                p50, p99 = np.percentile(np.asarray(self.recent[b]), (50, 99))
                out[str(_BS_BUCKETS[b])] = {
                    "calls": int(n),
                    "proposer_ms": round(float(1e3 * self.proposer[b] / n), 4),
                    "proposer_p50_ms": round(float(1e3 * p50), 4),
                    "proposer_p99_ms": round(float(1e3 * p99), 4),
                    "engine_step_ms": round(float(1e3 * self.engine[b] / n), 4),
                }
        return out


class LookaheadProposer:
    """vLLM's proposer interface over a lookahead drafter (see the module docstring).

    Args:
        vllm_config: vLLM's ``VllmConfig`` (its ``speculative_config`` gives ``K``).
        config: where drafts come from; None reads :data:`VLLM_ENV` (embedded when unset).

    Raises:
        InvalidArgumentError: :data:`VLLM_ENV` holds an invalid config (naming the key).
    """

    def __init__(self, vllm_config: Any, config: LookaheadConfig | None = None) -> None:
        in_vllm = check_version("custom_class") is not None
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.config = config or LookaheadConfig.from_env(VLLM_ENV) or LookaheadConfig()
        # Set by the hook at every step (see .hook).
        self._batch: Any = None
        self._schedule: Any = None
        self._step_started: float | None = None
        # When the last call returned: a step is timed from there to the next call.
        self._returned_at: float | None = None
        self._finished: set[str] = set()
        self._timing = _Timing()
        # vLLM's CPU backend verifies sampled rows wrong until repaired (every rank samples)
        self._sampled_rows_ok = not in_vllm or repair_expand()
        self.rank = tensor_parallel_rank(tensor_parallel_group())
        self._drafting: ChainDrafting | None = None
        self._hooked = False
        if self.rank != 0:
            return
        self._drafting = ChainDrafting(
            self.config, k=self.k, vocab_size=self.vocab_size, max_model_len=self.max_model_len
        )
        self._hooked = hook.install()
        _log.info(
            "lookahead: vLLM drafts come from %s (K=%d, sizing %s)",
            self.config.describe(),
            self.k,
            "on" if self.config.sizing else "off",
        )

    @property
    def drafting(self) -> ChainDrafting:
        """The drafting of this proposer.

        Raises:
            RuntimeError: on a tensor-parallel rank other than 0, which has no drafter.
        """
        if self._drafting is None:
            raise RuntimeError(f"tensor-parallel rank {self.rank} has no lookahead drafter")
        return self._drafting

    @property
    def guard(self) -> DraftGuard:
        """The deadline guard around the drafter."""
        return self.drafting.guard

    @property
    def book(self) -> RequestBook:
        """Which tokens of each request the drafter holds."""
        return self.drafting.book

    @property
    def cost(self) -> StepCostFeed | None:
        """The engine's measured step times (None without sizing)."""
        return self.drafting.cost

    # -- vLLM's interface -------------------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: lookahead drafts without a model."""

    def scheduled(self, input_batch: Any, scheduler_output: Any, started: float | None) -> None:
        """Called by :mod:`.hook` as every engine step begins."""
        self._batch = input_batch
        self._schedule = scheduler_output
        self._step_started = started
        finished = getattr(scheduler_output, "finished_req_ids", None)
        if finished:
            self._finished.update(finished)

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """The draft chain of each row (``[]``: no draft), at most ``K`` tokens each.

        Args:
            sampled_token_ids: per row, the tokens this step emitted (empty for a request
                still in prefill).
            num_tokens_no_spec: per row, the tokens the request holds.
            token_ids_cpu: the token table (row ``i``: prompt then outputs).
            slot_mappings: unused.
        """
        rows = len(sampled_token_ids)
        if self._drafting is None:
            return [[] for _ in range(rows)]  # not rank 0: vLLM uses rank 0's drafts
        started = time.perf_counter()
        engine = None
        if self._step_started is not None and self._returned_at is not None:
            if self._step_started >= self._returned_at:  # one step since the last answer
                # the whole step, from the last answer to this call: the scheduler and the
                # output handling cost every step too, not only the forward pass
                engine = started - self._returned_at
        try:
            drafts = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, engine)
        except Exception as e:  # noqa: BLE001 - a bug here must not fail the generation
            self.drafting.warn("internal", "lookahead drafting failed: %s: %s", type(e).__name__, e)
            drafts = [[] for _ in range(rows)]
        self._returned_at = time.perf_counter()
        self._timing.add(rows, self._returned_at - started, engine)
        self._step_started = None
        return drafts

    # -- one step ---------------------------------------------------------------------------

    def _propose(
        self,
        sampled: Sequence[Sequence[int]],
        num_tokens: np.ndarray,
        table: np.ndarray,
        engine_seconds: float | None,
    ) -> list[list[int]]:
        rows = len(sampled)
        out: list[list[int]] = [[] for _ in range(rows)]
        batch = self._batch
        warn = self.drafting.warn
        if batch is None:
            warn(
                "ids",
                "lookahead got no request ids from vLLM (hook %s); no drafts",
                "installed" if self._hooked else "not installed",
            )
            return out
        req_ids = list(batch.req_ids)
        if len(req_ids) < rows:
            warn("rows", "vLLM passed %d rows for %d requests; no drafts", rows, len(req_ids))
            return out
        self.drafting.end(self._finished)
        self._finished.clear()
        self._observe(req_ids, sampled, num_tokens, engine_seconds)
        if not self.drafting.begin():
            return out
        prompt_lens = batch.num_prompt_tokens
        temperatures = _temperatures(batch, rows)
        views = []
        for i in range(rows):
            n = int(num_tokens[i])
            room = self.max_model_len - n - 1
            if not sampled[i] or room <= 0:
                continue  # in prefill, or no room for a draft
            if temperatures[i] > 0 and not self._sampled_rows_ok:
                continue  # vLLM would verify it wrong (see .cpu_sampling)
            p = int(prompt_lens[i])
            views.append(Row(i, req_ids[i], table[i, :p], table[i, p:n], temperatures[i], room))
        for chain in self.drafting.step(views):
            out[chain.row] = chain.tokens
        return out

    def _observe(
        self,
        req_ids: list[str],
        sampled: Sequence[Sequence[int]],
        num_tokens: np.ndarray,
        engine_seconds: float | None,
    ) -> None:
        """Feeds the cost curve the step that just ran (its tokens and seconds)."""
        schedule = self._schedule
        per_request = (getattr(schedule, "num_scheduled_tokens", None) or {}) if schedule else {}
        context = pairs = 0
        for i, rid in enumerate(req_ids[: len(sampled)]):
            s = int(per_request.get(rid, 0))
            n = int(num_tokens[i])
            context += n
            pairs += s * (n + s)
        self.drafting.observe(
            int(getattr(schedule, "total_num_scheduled_tokens", 0)),
            engine_seconds,
            rows=len(sampled),
            context=context,
            pairs=pairs,
            scheduled=per_request,
            decoding=[rid for rid, s in zip(req_ids, sampled, strict=False) if s],
        )

    # -- observability ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of :class:`ChainDrafting`, and the proposer's own time per call against
        the engine's step time, by batch size (none on tensor-parallel ranks other than 0)."""
        if self._drafting is None:
            return {"rank": self.rank, "drafter": None}
        out = self.drafting.stats()
        out["rank"] = self.rank
        out["timing"] = self._timing.stats()
        return out

    def __repr__(self) -> str:
        if self._drafting is None:
            return f"LookaheadProposer(K={self.k}, rank={self.rank}, no drafter)"
        steps = self._drafting.session.steps
        return f"LookaheadProposer(K={self.k}, {self.config.describe()}, steps={steps})"


def _temperatures(batch: Any, rows: int) -> list[float]:
    """Each row's sampling temperature (0: greedy) from vLLM's input batch (greedy rows hold
    0 or a negative marker there); zeros when the batch has none."""
    temperature = getattr(batch, "temperature_cpu", None)
    if temperature is None:
        return [0.0] * rows
    return [max(float(t), 0.0) for t in temperature[:rows].tolist()]
