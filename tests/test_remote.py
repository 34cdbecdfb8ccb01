"""The remote drafter against a real ``lookahead-server`` process: the same call sequences give
the same trees as the embedded drafter (over TCP and a Unix socket, unary and streamed, sync
and asyncio); health and reflection answer; steps fall back to empty drafts when the server
stops or hangs and recover when it comes back; the client survives fork and spawn."""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from lookahead_client import EmbeddedDrafter
from lookahead_client.errors import (
    InvalidArgumentError,
    LookaheadError,
    UnknownRequestError,
)
from lookahead_client.processes.server import ServerProcess
from lookahead_client.remote import RemoteDrafter
from lookahead_client.remote.aio import AsyncRemoteDrafter
from lookahead_client.types import DraftTree, StepRequest
from remote_support import SERVER_NAMESPACE_BUDGET, SyncFacade, greedy_accept, repetitive_texts

LOGGER = "lookahead_client.remote"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One server (TCP + Unix socket) for the module; tests use their own namespaces, each
    with a memory budget of SERVER_NAMESPACE_BUDGET."""
    namespaces = 32
    budget = str(SERVER_NAMESPACE_BUDGET * namespaces)
    with ServerProcess(["--memory-budget", budget, "--max-namespaces", str(namespaces)]) as s:
        yield s


@pytest.fixture
def own_server() -> Iterator[ServerProcess]:
    """A server for one test (which may stop, pause or restart it)."""
    with ServerProcess() as s:
        yield s


# -- the shared suite: identical trees for identical call sequences ----------------------


def scenario(d: Any) -> list[Any]:
    """Drives a drafter through a mixed sequence (ingest, start, steps with feedback, a
    request started mid-run, draft/append, refused requests, ends) and records every tree
    and every refusal."""
    texts = repetitive_texts(7, 1200, seed=3)
    record: list[Any] = []

    def refused(call: Any) -> None:
        try:
            call()
        except LookaheadError as e:
            record.append(("refused", type(e).__name__, e.field))
        else:
            record.append(("accepted",))

    d.ingest(texts[0])
    d.ingest(texts[1])
    truth = {f"r{i}": texts[i + 2] for i in range(5)}
    pos = {rid: 24 for rid in truth}
    d.start("r0", truth["r0"][:24])
    d.start("r1", truth["r1"][:24])
    first = d.step(
        [
            StepRequest("r2", prompt=truth["r2"][:24], budget=8),
            StepRequest("r3", prompt=truth["r3"][:24], budget=4),
        ]
    )
    record.append([astuple(t) for t in first])
    active = ["r0", "r1", "r2", "r3"]
    last: dict[str, DraftTree | None] = {"r2": first[0], "r3": first[1]}
    for step in range(36):
        requests = []
        for rid in active:
            tree = last.get(rid)
            accepted = greedy_accept(tree, truth[rid][pos[rid] :])
            new = truth[rid][pos[rid] : pos[rid] + accepted + 1]
            pos[rid] += len(new)
            requests.append(
                StepRequest(
                    rid,
                    new_tokens=new,
                    budget=(8, 4, 16, 0)[step % 4],
                    accepted_last=accepted if tree is not None else -1,
                    finished=pos[rid] >= len(truth[rid]) or (rid == "r1" and step == 20),
                )
            )
        if step == 10:
            requests.append(StepRequest("r4", prompt=truth["r4"][:24], budget=8))
        active = [r.request_id for r in requests if not r.finished]
        if step == 15:
            # One bad request among good ones: the others are applied all the same.
            requests.append(StepRequest("ghost", new_tokens=[1], budget=4))
            refused(lambda reqs=requests: d.step(reqs))
            last = {}
            continue
        trees = d.step(requests)
        record.append([astuple(t) for t in trees])
        last = dict(zip([r.request_id for r in requests], trees, strict=True))
        if step == 25:
            record.append(astuple(d.draft("r0", 12)))
            d.append("r2", truth["r2"][pos["r2"] : pos["r2"] + 3])
            pos["r2"] += 3
            last["r2"] = None

    refused(lambda: d.start("r0", [1, 2, 3]))
    refused(lambda: d.draft("r0", 65))
    refused(lambda: d.append("r0", [-1]))
    refused(lambda: d.append("never-started", [1]))
    refused(lambda: d.step([StepRequest("r1", new_tokens=[5], budget=4)]))  # r1 finished
    record.append(astuple(d.draft("r0", 8)))
    for rid in active:
        d.end(rid)
    refused(lambda: d.end("r0"))
    record.append(d.stats()["active_requests"])
    return record


def astuple(tree: DraftTree) -> tuple[Any, ...]:
    """A tree as comparable plain values."""
    return (tree.root, tree.tokens, tree.parents, tree.scores)


DRAFTER_KINDS = [
    "tcp-unary",
    "unix-unary",
    "tcp-stream",
    "unix-stream",
    "aio-unix-stream",
    "aio-tcp-unary",
]


def make_drafter(kind: str, server: ServerProcess, namespace: str) -> Any:
    """A remote drafter of the given kind (transport, target, sync or asyncio)."""
    target = server.unix_target if "unix" in kind else server.tcp_target
    settings: dict[str, Any] = {
        "namespace": namespace,
        "timeout": 5.0,
        "stream": kind.endswith("stream"),
    }
    if kind.startswith("aio-"):
        return SyncFacade(AsyncRemoteDrafter(target, **settings))
    return RemoteDrafter(target, **settings)


@pytest.fixture(scope="module")
def embedded_record() -> list[Any]:
    """The scenario's record on the embedded drafter (the reference)."""
    return scenario(EmbeddedDrafter(memory_budget_bytes=SERVER_NAMESPACE_BUDGET))


