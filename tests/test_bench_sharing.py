"""Traffic for several engines at once (lookahead_client.bench.sharing) and running a trial's
engines side by side (rounds.run_children)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from lookahead_client.bench.rounds import Trial, TrialError, run_children
from lookahead_client.bench.sharing import (
    KINDS,
    REPEAT_AFTER,
    SlotBarrier,
    describe_kind,
    merge_engine_results,
    pick_groups,
    plan_traffic,
    plan_workloads,
    requests_per_engine,
    serve_share,
)
from lookahead_client.errors import InvalidArgumentError


def _prompt(group: str, n: int, half: str) -> dict:
    return {"id": f"{group}-{n}", "group": group, "half": half, "ids": [*map(ord, group), n]}


def _groups(count: int) -> list[list[dict]]:
    return [[_prompt(f"g{g}", n, "AB"[g % 2]) for n in range(2)] for g in range(count)]


@pytest.mark.parametrize(("groups", "engines"), [(2, 2), (3, 2), (4, 2), (3, 3), (1, 2)])
def test_every_prompt_goes_first_to_one_engine_and_again_to_another(groups, engines):
    plan = plan_traffic(_groups(groups), engines)
    where: dict[str, dict[str, tuple[int, int]]] = {}
    for slot, per_engine in enumerate(plan):
        assert len(per_engine) == engines
        for engine, requests in enumerate(per_engine):
            for r in requests:
                first_or_again = "repeat" if r["kind"] == "repeat" else "first"
                assert first_or_again not in where.get(r["id"], {}), r
                where.setdefault(r["id"], {})[first_or_again] = (slot, engine)
    assert len(where) == 2 * groups
    for prompt_id, seen in where.items():
        (slot, engine), (again, other) = seen["first"], seen["repeat"]
        assert again == slot + REPEAT_AFTER, prompt_id
        assert other != engine, prompt_id
    for g in range(groups):
        (s0, e0), (s1, e1) = where[f"g{g}-0"]["first"], where[f"g{g}-1"]["first"]
        assert s1 == s0 + 1 and e1 != e0  # the sibling: next slot, another engine


def test_kinds_are_new_sibling_and_repeat():
    plan = plan_traffic(_groups(2), 2)
    kinds = [r["kind"] for per_engine in plan for requests in per_engine for r in requests]
    assert kinds.count("new") == kinds.count("sibling") == 2
    assert kinds.count("repeat") == 4
    assert set(kinds) == set(KINDS)
    assert [[r["id"] for r in requests] for requests in plan[0]] == [["g0-0"], ["g1-0"]]
    assert [[r["id"] for r in requests] for requests in plan[1]] == [["g1-1"], ["g0-1"]]
    # In slot 2, each engine repeats what the other generated first in slot 0.
    assert [[r["id"] for r in requests] for requests in plan[2]] == [["g1-0"], ["g0-0"]]


def test_traffic_needs_two_engines_and_pairs():
    with pytest.raises(ValueError, match="at least 2"):
        plan_traffic(_groups(2), 1)
    with pytest.raises(ValueError, match="two prompts"):
        plan_traffic([[_prompt("g", 0, "A")]], 2)


def test_groups_are_picked_per_half_with_two_distinct_prompts():
    prompts = [
        _prompt("lonely", 0, "A"),
        _prompt("twice", 0, "B"),
        _prompt("twice", 0, "B"),  # the same ids again (a rollout file's samples)
        _prompt("a1", 0, "A"),
        _prompt("a1", 1, "A"),
        _prompt("b1", 0, "B"),
        _prompt("b1", 1, "B"),
        _prompt("b1", 2, "B"),
        _prompt("a2", 0, "A"),
        _prompt("a2", 1, "A"),
    ]
    groups = pick_groups(prompts, per_half=1)
    assert [[p["id"] for p in g] for g in groups] == [["a1-0", "a1-1"], ["b1-0", "b1-1"]]
    assert [g[0]["group"] for g in pick_groups(prompts, per_half=2)] == ["a1", "b1", "a2"]


def test_workloads_are_planned_and_one_without_groups_is_named():
    prompts = [p for g in _groups(3) for p in g]
    traffic = plan_workloads({"docs": prompts}, 2, 2, 512)
    assert traffic["docs"] == plan_traffic(pick_groups(prompts, 2), 2)
    # 3 groups: 6 first times and 6 repeats, engine 0 gets 3 + 3.
    assert requests_per_engine(traffic, 2) == 6
    assert describe_kind(traffic, 2, "docs/repeat", "; K = 8").startswith(
        "6 requests, repeat (see lookahead_client.bench.sharing), spread over 2 engines"
    )
    lonely = [_prompt("solo", 0, "A"), _prompt("other", 0, "B")]
    with pytest.raises(InvalidArgumentError, match="workload chat has no group") as e:
        plan_workloads({"docs": prompts, "chat": lonely}, 2, 2, 512)
    assert e.value.field == "workload"


def test_each_engine_serves_its_share_in_step_with_the_others(tmp_path):
    """Two engines (threads) serve one plan: each request once, on the planned engine and in
    the planned slot, and no engine starts a slot before the other finished the one before."""
    plan = plan_traffic(_groups(2), 2)
    log: list[tuple[int, str, str]] = []  # (engine, event, id) in the order they happened
    lock = threading.Lock()
    results: dict[int, dict] = {}

    def engine(me: int) -> None:
        def serve(prompt: dict) -> dict:
            with lock:
                log.append((me, "start", prompt["id"]))
            time.sleep(0.02 * (1 - me))  # engine 0 is the slow one
            record = {"id": prompt["id"], "half": prompt["half"], "seconds": 0.1, "tokens": 2}
            return {**record, "outputs": [[1, 2]], "counters": {"steps": 1.0}}

        spec = {"traffic": {"w": plan}, "engine": me, "engines": 2, "barrier": str(tmp_path)}
        results[me] = serve_share(spec, serve)

    threads = [threading.Thread(target=engine, args=(e,)) for e in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    merged = merge_engine_results([{"startup_s": 1.0, "workloads": results[e]} for e in range(2)])
    served = [
        (p["slot"], p["engine"], p["id"])
        for k in KINDS
        for p in merged["workloads"][f"w/{k}"]["prompts"]
    ]
    planned = [
        (slot + 1, e, r["id"])
        for slot, per in enumerate(plan)
        for e, rs in enumerate(per)
        for r in rs
    ]
    assert sorted(served) == sorted(planned)
    repeats = merged["workloads"]["w/repeat"]["prompts"]
    assert len(repeats) == 4 and all(p["counters"] == {"steps": 1.0} for p in repeats)
    # Slot by slot: every request of a slot starts after every request of the slot before.
    slot_of = {(e, i): s for s, e, i in planned}
    order = [slot_of[(e, i)] for e, _, i in log]
    assert order == sorted(order), log


def test_the_barrier_holds_each_engine_until_all_reach_the_slot(tmp_path):
    arrived = []

    def engine(index: int, delay: float) -> None:
        time.sleep(delay)
        SlotBarrier(tmp_path, 2, index).wait(0)
        arrived.append((index, time.monotonic()))

    started = time.monotonic()
    threads = [threading.Thread(target=engine, args=(i, 0.3 * i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(at - started >= 0.3 for _, at in arrived)  # the first waited for the second
    with pytest.raises(TimeoutError, match="never reached slot 1"):
        SlotBarrier(tmp_path, 2, 0, timeout_s=0.05).wait(1)


def test_engine_results_merge_in_plan_order():
    def result(engine: int, startup: float) -> dict:
        prompts = [
            {"id": f"p{engine}{slot}", "slot": slot, "engine": engine, "place": 0}
            for slot in (1, 2)
        ]
        row = {"n": 1, "prompts": prompts}
        return {"startup_s": startup, "workloads": {"w/new": row}}

    merged = merge_engine_results([result(0, 50.0), result(1, 60.0)])
    assert merged["startup_s"] == 60.0
    row = merged["workloads"]["w/new"]
    assert [p["id"] for p in row["prompts"]] == ["p01", "p11", "p02", "p12"]
    assert row["n"] == 1


def test_a_failing_engine_takes_the_trials_other_engines_down():
    hung = [sys.executable, "-c", "import time; time.sleep(60)"]
    failing = [sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(4)"]
    started = time.monotonic()
    with pytest.raises(TrialError, match=r"process 2 of 2\) \(exit status 4\)"):
        run_children([(hung, os.environ), (failing, os.environ)], Trial(0, 0, "two"))
    assert time.monotonic() - started < 10  # the hung one was killed, not waited for
    run_children([([sys.executable, "-c", "pass"], os.environ)] * 2, Trial(0, 0, "fine"))
