"""``LookaheadNGRAMWorker``: SGLang 0.5.23's NGRAM worker drafting with a lookahead drafter.

The subclass changes two things and inherits everything else (draft preparation, positions and
retrieve indices, the FlashInfer custom mask, CUDA graphs, verification, sampling, grammar,
overlap scheduling, external corpora):

* its corpus is a :class:`~lookahead_client.sglang.corpus.DrafterCorpus` instead of the C++
  ``NgramCorpus`` (``NGRAMWorker.__init__`` builds its corpus through the module-level name
  ``NgramCorpus``, which is pointed at the prebuilt adapter for the duration of the call);
* ``_prepare_draft_tokens`` first shows the corpus the batch's ``Req`` objects, so that the
  drafter gets whole requests, then runs SGLang's own method unchanged.

With tensor parallelism only the group's first rank talks to the drafter; it broadcasts each
step's arrays to the other ranks over SGLang's CPU group (every rank must verify the same
tree, and a shared or deadline-bound drafter is not deterministic across processes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import sglang.srt.speculative.ngram_worker as _ngram_module
from sglang.srt.runtime_context import get_parallel, get_spec
from sglang.srt.speculative.ngram_worker import NGRAMWorker

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.engine.guard import guard_for
from lookahead_client.sglang.corpus import DrafterCorpus, Share, StepContext, broadcast_share
from lookahead_client.types import Drafter

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
        if drafts_here:
            if drafter is None:
                drafter = config.build_drafter(
                    num_slots=num_slots,
                    vocab_size=vocab_size,
                    context_len=int(getattr(model_config, "context_len", 0) or 0),
                )
            guard = guard_for(config, drafter)
        corpus = DrafterCorpus(num_slots=num_slots, guard=guard, vocab_size=vocab_size, share=share)
        with _corpus_built_as(corpus):
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        if self.ngram_corpus is not corpus:
            raise RuntimeError(
                "NGRAMWorker did not take the lookahead corpus; is this SGLang 0.5.23?"
            )
        _log.info(
            "lookahead: NGRAM drafts come from %s (%d slots)%s",
            config.describe(),
            num_slots,
            "" if drafts_here else " via the first tensor-parallel rank",
        )

    def _prepare_draft_tokens(self, batch):
        """SGLang's own draft preparation, with the batch shown to the lookahead corpus."""
        corpus: DrafterCorpus = self.ngram_corpus
        corpus.attach(
            StepContext(
                batch.reqs, lambda: getattr(self, "prev_token_ids", ()), self.draft_token_num
            )
        )
        try:
            return super()._prepare_draft_tokens(batch)
        finally:
            corpus.attach(None)

    def lookahead_stats(self) -> dict[str, int | bool]:
        """This process's drafting counters (steps, drafts, fallbacks, resyncs...)."""
        return self.ngram_corpus.stats()
