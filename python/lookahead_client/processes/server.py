"""Runs a ``lookahead-server`` process (for tests, benchmarks and local setups).

The binary is found, in order: the ``LOOKAHEAD_SERVER_BIN`` environment variable, the
``lookahead-server`` console script on ``PATH``, then ``target/release/lookahead-server`` of
the source tree. :class:`ServerProcess` starts it on a free TCP port of 127.0.0.1 and on a
Unix socket, waits until gRPC health answers SERVING, and can stop, pause and restart it on
the same addresses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from lookahead_client.processes.child import ChildProcess, find_binary, free_tcp_port
from lookahead_client.remote.security import TlsSettings, tls_channel_options

__all__ = ["ServerProcess", "find_server_binary", "free_tcp_port"]

_REPO_ROOT = Path(__file__).resolve().parents[3]


def find_server_binary() -> str:
    """The path of the ``lookahead-server`` binary.

    Raises:
        FileNotFoundError: none was found (the message says how to get one).
    """
    return find_binary(
        "lookahead-server",
        "LOOKAHEAD_SERVER_BIN",
        fallbacks=[
            # The console script beside this interpreter (``.venv/bin/lookahead-bench`` run
            # without the environment's bin folder on PATH), then a source checkout's build.
            str(Path(sysconfig.get_path("scripts")) / "lookahead-server"),
            str(_REPO_ROOT / "target" / "release" / "lookahead-server"),
        ],
        hint="set LOOKAHEAD_SERVER_BIN, install the package (console script lookahead-server), "
        "or run `cargo build --release -p lookahead-server`",
    )


class ServerProcess(ChildProcess):
    """A ``lookahead-server`` child process listening on TCP and a Unix socket.

    Args:
        args: extra command-line arguments (``--max-budget 32``...).
        binary: the binary (default: :func:`find_server_binary`).
        tcp: listen on a free TCP port of 127.0.0.1.
        unix: listen on a Unix socket in a private temporary directory.
        tls: client TLS settings for the readiness probe, for a server started with
            ``--tls-cert`` (the probe uses TCP when the server listens on it).
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        binary: str | None = None,
        tcp: bool = True,
        unix: bool = True,
        tls: TlsSettings | None = None,
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="lookahead-server-")
        super().__init__("lookahead-server", os.path.join(self._dir.name, "server.log"))
        self.tls = tls
        self.binary = binary or find_server_binary()
        self.args = list(args)
        self.port = free_tcp_port() if tcp else None
        self.socket_path = os.path.join(self._dir.name, "server.sock") if unix else None

    @property
    def tcp_target(self) -> str:
        """``127.0.0.1:PORT``."""
        if self.port is None:
            raise ValueError("this server does not listen on TCP")
        return f"127.0.0.1:{self.port}"

    @property
    def unix_target(self) -> str:
        """``unix:///path/to/server.sock``."""
        if self.socket_path is None:
            raise ValueError("this server does not listen on a Unix socket")
        return f"unix://{self.socket_path}"

    def command(self) -> list[str]:
        """The command line the server runs with."""
        cmd = [self.binary]
        if self.port is not None:
            cmd += ["--listen", self.tcp_target]
        if self.socket_path is not None:
            cmd += ["--listen", self.unix_target]
        return cmd + self.args

    def start(self, timeout: float = 30.0) -> ServerProcess:
        """Starts the server and waits until it answers health checks."""
        self._spawn(self.command())
        self._wait_serving(timeout)
        return self

    def _wait_serving(self, timeout: float) -> None:
        # grpcio-health-checking is a test/bench extra: import it only here.
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        target = self.tcp_target if self.port is not None else self.unix_target
        options = [("grpc.default_authority", "localhost")] if self.port is None else []
        deadline = time.monotonic() + timeout
        if self.port is not None and self.tls is not None:
            channel = grpc.secure_channel(
                target, self.tls.credentials(), options=tls_channel_options(self.tls)
            )
        else:
            channel = grpc.insecure_channel(target, options=options)
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                self._raise_if_exited()
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"lookahead-server not serving after {timeout} s:\n{self.log()}"
                    )
                time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Sends ``sig`` and waits for the exit; returns the exit status."""
        if self.process is None:
            raise RuntimeError("the server was not started")
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                stacks = self.thread_stacks()
                self.process.kill()
                self.process.wait()
                raise TimeoutError(
                    f"lookahead-server ignored signal {sig}:\n{self.log()}\n"
                    f"its threads when it was killed:\n{stacks}"
                ) from None
        return self.process.returncode

    def pause(self, timeout: float = 5.0) -> None:
        """Freezes the server (SIGSTOP) and waits until it is stopped: connections stay open,
        nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while self._state() != "T":
            if time.monotonic() > deadline:
                raise TimeoutError("lookahead-server did not stop on SIGSTOP")
            time.sleep(0.001)

    def _state(self) -> str:
        """The process state letter of /proc/PID/stat (R, S, T...)."""
        with open(f"/proc/{self.pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]

    def resume(self) -> None:
        """Unfreezes a paused server (SIGCONT)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> ServerProcess:
        """Stops the server (SIGTERM) and starts a fresh one on the same addresses."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stops the server if it runs (resuming it first if paused) and removes its files."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)
            self.stop()
        self._dir.cleanup()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