@pytest.mark.parametrize("kind", DRAFTER_KINDS)
def test_remote_gives_the_same_trees_as_embedded(
    kind: str, server: ServerProcess, embedded_record: list[Any]
) -> None:
    d = make_drafter(kind, server, namespace=f"parity-{kind}")
    try:
        record = scenario(d)
    finally:
        d.close()
    assert len(record) == len(embedded_record)
    for i, (got, want) in enumerate(zip(record, embedded_record, strict=True)):
        assert got == want, f"record entry {i} differs"
    # The scenario drafts for real (not only empty trees) and refuses what it must.
    assert sum(len(entry[1]) for step in record if isinstance(step, list) for entry in step) > 50
    assert ("refused", "UnknownRequestError", "request_id") in record
    assert ("refused", "RequestAlreadyActiveError", "request_id") in record
    assert ("refused", "InvalidArgumentError", "budget") in record
    assert ("refused", "InvalidArgumentError", "new_tokens") in record


def test_stats_have_the_keys_of_the_embedded_drafter(server: ServerProcess) -> None:
    with RemoteDrafter(server.tcp_target, namespace="stats-keys", timeout=5.0) as d:
        fresh = d.stats()
        d.start("a", [1, 2, 3])
        stats = d.stats()
    embedded = EmbeddedDrafter(memory_budget_bytes=SERVER_NAMESPACE_BUDGET).stats()
    assert set(fresh) == set(stats) == set(embedded)
    assert stats["active_requests"] == 1
    assert stats["memory_budget_bytes"] == SERVER_NAMESPACE_BUDGET


def test_refusal_carries_the_other_trees(server: ServerProcess) -> None:
    with RemoteDrafter(server.tcp_target, namespace="partial", timeout=5.0) as d:
        text = repetitive_texts(1, 80, seed=9)[0]
        d.start("a", text[:60])
        with pytest.raises(UnknownRequestError) as info:
            d.step(
                [
                    StepRequest("a", new_tokens=text[60:61], budget=8),
                    StepRequest("nobody", new_tokens=[1], budget=8),
                ]
            )
        assert info.value.field == "request_id"
        assert info.value.index == 1
        assert info.value.batch[0].root == text[60]
        assert list(info.value.batch.errors) == [1]
        # The good request was applied: the next step continues from it.
        assert d.draft("a", 4).root == text[60]


