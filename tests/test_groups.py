"""Group drafting through both drafters: samples of one prompt running side by side draft from
each other's outputs (no flag needed), a named group joins requests with different prompts,
another group does not see them, and a group name over 256 bytes is refused naming the field.
The remote drafter talks to a real ``lookahead-server``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from lookahead_client import EmbeddedDrafter
from lookahead_client.bench.replay import ReplaySettings, replay
from lookahead_client.bench.workload import Request, Workload
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.processes.server import ServerProcess
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import DraftTree, StepRequest

PROMPT = [11, 12, 13, 14]
#: An answer whose n-grams appear nowhere else, so only a sibling can predict it.
ANSWER = [1000 + 7 * i for i in range(40)]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(["--memory-budget", str(256 << 20), "--max-namespaces", "8"]) as s:
        yield s


_namespaces = itertools.count()


@pytest.fixture(params=["embedded", "remote"])
def drafter(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "embedded":
        yield EmbeddedDrafter(memory_budget_bytes=64 << 20)
        return
    server = request.getfixturevalue("server")
    with RemoteDrafter(server.tcp_target, namespace=f"groups-{next(_namespaces)}") as d:
        yield d


def spells(tree: DraftTree, want: list[int]) -> bool:
    return any(path == want for path in tree.paths())


def test_samples_of_one_prompt_draft_from_each_other_without_a_flag(drafter: Any) -> None:
    drafter.step(
        [
            StepRequest("s0", prompt=PROMPT, new_tokens=ANSWER[:1], budget=0),
            StepRequest("s1", prompt=PROMPT, new_tokens=ANSWER[:1], budget=0),
        ]
    )
    # s0 runs ahead; s1, on the same context ten tokens in, drafts what s0 wrote
    trees = drafter.step(
        [
            StepRequest("s0", new_tokens=ANSWER[1:], budget=0),
            StepRequest("s1", new_tokens=ANSWER[1:10], budget=8),
        ]
    )
    assert spells(trees[1], ANSWER[10:15]), trees[1]
    assert drafter.stats()["active_groups"] == 1


def test_a_named_group_joins_different_prompts_and_keeps_others_out(drafter: Any) -> None:
    drafter.step(
        [
            StepRequest("call-1", prompt=[5, 6, 7], new_tokens=ANSWER, budget=0, group="agent-1"),
            StepRequest("call-2", prompt=[8, 9], new_tokens=ANSWER[:10], budget=0, group="agent-1"),
            StepRequest("other", prompt=[5, 6, 7], new_tokens=ANSWER[:10], budget=0, group="b"),
        ]
    )
    mine, other = drafter.step([StepRequest("call-2", budget=8), StepRequest("other", budget=8)])
    assert spells(mine, ANSWER[10:15]), mine
    assert not spells(other, ANSWER[10:15]), other
    assert drafter.stats()["active_groups"] == 2


def test_a_group_name_over_256_bytes_is_refused_naming_the_field(drafter: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        drafter.step([StepRequest("r", prompt=[1, 2], group="g" * 257)])
    assert info.value.field == "group"
    assert "257" in str(info.value)
    # at the limit it starts
    drafter.step([StepRequest("r", prompt=[1, 2], group="g" * 256)])
    assert drafter.stats()["active_requests"] == 1


def test_the_replay_reports_phases_lockstep_and_halves() -> None:
    # two groups of three samples of one answer each, the second group's answer distinct
    answers = [ANSWER, [2000 + 3 * i for i in range(40)]]
    requests = tuple(
        Request(f"g{g}-s{s}", f"g{g}", tuple(PROMPT) + (g,), tuple(answers[g]))
        for g in range(2)
        for s in range(3)
    )
    workload = Workload("twins", requests)
    assert [r.id for r in workload.half("b").requests] == ["g1-s0", "g1-s1", "g1-s2"]

    def run(admission: str, concurrency: int, names: bool = False):
        settings = ReplaySettings(8, concurrency, 1, "shared", admission, names)
        return replay(workload, lambda: EmbeddedDrafter(memory_budget_bytes=16 << 20), settings)

    lockstep = run("lockstep", 4)
    assert lockstep.phase_steps[0] + lockstep.phase_steps[1] == lockstep.steps
    assert lockstep.phase_accepted[0] + lockstep.phase_accepted[1] == lockstep.accepted
    # lockstep: a group of three starts only when three slots are free, so with four slots
    # the second group waits for the first to finish; continuous admission starts a sample of
    # it at once, which then has no sibling ahead of it
    continuous = run("continuous", 4)
    assert lockstep.engine_steps > continuous.engine_steps
    # naming the groups changes nothing here: the samples of a group share their prompt
    assert run("lockstep", 4, names=True).accepted == lockstep.accepted
