"""``LookaheadNGRAMWorker``: SGLang 0.5.23's NGRAM worker drafting with a lookahead drafter.

The subclass changes two things and inherits everything else (draft preparation, positions and
retrieve indices, the FlashInfer custom mask, CUDA graphs, verification, sampling, grammar,
overlap scheduling, external corpora):

* its corpus is a :class:`~lookahead_client.sglang.corpus.DrafterCorpus` instead of the C++
  ``NgramCorpus`` (``NGRAMWorker.__init__`` builds its corpus through the module-level name
  ``NgramCorpus``, which is pointed at the prebuilt adapter for the duration of the call);
* ``_prepare_draft_tokens`` first shows the corpus the batch's ``Req`` objects, so that the
  drafter gets whole requests, then runs SGLang's own method unchanged;
* with sizing on (the default), a decode step whose batch got no draft node runs as a plain
  decode step where that is measured cheaper than verifying (:mod:`.step_modes`): SGLang's
  verify preparation is turned into a decode batch (the roots as input, each request's first
  reserved KV slot), SGLang's own non-verify branch runs the forward and builds the step's
  result, and the worker lays its tokens out as a verify result with nothing accepted.

With tensor parallelism only the group's first rank talks to the drafter; it broadcasts each
step's arrays to the other ranks over SGLang's CPU group (every rank must verify the same
tree, and a shared or deadline-bound drafter is not deterministic across processes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import sglang.srt.speculative.ngram_worker as _ngram_module
from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_parallel, get_schedule, get_spec
from sglang.srt.speculative.ngram_worker import NGRAMWorker

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.engine.guard import guard_for, quiet_every_for
from lookahead_client.sglang.corpus import DrafterCorpus, Share, StepContext, broadcast_share
from lookahead_client.sglang.step_modes import StepModes
from lookahead_client.types import Drafter, DraftShape

__all__ = ["LookaheadNGRAMWorker"]

_log = logging.getLogger("lookahead_client.sglang")

_swap_lock = threading.Lock()
_configured: dict[LookaheadConfig, type[LookaheadNGRAMWorker]] = {}


@contextmanager
def _corpus_built_as(corpus: DrafterCorpus) -> Iterator[None]:
    """While active, ``NGRAMWorker.__init__`` gets ``corpus`` as its ``ngram_corpus``."""
    with _swap_lock:
        saved = _ngram_module.NgramCorpus
        _ngram_module.NgramCorpus = lambda **_sglang_settings: corpus
        try:
            yield
        finally:
            _ngram_module.NgramCorpus = saved


def _tensor_parallel_share() -> tuple[Share | None, bool]:
    """``(share, drafts_here)`` for this process's tensor-parallel group."""
    parallel = get_parallel()
    if parallel.tp_size <= 1:
        return None, True
    group = parallel.tp_group
    src = group.ranks[0]
    return broadcast_share(group.rank, src, group.cpu_group), group.rank == src


