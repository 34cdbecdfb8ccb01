"""Production hardening of ``lookahead-server``, against the real binary: snapshots (restored
after kill -9, corrupt files refused or moved aside), limits with clear statuses, request
expiry, memory under budget, Prometheus metrics, bearer tokens, Unix socket mode and TLS."""

from __future__ import annotations

import http.client
import os
import random
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client._proto.lookahead.v1.lookahead_pb2_grpc import LookaheadStub
from lookahead_client.errors import UnauthenticatedError
from lookahead_client.processes.server import ServerProcess, free_tcp_port
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import StepRequest
from remote_support import repetitive_texts

SNAPSHOT_FILE = "ns-default.snap"


# -- helpers shared with test_faults ------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def scrape(port: int) -> dict[str, float]:
    """The metrics endpoint's samples: ``{'name{labels}': value}``, labels sorted by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
        text = reply.read().decode()
    assert text.endswith("# EOF\n")
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            name, _, labels = key.partition("{")
            if labels:
                key = name + "{" + ",".join(sorted(labels.rstrip("}").split(","))) + "}"
            samples[key] = float(value)
    return samples


def wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Polls ``condition()`` until it is true; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def learn(drafter: RemoteDrafter, texts: list[list[int]], prefix: str = "r") -> None:
    """Runs ``texts`` through the drafter as finished requests (prompt, then the rest)."""
    for i, text in enumerate(texts):
        rid = f"{prefix}{i}"
        drafter.step([StepRequest(rid, prompt=text[:50], budget=4)])
        for j in range(50, len(text), 25):
            drafter.step([StepRequest(rid, new_tokens=text[j : j + 25], budget=4)])
        drafter.end(rid)


def probe(drafter: RemoteDrafter, context: list[int], rid: str = "probe") -> tuple:
    """The draft tree (as a tuple of its fields) for ``context``."""
    tree = drafter.step([StepRequest(rid, prompt=context, budget=16)])[0]
    return (tree.root, tuple(tree.tokens), tuple(tree.parents), tuple(tree.scores))


def raw_step(stub: LookaheadStub, requests: list[pb.RequestStep], **kw: object) -> pb.StepResponse:
    """One Step call with the generated stub."""
    return stub.Step(pb.StepRequest(requests=requests), timeout=5, **kw)


# -- persistence ----------------------------------------------------------------------------------


def test_snapshot_survives_kill_9_and_restores_the_same_drafts(tmp_path: Path) -> None:
    snaps = tmp_path / "snaps"
    args = ["--snapshot-dir", str(snaps), "--snapshot-interval", "0.2", "--max-namespaces", "2"]
    texts = repetitive_texts(6, 600, seed=11)
    context = texts[0][:120]
    with ServerProcess(args) as server:
        with RemoteDrafter(server.tcp_target, timeout=5.0) as d:
            learn(d, texts)
            nodes = d.stats()["trie_nodes"]
            assert nodes > 100
            path = snaps / SNAPSHOT_FILE
            # Wait for two periodic writes after the last change: the file holds this state.
            wait_for(path.exists, 5, "the first snapshot")
            first = path.stat().st_mtime_ns
            wait_for(lambda: path.stat().st_mtime_ns != first, 5, "a second snapshot")
            state = path.read_bytes()
            live = probe(d, context)
            assert live[1], "the probe context should draft something"
        # A hard kill: the last periodic snapshot is what survives.
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        server.start()
        with RemoteDrafter(server.tcp_target, timeout=5.0) as d:
            assert d.stats()["trie_nodes"] >= nodes, "restored after kill -9"
        server.stop(signal.SIGKILL)
        # The state of the snapshot taken before the probe gives the probe's tree again.
        path.write_bytes(state)
        server.start()
        with RemoteDrafter(server.tcp_target, timeout=5.0) as d:
            assert d.stats()["trie_nodes"] == nodes
            assert probe(d, context) == live
        assert "snapshot restored" in server.log()


def test_graceful_shutdown_writes_a_final_snapshot(tmp_path: Path) -> None:
    snaps = tmp_path / "snaps"
    # No periodic snapshots: only the one written at shutdown.
    args = ["--snapshot-dir", str(snaps), "--snapshot-interval", "0"]
    with ServerProcess(args) as server:
        with RemoteDrafter(server.tcp_target, namespace="m/7b:v1", timeout=5.0) as d:
            learn(d, repetitive_texts(2, 300, seed=2))
            nodes = d.stats()["trie_nodes"]
        assert not list(snaps.iterdir())
        assert server.stop() == 0
        assert [p.name for p in snaps.iterdir()] == ["ns-m%2F7b%3Av1.snap"]
        server.start()
        with RemoteDrafter(server.tcp_target, namespace="m/7b:v1", timeout=5.0) as d:
            assert d.stats()["trie_nodes"] == nodes


def _corrupt_snapshot_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A snapshot directory whose default-namespace file is truncated."""
    snaps = tmp_path / "snaps"
    with ServerProcess(["--snapshot-dir", str(snaps)]) as server:
        with RemoteDrafter(server.tcp_target, timeout=5.0) as d:
            learn(d, repetitive_texts(2, 300, seed=4))
    path = snaps / SNAPSHOT_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return snaps, path


