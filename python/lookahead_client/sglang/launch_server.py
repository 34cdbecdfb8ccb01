"""``python -m lookahead_client.sglang.launch_server``: SGLang's HTTP server with lookahead.

Takes every ``sglang serve`` / ``python -m sglang.launch_server`` flag plus ``--lookahead-*``
(see :mod:`.args`); ``--speculative-algorithm NGRAM`` is implied. Without
``--lookahead-target`` each scheduler process drafts with an embedded drafter; with it, they
all use that ``lookahead-server``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.sglang.activate import scheduler_process_func
from lookahead_client.sglang.args import lookahead_help, require_ngram, split_argv

__all__ = ["main", "run_server"]

# Serving modes whose launchers take no scheduler entry function.
_UNSUPPORTED_MODES = ("encoder_only", "smg_grpc_mode", "use_ray")


def run_server(server_args, config: LookaheadConfig) -> None:
    """Runs SGLang's HTTP server (its default mode) with lookahead schedulers.

    Raises:
        InvalidArgumentError: a serving mode this launcher cannot switch (gRPC, encoder-only,
            Ray), naming it.
    """
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.utils import kill_process_tree

    require_ngram(server_args.speculative_algorithm, must_be_set=True)
    server_args.resolve_once()
    cfg = resolving_view(server_args)
    for mode in _UNSUPPORTED_MODES:
        if getattr(cfg, mode, False):
            raise InvalidArgumentError(
                f"{mode} is not supported by the lookahead launcher (HTTP mode only); use "
                "the SGLang plugin (LOOKAHEAD_SGLANG) instead",
                field=mode,
            )
    try:
        launch_server(server_args, run_scheduler_process_func=scheduler_process_func(config))
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line entry."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        print(lookahead_help())  # SGLang's parser prints its own flags next, then exits
    try:
        config, sglang_argv = split_argv(argv)
    except InvalidArgumentError as e:
        sys.exit(f"lookahead: {e}")
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    server_args = prepare_server_args(sglang_argv)
    run_server(server_args, config)


if __name__ == "__main__":
    main()
