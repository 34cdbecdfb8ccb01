"""The cluster with real processes on loopback: one ``nats-server -js`` and two or three
``lookahead-server --cluster`` processes (docs/cluster.md). Learning crosses servers, namespaces
stay apart, and faults (kill -9 of NATS or of a server, NATS down at start, junk on the
subjects) never reach a client and never make a server apply a text twice."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client._proto.lookahead.v1.lookahead_pb2_grpc import LookaheadStub
from lookahead_client.processes.nats import NatsServerProcess
from lookahead_client.processes.server import ServerProcess, free_tcp_port
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import StepRequest
from remote_support import greedy_accept, repetitive_texts
from test_hardening import scrape, wait_for

CLUSTER = "t"
NS = "shared"


def cluster_server(
    nats_url: str, node: str, *extra: str, snapshot_dir: Path | None = None
) -> ServerProcess:
    """A server of cluster ``t`` with node id ``node`` and a metrics port."""
    args = ["--cluster", nats_url, "--cluster-name", CLUSTER, "--node-id", node]
    args += ["--cluster-batch-ms", "10", "--metrics-listen", f"127.0.0.1:{free_tcp_port()}"]
    if snapshot_dir is not None:
        args += ["--snapshot-dir", str(snapshot_dir)]
    server = ServerProcess([*args, *extra])
    server.metrics_port = int(args[args.index("--metrics-listen") + 1].rsplit(":", 1)[1])  # type: ignore[attr-defined]
    return server


def metrics(server: ServerProcess) -> dict[str, float]:
    return scrape(server.metrics_port)  # type: ignore[attr-defined]


def stub(server: ServerProcess) -> LookaheadStub:
    return LookaheadStub(grpc.insecure_channel(server.tcp_target))


def open_namespace(server: ServerProcess, namespace: str = NS) -> None:
    """Makes ``server`` serve ``namespace`` (an empty step creates it) without learning."""
    stub(server).Step(pb.StepRequest(namespace=namespace), timeout=5)


def ingested(server: ServerProcess, namespace: str = NS) -> int:
    reply = stub(server).Stats(pb.StatsRequest(namespace=namespace), timeout=5)
    return int(reply.tokens_ingested)


def ingest(server: ServerProcess, texts: list[list[int]], namespace: str = NS) -> int:
    """Ingests ``texts``; returns their tokens."""
    request = pb.IngestRequest(
        namespace=namespace, documents=[pb.TokenList(tokens=t) for t in texts]
    )
    reply = stub(server).Ingest(iter([request]), timeout=10)
    return int(reply.tokens)


def draft_accepts(server: ServerProcess, text: list[int], namespace: str = NS) -> int:
    """Greedy-accepted length of the server's draft after the first 40 tokens of ``text``."""
    with RemoteDrafter(server.tcp_target, namespace=namespace, timeout=5.0) as d:
        rid = f"probe-{time.monotonic_ns()}"
        tree = d.step([StepRequest(rid, prompt=text[:40], budget=16)])[0]
        d.step([StepRequest(rid, budget=0, finished=True)])
    return greedy_accept(tree, text[40:])


def same_tokens(a: ServerProcess, b: ServerProcess, timeout: float = 20.0) -> None:
    """Waits until ``b`` has applied exactly what ``a`` learnt (and stays there)."""
    wait_for(lambda: ingested(b) == ingested(a), timeout, "the other server to catch up")
    time.sleep(0.3)  # a duplicate would show up now
    assert ingested(b) == ingested(a)


@pytest.fixture
def nats() -> Iterator[NatsServerProcess]:
    with NatsServerProcess() as server:
        yield server