def test_corrupt_snapshot_fails_the_start_naming_the_file(tmp_path: Path) -> None:
    snaps, path = _corrupt_snapshot_dir(tmp_path)
    server = ServerProcess(["--snapshot-dir", str(snaps), "--on-corrupt", "fail"])
    try:
        with pytest.raises(RuntimeError) as failed:
            server.start()
        message = str(failed.value)
        assert "exited with 1" in message
        assert str(path) in message and "truncated" in message, message
        assert path.exists(), "the file is left for inspection"
    finally:
        server.close()


def test_corrupt_snapshot_is_moved_aside_and_the_namespace_starts_empty(tmp_path: Path) -> None:
    snaps, path = _corrupt_snapshot_dir(tmp_path)
    with ServerProcess(["--snapshot-dir", str(snaps), "--on-corrupt", "empty"]) as server:
        assert "CORRUPT SNAPSHOT SKIPPED" in server.log()
        assert not path.exists()
        assert (snaps / (SNAPSHOT_FILE + ".corrupt")).exists()
        with RemoteDrafter(server.tcp_target, timeout=5.0) as d:
            assert d.stats()["trie_nodes"] == 0


# -- limits ---------------------------------------------------------------------------------------


def test_limits_answer_resource_exhausted_naming_the_field() -> None:
    args = ["--max-active-requests", "2", "--max-step-tokens", "100", "--request-ttl", "0.3"]
    with ServerProcess(args) as server, grpc.insecure_channel(server.tcp_target) as channel:
        stub = LookaheadStub(channel)
        start = [
            pb.RequestStep(request_id=f"a{i}", prompt=pb.TokenList(tokens=[1, 2, 3]))
            for i in range(3)
        ]
        reply = raw_step(stub, start)
        assert [(e.index, e.code, e.field) for e in reply.errors] == [
            (2, pb.ERROR_CODE_RESOURCE_EXHAUSTED, "prompt")
        ]
        assert "--max-active-requests" in reply.errors[0].message
        with pytest.raises(grpc.RpcError) as big:
            raw_step(stub, [pb.RequestStep(request_id="b", new_tokens=[1] * 101)])
        assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-step-tokens" in big.value.details()
        # Idle requests expire after --request-ttl: the engine must re-send their prompt.
        wait_for(
            lambda: stub.Stats(pb.StatsRequest(), timeout=5).active_requests == 0,
            5,
            "idle requests to expire",
        )
        reply = raw_step(stub, [pb.RequestStep(request_id="a0", new_tokens=[4])])
        assert reply.errors[0].code == pb.ERROR_CODE_UNKNOWN_REQUEST


def test_memory_stays_under_budget_while_random_tokens_stream_in() -> None:
    budget = 8 << 20
    args = ["--memory-budget", "8MiB", "--max-namespaces", "1", "--request-ttl", "0"]
    with ServerProcess(args) as server, grpc.insecure_channel(server.tcp_target) as channel:
        stub = LookaheadStub(channel)
        baseline = rss_bytes(server.pid)
        rng = random.Random(5)
        peak, stop = baseline, time.monotonic() + 6.0
        sent = 0
        while time.monotonic() < stop:
            docs = [pb.TokenList(tokens=[rng.randrange(50_000) for _ in range(4096)])]
            stub.Ingest(iter([pb.IngestRequest(documents=docs)]), timeout=10)
            sent += 4096
            reqs = [
                pb.RequestStep(
                    request_id=f"s{sent}-{k}",
                    prompt=pb.TokenList(tokens=[rng.randrange(50_000) for _ in range(512)]),
                    budget=8,
                    finished=True,
                )
                for k in range(8)
            ]
            raw_step(stub, reqs)
            sent += 8 * 512
            peak = max(peak, rss_bytes(server.pid))
        stats = stub.Stats(pb.StatsRequest(), timeout=5)
        assert stats.evicted_nodes > 0, "the budget was reached (eviction ran)"
        assert stats.memory_bytes <= budget
        # RSS: the process baseline plus the budget, plus 50% slack for allocator overhead.
        slack = budget // 2
        print(
            f"\nrandom tokens sent={sent} baseline_rss={baseline >> 20}MiB "
            f"peak_rss={peak >> 20}MiB budget={budget >> 20}MiB memory_bytes={stats.memory_bytes}"
        )
        assert peak <= baseline + budget + slack, (peak, baseline)