# -- health and reflection -------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_health_answers_serving(server: ServerProcess, transport: str) -> None:
    target = server.tcp_target if transport == "tcp" else server.unix_target
    options = [("grpc.default_authority", "localhost")] if transport == "unix" else []
    with grpc.insecure_channel(target, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "lookahead.v1.Lookahead"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_describes_the_service(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.tcp_target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"lookahead.v1.Lookahead", "grpc.health.v1.Health"} <= services
        from google.protobuf.descriptor_pool import DescriptorPool

        pool = DescriptorPool(db)
        service = pool.FindServiceByName("lookahead.v1.Lookahead")
        assert {m.name for m in service.methods} == {
            "Step",
            "StepStream",
            "Ingest",
            "Stats",
            "Info",
        }
        new_tokens = pool.FindMessageTypeByName("lookahead.v1.RequestStep").fields_by_name[
            "new_tokens"
        ]
        assert new_tokens.type == new_tokens.TYPE_INT64


# -- fallback and recovery -------------------------------------------------------------


class Engine:
    """A tiny engine: requests over repetitive texts, each step advancing every request by
    its accepted draft tokens plus one."""

    def __init__(self, drafter: Any, n: int = 3, seed: int = 5) -> None:
        self.d = drafter
        self.texts = {f"q{i}": t for i, t in enumerate(repetitive_texts(n, 4000, seed=seed))}
        self.pos = {rid: 40 for rid in self.texts}
        self.last: dict[str, DraftTree] = {}
        for rid, text in self.texts.items():
            self.d.start(rid, text[:40])

    def step(self, budget: int = 8) -> list[DraftTree]:
        requests = []
        for rid, text in self.texts.items():
            accepted = greedy_accept(self.last.get(rid), text[self.pos[rid] :])
            new = text[self.pos[rid] : self.pos[rid] + accepted + 1]
            self.pos[rid] += len(new)
            requests.append(StepRequest(rid, new_tokens=new, budget=budget))
        trees = self.d.step(requests)
        self.last = dict(zip(self.texts, trees, strict=True))
        return trees

    def roots_match(self, trees: list[DraftTree]) -> bool:
        """Every tree hangs under the request's true last token."""
        return all(
            t.root == self.texts[rid][self.pos[rid] - 1]
            for rid, t in zip(self.texts, trees, strict=True)
        )

    def step_until_drafting(self, limit_s: float = 10.0) -> list[DraftTree]:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            trees = self.step()
            if any(trees):
                return trees
            time.sleep(0.01)
        raise AssertionError("drafting did not resume")


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.mark.parametrize(
    ("stream", "transport", "sig"),
    [(False, "tcp", signal.SIGTERM), (True, "unix", signal.SIGKILL)],
    ids=["unary-tcp-sigterm", "stream-unix-sigkill"],
)
def test_fallback_when_the_server_stops_and_recovery_when_it_restarts(
    own_server: ServerProcess,
    stream: bool,
    transport: str,
    sig: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    d = RemoteDrafter(
        own_server.tcp_target if transport == "tcp" else own_server.unix_target,
        namespace="fb",
        timeout=0.25,
        stream=stream,
        min_backoff=0.02,
        max_backoff=0.1,
    )
    engine = Engine(d)
    trees = [engine.step() for _ in range(5)]
    assert any(any(t) for t in trees), "drafts before the outage"

    # A killed server leaves its socket file behind: the restart must replace it.
    assert own_server.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    for _ in range(30):
        started = time.monotonic()
        trees = engine.step()
        assert time.monotonic() - started < 0.25 + 0.5
        assert not any(trees), "empty drafts while the server is down"
        assert engine.roots_match(trees)
    assert len(messages(caplog, logging.WARNING)) == 1, "the outage is logged once"
    assert d.client_stats()["available"] is False

    own_server.start()
    trees = engine.step_until_drafting()
    assert engine.roots_match(trees)
    assert len(messages(caplog, logging.INFO)) == 1, "the recovery is logged once"
    stats = d.client_stats()
    assert stats["available"] is True and stats["resyncs"] >= 3
    # The restarted server holds every request again, with all its tokens.
    assert d.stats()["active_requests"] == 3
    for _ in range(5):
        trees = engine.step()
        assert engine.roots_match(trees)
    d.close()


def test_restart_between_two_steps_is_repaired_within_the_step(
    own_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    d = RemoteDrafter(own_server.unix_target, namespace="restart", timeout=2.0)
    engine = Engine(d)
    engine.step()
    own_server.restart()
    # The channel reconnects within the step's deadline; the server answers UNKNOWN_REQUEST
    # for the lost requests and the client re-sends them at once.
    trees = engine.step_until_drafting()
    assert engine.roots_match(trees)
    assert d.client_stats()["resyncs"] >= 3
    assert d.stats()["active_requests"] == 3
    d.close()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_hung_server_costs_one_deadline_then_recovers(
    own_server: ServerProcess, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    d = RemoteDrafter(
        own_server.tcp_target,
        namespace="hang",
        timeout=0.2,
        stream=stream,
        min_backoff=0.5,
        max_backoff=1.0,
    )
    engine = Engine(d)
    engine.step()
    own_server.pause()
    try:
        started = time.monotonic()
        trees = engine.step()
        assert 0.15 < time.monotonic() - started < 1.0, "one step waits for its deadline"
        assert not any(trees)
        # Within the backoff, steps do not wait on the hung server at all.
        started = time.monotonic()
        for _ in range(10):
            assert not any(engine.step())
        assert time.monotonic() - started < 0.4
    finally:
        own_server.resume()
    # The step that timed out reaches the server late; the client does not know whether it
    # was applied, so it re-sends its requests with reset and both sides agree again.
    trees = engine.step_until_drafting()
    assert engine.roots_match(trees)
    assert d.stats()["active_requests"] == 3
    for _ in range(5):
        assert engine.roots_match(engine.step())
    assert len(messages(caplog, logging.WARNING)) == 1
    d.close()


def test_finishes_lost_in_an_outage_are_delivered_later(own_server: ServerProcess) -> None:
    d = RemoteDrafter(
        own_server.tcp_target, namespace="owed", timeout=0.3, min_backoff=0.01, max_backoff=0.05
    )
    d.start("a", [1, 2, 3])
    d.start("b", [4, 5, 6])
    own_server.pause()
    try:
        d.end("a")  # times out: the server may or may not have applied it
    finally:
        own_server.resume()
    assert d.client_stats()["owed_ends"] == 1
    time.sleep(0.1)
    deadline = time.monotonic() + 5
    while d.client_stats()["owed_ends"] and time.monotonic() < deadline:
        d.draft("b", 4)
        time.sleep(0.02)
    assert d.client_stats()["owed_ends"] == 0
    assert d.stats()["active_requests"] == 1
    d.close()


# -- processes -------------------------------------------------------------------------


def _child_drafts(d: RemoteDrafter, out: Any) -> None:
    d.start("child", [7, 8, 9, 7, 8])
    out.put((d.draft("child", 4).root, d.stats()["active_requests"]))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_client_works_in_forked_and_spawned_processes(
    server: ServerProcess, method: str
) -> None:
    d = RemoteDrafter(server.unix_target, namespace=f"proc-{method}", timeout=5.0)
    d.start("parent", [1, 2, 3, 1, 2])
    assert d.draft("parent", 4).root == 2
    ctx = multiprocessing.get_context(method)
    out = ctx.Queue()
    child = ctx.Process(target=_child_drafts, args=(d, out))
    child.start()
    root, active = out.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert (root, active) == (8, 2)
    # The parent's channel still works after the fork.
    d.append("parent", [3])
    assert d.draft("parent", 4).root == 3
    d.close()


def test_targets_are_checked() -> None:
    for bad in ["", "localhost", "host:notaport", "unix://relative", "unix:"]:
        with pytest.raises(InvalidArgumentError) as info:
            RemoteDrafter(bad)
        assert info.value.field == "target"
    with pytest.raises(InvalidArgumentError) as info:
        RemoteDrafter("127.0.0.1:1", timeout=0)
    assert info.value.field == "timeout"


def test_nothing_listening_falls_back_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    from lookahead_client.processes.server import free_tcp_port

    d = RemoteDrafter(f"127.0.0.1:{free_tcp_port()}", timeout=0.5)
    started = time.monotonic()
    d.start("a", [1, 2, 3])
    tree = d.draft("a", 8)
    assert time.monotonic() - started < 1.5
    assert tree == DraftTree.empty(3)
    # The client remembers its request while offline, to re-send it later.
    assert d.client_stats()["active_requests"] == 1
    assert len(messages(caplog, logging.WARNING)) == 1
