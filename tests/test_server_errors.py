"""Bad input against a real ``lookahead-server``: every refusal is a clear status or a
per-request error naming the field (mapped to the typed exceptions of
lookahead_client.errors), never a crash, and the server keeps serving. Also the command line
and graceful shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client._proto.lookahead.v1.lookahead_pb2_grpc import LookaheadStub
from lookahead_client.errors import (
    InvalidArgumentError,
    RequestAlreadyActiveError,
    ResourceExhaustedError,
    UnknownRequestError,
)
from lookahead_client.processes.server import ServerProcess, find_server_binary
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import StepRequest
from test_hardening import wait_for

LIMITS = [
    "--max-message-bytes",
    "64KiB",
    "--max-namespaces",
    "3",
    "--max-requests-per-step",
    "8",
    "--max-budget",
    "16",
    "--vocab-size",
    "1000",
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A server with small limits, shared by the module (the namespaces are: default,
    "second", and one that the namespace-limit test creates)."""
    with ServerProcess(LIMITS) as s:
        yield s


@pytest.fixture
def d(server: ServerProcess) -> Iterator[RemoteDrafter]:
    with RemoteDrafter(server.tcp_target, timeout=5.0) as drafter:
        yield drafter


@pytest.fixture
def stub(server: ServerProcess) -> Iterator[LookaheadStub]:
    with grpc.insecure_channel(server.tcp_target) as channel:
        yield LookaheadStub(channel)


