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
3. asks the drafter for a tree per request, behind a deadline
   (:class:`~lookahead_client.engine.guard.DraftGuard`): slow, down or wrong gives empty
   drafts for that step, never an error;
4. turns each tree into its best chain (:func:`~.chains.best_chain`), up to ``K`` tokens;
   with ``sizing`` on, a ragged :class:`~lookahead_client.sizing.SizingPolicy` cuts the
   chains to the lengths that maximise the batch's expected tokens per second, with a cost
   model learnt from this engine's own step times (zero for everyone when drafting does not
   pay).

Which drafter: the ``LOOKAHEAD_VLLM`` environment variable, the JSON of
:class:`~lookahead_client.engine.config.LookaheadConfig` (unset or ``{}``: embedded).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lookahead_client.engine.book import RequestBook, RequestView
from lookahead_client.engine.checks import tree_problem
from lookahead_client.engine.config import VLLM_ENV, LookaheadConfig
from lookahead_client.engine.guard import guard_for
from lookahead_client.engine.warn_once import WarnOnce
from lookahead_client.sizing import SizingPlan, SizingPolicy
from lookahead_client.types import DraftTree
from lookahead_client.vllm import hook
from lookahead_client.vllm.chains import best_chain

__all__ = ["LookaheadProposer"]

_log = logging.getLogger("lookahead_client.vllm")

