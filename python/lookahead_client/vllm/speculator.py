"""``LookaheadSpeculator``: the speculator of ``"method": "lookahead"`` on vLLM >= 0.34.

vLLM's V2 model runner builds it on the last pipeline stage with its request states and calls
:meth:`LookaheadSpeculator.propose` after every step. Request identity comes from vLLM itself
(``input_batch.req_ids``, ``on_requests_finished``): no monkeypatching. Each step it reads
from vLLM's request states, in one copy to the host, every row's length, sampled count,
temperature and last tokens (gathered on the device; the drafter holds the rest): K + 1 of
them, as a step appends at most K + 1, or ``quiet_every`` if larger, as a quiet stretch
appends that many before the drafter is called. Only a request that starts (or fell behind
that window) has its whole history read, once, in a second copy. It asks
:class:`~lookahead_client.vllm.drafting.ChainDrafting` for chains, and writes them into the
``[num_reqs, K]`` draft tensor vLLM verifies. vLLM 0.34 verifies K slots for every row: a row
without a draft (or a short one) is padded with token 0, which vLLM rejects unless the model
really produces it (lossless either way). With vLLM's adaptive verification on
(``"enable_adaptive_verification": true``), ``draft_token_confidence_probs`` holds each draft
token's calibrated conditional probability, from which vLLM picks each row's length.

Tensor parallel: every rank of the last stage builds a speculator and feeds its own drafts to
its own shard of the model at the next step, so every rank must propose the same drafts (a
rank with other drafts computes other activations, and the all-reduce mixes them: wrong
output). Only tensor-parallel rank 0 builds a drafter (and talks to a server); it broadcasts
each step's drafts (and, with adaptive verification, their confidences) to the other ranks of
its group.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from lookahead_client.vllm.drafting import ChainDrafting, Row
from lookahead_client.vllm.method import config_of
from lookahead_client.vllm.parallel import tensor_parallel_group, tensor_parallel_rank
from lookahead_client.vllm.versions import check_version

__all__ = ["LookaheadSpeculator"]

_log = logging.getLogger("lookahead_client.vllm")


class LookaheadSpeculator(BaseSpeculator):
    """vLLM 0.34's speculator interface over a lookahead drafter (see the module docstring).

    Raises:
        InvalidArgumentError: bad ``speculator_options`` (naming the key).
        RuntimeError: an unsupported vLLM version (naming the supported ones).
    """

    def __init__(self, vllm_config: Any, device: torch.device, req_states: Any) -> None:
        check_version("speculator")
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.device = device
        self.req_states = req_states
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        max_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.drafts = torch.zeros((max_reqs, self.k), dtype=torch.int64, device=device)
        self.enable_adaptive_verification = bool(spec.enable_adaptive_verification)
        self.draft_token_confidence_probs = torch.zeros(
            (max_reqs, self.k), dtype=torch.float32, device=device
        )
        self.config = config_of(spec.speculator_options)
        if self.config.sizing and not self.enable_adaptive_verification:
            # Without adaptive verification vLLM 0.34 verifies K slots of every row whatever
            # the chain's length: a cut chain saves nothing, so every slot gets a draft token.
            self.config = dataclasses.replace(self.config, sizing=False)
        self._vocab_size = int(vllm_config.model_config.get_vocab_size())
        self._group = tensor_parallel_group()
        self.rank = tensor_parallel_rank(self._group)
        self.drafting: ChainDrafting | None = None
        if self.rank == 0:
            self.drafting = self._new_drafting()
            _log.info(
                "lookahead: vLLM drafts come from %s (K=%d, sizing %s)",
                self.config.describe(),
                self.k,
                "on" if self.config.sizing else "off",
            )
        self._finished: set[str] = set()
        self._returned_at: float | None = None
        self.ended = 0
        # The window read every step: a step appends at most K + 1 tokens to a request, and
        # a quiet stretch (the drafter not called, no draft to verify: one token a step) at
        # most quiet_every before the drafter hears of them.
        window = self.k + 1
        if self.drafting is not None:
            window = max(window, self.drafting.session.quiet_every)
        self._offsets = torch.arange(window, dtype=torch.int64, device=device)
        #: Rows read as the window's tail (the drafter held the rest), and rows whose whole
        #: history was read (requests that start, or fell behind the window).
        self.tail_reads = 0
        self.whole_reads = 0

    def _new_drafting(self) -> ChainDrafting:
        return ChainDrafting(
            self.config, k=self.k, vocab_size=self._vocab_size, max_model_len=self.max_model_len
        )

    # -- vLLM's hooks ----------------------------------------------------------------------

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        """Nothing to capture: drafting runs on the host."""

    def capture(self) -> None:
        """Nothing to capture: drafting runs on the host."""

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        """Requests that finished: ended in the drafter with the next step."""
        finished = set(finished_req_ids)
        self.ended += len(finished)
        if self.drafting is not None:
            self._finished.update(finished)

    def reset_state(self) -> None:
        """After vLLM's warm-up: an embedded drafter forgets the warm-up's dummy text."""
        if self.drafting is not None and self.config.embedded:
            self.drafting = self._new_drafting()
        self._finished.clear()
        self._returned_at = None

    @torch.inference_mode()
    def propose(
        self,
        input_batch: Any,
        attn_metadata: Any,
        slot_mappings: Any,
        last_hidden_states: torch.Tensor,
        aux_hidden_states: list[torch.Tensor] | None,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        last_sampled: torch.Tensor,
        next_prefill_tokens: torch.Tensor,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        dp_sync_state: Any = None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        mm_inputs: Any = None,
        is_profile: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:
        """The ``[num_reqs, K]`` draft tokens of the step (see the module docstring)."""
        num_reqs = int(input_batch.num_reqs)
        drafts = self.drafts[:num_reqs]
        confidence = self.draft_token_confidence_probs[:num_reqs]
        drafts.zero_()
        confidence.zero_()
        if dummy_run or is_profile or num_reqs == 0:
            return drafts  # the same on every rank: nothing to share
        drafting = self.drafting
        if drafting is not None:
            try:
                self._propose(drafting, input_batch, num_reqs, num_sampled, temperature)
            except Exception as e:  # noqa: BLE001 - a bug here must not fail the generation
                drafting.warn("internal", "lookahead drafting failed: %s: %s", type(e).__name__, e)
                drafts.zero_()
                confidence.zero_()
            finally:
                self._returned_at = time.perf_counter()
        if self._group is not None:
            # every rank verifies its own copy: rank 0's drafts go to all (rank 0 always
            # reaches this line, or the other ranks would wait for it forever)
            self._group.broadcast(drafts, src=0)
            if self.enable_adaptive_verification:
                self._group.broadcast(confidence, src=0)
        return drafts

    # -- one step ---------------------------------------------------------------------------

    def _propose(
        self,
        drafting: ChainDrafting,
        input_batch: Any,
        num_reqs: int,
        num_sampled: torch.Tensor,
        temperature: torch.Tensor,
    ) -> None:
        now = time.perf_counter()
        if self._finished:
            drafting.end(self._finished)
            self._finished.clear()
        if not drafting.begin():
            return  # the drafter is still busy with an earlier step: nothing to read
        states = self.req_states
        slots_np = np.asarray(input_batch.idx_mapping_np[:num_reqs], dtype=np.int64)
        slots = torch.from_numpy(slots_np).to(temperature.device)
        total_gpu = states.total_len.gpu[slots]
        # the last `window` tokens of every row, gathered where they live
        w = self._offsets.numel()
        positions = (total_gpu.to(torch.int64)[:, None] - w + self._offsets).clamp_(min=0)
        tails_gpu = states.all_token_ids.gpu[slots[:, None], positions]
        packed = torch.cat(
            [
                total_gpu.to(torch.int32)[:, None],
                num_sampled[:num_reqs].to(torch.int32)[:, None],
                temperature[slots].to(torch.float32).view(torch.int32)[:, None],
                tails_gpu.to(torch.int32),
            ],
            dim=1,
        )
        host = packed.cpu().numpy()  # the step's one copy to the host
        total = host[:, 0].astype(np.int64)
        sampled = host[:, 1]
        temps = np.maximum(host[:, 2].view(np.float32).astype(np.float64), 0.0)
        tails = host[:, 3:]
        prompt_len = states.prompt_len.np[slots_np]
        req_ids = input_batch.req_ids
        drafting.observe(
            int(getattr(input_batch, "num_tokens", 0)),
            # the engine's step: from the last answer to this call
            None if self._returned_at is None else now - self._returned_at,
            rows=num_reqs,
            context=int(total.sum()),
            scheduled=req_ids[:num_reqs],
            decoding=[
                req_ids[b] for b in range(num_reqs) if sampled[b] > 0 and total[b] > prompt_len[b]
            ],
        )
        rows: list[Row] = []
        whole: list[tuple[int, int, int, float, int]] = []
        for b in range(num_reqs):
            n = int(total[b])
            p = int(prompt_len[b])
            room = self.max_model_len - n - 1
            if sampled[b] <= 0 or room <= 0 or n <= p:
                continue  # a prefill chunk, or no room for a draft
            needs = drafting.needs_from(req_ids[b])
            if needs is None:
                continue  # no longer drafted
            m = min(w, n - 1)  # a tail starts at 1 or later: it never looks like a whole
            if needs >= n - m:
                rows.append(Row(b, req_ids[b], (), tails[b, w - m :], float(temps[b]), room, n - m))
            else:
                whole.append((b, n, p, float(temps[b]), room))
        if whole:
            # requests that start (or fell behind the window): their whole history, once
            index = np.array([b for b, *_ in whole], dtype=np.int64)
            longest = max(n for _, n, *_ in whole)
            table = states.all_token_ids.gpu[slots[index], :longest].cpu().numpy()
            for j, (b, n, p, temp, room) in enumerate(whole):
                rows.append(Row(b, req_ids[b], table[j, :p], table[j, p:n], temp, room))
        self.tail_reads += len(rows) - len(whole)
        self.whole_reads += len(whole)
        chains = drafting.step(rows)
        if not chains:
            return
        host_drafts = np.zeros((num_reqs, self.k), dtype=np.int64)
        conf = np.zeros((num_reqs, self.k), dtype=np.float32)
        for chain in chains:
            host_drafts[chain.row, : len(chain.tokens)] = chain.tokens
            conf[chain.row, : len(chain.confidence)] = chain.confidence
        self.drafts[:num_reqs].copy_(torch.from_numpy(host_drafts))
        self.draft_token_confidence_probs[:num_reqs].copy_(torch.from_numpy(conf))

    # -- observability ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of :class:`ChainDrafting` (none on tensor-parallel ranks other than 0)."""
        if self.drafting is None:
            return {"rank": self.rank, "drafter": None}
        out = self.drafting.stats()
        out["rank"] = self.rank
        out["ended"] = self.ended  # requests vLLM reported finished
        out["tail_reads"] = self.tail_reads
        out["whole_reads"] = self.whole_reads
        return out

    def __repr__(self) -> str:
        return f"LookaheadSpeculator(K={self.k}, {self.config.describe()}, rank={self.rank})"