# -- metrics --------------------------------------------------------------------------------------


def test_metrics_endpoint_reports_steps_drafts_and_errors() -> None:
    port = free_tcp_port()
    with ServerProcess(["--metrics-listen", f"127.0.0.1:{port}"]) as server:
        with RemoteDrafter(server.tcp_target, timeout=5.0) as d:
            learn(d, repetitive_texts(3, 300, seed=7))
            d.step([StepRequest("m", prompt=repetitive_texts(1, 200, seed=7)[0], budget=8)])
        with grpc.insecure_channel(server.tcp_target) as channel:
            stub = LookaheadStub(channel)
            raw_step(stub, [pb.RequestStep(request_id="ghost", new_tokens=[1])])
            with pytest.raises(grpc.RpcError):
                stub.Stats(pb.StatsRequest(namespace="missing"), timeout=5)
        m = scrape(port)
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    ns = 'namespace="default"'
    steps = m[f"lookahead_step_latency_seconds_count{{{ns}}}"]
    assert steps == 3 * 12 + 2  # learn() makes 12 steps per 300-token text, then "m" and "ghost"
    assert m[f'lookahead_step_latency_seconds_bucket{{le="+Inf",{ns}}}'] == steps
    assert m[f"lookahead_drafts_total{{{ns}}}"] > 0
    assert m[f"lookahead_draft_nodes_total{{{ns}}}"] > 0
    assert m[f"lookahead_trie_nodes{{{ns}}}"] > 0
    assert m[f"lookahead_memory_bytes{{{ns}}}"] > 0
    assert m[f"lookahead_active_requests{{{ns}}}"] == 1
    assert m[f'lookahead_request_errors_total{{code="ERROR_CODE_UNKNOWN_REQUEST",{ns}}}'] == 1
    assert m['lookahead_call_errors_total{code="NotFound",method="Stats"}'] == 1


