"""``--sharing cluster``: one ``lookahead-server`` per replica, joined through one local
``nats-server`` (docs/cluster.md), each replica's drafter a :class:`RemoteDrafter` to its own
server. Every run gets a fresh cluster, so nothing carries over between runs.

The servers run with the embedded drafter's defaults (one namespace of 1 GiB), so that MAT
compares with ``--sharing shared`` (one embedded drafter for all replicas) and ``private``
(one each).
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from lookahead_client.processes.nats import NatsServerProcess
from lookahead_client.processes.server import ServerProcess, free_tcp_port
from lookahead_client.types import Drafter

__all__ = ["ClusterLag", "LocalCluster"]

#: The namespace every replica uses (one cluster per run: no need for fresh names).
NAMESPACE = "bench"


@dataclass(frozen=True, slots=True)
class ClusterLag:
    """Time from a batch made on one server to its being applied on another (seconds), from
    the servers' ``lookahead_cluster_apply_lag_seconds`` histograms (quantiles interpolated
    within buckets, as Prometheus's ``histogram_quantile`` does)."""

    messages: int
    p50_s: float
    p99_s: float


def _histogram(port: int, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram on a metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    buckets = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            labels, _, value = line.rpartition(" ")
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((math.inf if le == "+Inf" else float(le), float(value)))
    return sorted(buckets)


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    total = buckets[-1][1] if buckets else 0.0
    if total == 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


class LocalCluster:
    """A nats-server and ``replicas`` lookahead-server processes on loopback."""

    def __init__(self, replicas: int, server_args: list[str] | None = None) -> None:
        self.replicas = replicas
        self.server_args = server_args or []
        self._stack = ExitStack()
        self.servers: list[ServerProcess] = []
        self.metrics_ports: list[int] = []

    def __enter__(self) -> LocalCluster:
        try:
            nats = self._stack.enter_context(NatsServerProcess())
            for r in range(self.replicas):
                port = free_tcp_port()
                args = ["--cluster", nats.url, "--cluster-name", "bench", "--node-id", f"r{r}"]
                args += ["--memory-budget", "1GiB", "--max-namespaces", "1"]
                args += ["--metrics-listen", f"127.0.0.1:{port}", *self.server_args]
                self.servers.append(self._stack.enter_context(ServerProcess(args, tcp=False)))
                self.metrics_ports.append(port)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def factory(self) -> Callable[[], Drafter]:
        """Makes the replicas' drafters: call ``i`` connects to server ``i``."""
        from lookahead_client.remote import RemoteDrafter

        targets = iter([s.unix_target for s in self.servers])
        # A generous deadline: a step that fell back to an empty tree would lower MAT.
        return lambda: RemoteDrafter(next(targets), namespace=NAMESPACE, timeout=30.0)

    def lag(self) -> ClusterLag:
        """The apply lag over every server."""
        merged: dict[float, float] = {}
        for port in self.metrics_ports:
            for upper, count in _histogram(port, "lookahead_cluster_apply_lag_seconds"):
                merged[upper] = merged.get(upper, 0.0) + count
        buckets = sorted(merged.items())
        return ClusterLag(
            messages=int(buckets[-1][1]) if buckets else 0,
            p50_s=_quantile(0.5, buckets),
            p99_s=_quantile(0.99, buckets),
        )