def nats_publish(port: int, subject: str, payload: bytes) -> None:
    """Publishes raw bytes with the NATS text protocol (JetStream stores them like any
    publish on the stream's subjects)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        assert s.recv(4096).startswith(b"INFO")
        s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
        s.sendall(f"PUB {subject} {len(payload)}\r\n".encode() + payload + b"\r\nPING\r\n")
        reply = b""
        while b"PONG" not in reply:
            chunk = s.recv(4096)
            assert chunk, "connection closed"
            reply += chunk


def test_text_learnt_on_one_server_drafts_on_the_others(nats: NatsServerProcess) -> None:
    texts = repetitive_texts(6, 400, seed=11)
    with ExitStack() as stack:
        a, b, c = (stack.enter_context(cluster_server(nats.url, n)) for n in "abc")
        alone = stack.enter_context(ServerProcess())
        for server in (b, c, alone):
            open_namespace(server)
        tokens = ingest(a, texts[:3])
        with RemoteDrafter(a.tcp_target, namespace=NS, timeout=5.0) as d:
            for i, text in enumerate(texts[3:]):  # requests that finish on a
                d.step([StepRequest(f"r{i}", prompt=text[:50], budget=4)])
                d.step([StepRequest(f"r{i}", new_tokens=text[50:], budget=0, finished=True)])
        assert tokens == 3 * 400
        same_tokens(a, b)
        same_tokens(a, c)
        probe = texts[4]
        assert draft_accepts(b, probe) > 0 and draft_accepts(c, probe) > 0
        assert draft_accepts(alone, probe) == 0, "a server outside the cluster learnt nothing"
        m = metrics(b)
        assert m[f'lookahead_cluster_consumed_messages_total{{namespace="{NS}"}}'] > 0
        assert m["lookahead_cluster_connected"] == 1
        assert metrics(a)["lookahead_cluster_published_messages_total"] > 0


def test_samples_of_one_prompt_on_two_servers_draft_from_each_other(
    nats: NatsServerProcess,
) -> None:
    """Two samples of one prompt, on two servers: the one that starts late drafts the text the
    other has written so far (its history) and what it writes next, while both are running."""
    rng = random.Random(4)
    prompt = [rng.randrange(1000, 2000) for _ in range(50)]
    output = [rng.randrange(2000, 3000) for _ in range(300)]

    def late_sample_accepts(server: ServerProcess, early: RemoteDrafter) -> int:
        with RemoteDrafter(server.tcp_target, namespace=NS, timeout=5.0) as late:
            late.step([StepRequest("s2", prompt=prompt, budget=0)])
            time.sleep(0.3)  # the history request and its answer
            early.step([StepRequest("s1", new_tokens=output[150:200], budget=0)])
            time.sleep(0.1)
            tree = late.step([StepRequest("s2", new_tokens=output[:160], budget=16)])[0]
            late.step([StepRequest("s2", budget=0, finished=True)])
        return greedy_accept(tree, output[160:])

    with ExitStack() as stack:
        a, b = (stack.enter_context(cluster_server(nats.url, n)) for n in "ab")
        alone = stack.enter_context(ServerProcess())
        for server, expect_drafts in ((b, True), (alone, False)):
            with RemoteDrafter(a.tcp_target, namespace=NS, timeout=5.0) as early:
                rid = "s1"
                early.step([StepRequest(rid, prompt=prompt, budget=0)])
                for i in range(0, 150, 10):  # s1 runs on a, 150 tokens in
                    early.step([StepRequest(rid, new_tokens=output[i : i + 10], budget=0)])
                accepted = late_sample_accepts(server, early)
                early.step([StepRequest(rid, budget=0, finished=True)])
            if expect_drafts:
                assert accepted >= 8, f"the late sample drafted {accepted} tokens of its sibling's"
                assert metrics(b)["lookahead_cluster_group_applied_tokens_total"] >= 150
            else:
                assert accepted == 0, "a server outside the cluster cannot know the sibling"


def novel_text(seed: int, length: int) -> list[int]:
    """Random tokens from a range no other test text uses: only learning can draft them."""
    rng = random.Random(seed)
    return [rng.randrange(5000, 9000) for _ in range(length)]


def test_a_running_request_drafts_on_the_other_servers_before_it_ends(
    nats: NatsServerProcess,
) -> None:
    """A request still running on a (in no group with anything on b): a request of another
    prompt on b drafts the text a's request has written so far, as on one server; its end adds
    nothing to b's trie that its steps had not brought."""
    prompt, output = novel_text(31, 30), novel_text(32, 200)
    consumed = f'lookahead_cluster_consumed_tokens_total{{namespace="{NS}"}}'
    with ExitStack() as stack:
        a, b = (stack.enter_context(cluster_server(nats.url, n)) for n in "ab")
        open_namespace(b)
        alone = stack.enter_context(ServerProcess())  # the same request, no cluster
        open_namespace(alone)
        with ExitStack() as engines:
            on_a, on_alone = (
                engines.enter_context(RemoteDrafter(s.tcp_target, namespace=NS, timeout=5.0))
                for s in (a, alone)
            )
            for d in (on_a, on_alone):
                d.step([StepRequest("running", prompt=prompt, budget=0)])
                for i in range(0, len(output), 20):
                    d.step([StepRequest("running", new_tokens=output[i : i + 20], budget=0)])
            probe = output[100:]  # b's request: 40 tokens of it as its prompt, then the rest
            total = len(prompt) + len(output)
            wait_for(lambda: metrics(b).get(consumed) == total, 10, "b to get it while it runs")
            accepted = draft_accepts(b, probe), draft_accepts(alone, probe)
            assert accepted[0] >= 3, f"b drafts a's running text: {accepted}"
            assert accepted[0] == accepted[1], f"as one server does: {accepted}"
            for d in (on_a, on_alone):
                d.step([StepRequest("running", budget=0, finished=True)])
        published = "lookahead_cluster_published_messages_total"
        wait_for(
            lambda: (
                metrics(b)[f'lookahead_cluster_consumed_messages_total{{namespace="{NS}"}}']
                == metrics(a)[published]
            ),
            10,
            "b to consume the end",
        )
        assert metrics(b)[consumed] == total, "the end added nothing"
        probes = [prompt + output, output[60:], output[130:]]
        assert trees(b, probes) == trees(alone, probes), "b's trie holds it once, as alone's"


