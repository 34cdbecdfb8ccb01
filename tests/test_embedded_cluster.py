"""Embedded drafters as members of a cluster (``EmbeddedDrafter(cluster=...)``), with a real
``nats-server -js`` on loopback and, beside them, a real ``lookahead-server --cluster``:
an engine drafts in its own process and learns what every other member learns."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest

from lookahead_client import EmbeddedDrafter
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.processes.nats import NatsServerProcess
from lookahead_client.processes.server import free_tcp_port
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import StepRequest
from remote_support import greedy_accept
from test_cluster import CLUSTER, NS, cluster_server, metrics, novel_text
from test_hardening import wait_for


@pytest.fixture
def nats() -> Iterator[NatsServerProcess]:
    with NatsServerProcess() as server:
        yield server


def member(nats_url: str, node: str) -> EmbeddedDrafter:
    return EmbeddedDrafter(cluster=nats_url, cluster_name=CLUSTER, node_id=node, namespace=NS)


def run_request(drafter: EmbeddedDrafter | RemoteDrafter, rid: str, text: list[int]) -> None:
    """``text`` through ``drafter`` as one finished request: 30 tokens of prompt, then the
    rest 20 tokens a step."""
    drafter.step([StepRequest(rid, prompt=text[:30], budget=0)])
    for i in range(30, len(text), 20):
        drafter.step([StepRequest(rid, new_tokens=text[i : i + 20], budget=0)])
    drafter.step([StepRequest(rid, budget=0, finished=True)])


def accepts(drafter: EmbeddedDrafter | RemoteDrafter, text: list[int]) -> int:
    """Greedy-accepted length of a draft after the first 40 tokens of ``text``."""
    rid = f"probe-{time.monotonic_ns()}"
    tree = drafter.step([StepRequest(rid, prompt=text[:40], budget=16)])[0]
    drafter.step([StepRequest(rid, budget=0, finished=True)])
    return greedy_accept(tree, text[40:])


def test_an_embedded_member_and_a_server_learn_from_each_other(nats: NatsServerProcess) -> None:
    """An engine's embedded drafter and a ``lookahead-server`` of one cluster: each drafts
    the text the other's requests wrote; a drafter outside the cluster does not."""
    from_engine, from_server = novel_text(41, 300), novel_text(42, 300)
    alone = EmbeddedDrafter()
    with cluster_server(nats.url, "server") as server:
        engine = member(nats.url, "engine")
        assert engine.node_id == "engine"
        with RemoteDrafter(server.tcp_target, namespace=NS, timeout=5.0) as remote:
            run_request(engine, "e", from_engine)
            run_request(remote, "s", from_server)
            consumed = f'lookahead_cluster_consumed_tokens_total{{namespace="{NS}"}}'
            wait_for(lambda: metrics(server).get(consumed, 0) >= 300, 10, "the server to apply")
            wait_for(
                lambda: engine.stats()["cluster_consumed_tokens"] >= 300, 10, "the engine to apply"
            )
            assert accepts(remote, from_engine[100:]) >= 3, "the server drafts the engine's text"
        got = accepts(engine, from_server[100:])
        assert accepts(alone, from_server[100:]) == 0, "a drafter outside learnt nothing"
        run_request(alone, "s", from_server)
        assert got == accepts(alone, from_server[100:]) >= 3, "as if it had run the request"
        stats = engine.stats()
        assert stats["cluster_connected"] and stats["cluster_published_messages"] > 0
        assert "cluster=" in repr(engine) and "node_id='engine'" in repr(engine)


def test_samples_of_one_prompt_in_two_engines_draft_from_each_other(
    nats: NatsServerProcess,
) -> None:
    """Two embedded members (two engines' drafters), one sample of a prompt on each: the one
    that runs behind drafts what the other has written while both are running."""
    rng = random.Random(5)
    prompt = [rng.randrange(1000, 2000) for _ in range(50)]
    output = [rng.randrange(2000, 3000) for _ in range(1000)]
    a, b = member(nats.url, "a"), member(nats.url, "b")
    a.step([StepRequest("s1", prompt=prompt, budget=0)])
    for i in range(0, 200, 10):
        a.step([StepRequest("s1", new_tokens=output[i : i + 10], budget=0)])
    b.step([StepRequest("s2", prompt=prompt, budget=0)])
    # a goes on decoding, a token a poll, as an engine steps: its first step after b's request
    # for the group's history has come through NATS answers it (however long that takes on a
    # loaded machine; a fixed wait before one step was not always enough)
    fed = [200]

    def b_has_a_sample() -> bool:
        a.step([StepRequest("s1", new_tokens=output[fed[0] : fed[0] + 1], budget=0)])
        fed[0] += 1
        return b.stats()["cluster_group_applied_tokens"] >= 200

    wait_for(b_has_a_sample, 10, "b to get a's sample")
    tree = b.step([StepRequest("s2", new_tokens=output[:120], budget=16)])[0]
    assert greedy_accept(tree, output[120:]) >= 8, "b drafts its sibling's text"
    for d, rid in ((a, "s1"), (b, "s2")):
        d.step([StepRequest(rid, budget=0, finished=True)])
    assert b.stats()["accepted_cross_replica"] == 0  # nothing reported accepted yet


def test_a_member_drafts_with_nats_down_and_bad_settings_name_their_field() -> None:
    dead = f"nats://127.0.0.1:{free_tcp_port()}"  # nothing listens there
    engine = EmbeddedDrafter(cluster=dead, node_id="lonely")
    text = novel_text(43, 200)
    run_request(engine, "r", text)
    alone = EmbeddedDrafter()
    run_request(alone, "r", text)
    assert accepts(engine, text[60:]) == accepts(alone, text[60:]) >= 3, "as without a cluster"
    assert not engine.stats()["cluster_connected"]
    for kwargs, field in (
        ({"cluster": "http://127.0.0.1:4222"}, "cluster"),
        ({"cluster": "nats://127.0.0.1:4222", "cluster_name": "a b"}, "cluster_name"),
        ({"cluster": "nats://127.0.0.1:4222", "node_id": "x.y"}, "node_id"),
        ({"cluster": "nats://127.0.0.1:4222", "namespace": "a b"}, "namespace"),
    ):
        with pytest.raises(InvalidArgumentError) as err:
            EmbeddedDrafter(**kwargs)  # type: ignore[arg-type]
        assert err.value.field == field, err.value


def test_a_member_that_joins_later_replays_what_the_cluster_learnt(
    nats: NatsServerProcess,
) -> None:
    """A new engine (a replica scaled up, one restarted) starts with what the others learnt:
    its consumer replays the stream's window."""
    text = novel_text(44, 300)
    early = member(nats.url, "early")
    run_request(early, "e", text)
    wait_for(lambda: early.stats()["cluster_published_messages"] > 0, 10, "the publish")
    late = member(nats.url, "late")
    wait_for(lambda: late.stats()["cluster_consumed_tokens"] >= 300, 10, "the replay")
    assert accepts(late, text[100:]) == accepts(early, text[100:]) >= 3
