"""Which accepted draft tokens came from another replica's text, on a real ``lookahead-server``:
two clients naming two replicas share one namespace; the second one's accepted tokens drafted
from the first one's output are counted (``accepted_cross_replica``, also a Prometheus series),
its own text never is, and a replica name that is too long is refused naming the field."""

from __future__ import annotations

import random
import urllib.request

import grpc
import pytest

from lookahead_client import RemoteDrafter, StepRequest
from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client._proto.lookahead.v1.lookahead_pb2_grpc import LookaheadStub
from lookahead_client.processes.server import ServerProcess, free_tcp_port
from remote_support import greedy_accept

NS = "provenance"


def novel_text(seed: int, length: int) -> list[int]:
    """Random tokens no other text shares: only what was learnt drafts them."""
    rng = random.Random(seed)
    return [rng.randrange(5000, 9000) for _ in range(length)]


def generate(target: str, replica: str, text: list[int], times: int = 3) -> None:
    """Replica ``replica`` generates ``text`` (its first 20 tokens the prompt), ``times`` over."""
    with RemoteDrafter(target, namespace=NS, timeout=5.0, replica=replica) as d:
        for i in range(times):
            rid = f"{replica}-gen-{i}"
            d.step([StepRequest(rid, prompt=text[:20], budget=0)])
            d.step([StepRequest(rid, new_tokens=text[20:], budget=0, finished=True)])


def follow(target: str, replica: str, text: list[int]) -> tuple[int, dict[str, int | float]]:
    """A request of ``replica`` whose prompt ends inside ``text`` accepts what is drafted of
    its continuation, and says so at its next step: the tokens accepted, and the stats its
    client reads after that."""
    with RemoteDrafter(target, namespace=NS, timeout=5.0, replica=replica) as d:
        tree = d.step([StepRequest("follower", prompt=text[40:60], budget=8)])[0]
        accepted = greedy_accept(tree, text[60:])
        new = text[60 : 61 + accepted]
        d.step([StepRequest("follower", new_tokens=new, accepted_last=accepted, budget=0)])
        d.step([StepRequest("follower", budget=0, finished=True)])
        return accepted, d.stats()


def test_tokens_drafted_from_another_replicas_output_are_counted_and_never_its_own() -> None:
    port = free_tcp_port()
    with ServerProcess(["--metrics-listen", f"127.0.0.1:{port}"]) as server:
        target = server.tcp_target
        generate(target, "replica-a", novel_text(1, 120))
        accepted, stats = follow(target, "replica-b", novel_text(1, 120))
        assert accepted >= 3
        assert stats["accepted_reported"] == accepted
        assert stats["accepted_cross_replica"] == accepted
        assert stats["replica_accepted_reported"] == accepted  # replica-b's own
        assert stats["replica_accepted_cross_replica"] == accepted
        # the same replica follows its own text: nothing is another's
        generate(target, "replica-a", novel_text(2, 120))
        own, after = follow(target, "replica-a", novel_text(2, 120))
        assert own >= 3
        assert after["accepted_reported"] == accepted + own
        assert after["accepted_cross_replica"] == accepted
        assert after["replica_accepted_reported"] == own  # replica-a's
        assert after["replica_accepted_cross_replica"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        series = f'lookahead_accepted_cross_replica_tokens_total{{namespace="{NS}"}} {accepted}'
        assert series in body


def test_a_replica_name_too_long_is_refused_naming_the_field() -> None:
    with ServerProcess() as server, grpc.insecure_channel(server.tcp_target) as channel:
        message = pb.StepRequest(namespace=NS, replica="r" * 129)
        message.requests.add(request_id="x", prompt=pb.TokenList(tokens=[1, 2, 3]))
        with pytest.raises(grpc.RpcError) as caught:
            LookaheadStub(channel).Step(message, timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "replica" in (caught.value.details() or "")