def test_drafts_on_one_server_calibrate_the_others(nats: NatsServerProcess) -> None:
    """An engine's feedback on a's drafts (the tokens that came after each draft) calibrates b
    too: b's scores equal those of a server that drafted and learnt it all alone."""
    text = repetitive_texts(1, 400, seed=51)[0]
    with ExitStack() as stack:
        a, b = (stack.enter_context(cluster_server(nats.url, n)) for n in "ab")
        open_namespace(b)
        alone = stack.enter_context(ServerProcess())
        open_namespace(alone)
        for server in (a, alone):
            with RemoteDrafter(server.tcp_target, namespace=NS, timeout=5.0) as d:
                d.step([StepRequest("x", prompt=text[:20], budget=8)])
                for i in range(20, len(text), 2):  # each step scores the draft before it
                    d.step([StepRequest("x", new_tokens=text[i : i + 2], budget=8)])
                d.step([StepRequest("x", budget=0, finished=True)])
        consumed = f'lookahead_cluster_consumed_messages_total{{namespace="{NS}"}}'
        published = "lookahead_cluster_published_messages_total"
        time.sleep(0.5)  # the last calibration counts go out within 200 ms
        wait_for(lambda: metrics(b)[consumed] == metrics(a)[published], 10, "b to consume all")
        probes = repetitive_texts(3, 60, seed=51)
        assert trees(b, probes) == trees(alone, probes)


def test_namespaces_stay_apart_across_servers(nats: NatsServerProcess) -> None:
    secret = repetitive_texts(3, 400, seed=23)
    with ExitStack() as stack:
        a, b, c = (stack.enter_context(cluster_server(nats.url, n)) for n in "abc")
        open_namespace(b, "other")
        open_namespace(c, "tenant-a")
        ingest(a, secret, namespace="tenant-a")
        wait_for(
            lambda: ingested(c, "tenant-a") == ingested(a, "tenant-a"), 20, "c to learn tenant-a"
        )
        time.sleep(0.5)  # what would leak has had time to
        # b serves only "other": it never created "tenant-a", learnt nothing, drafts nothing.
        info = stub(b).Info(pb.InfoRequest(), timeout=5)
        assert list(info.namespaces) == ["other"]
        assert ingested(b, "other") == 0
        assert draft_accepts(b, secret[0], namespace="other") == 0
        m = metrics(b)
        assert not any("tenant-a" in key for key in m), "b consumed tenant-a's subject"


