"""The launcher's ``--lookahead-*`` flags, and the one SGLang setting lookahead requires."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.errors import InvalidArgumentError

__all__ = [
    "add_arguments",
    "config_from_args",
    "lookahead_help",
    "split_argv",
    "require_ngram",
    "with_ngram",
]

_ALGORITHM_FLAG = "--speculative-algorithm"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``--lookahead-*`` flags to ``parser``."""
    d = LookaheadConfig()
    g = parser.add_argument_group("lookahead")
    g.add_argument(
        "--lookahead-target",
        default=None,
        metavar="ADDRESS",
        help="lookahead-server address, host:port or unix:///path "
        "(absent: an embedded drafter in each scheduler process)",
    )
    g.add_argument(
        "--lookahead-namespace",
        default=d.namespace,
        help="server namespace, one per model/tokenizer (default %(default)s)",
    )
    g.add_argument(
        "--lookahead-timeout",
        type=float,
        default=d.timeout,
        metavar="SECONDS",
        help="deadline of one drafting step; past it the step decodes without "
        "drafts (default %(default)s)",
    )
    g.add_argument(
        "--lookahead-memory-bytes",
        type=int,
        default=d.memory_budget_bytes,
        help="embedded drafter memory per scheduler process (default %(default)s)",
    )
    g.add_argument(
        "--lookahead-max-ngram",
        type=int,
        default=d.max_ngram,
        help="embedded drafter n-gram depth (default %(default)s)",
    )
    g.add_argument(
        "--lookahead-min-score",
        type=float,
        default=d.min_score,
        help="embedded drafter minimum node score (default %(default)s)",
    )
    g.add_argument(
        "--lookahead-token-file",
        default=None,
        metavar="FILE",
        help="file holding the bearer token of a server started with --auth-tokens",
    )
    g.add_argument(
        "--lookahead-chain",
        action="store_true",
        help="embedded drafter proposes chains instead of trees",
    )
    g.add_argument(
        "--lookahead-no-sizing",
        dest="lookahead_sizing",
        action="store_false",
        help="verify every decode step (default: a batch whose drafts do not pay for a "
        "verify step runs as a plain decode step, where measured cheaper)",
    )
    g.add_argument(
        "--lookahead-cluster",
        default=None,
        metavar="URL",
        help="the embedded drafter of each scheduler joins the lookahead cluster at this NATS "
        "URL (nats://HOST:PORT; several comma-separated): it drafts in process and learns what "
        "every replica learns (docs/cluster.md)",
    )
    g.add_argument(
        "--lookahead-cluster-name",
        default="default",
        metavar="NAME",
        help="the cluster's name (--cluster-name of its servers; default %(default)s)",
    )
    g.add_argument(
        "--lookahead-quiet-every",
        type=int,
        default=None,
        metavar="N",
        help="while no request of a batch has had a draft accepted for a while, call the "
        "drafter every N-th step (default: a server every 4th, the embedded drafter every step)",
    )


def lookahead_help() -> str:
    """The help text of the ``--lookahead-*`` flags."""
    parser = argparse.ArgumentParser(
        prog="python -m lookahead_client.sglang.launch_server",
        add_help=False,
        usage="%(prog)s [--lookahead-* flags] [every sglang serve flag]",
    )
    add_arguments(parser)
    return parser.format_help()


def config_from_args(ns: argparse.Namespace) -> LookaheadConfig:
    """The config the parsed ``--lookahead-*`` flags describe."""
    return LookaheadConfig(
        target=ns.lookahead_target,
        namespace=ns.lookahead_namespace,
        timeout=ns.lookahead_timeout,
        memory_budget_bytes=ns.lookahead_memory_bytes,
        max_ngram=ns.lookahead_max_ngram,
        min_score=ns.lookahead_min_score,
        chain=ns.lookahead_chain,
        sizing=ns.lookahead_sizing,
        quiet_every=ns.lookahead_quiet_every,
        cluster=ns.lookahead_cluster,
        cluster_name=ns.lookahead_cluster_name,
        token=_read_token(ns.lookahead_token_file),
    )


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read the token file: {e}", field="token_file") from e
    if not token:
        raise InvalidArgumentError(f"the token file {path} is empty", field="token_file")
    return token


def split_argv(argv: Sequence[str]) -> tuple[LookaheadConfig, list[str]]:
    """Separates the ``--lookahead-*`` flags from SGLang's.

    Returns:
        The lookahead config and the remaining arguments (SGLang's), with
        ``--speculative-algorithm NGRAM`` added when absent.

    Raises:
        InvalidArgumentError: a ``--lookahead-*`` value is invalid, or another speculative
            algorithm was asked for.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_arguments(parser)
    ns, rest = parser.parse_known_args(list(argv))
    return config_from_args(ns), with_ngram(rest)


def with_ngram(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--speculative-algorithm NGRAM`` (added when absent; refused when it
    names another algorithm)."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == _ALGORITHM_FLAG:
            require_ngram(argv[i + 1] if i + 1 < len(argv) else "", must_be_set=True)
            return argv
        if arg.startswith(_ALGORITHM_FLAG + "="):
            require_ngram(arg.split("=", 1)[1], must_be_set=True)
            return argv
    return argv + [_ALGORITHM_FLAG, "NGRAM"]


def require_ngram(algorithm: object, *, must_be_set: bool = False) -> None:
    """Refuses any speculative algorithm but NGRAM (None too when ``must_be_set``).

    Raises:
        InvalidArgumentError: naming ``speculative_algorithm``.
    """
    name = getattr(algorithm, "name", algorithm)  # an enum member or a string
    if name is None and not must_be_set:
        return
    if not isinstance(name, str) or name.upper() != "NGRAM":
        raise InvalidArgumentError(
            f"lookahead drives SGLang's NGRAM speculative decoding; "
            f"speculative_algorithm={algorithm!r} (use NGRAM or leave it unset)",
            field="speculative_algorithm",
        )
