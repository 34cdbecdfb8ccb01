"""The ``lookahead-server`` console script: the Rust gRPC server, run from the Python package.

The server runs in Rust with the GIL released and handles SIGINT/SIGTERM itself (graceful
shutdown); ``lookahead-server --help`` lists its flags.
"""

from __future__ import annotations

import sys

from lookahead_client._native import run_server

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Runs the server with ``argv`` (default: this process's command line)."""
    args = ["lookahead-server", *(sys.argv[1:] if argv is None else argv)]
    try:
        return run_server(args)
    except KeyboardInterrupt:  # Python's handler may see the SIGINT the server also handled
        return 0


if __name__ == "__main__":
    sys.exit(main())