def test_nats_killed_mid_run_servers_keep_answering_then_catch_up_exactly_once(
    nats: NatsServerProcess,
) -> None:
    texts = repetitive_texts(30, 300, seed=5)
    errors: list[BaseException] = []
    stop = threading.Event()

    def load(server: ServerProcess, seed: int) -> None:
        """An engine stepping on its own namespace all along: no error may reach it."""
        try:
            with RemoteDrafter(server.tcp_target, namespace="load", timeout=5.0) as d:
                n = 0
                while not stop.is_set():
                    text = texts[n % len(texts)]
                    rid = f"l{seed}-{n}"
                    d.step([StepRequest(rid, prompt=text[:32], budget=8)])
                    for i in range(32, 120, 4):
                        d.step([StepRequest(rid, new_tokens=text[i : i + 4], budget=8)])
                    d.step([StepRequest(rid, budget=0, finished=True)])
                    n += 1
        except BaseException as e:  # noqa: BLE001 - any client-visible error fails the test
            errors.append(e)

    with ExitStack() as stack:
        a, b = (stack.enter_context(cluster_server(nats.url, n)) for n in "ab")
        open_namespace(b)
        threads = [threading.Thread(target=load, args=(s, i)) for i, s in enumerate((a, b))]
        for t in threads:
            t.start()
        ingest(a, texts[:10])
        same_tokens(a, b)
        nats.kill()
        wait_for(lambda: metrics(a)["lookahead_cluster_connected"] == 0, 10, "a to see NATS go")
        ingest(a, texts[10:20])  # learnt while NATS is down: waits in a's buffer
        time.sleep(0.5)
        assert ingested(b) < ingested(a)
        nats.start()
        ingest(a, texts[20:])
        same_tokens(a, b, timeout=30)
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert metrics(a)["lookahead_cluster_dropped_messages_total"] == 0
        assert metrics(a)["lookahead_cluster_connections_total"] >= 2


def trees(server: ServerProcess, probes: list[list[int]]) -> list[tuple]:
    """The draft trees (tokens, parents, scores) ``server`` gives for the first 40 tokens of
    each probe: equal trees mean equal trie counts (a text applied twice changes scores)."""
    requests = [
        pb.RequestStep(request_id=f"p{i}", prompt=pb.TokenList(tokens=p[:40]), budget=32)
        for i, p in enumerate(probes)
    ]
    r = stub(server).Step(pb.StepRequest(namespace=NS, requests=requests), timeout=5)
    return [tuple(r.tokens), tuple(r.parents), tuple(round(x, 6) for x in r.scores)]


def test_while_nats_is_away_the_outgoing_buffer_keeps_the_newest(
    nats: NatsServerProcess,
) -> None:
    """A 64 KiB buffer and eight batches of about 30 KB learnt while NATS is down: the oldest
    are dropped (counted), the newest reach the other server once NATS is back."""
    rng = random.Random(8)
    docs = [[rng.randrange(100_000, 150_000) for _ in range(10_000)] for _ in range(8)]
    with ExitStack() as stack:
        a = stack.enter_context(cluster_server(nats.url, "a", "--cluster-buffer", "64KiB"))
        b = stack.enter_context(cluster_server(nats.url, "b"))
        open_namespace(b)
        ingest(a, [[1, 2, 3, 4, 5] * 10])  # the namespace exists on a, and its consumer
        same_tokens(a, b)
        base = ingested(b)
        nats.kill()
        wait_for(lambda: metrics(a)["lookahead_cluster_connected"] == 0, 10, "a to see NATS go")
        for doc in docs:
            ingest(a, [doc])
            time.sleep(0.1)  # one batch each
        dropped = metrics(a)["lookahead_cluster_dropped_messages_total"]
        kept = len(docs) - int(dropped)
        assert 1 <= kept < len(docs), f"{dropped} of {len(docs)} dropped"
        assert metrics(a)["lookahead_cluster_dropped_tokens_total"] == dropped * 10_000
        nats.start()
        wait_for(lambda: ingested(b) == base + kept * 10_000, 30, "the kept batches to arrive")
        assert draft_accepts(b, docs[-1]) > 0, "the newest reached b"
        assert draft_accepts(b, docs[0]) == 0, "the oldest were dropped"


