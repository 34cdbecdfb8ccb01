"""What the ``lookahead-server`` and ``nats-server`` child processes have in common: finding
the binary, a free port, starting with the output in a log file, and the checks and signals
every test and benchmark needs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence

__all__ = ["ChildProcess", "find_binary", "free_tcp_port"]


def find_binary(name: str, env_var: str, *, fallbacks: Sequence[str] = (), hint: str) -> str:
    """The path of the executable ``name``: ``$env_var`` if set, else ``name`` on ``PATH``,
    else the first executable of ``fallbacks``.

    Raises:
        FileNotFoundError: none was found; the message ends with ``hint`` (how to get one).
    """
    explicit = os.environ.get(env_var)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise FileNotFoundError(f"{env_var}={explicit!r} is not an executable")
        return explicit
    on_path = shutil.which(name)
    if on_path:
        return on_path
    for candidate in fallbacks:
        if os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(f"no {name} binary: {hint}")


def free_tcp_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildProcess:
    """A child process whose stdout and stderr go to one log file.

    Args:
        name: the program's name, for messages.
        log_path: the log file (appended to by every start).
    """

    def __init__(self, name: str, log_path: str) -> None:
        self.name = name
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def _spawn(self, command: Sequence[str]) -> subprocess.Popen[bytes]:
        if self.alive():
            raise RuntimeError(f"{self.name} is already running")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return self.process

    def _raise_if_exited(self) -> None:
        """Raises ``RuntimeError`` with the log if the process has exited (while starting)."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")

    @property
    def pid(self) -> int:
        """The process id."""
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """``kill -9``: no shutdown of any kind."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def thread_stacks(self) -> str:
        """Every thread's stack of the running process, from ``gdb`` (for the message of a
        process that hangs); a line saying why when there is none to give."""
        gdb = shutil.which("gdb")
        if gdb is None or not self.alive():
            return "(no thread stacks: gdb is not installed or the process has exited)"
        command = [gdb, "-p", str(self.pid), "-batch", "-nx", "-ex", "thread apply all bt"]
        try:
            traced = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"(no thread stacks: {e})"
        return traced.stdout or f"(no thread stacks: gdb said {traced.stderr.strip()!r})"

    def log(self) -> str:
        """Everything the process wrote (stdout and stderr)."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""