@pytest.fixture(autouse=True)
def still_serving(server: ServerProcess) -> Iterator[None]:
    """After every test: the server process is alive and answers health checks."""
    yield
    assert server.alive(), server.log()
    with grpc.insecure_channel(server.tcp_target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def field_of(error: grpc.RpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get("lookahead-field")


# -- token ids -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "field"),
    [(-1, "new_tokens"), (1000, "new_tokens"), (2**32, "new_tokens"), (2**40, "new_tokens")],
)
def test_bad_new_tokens_are_refused_naming_the_field(
    d: RemoteDrafter, token: int, field: str
) -> None:
    d.start("t", [1, 2, 3])
    with pytest.raises(InvalidArgumentError) as info:
        d.append("t", [5, token])
    assert info.value.field == field
    assert f"new_tokens[1] = {token}" in str(info.value)
    # Nothing of the refused request was applied; it goes on.
    d.append("t", [4])
    assert d.draft("t", 4).root == 4
    d.end("t")


def test_bad_prompt_tokens_and_ids_beyond_int64(d: RemoteDrafter) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        d.start("p", [1, -7])
    assert info.value.field == "prompt"
    assert "prompt[1] = -7 is negative" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        d.start("p", [2**63])  # cannot even travel as int64: refused by the client
    assert info.value.field == "prompt"
    with pytest.raises(UnknownRequestError):
        d.draft("p", 4)


# -- budgets ---------------------------------------------------------------------------


def test_budgets(d: RemoteDrafter) -> None:
    d.start("b", [1, 2, 3, 1, 2, 3, 1, 2])
    assert len(d.draft("b", 0)) == 0
    assert len(d.draft("b", 16)) > 0
    for budget in (17, -1):
        with pytest.raises(InvalidArgumentError) as info:
            d.draft("b", budget)
        assert info.value.field == "budget"
    with pytest.raises(InvalidArgumentError) as info:
        d.draft("b", 2**31)  # not an int32: refused by the client
    assert info.value.field == "budget"
    d.end("b")


# -- request ids -----------------------------------------------------------------------


def test_unknown_and_finished_requests(d: RemoteDrafter) -> None:
    with pytest.raises(UnknownRequestError) as info:
        d.append("nobody", [1])
    assert info.value.field == "request_id"
    d.start("f", [1, 2])
    d.step([StepRequest("f", new_tokens=[3], budget=4, finished=True)])
    with pytest.raises(UnknownRequestError) as info:
        d.append("f", [4])  # tokens for a finished request
    assert info.value.field == "request_id"
    with pytest.raises(UnknownRequestError):
        d.end("f")
    d.start("f", [9])  # the id may be used again
    with pytest.raises(RequestAlreadyActiveError) as info:
        d.start("f", [9])
    assert info.value.field == "request_id"
    d.end("f")


def test_empty_and_repeated_request_ids(stub: LookaheadStub) -> None:
    reply = stub.Step(
        pb.StepRequest(
            namespace="second",
            requests=[
                pb.RequestStep(request_id="", budget=1),
                pb.RequestStep(request_id="x", prompt=pb.TokenList(tokens=[1, 2])),
                pb.RequestStep(request_id="x", new_tokens=[3]),
                pb.RequestStep(request_id="y", new_tokens=[3], reset=True),
            ],
        ),
        timeout=5,
    )
    errors = [(e.index, e.code, e.field) for e in reply.errors]
    assert errors == [
        (0, pb.ERROR_CODE_INVALID_ARGUMENT, "request_id"),
        (2, pb.ERROR_CODE_INVALID_ARGUMENT, "request_id"),
        (3, pb.ERROR_CODE_INVALID_ARGUMENT, "reset"),
    ]
    assert list(reply.roots) == [-1, 2, -1, -1]
    assert "repeated" in reply.errors[1].message
    stub.Step(
        pb.StepRequest(
            namespace="second", requests=[pb.RequestStep(request_id="x", finished=True)]
        ),
        timeout=5,
    )


# -- whole-step limits -----------------------------------------------------------------


def test_messages_over_the_size_limit(d: RemoteDrafter, stub: LookaheadStub) -> None:
    huge = [999] * 40_000  # about 80 KiB on the wire, over the 64 KiB limit
    with pytest.raises(ResourceExhaustedError):
        d.start("huge", huge)
    with pytest.raises(grpc.RpcError) as info:
        stub.Step(
            pb.StepRequest(
                requests=[pb.RequestStep(request_id="huge", prompt=pb.TokenList(tokens=huge))]
            ),
            timeout=5,
        )
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE


def test_too_many_requests_in_one_step(d: RemoteDrafter) -> None:
    with pytest.raises(ResourceExhaustedError) as info:
        d.step([StepRequest(f"r{i}", prompt=[1]) for i in range(9)])
    assert info.value.field == "requests"
    assert info.value.index == -1
    assert d.stats()["active_requests"] == 0, "a refused step applies nothing"


# -- namespaces ------------------------------------------------------------------------


def test_namespaces(server: ServerProcess, stub: LookaheadStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Stats(pb.StatsRequest(namespace="never-used"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert field_of(info.value) == "namespace"
    # The client reads a namespace the server has not created yet as all zeros.
    with RemoteDrafter(server.tcp_target, namespace="never-used") as fresh:
        assert set(fresh.stats().values()) == {0}

    with RemoteDrafter(server.tcp_target, namespace="bad name!", timeout=5.0) as bad:
        with pytest.raises(InvalidArgumentError) as err:
            bad.start("a", [1])
        assert err.value.field == "namespace"

    # default and "second" exist; one more fits, the next does not.
    with RemoteDrafter(server.tcp_target, namespace="third", timeout=5.0) as third:
        third.start("a", [1])
    with RemoteDrafter(server.tcp_target, namespace="fourth", timeout=5.0) as fourth:
        with pytest.raises(ResourceExhaustedError) as err:
            fourth.start("a", [1])
        assert err.value.field == "namespace"
        with pytest.raises(ResourceExhaustedError) as err:
            fourth.ingest([1, 2, 3])
        assert err.value.field == "namespace"


# -- streams ---------------------------------------------------------------------------


def test_one_bad_request_does_not_kill_the_stream(stub: LookaheadStub) -> None:
    def steps() -> Iterator[pb.StepRequest]:
        yield pb.StepRequest(
            namespace="second",
            step_id=1,
            requests=[
                pb.RequestStep(
                    request_id=f"s{i}", prompt=pb.TokenList(tokens=[1, 2, 3, 1, 2]), budget=4
                )
                for i in range(8)
            ],
        )
        bad = [pb.RequestStep(request_id=f"s{i}", new_tokens=[3], budget=4) for i in range(8)]
        bad[5].new_tokens[0] = -3
        yield pb.StepRequest(namespace="second", step_id=2, requests=bad)
        yield pb.StepRequest(namespace="no such namespace!", step_id=3)
        yield pb.StepRequest(
            namespace="second",
            step_id=4,
            requests=[pb.RequestStep(request_id=f"s{i}", finished=True) for i in range(8)],
        )

    answers = list(stub.StepStream(steps(), timeout=10))
    assert [a.step_id for a in answers] == [1, 2, 3, 4]
    second = answers[1]
    assert [(e.index, e.field) for e in second.errors] == [(5, "new_tokens")]
    assert list(second.roots) == [3] * 5 + [-1] + [3] * 2
    assert sum(second.sizes) == len(second.tokens) > 0
    assert answers[2].error.field == "namespace" and not answers[2].roots
    assert not answers[3].errors and len(answers[3].roots) == 8


# -- ingest ----------------------------------------------------------------------------


def test_ingest_errors_name_the_document(d: RemoteDrafter, stub: LookaheadStub) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        d.ingest([1, 2, 5000])
    assert info.value.field == "tokens"
    messages = iter(
        [pb.IngestRequest(documents=[pb.TokenList(tokens=[1, 2]), pb.TokenList(tokens=[3, -4])])]
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.Ingest(messages, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_of(err.value) == "documents[1].tokens"
    assert "1 documents of this call were ingested" in err.value.details()
    assert d.ingest_many([[1, 2, 3]] * 5, batch_tokens=4) == {"documents": 5, "tokens": 15}


# -- command line and shutdown ---------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_server_binary(), *args], capture_output=True, text=True, timeout=30)


def test_bad_command_lines_exit_2_naming_the_flag() -> None:
    for args, flag in [
        (["--listen", "nowhere"], "--listen"),
        (["--memory-budget", "lots"], "--memory-budget"),
        (["--max-namespaces", "0"], "--max-namespaces"),
        (["--log-format", "xml"], "--log-format"),
    ]:
        done = run_cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert flag in done.stderr, (args, done.stderr)
    assert run_cli("--help").returncode == 0


def test_unusable_listen_address_exits_1(tmp_path: object) -> None:
    not_a_socket = os.path.join(str(tmp_path), "file")
    with open(not_a_socket, "w") as f:
        f.write("x")
    done = run_cli("--listen", f"unix://{not_a_socket}")
    assert done.returncode == 1
    assert "cannot listen on" in done.stderr and "not a socket" in done.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_shutdown(sig: int) -> None:
    server = ServerProcess(["--log-format", "json"]).start()
    try:
        with RemoteDrafter(server.unix_target, timeout=5.0, stream=True) as drafter:
            drafter.start("a", [1, 2, 3])  # an open stream must not block the shutdown
            assert server.stop(sig) == 0
        assert server.socket_path is not None and not os.path.exists(server.socket_path)
        log = server.log()
        assert '"message":"stopped"' in log.replace(" ", ""), log
    finally:
        server.close()


def test_graceful_shutdown_when_the_parent_blocked_the_signals() -> None:
    """The signal mask is inherited across exec: a server started by a process that blocks
    SIGTERM and SIGINT still shuts down gracefully on them."""
    shutdown = {signal.SIGTERM, signal.SIGINT}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, shutdown)
    try:
        server = ServerProcess(["--log-format", "json"]).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        with open(f"/proc/{server.pid}/status") as f:
            masks = dict(line.split(":\t", 1) for line in f if line.startswith("Sig"))
        assert int(masks["SigBlk"], 16) & (1 << (signal.SIGTERM - 1)), "inherited blocked"
        assert server.stop(signal.SIGTERM) == 0
        assert '"message":"stopped"' in server.log().replace(" ", ""), server.log()
    finally:
        server.close()


def test_second_signal_ends_a_graceful_shutdown_at_once() -> None:
    """A graceful shutdown waits up to --shutdown-grace for open calls (here an ingest whose
    client never ends its stream); a second signal ends the process at once, status 1."""
    server = ServerProcess(["--shutdown-grace", "120"]).start()
    release = threading.Event()

    def documents() -> Iterator[pb.IngestRequest]:
        yield pb.IngestRequest(documents=[pb.TokenList(tokens=[1, 2, 3])])
        release.wait(180)

    try:
        with grpc.insecure_channel(server.tcp_target) as channel:
            call = LookaheadStub(channel).Ingest.future(documents())
            wait_for(lambda: "namespace created" in server.log(), 10, "the ingest to begin")
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            wait_for(lambda: "SIGTERM received" in server.log(), 10, "the first signal")
            time.sleep(0.5)
            assert server.alive(), "the open ingest holds the graceful shutdown"
            started = time.monotonic()
            assert server.stop(signal.SIGTERM, timeout=10) == 1
            assert time.monotonic() - started < 5
            assert "second shutdown signal" in server.log(), server.log()
            release.set()
            with pytest.raises(grpc.RpcError):
                call.result(timeout=10)
    finally:
        release.set()
        server.close()