def test_a_killed_server_restarts_from_its_snapshot_and_the_stream(
    nats: NatsServerProcess, tmp_path: Path
) -> None:
    texts = repetitive_texts(20, 300, seed=9)
    with ExitStack() as stack:
        a = stack.enter_context(cluster_server(nats.url, "a"))
        b = stack.enter_context(
            cluster_server(nats.url, "b", "--snapshot-interval", "0.2", snapshot_dir=tmp_path)
        )
        reference = stack.enter_context(ServerProcess())  # learns the same texts directly
        open_namespace(b)
        ingest(a, texts[:8])
        same_tokens(a, b)
        snap = tmp_path / f"ns-{NS}.snap"
        wait_for(lambda: snap.exists() and snap.read_bytes()[:8] == b"LKCLSEQ1", 10, "b's snapshot")
        ingest(a, texts[8:12])  # perhaps in b's last snapshot, perhaps not
        time.sleep(0.3)
        assert b.process is not None
        b.process.kill()
        b.process.wait()
        ingest(a, texts[12:])  # while b is down
        b.start()
        assert "snapshot restored" in b.log()
        for part in (texts[:8], texts[8:12], texts[12:]):
            ingest(reference, part)
        # The restarted server's counter starts from 0 (counters are not in snapshots): it
        # applies what came after its snapshot, then its trie equals the reference's.
        wait_for(
            lambda: (
                metrics(b).get(f'lookahead_cluster_lag_messages{{namespace="{NS}"}}') == 0
                and metrics(b)[f'lookahead_cluster_applied_sequence{{namespace="{NS}"}}']
                == metrics(a)[f'lookahead_cluster_applied_sequence{{namespace="{NS}"}}']
            ),
            30,
            "b to catch up",
        )
        probes = texts[::3]
        assert trees(b, probes) == trees(reference, probes)
        assert not (tmp_path / "node-id").exists(), "--node-id given: no file written"


def test_a_server_killed_while_a_request_runs_elsewhere_inserts_nothing_twice(
    nats: NatsServerProcess, tmp_path: Path
) -> None:
    """b learns a running request of a step by step, is killed -9 midway (after a snapshot),
    and restarts while the request goes on and ends: b's trie then holds the request's text
    exactly once, as a server that ran it alone."""
    prompt, output = novel_text(41, 30), novel_text(42, 600)
    with ExitStack() as stack:
        a = stack.enter_context(cluster_server(nats.url, "a"))
        b = stack.enter_context(
            cluster_server(nats.url, "b", "--snapshot-interval", "0.2", snapshot_dir=tmp_path)
        )
        reference = stack.enter_context(ServerProcess())
        open_namespace(b)
        open_namespace(reference)
        applied = f'lookahead_cluster_applied_sequence{{namespace="{NS}"}}'
        with ExitStack() as engines:
            on_a, on_reference = (
                engines.enter_context(RemoteDrafter(s.tcp_target, namespace=NS, timeout=5.0))
                for s in (a, reference)
            )

            def write(start: int, end: int) -> None:
                for d in (on_a, on_reference):
                    for i in range(start, end, 10):
                        d.step([StepRequest("x", new_tokens=output[i : i + 10], budget=0)])

            for d in (on_a, on_reference):
                d.step([StepRequest("x", prompt=prompt, budget=0)])
            write(0, 200)
            wait_for(lambda: metrics(b).get(applied, 0) > 0, 10, "b to apply running parts")
            snap = tmp_path / f"ns-{NS}.snap"
            wait_for(lambda: snap.exists(), 10, "b's snapshot")
            time.sleep(0.5)  # a snapshot in the middle of the request
            write(200, 300)  # perhaps in b's last snapshot, perhaps not
            time.sleep(0.3)
            assert b.process is not None
            b.process.kill()
            b.process.wait()
            write(300, 500)  # while b is down
            b.start()
            assert "snapshot restored" in b.log()
            write(500, 600)
            for d in (on_a, on_reference):
                d.step([StepRequest("x", budget=0, finished=True)])
        wait_for(
            lambda: (
                metrics(b).get(f'lookahead_cluster_lag_messages{{namespace="{NS}"}}') == 0
                and metrics(b)[applied] == metrics(a)[applied]
            ),
            30,
            "b to catch up",
        )
        time.sleep(0.3)
        probes = [prompt + output[:10], output[150:], output[250:], output[400:], output[540:]]
        assert trees(b, probes) == trees(reference, probes)