def _http_exchange(port: int, payload: bytes, *, read_until_close: bool = True) -> bytes:
    """Sends raw bytes to the metrics port and returns what came back until the server
    closed the connection (or 5 s passed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if not read_until_close:
                break
        return b"".join(chunks)


def test_metrics_endpoint_speaks_http_like_a_server_should() -> None:
    """HEAD, keep-alive (two requests on one connection), 404/405, a malformed request and a
    client that never finishes its request head: the endpoint answers each as HTTP says and
    keeps serving."""
    port = free_tcp_port()
    with ServerProcess(["--metrics-listen", f"127.0.0.1:{port}"]):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("HEAD", "/metrics")
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        conn.request("GET", "/metrics")  # same connection: keep-alive
        body = conn.getresponse().read().decode()
        assert "lookahead_snapshot_failures_total 0" in body
        conn.request("POST", "/metrics", body=b"x")
        assert conn.getresponse().status == 405
        conn.close()
        assert _http_exchange(
            port, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", read_until_close=False
        ).startswith(b"HTTP/1.1 404")
        assert _http_exchange(port, b"\x00\x01 garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")  # ...and never the rest
        assert scrape(port)["lookahead_namespaces"] == 0  # others are served meanwhile
        slow.close()


def test_json_logs() -> None:
    with ServerProcess(["--log-format", "json"]) as server:
        first = server.log().splitlines()[0]
    assert re.match(r'^\{".*"message":"lookahead-server starting"', first), first


# -- access control -------------------------------------------------------------------------------


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text("# token  namespaces\nall-ns *\nmodel-a a,default\n")
    return path


@pytest.fixture
def auth_server(tokens_file: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["--auth-tokens", str(tokens_file)]) as server:
        yield server


def _status(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value.code()


def test_tokens_are_required_and_grant_namespaces(auth_server: ServerProcess) -> None:
    with grpc.insecure_channel(auth_server.tcp_target) as channel:
        stub = LookaheadStub(channel)
        one = [pb.RequestStep(request_id="r", prompt=pb.TokenList(tokens=[1, 2]))]
        assert _status(lambda: raw_step(stub, one)) == grpc.StatusCode.UNAUTHENTICATED
        bad = [("authorization", "Bearer nope")]
        assert _status(lambda: raw_step(stub, one, metadata=bad)) == grpc.StatusCode.UNAUTHENTICATED
        a = [("authorization", "Bearer model-a")]
        raw_step(stub, one, metadata=a)
        denied = pb.StepRequest(namespace="b", requests=one)
        assert (
            _status(lambda: stub.Step(denied, timeout=5, metadata=a))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        info = stub.Info(pb.InfoRequest(), timeout=5, metadata=a)
        assert list(info.namespaces) == ["default"]
        # A stream: steps of granted namespaces are answered, the first other one ends it.
        steps = [pb.StepRequest(step_id=1), pb.StepRequest(step_id=2, namespace="b")]
        answers = stub.StepStream(iter(steps), timeout=5, metadata=a)
        assert next(answers).step_id == 1
        assert _status(lambda: next(answers)) == grpc.StatusCode.PERMISSION_DENIED
        no_token = stub.StepStream(iter(steps[:1]), timeout=5)
        assert _status(lambda: next(no_token)) == grpc.StatusCode.UNAUTHENTICATED
    for n, target in enumerate((auth_server.tcp_target, auth_server.unix_target)):
        with RemoteDrafter(target, namespace="b", timeout=5.0, token="all-ns") as d:
            d.start(f"x{n}", [1, 2, 3])
            assert d.stats()["active_requests"] == n + 1
    with RemoteDrafter(auth_server.tcp_target, timeout=5.0) as d:
        with pytest.raises(UnauthenticatedError):
            d.stats()


def test_tokens_file_is_reloaded_on_change_and_on_sighup(
    auth_server: ServerProcess, tokens_file: Path
) -> None:
    with grpc.insecure_channel(auth_server.tcp_target) as channel:
        stub = LookaheadStub(channel)

        def allowed(token: str) -> bool:
            try:
                stub.Info(
                    pb.InfoRequest(), timeout=5, metadata=[("authorization", f"Bearer {token}")]
                )
                return True
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED
                return False

        assert allowed("all-ns") and not allowed("new-token")
        tokens_file.write_text("new-token *\n")
        wait_for(lambda: allowed("new-token"), 5, "the changed file to be reloaded")
        assert not allowed("all-ns")
        # SIGHUP reloads at once (same size and a restored mtime would not be noticed).
        stat = tokens_file.stat()
        tokens_file.write_text("old-token *\n")
        os.utime(tokens_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        os.kill(auth_server.pid, signal.SIGHUP)
        wait_for(lambda: allowed("old-token"), 5, "SIGHUP to reload the file")
        assert auth_server.alive()


def test_unix_socket_mode() -> None:
    with ServerProcess() as server:
        assert server.socket_path is not None
        assert os.stat(server.socket_path).st_mode & 0o777 == 0o600
    with ServerProcess(["--unix-socket-mode", "660"]) as server:
        assert server.socket_path is not None
        assert os.stat(server.socket_path).st_mode & 0o777 == 0o660


def test_stock_grpc_clients_work_over_the_unix_socket() -> None:
    """A plain ``grpc.insecure_channel("unix://...")`` with no options: grpcio sends the
    socket path as the HTTP/2 authority; health, steps and streams must still work."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with ServerProcess(tcp=False) as server:
        assert server.socket_path is not None
        for target in (server.unix_target, f"unix:{server.socket_path}"):
            with grpc.insecure_channel(target) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                stub = LookaheadStub(channel)
                answer = raw_step(
                    stub,
                    [
                        pb.RequestStep(
                            request_id="u", prompt=pb.TokenList(tokens=[1, 2, 3, 1, 2]), budget=4
                        )
                    ],
                )
                assert list(answer.roots) == [2]
                requests = iter(
                    [
                        pb.StepRequest(
                            step_id=7,
                            requests=[pb.RequestStep(request_id="u", new_tokens=[3], budget=4)],
                        )
                    ]
                )
                streamed = list(stub.StepStream(requests, timeout=5))
                assert [a.step_id for a in streamed] == [7]
                stub.Step(
                    pb.StepRequest(requests=[pb.RequestStep(request_id="u", finished=True)]),
                    timeout=5,
                )