class LookaheadNGRAMWorker(NGRAMWorker):
    """SGLang's NGRAM worker whose drafts come from a lookahead drafter.

    Built by SGLang's scheduler exactly like ``NGRAMWorker`` (the activation hook returns a
    subclass carrying the config, see :meth:`with_config`).

    Args:
        server_args, gpu_id, nccl_port, target_worker: as for ``NGRAMWorker``.
        drafter: a ready drafter to use instead of building one from the config.
    """

    #: Where drafts come from (set on the subclass made by :meth:`with_config`).
    lookahead_config: ClassVar[LookaheadConfig] = LookaheadConfig()

    @classmethod
    def with_config(cls, config: LookaheadConfig) -> type[LookaheadNGRAMWorker]:
        """The worker class that drafts as ``config`` says (one class per config)."""
        sub = _configured.get(config)
        if sub is None:
            sub = type(
                cls.__name__,
                (cls,),
                {
                    "lookahead_config": config,
                    "__module__": cls.__module__,
                    "__doc__": cls.__doc__,
                },
            )
            _configured[config] = sub
        return sub

    def __init__(
        self,
        server_args: Any,
        gpu_id: int,
        nccl_port: int,
        target_worker: Any,
        *,
        drafter: Drafter | None = None,
    ) -> None:
        config = self.lookahead_config
        num_slots = get_spec().speculative_num_draft_tokens
        model_config = target_worker.model_runner.model_config
        vocab_size = model_config.vocab_size
        share, drafts_here = _tensor_parallel_share()
        guard = None
        quiet_every = 1
        if drafts_here:
            if drafter is None:
                drafter = config.build_drafter(
                    num_slots=num_slots,
                    vocab_size=vocab_size,
                    context_len=int(getattr(model_config, "context_len", 0) or 0),
                )
            guard = guard_for(config, drafter)
            quiet_every = quiet_every_for(config, drafter)
        # Plain steps need one decision for every rank (so no tensor parallelism), and are
        # not wired for the overlap scheduler's relay nor for hybrid models' state, which
        # SGLang commits in its verify branch only.
        sized = (
            config.sizing
            and share is None
            and num_slots >= 2
            and get_schedule().disable_overlap_schedule
            and mambaish_config(model_config) is None
        )
        corpus = DrafterCorpus(
            num_slots=num_slots,
            guard=guard,
            vocab_size=vocab_size,
            share=share,
            shape=DraftShape.SIZED_TREE if sized else DraftShape.TREE,
            quiet_every=quiet_every,
        )
        with _corpus_built_as(corpus):
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        if self.ngram_corpus is not corpus:
            raise RuntimeError(
                "NGRAMWorker did not take the lookahead corpus; is this SGLang 0.5.23?"
            )
        #: Verify or plain decode steps (None: every decode step verifies).
        self.step_modes = StepModes(num_slots) if sized else None
        self._plain_step = False
        _log.info(
            "lookahead: NGRAM drafts come from %s (%d slots)%s%s",
            config.describe(),
            num_slots,
            "" if drafts_here else " via the first tensor-parallel rank",
            ", plain steps where cheaper" if sized else "",
        )

    def _prepare_draft_tokens(self, batch):
        """SGLang's own draft preparation, with the batch shown to the lookahead corpus."""
        corpus: DrafterCorpus = self.ngram_corpus
        modes = self.step_modes if self._may_run_plain(batch) else None
        corpus.attach(
            StepContext(
                batch.reqs,
                lambda: getattr(self, "prev_token_ids", ()),
                self.draft_token_num,
                cost=None if modes is None else modes.cost(len(batch.reqs)),
            )
        )
        try:
            return super()._prepare_draft_tokens(batch)
        finally:
            corpus.attach(None)

    # -- plain decode steps (see step_modes) ------------------------------------------------

    def _may_run_plain(self, batch) -> bool:
        """Whether this decode batch may run as a plain step: sizing on, and nothing SGLang
        handles only in its verify branch (grammar masks, log-probabilities)."""
        return self.step_modes is not None and not batch.has_grammar and not batch.return_logprob

    def _prepare_for_speculative_decoding(self, batch) -> None:
        """SGLang's verify preparation; a batch with no draft node then runs plain when that
        is measured cheaper."""
        modes = self.step_modes
        self._plain_step = False
        if modes is None:
            super()._prepare_for_speculative_decoding(batch)
            return
        start = time.perf_counter()
        modes.begin(start)
        super()._prepare_for_speculative_decoding(batch)
        if not batch.forward_mode.is_target_verify():
            return  # prefill: SGLang's plain forward anyway
        bs = len(batch.reqs)
        plain = (
            self._may_run_plain(batch)
            and self.ngram_corpus.last_nodes == 0
            and modes.plain_pays(bs)
        )
        if plain:
            if not modes.plain_steps:
                _log.info("lookahead: a decode step without drafts runs plain (batch of %d)", bs)
            self._as_plain_decode(batch)
        self._plain_step = plain
        modes.started(start, plain=plain, bs=bs)

    def _as_plain_decode(self, batch) -> None:
        """Turns the prepared verify batch into SGLang's plain decode batch: each request's
        root (the last token, slot 0 of its tree) decoded at position ``seq_len`` into its
        first reserved KV slot. The scheduler restores every field after the forward."""
        bs, d = len(batch.reqs), self.draft_token_num
        batch.forward_mode = ForwardMode.DECODE
        batch.input_ids = batch.input_ids.view(bs, d)[:, 0].contiguous()
        batch.out_cache_loc = batch.out_cache_loc.view(bs, d)[:, 0].contiguous()
        # a decode batch counts the token it decodes (positions are seq_lens - 1); SGLang's
        # non-verify branch hands these lengths back as the step's new ones
        batch.seq_lens = batch.seq_lens + 1
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu + 1
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        else:
            batch.seq_lens_sum = None
        if batch.orig_seq_lens is not None:
            batch.orig_seq_lens = batch.orig_seq_lens + 1
        batch.spec_info = None

    def forward_batch_generation(self, batch, on_publish=None, pp_proxy_tensors=None):
        """SGLang's step; a plain step's tokens laid out as a verify result (stride ``d``,
        one accepted token per request), which is how the scheduler reads NGRAM's."""
        result = super().forward_batch_generation(
            batch, on_publish=on_publish, pp_proxy_tensors=pp_proxy_tensors
        )
        if self._plain_step:
            self._plain_step = False
            result.next_token_ids = result.next_draft_input.accept_tokens
            # SGLang erases departed requests' state after a verify only
            rids = {req.rid for req in batch.reqs}
            departed = self._prev_decode_rids - rids
            if departed:
                self.ngram_corpus.erase_match_state(list(departed))
            self._prev_decode_rids = rids
        return result

    def lookahead_stats(self) -> dict[str, int | float | bool]:
        """This process's drafting counters (steps, drafts, fallbacks, resyncs...)."""
        stats = self.ngram_corpus.stats()
        if self.step_modes is not None:
            stats.update(self.step_modes.stats())
        return stats
