"""``Engine``: SGLang's offline engine (``sgl.Engine``) with lookahead drafting."""

from __future__ import annotations

from typing import Any

from sglang.srt.entrypoints.engine import Engine as _SGLangEngine

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.sglang.activate import scheduler_process_func
from lookahead_client.sglang.args import require_ngram

__all__ = ["Engine"]


class Engine(_SGLangEngine):
    """``sgl.Engine`` whose NGRAM speculative decoding drafts with lookahead.

    Takes every ``sgl.Engine`` argument. ``speculative_algorithm`` defaults to ``"NGRAM"``
    (any other value is refused); ``speculative_num_draft_tokens`` and the rest of SGLang's
    settings keep their meaning.

    Args:
        lookahead: where drafts come from (default: an embedded drafter in each scheduler).
        kwargs: ``sgl.Engine``'s arguments (or ``server_args=``).

    Raises:
        InvalidArgumentError: another speculative algorithm was asked for.
    """

    def __init__(self, *, lookahead: LookaheadConfig | None = None, **kwargs: Any) -> None:
        server_args = kwargs.get("server_args")
        if server_args is not None:
            require_ngram(server_args.speculative_algorithm, must_be_set=True)
        else:
            require_ngram(kwargs.get("speculative_algorithm"))
            kwargs["speculative_algorithm"] = "NGRAM"
        self.lookahead_config = lookahead if lookahead is not None else LookaheadConfig()
        # SGLang reads the scheduler entry from the instance (a class attribute it documents
        # for overriding); the partial travels to the spawned schedulers by pickling.
        self.run_scheduler_process_func = scheduler_process_func(self.lookahead_config)
        super().__init__(**kwargs)
