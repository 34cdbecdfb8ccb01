"""Idempotent steps: with ``offset``, every step sent twice (a retry after a timeout, a message
sent again after a reconnect), some repeats overlapping the tokens before them, leaves the
drafter as one clean run leaves it, in the embedded drafter and in a real lookahead-server; a
step that would leave a gap is refused naming ``offset`` and the request drafts on."""

from __future__ import annotations

import random

import grpc
import pytest

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client._proto.lookahead.v1 import lookahead_pb2_grpc as pb_grpc
from lookahead_client.embedded import EmbeddedDrafter
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.processes.server import ServerProcess
from lookahead_client.types import DraftTree, StepRequest
from remote_support import repetitive_texts

PROMPT = 24


def schedule(seed: int, length: int) -> list[tuple[int, int]]:
    """(offset, end) of each step: 1 to 4 tokens a step, as an engine accepts them."""
    rng = random.Random(seed)
    steps, at = [], PROMPT
    while at < length:
        end = min(length, at + rng.randint(1, 4))
        steps.append((at, end))
        at = end
    return steps


class Server:
    """The same through a real lookahead-server's gRPC API (no client-side bookkeeping)."""

    def __init__(self, server: ServerProcess, namespace: str) -> None:
        self.stub = pb_grpc.LookaheadStub(grpc.insecure_channel(server.tcp_target))
        self.namespace = namespace  # each run its own, so that each starts empty

    def step(self, items: list[StepRequest]) -> list[DraftTree]:
        message = pb.StepRequest(namespace=self.namespace)
        for r in items:
            m = message.requests.add(request_id=r.request_id, budget=r.budget, offset=r.offset)
            m.new_tokens.extend(r.new_tokens)
            if r.prompt is not None:
                m.prompt.tokens.extend(r.prompt)
        response = self.stub.Step(message)
        if response.errors:
            e = response.errors[0]
            raise InvalidArgumentError(e.message, field=e.field)
        trees, at = [], 0
        for root, size in zip(response.roots, response.sizes, strict=True):
            nodes = slice(at, at + size)
            trees.append(
                DraftTree(
                    root,
                    tuple(response.tokens[nodes]),
                    tuple(response.parents[nodes]),
                    tuple(round(s, 5) for s in response.scores[nodes]),
                )
            )
            at += size
        return trees


def run(drafter, texts: list[list[int]], twice: bool, seed: int) -> list[list[DraftTree]]:
    """Both requests through their schedules; with ``twice`` every step is sent again, the
    repeat starting up to 3 tokens earlier. Returns the drafts of the first sends."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(len(texts))]
    first = [
        StepRequest(i, prompt=t[:PROMPT], budget=8, offset=PROMPT)
        for i, t in zip(ids, texts, strict=True)
    ]
    drafts = [drafter.step(first)]
    if twice:
        drafter.step(first)
    steps = [schedule(seed + k, len(t)) for k, t in enumerate(texts)]
    for n in range(min(len(s) for s in steps)):
        items = [
            StepRequest(i, new_tokens=t[a:b], budget=8, offset=a)
            for i, t, (a, b) in ((i, t, s[n]) for i, t, s in zip(ids, texts, steps, strict=True))
        ]
        drafts.append(drafter.step(items))
        if twice:
            again = []
            for item, t in zip(items, texts, strict=True):
                back = max(PROMPT, item.offset - rng.randint(0, 3))
                end = item.offset + len(item.new_tokens)
                again.append(
                    StepRequest(item.request_id, new_tokens=t[back:end], budget=8, offset=back)
                )
            drafter.step(again)
    return drafts


@pytest.fixture(scope="module")
def server():
    with ServerProcess() as s:
        yield s


def drafters(kind: str, server: ServerProcess):
    if kind == "embedded":
        return EmbeddedDrafter(), EmbeddedDrafter()
    return Server(server, "clean"), Server(server, "twice")


@pytest.mark.parametrize("kind", ["embedded", "server"])
def test_every_step_sent_twice_changes_nothing(kind: str, server: ServerProcess) -> None:
    texts = repetitive_texts(2, 160, seed=3)
    for seed in (1, 2):
        once, twice = drafters(kind, server)
        if kind == "server":
            once.namespace, twice.namespace = f"clean{seed}", f"twice{seed}"
        clean = run(once, texts, twice=False, seed=seed)
        assert sum(len(t) for step in clean for t in step) > 0
        assert run(twice, texts, twice=True, seed=seed) == clean


@pytest.mark.parametrize("kind", ["embedded", "server"])
def test_a_gap_is_refused_naming_offset_and_the_request_drafts_on(
    kind: str, server: ServerProcess
) -> None:
    d, _ = drafters(kind, server)
    if kind == "server":
        d.namespace = "gap"
    text = list(range(50, 57)) * 12  # repeats: drafts follow it
    d.step([StepRequest("g", prompt=text[:PROMPT], budget=8, offset=PROMPT)])
    with pytest.raises(InvalidArgumentError) as err:
        d.step([StepRequest("g", new_tokens=text[PROMPT + 2 : PROMPT + 4], offset=PROMPT + 2)])
    assert err.value.field == "offset"
    assert f"{PROMPT} tokens it holds" in str(err.value)
    [tree] = d.step(
        [StepRequest("g", new_tokens=text[PROMPT : PROMPT + 4], budget=8, offset=PROMPT)]
    )
    assert len(tree) > 0 and tree.root == text[PROMPT + 3]


def test_steps_whose_answer_was_lost_go_out_again_without_doubling(
    server: ServerProcess,
) -> None:
    """The remote client's ledger: when a step's answer is lost (the server applied it, the
    client cannot know), the next step re-sends its tokens at their offset and the server
    skips them; the drafts end as those of a run that lost nothing, with no restart."""
    from lookahead_client.remote.ledger import Ledger

    stub = pb_grpc.LookaheadStub(grpc.insecure_channel(server.tcp_target))
    text = list(range(50, 57)) * 12

    def run(namespace: str, lose_every: int) -> tuple[list[DraftTree], Ledger, int]:
        ledger = Ledger()
        steps = [StepRequest("r", prompt=text[:PROMPT], budget=8)]
        steps += [
            StepRequest("r", new_tokens=text[a:b], budget=8) for a, b in schedule(5, len(text))
        ]
        steps.append(StepRequest("r", budget=8))  # a last step, always answered
        trees, held = [], 0
        for n, request in enumerate(steps):
            plan = ledger.plan([request], namespace, n)
            response = stub.Step(plan.first_message())
            if lose_every and n % lose_every == 1 and n < len(steps) - 1:
                plan.on_unavailable()  # applied by the server, but the answer is lost
                continue
            assert plan.on_response(response) is None
            trees.append(plan.result()[0])
            held = response.held[0]
        return trees, ledger, held

    clean, _, clean_held = run("lost-none", 0)
    lossy, ledger, held = run("lost-some", 3)
    assert held == clean_held == len(text), "every token held once"
    assert lossy[-1] == clean[-1] and len(lossy[-1]) > 0
    assert ledger.resyncs == 0