# The tree each chain is chosen from has this many nodes per speculative token (a wider tree
# offers better paths; the drafter's time grows with it), and at most _MAX_TREE.
_TREE_FACTOR = 4
_MAX_TREE = 64
# Batch sizes of the proposer's timing histogram: 1, 2-3, 4-7, 8-15, ...
_BS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _Timing:
    """The proposer's own seconds per call, and the engine's step seconds, by batch size."""

    def __init__(self) -> None:
        self.calls = np.zeros(len(_BS_BUCKETS), dtype=np.int64)
        self.proposer = np.zeros(len(_BS_BUCKETS))
        self.engine = np.zeros(len(_BS_BUCKETS))

    def add(self, rows: int, proposer: float, engine: float | None) -> None:
        b = max(0, int(np.searchsorted(_BS_BUCKETS, rows, side="right")) - 1)
        self.calls[b] += 1
        self.proposer[b] += proposer
        self.engine[b] += engine or 0.0

    def stats(self) -> dict[str, dict[str, float]]:
        out = {}
        for b, n in enumerate(self.calls):
            if n:
                out[str(_BS_BUCKETS[b])] = {
                    "calls": int(n),
                    "proposer_ms": round(float(1e3 * self.proposer[b] / n), 4),
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
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.config = config or LookaheadConfig.from_env(VLLM_ENV) or LookaheadConfig()
        tree_budget = min(_MAX_TREE, _TREE_FACTOR * self.k)
        drafter = self.config.build_drafter(
            num_slots=tree_budget + 1,
            vocab_size=self.vocab_size,
            context_len=self.max_model_len,
        )
        self.guard = guard_for(self.config, drafter)
        self.book = RequestBook(budget=tree_budget)
        # The cost model learns from every engine step (see _observe), whose token counts
        # vary with the batch and prefill chunks; probing sizes on purpose (explore) would
        # cost whole verification steps of the widest chains on a CPU.
        self.policy = (
            SizingPolicy(layout="ragged", learn_cost=False, explore=False)
            if self.config.sizing
            else None
        )
        self._warn = WarnOnce(_log)
        self._hooked = hook.install()
        # Set by the hook at every step (see .hook).
        self._batch: Any = None
        self._schedule: Any = None
        self._step_started: float | None = None
        self._finished: set[str] = set()
        # The last step's sizing plan and the request id of each of its chains.
        self._last_plan: SizingPlan | None = None
        self._last_keys: list[str] = []
        self._timing = _Timing()
        self.steps = 0
        self.drafted_requests = 0
        self.draft_tokens = 0
        _log.info(
            "lookahead: vLLM drafts come from %s (K=%d, trees of %d, sizing %s)",
            self.config.describe(),
            self.k,
            tree_budget,
            "on" if self.policy else "off",
        )

    # -- vLLM's interface -------------------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: lookahead drafts without a model."""

    def scheduled(self, input_batch: Any, scheduler_output: Any, started: float) -> None:
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
        started = time.perf_counter()
        engine = None if self._step_started is None else started - self._step_started
        rows = len(sampled_token_ids)
        try:
            drafts = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, engine)
        except Exception as e:  # noqa: BLE001 - a bug here must not fail the generation
            self._warn("internal", "lookahead drafting failed: %s: %s", type(e).__name__, e)
            self._last_plan = None
            drafts = [[] for _ in range(rows)]
        self.steps += 1
        self._timing.add(rows, time.perf_counter() - started, engine)
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
        if batch is None:
            self._warn(
                "ids",
                "lookahead got no request ids from vLLM (hook %s); no drafts",
                "installed" if self._hooked else "not installed",
            )
            return out
        req_ids = list(batch.req_ids)
        if len(req_ids) < rows:
            self._warn("rows", "vLLM passed %d rows for %d requests; no drafts", rows, len(req_ids))
            return out
        for rid in self._finished:
            self.book.forget(rid)
            if self.policy is not None:
                self.policy.end(rid)
        self._finished.clear()
        self._observe(req_ids, sampled, num_tokens, engine_seconds)

        guard = self.guard
        for plan, outcome in guard.collect():
            self.book.commit(plan, outcome.failed)
        if not guard.ready:
            guard.skip()
            return out
        views, view_rows = [], []
        prompt_lens = batch.num_prompt_tokens
        for i in range(rows):
            n = int(num_tokens[i])
            if not sampled[i] or n + 1 >= self.max_model_len:
                continue  # in prefill, or no room for a draft
            p = int(prompt_lens[i])
            views.append(RequestView(req_ids[i], table[i, :p], table[i, p:n]))
            view_rows.append(i)
        plan = self.book.plan(views)
        if not plan.requests:
            return out
        outcome = guard.run(plan.requests, token=plan)
        if outcome.late:
            return out
        self.book.commit(plan, outcome.failed)
        if outcome.trees is None:
            return out

        chains: list[DraftTree] = []
        kept: list[tuple[int, int]] = []  # (view index, row)
        for j, i in enumerate(view_rows):
            index = plan.live[j]
            tree = None
            if index >= 0 and not (outcome.failed and index in outcome.failed):
                tree = outcome.trees[index]
                root = int(table[i, int(num_tokens[i]) - 1])
                problem = tree_problem(tree, root, self.vocab_size)
                if problem is not None:
                    kind, message = problem
                    self._warn(kind, "request %s: %s", req_ids[i], message)
                    if kind == "root":
                        self.book.resync(req_ids[i])  # the drafter's copy is wrong
                    tree = None
            if tree is None:
                self.book.fed(plan, j, -1)
                continue
            room = self.max_model_len - int(num_tokens[i]) - 1
            chains.append(best_chain(tree, min(self.k, room)))
            kept.append((j, i))
        if self.policy is not None and chains:
            sizing = self.policy.plan(
                chains,
                [int(num_tokens[i]) for _, i in kept],
                max_nodes=self.k,
                requests=[req_ids[i] for _, i in kept],
            )
            chains = sizing.trees
            self._last_plan, self._last_keys = sizing, [req_ids[i] for _, i in kept]
        for (j, i), chain in zip(kept, chains, strict=True):
            self.book.fed(plan, j, len(chain), float(sum(chain.scores)))
            if chain.tokens:
                out[i] = list(chain.tokens)
                self.drafted_requests += 1
                self.draft_tokens += len(chain)
        return out

    def _observe(
        self,
        req_ids: list[str],
        sampled: Sequence[Sequence[int]],
        num_tokens: np.ndarray,
        engine_seconds: float | None,
    ) -> None:
        """Feeds the sizing policy what the step that just ran accepted and cost."""
        policy, plan = self.policy, self._last_plan
        if policy is None:
            return
        self._last_plan = None
        if plan is not None:
            row_of = {rid: i for i, rid in enumerate(req_ids[: len(sampled)])}
            accepted = []
            for rid, chain in zip(self._last_keys, plan.trees, strict=True):
                i = row_of.get(rid)
                n = 0 if i is None else min(max(len(sampled[i]) - 1, 0), len(chain))
                accepted.append(range(n))
            policy.observe(plan, accepted, None)
        schedule = self._schedule
        if engine_seconds is None or schedule is None or engine_seconds <= 0:
            return
        per_request = getattr(schedule, "num_scheduled_tokens", None) or {}
        context = pairs = 0
        for i, rid in enumerate(req_ids[: len(sampled)]):
            s = int(per_request.get(rid, 0))
            n = int(num_tokens[i])
            context += n
            pairs += s * (n + s)
        tokens = int(getattr(schedule, "total_num_scheduled_tokens", 0))
        if tokens > 0:
            policy.cost.observe(tokens, engine_seconds, context=context, pairs=pairs)

    # -- observability ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: steps, drafts, the request book, the guard, a remote client's own
        fallbacks, the sizing policy, and the proposer's own time per call against the
        engine's step time, by batch size."""
        out: dict[str, Any] = {
            "steps": self.steps,
            "drafted_requests": self.drafted_requests,
            "draft_tokens": self.draft_tokens,
            "tracked_requests": len(self.book),
            "resyncs": self.book.resyncs,
            "accepted_drafts": self.book.accepted_drafts,
            "expected_drafts": round(self.book.expected_drafts, 2),
            "timing": self._timing.stats(),
        }
        out.update(self.guard.stats())
        client_stats = getattr(self.guard.drafter, "client_stats", None)
        if callable(client_stats):  # a remote drafter's own fallbacks and outages
            out["client"] = client_stats()
        if self.policy is not None:
            out["sizing"] = self.policy.stats()
        for kind, count in self._warn.counts.items():
            out[f"problems_{kind}"] = count
        return out

    def __repr__(self) -> str:
        return f"LookaheadProposer(K={self.k}, {self.config.describe()}, steps={self.steps})"