def test_concurrent_snapshots_do_not_stall_steps(tmp_path: Path) -> None:
    """Steps go on while snapshots of a large trie are written every 50 ms."""
    args = ["--snapshot-dir", str(tmp_path), "--snapshot-interval", "0.05"]
    with ServerProcess(args) as server, RemoteDrafter(server.tcp_target, timeout=5.0) as d:
        d.ingest_many(repetitive_texts(20, 5000, seed=3))
        stop = threading.Event()
        worst: list[float] = []

        def steps() -> None:
            text = repetitive_texts(1, 4000, seed=8)[0]
            d.step([StepRequest("w", prompt=text[:64], budget=8)])
            i = 64
            while not stop.is_set() and i < len(text):
                t0 = time.perf_counter()
                d.step([StepRequest("w", new_tokens=text[i : i + 4], budget=8)])
                worst.append(time.perf_counter() - t0)
                i += 4

        worker = threading.Thread(target=steps)
        worker.start()
        time.sleep(2.0)
        stop.set()
        worker.join()
        written = len(list(tmp_path.glob("ns-*.snap")))
    assert written == 1 and len(worst) > 50
    print(f"\nsteps={len(worst)} max_step_ms={max(worst) * 1e3:.1f}")
    assert max(worst) < 1.0


def test_async_client_sends_its_token(auth_server: ServerProcess) -> None:
    from lookahead_client.remote.aio import AsyncRemoteDrafter
    from remote_support import SyncFacade

    d = SyncFacade(AsyncRemoteDrafter(auth_server.unix_target, namespace="a", token="model-a"))
    try:
        d.start("y", [1, 2, 3])
        assert d.stats()["active_requests"] == 1
    finally:
        d.close()


# -- TLS ------------------------------------------------------------------------------------------


def _pki(tmp_path: Path) -> dict[str, Path]:
    """A CA, a server certificate for localhost / 127.0.0.1 and a client certificate, as PEM
    files (written with the ``cryptography`` package)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject: str, key, issuer: str, issuer_key, *, ca: bool, san=None):  # type: ignore[no-untyped-def]
        b = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san is not None:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    files: dict[str, Path] = {}

    def write(label: str, data: bytes) -> None:
        files[label] = tmp_path / f"{label}.pem"
        files[label].write_bytes(data)

    def key_pem(key) -> bytes:  # type: ignore[no-untyped-def]
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert("test-ca", ca_key, "test-ca", ca_key, ca=True)
    write("ca", ca.public_bytes(serialization.Encoding.PEM))
    server_key = ec.generate_private_key(ec.SECP256R1())
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = cert("localhost", server_key, "test-ca", ca_key, ca=False, san=san)
    write("server", server.public_bytes(serialization.Encoding.PEM))
    write("server-key", key_pem(server_key))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = cert("engine-1", client_key, "test-ca", ca_key, ca=False, san=[x509.DNSName("e1")])
    write("client", client.public_bytes(serialization.Encoding.PEM))
    write("client-key", key_pem(client_key))
    return files


def test_mutual_tls_and_tokens(tmp_path: Path, tokens_file: Path) -> None:
    from lookahead_client.errors import UnavailableError
    from lookahead_client.remote.security import TlsSettings

    pki = _pki(tmp_path)
    tls = TlsSettings(
        root_certificates=pki["ca"],
        certificate_chain=pki["client"],
        private_key=pki["client-key"],
        server_name="localhost",
    )
    args = [
        "--tls-cert", str(pki["server"]), "--tls-key", str(pki["server-key"]),
        "--tls-client-ca", str(pki["ca"]), "--auth-tokens", str(tokens_file),
    ]  # fmt: skip
    with ServerProcess(args, tls=tls) as server:
        with RemoteDrafter(server.tcp_target, namespace="a", token="model-a", tls=tls) as d:
            d.start("t", [1, 2, 3])
            assert d.stats()["active_requests"] == 1
        # TLS without a client certificate, and plaintext, are refused by the transport.
        no_cert = TlsSettings(root_certificates=pki["ca"], server_name="localhost")
        for settings in (no_cert, None):
            with RemoteDrafter(server.tcp_target, token="model-a", tls=settings) as d:
                with pytest.raises(UnavailableError):
                    d.stats()
        # The Unix socket stays plaintext (file mode protects it); tokens still apply.
        with RemoteDrafter(server.unix_target, namespace="a", token="model-a") as d:
            assert d.stats()["active_requests"] == 1