def test_junk_and_foreign_messages_are_counted_and_skipped(nats: NatsServerProcess) -> None:
    texts = repetitive_texts(4, 300, seed=3)
    with ExitStack() as stack:
        a, b = (stack.enter_context(cluster_server(nats.url, n)) for n in "ab")
        open_namespace(b)
        subject = f"lookahead.{CLUSTER}.learn.{NS}"
        nats_publish(nats.port, subject, b"\xff\xfe not a batch")
        # A well-formed LearnedBatch of another cluster (fields 1-3, 5: a 3-token document),
        # written by hand so that the test does not trust the server's own encoder.
        document = b"\x0a\x03\x01\x02\x03"
        text = b"\x12" + bytes([len(document)]) + document
        foreign = b"\x0a\x05other" + b"\x12" + bytes([len(NS)]) + NS.encode() + b"\x1a\x01x"
        foreign += b"\x2a" + bytes([len(text)]) + text
        nats_publish(nats.port, subject, foreign)
        ingest(a, texts)
        same_tokens(a, b)
        m = metrics(b)
        assert (
            m[f'lookahead_cluster_skipped_messages_total{{namespace="{NS}",reason="malformed"}}']
            == 1
        )
        assert (
            m[f'lookahead_cluster_skipped_messages_total{{namespace="{NS}",reason="foreign"}}'] == 1
        )
        # a sees its own messages on the subject and skips every one of them.
        own = f'lookahead_cluster_skipped_messages_total{{namespace="{NS}",reason="own"}}'
        wait_for(
            lambda: metrics(a).get(own) == metrics(a)["lookahead_cluster_published_messages_total"],
            10,
            "a to pass its own messages",
        )


def test_nats_down_at_start_then_up_and_a_late_server_replays_the_window(tmp_path: Path) -> None:
    nats = NatsServerProcess()
    texts = repetitive_texts(6, 300, seed=17)
    with ExitStack() as stack:
        stack.callback(nats.close)
        a = stack.enter_context(cluster_server(nats.url, "a"))  # nothing listens there yet
        with RemoteDrafter(a.tcp_target, namespace=NS, timeout=5.0) as d:  # serves alone
            d.step([StepRequest("x", prompt=texts[0][:50], budget=4)])
            d.step([StepRequest("x", new_tokens=texts[0][50:], budget=0, finished=True)])
        ingest(a, texts)
        assert "NATS is not reachable" in _wait_log(a, "NATS is not reachable")
        nats.start()
        wait_for(lambda: metrics(a)["lookahead_cluster_connected"] == 1, 15, "a to connect")
        late = stack.enter_context(cluster_server(nats.url, "late"))
        open_namespace(late)
        same_tokens(a, late)
        assert metrics(late)[f'lookahead_cluster_lag_messages{{namespace="{NS}"}}'] == 0


def _wait_log(server: ServerProcess, text: str, timeout: float = 10.0) -> str:
    wait_for(lambda: text in server.log(), timeout, f"{text!r} in the log")
    return server.log()
