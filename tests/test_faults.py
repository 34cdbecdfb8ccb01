"""Faults with the real ``lookahead-server`` under load (loopback only, bounded in time): kill -9
and restart (the last snapshot comes back, clients recover with no error visible to the
engine), SIGSTOP / SIGCONT (clients fall back within their deadline, then recover), and a
short soak (memory flat under the budget, step latency stable).

The soak lasts ``LOOKAHEAD_SOAK_S`` seconds (default 15); docs/reliability.md has the figures
of longer runs."""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lookahead_client.processes.server import ServerProcess
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import StepRequest
from remote_support import repetitive_texts
from test_hardening import learn, rss_bytes, wait_for


@dataclass
class Load:
    """A client thread that plays requests as an engine would, step after step, and records
    each step's end time, latency and whether its tree was empty. Any exception is kept."""

    drafter: RemoteDrafter
    texts: list[list[int]]
    seed: int = 0
    steps: list[tuple[float, float, bool]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(self.seed)
        n = 0
        try:
            while not self.stop.is_set():
                text = rng.choice(self.texts)
                rid = f"load{self.seed}-{n}"
                n += 1
                prompt, i = 32, 32
                self._step([StepRequest(rid, prompt=text[:prompt], budget=8)])
                while i < len(text) and not self.stop.is_set():
                    self._step([StepRequest(rid, new_tokens=text[i : i + 3], budget=8)])
                    i += 3
                self._step([StepRequest(rid, budget=0, finished=True)])
        except BaseException as e:  # noqa: BLE001 - any engine-visible error fails the test
            self.errors.append(e)

    def _step(self, requests: list[StepRequest]) -> None:
        t0 = time.monotonic()
        tree = self.drafter.step(requests)[0]
        t1 = time.monotonic()
        self.steps.append((t1, t1 - t0, not tree.tokens))

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def drafted_after(self, t: float) -> int:
        """Steps that ended after ``t`` with a non-empty tree."""
        return sum(1 for end, _, empty in self.steps if end > t and not empty)


def test_kill_9_under_load_restores_the_snapshot_and_clients_recover(tmp_path: Path) -> None:
    args = ["--snapshot-dir", str(tmp_path), "--snapshot-interval", "0.2"]
    texts = repetitive_texts(8, 400, seed=21)
    with ServerProcess(args) as server:
        fast = dict(timeout=0.25, connect_timeout=0.5, min_backoff=0.05, max_backoff=0.2)
        with RemoteDrafter(server.tcp_target, **fast) as d:  # type: ignore[arg-type]
            with RemoteDrafter(server.tcp_target, timeout=5.0) as teacher:
                learn(teacher, texts)
                nodes = teacher.stats()["trie_nodes"]
            snap = tmp_path / "ns-default.snap"
            wait_for(lambda: snap.exists() and snap.stat().st_size > 1000, 5, "a snapshot")
            time.sleep(0.5)  # a snapshot after the last lesson
            with Load(d, texts) as load:
                wait_for(lambda: load.drafted_after(0) > 20, 10, "drafts before the kill")
                server.stop(signal.SIGKILL)
                killed = time.monotonic()
                time.sleep(0.5)
                restarted = time.monotonic()
                server.start()
                wait_for(lambda: load.drafted_after(restarted) > 20, 15, "drafts after restart")
            assert not load.errors, load.errors
            down = [empty for end, _, empty in load.steps if killed + 0.3 < end < restarted]
            assert down and all(down), "steps while the server is down get empty trees"
            stats = d.stats()
            assert stats["trie_nodes"] >= nodes
            assert d.client_stats()["outages"] >= 1


def test_sigstop_falls_back_within_the_deadline_and_recovers() -> None:
    texts = repetitive_texts(6, 400, seed=31)
    with ServerProcess() as server:
        with RemoteDrafter(server.tcp_target, timeout=5.0) as teacher:
            learn(teacher, texts)
        with RemoteDrafter(server.tcp_target, timeout=0.1, min_backoff=0.05, max_backoff=0.2) as d:
            with Load(d, texts, seed=1) as load:
                wait_for(lambda: load.drafted_after(0) > 20, 10, "drafts before the pause")
                server.pause()
                paused = time.monotonic()
                time.sleep(2.0)
                resumed = time.monotonic()
                server.resume()
                wait_for(lambda: load.drafted_after(resumed + 0.2) > 20, 15, "drafts after SIGCONT")
            assert not load.errors, load.errors
            frozen = [
                (lat, empty) for end, lat, empty in load.steps if paused + 0.2 < end < resumed
            ]
            assert frozen, "steps went on while the server was frozen"
            assert all(empty for _, empty in frozen)
            # Each step costs at most its deadline, plus slack for a busy machine (a pause of
            # the test process's own, its garbage collector's or the scheduler's, 0.26 s seen
            # once on CI): a step that waited for the server would take over 1.8 s.
            assert max(lat for lat, _ in frozen) < 0.1 + 0.5, frozen


def test_short_soak_memory_flat_under_budget_and_latency_stable() -> None:
    duration = float(os.environ.get("LOOKAHEAD_SOAK_S", "15"))
    budget = 4 << 20
    args = ["--memory-budget", "4MiB", "--max-namespaces", "1"]
    # Mostly repetitive texts, with random tokens mixed in so the trie keeps growing and
    # eviction runs.
    rng = random.Random(3)
    texts = repetitive_texts(40, 600, seed=41)
    texts += [[rng.randrange(30_000) for _ in range(600)] for _ in range(400)]
    with ServerProcess(args) as server:
        baseline = rss_bytes(server.pid)
        rss: list[tuple[float, int]] = []
        drafters = [RemoteDrafter(server.tcp_target, timeout=1.0) for _ in range(2)]
        loads = [Load(dr, texts, seed=i) for i, dr in enumerate(drafters)]
        start = time.monotonic()
        for load in loads:
            load.__enter__()
        while time.monotonic() - start < duration:
            rss.append((time.monotonic() - start, rss_bytes(server.pid)))
            time.sleep(0.25)
        for load in loads:
            load.__exit__()
        stats = drafters[0].stats()
        for dr in drafters:
            dr.close()
    for load in loads:
        assert not load.errors, load.errors
    steps = sorted((end - start, lat) for load in loads for end, lat, _ in load.steps)
    third = duration / 3

    def p99(lo: float, hi: float) -> float:
        lats = [lat for t, lat in steps if lo <= t < hi]
        return statistics.quantiles(lats, n=100)[98]

    first, last = p99(0, third), p99(2 * third, duration)
    peak = max(v for _, v in rss)
    print(
        f"\nsoak {duration:.0f}s: steps={len(steps)} p99_first_third={first * 1e3:.2f}ms "
        f"p99_last_third={last * 1e3:.2f}ms baseline_rss={baseline >> 20}MiB "
        f"peak_rss={peak >> 20}MiB memory_bytes={stats['memory_bytes']} "
        f"evicted={stats['evicted_nodes']}"
    )
    assert stats["evicted_nodes"] > 0, "the budget was reached"
    assert stats["memory_bytes"] <= budget
    assert peak <= baseline + budget + budget // 2
    assert last <= max(3 * first, 0.02), (first, last)
