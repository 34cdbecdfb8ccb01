"""``lookahead-bench replicas`` without engines: its traffic (two passes; rollouts' samples
spread over the replicas or kept together on one, each sample elsewhere the second time), its
table, its refusals."""

from __future__ import annotations

import pytest

from lookahead_client.bench.replicas import plan_replicas, replicas_table
from lookahead_client.bench.sharing import as_passes, plan_samples, plan_traffic
from lookahead_client.errors import InvalidArgumentError


def _prompt(group: str, n: int, half: str) -> dict:
    return {"id": f"{group}-{n}", "group": group, "half": half, "ids": [*map(ord, group), n]}


def _requests(plan):
    """(slot, engine, request) of a plan."""
    return [(s, e, r) for s, slot in enumerate(plan) for e, rs in enumerate(slot) for r in rs]


@pytest.mark.parametrize(("n", "engines"), [(4, 2), (8, 2), (3, 3), (2, 4)])
def test_rollouts_spread_each_prompts_samples_and_repeat_each_on_another_replica(n, engines):
    prompts = [_prompt("p", 0, "A"), _prompt("q", 0, "B")]
    plan = plan_samples(prompts, n, engines, temperature=1.0)
    requests = _requests(plan)
    assert len(requests) == 2 * len(prompts) * n
    for prompt in prompts:
        for kind in ("first", "repeat"):
            mine = [(s, e, r) for s, e, r in requests if r["id"] == prompt["id"]]
            samples = [(s, e, r) for s, e, r in mine if r["kind"] == kind]
            assert len(samples) == n and len({s for s, _, _ in samples}) == 1  # one slot
            assert len({e for _, e, _ in samples}) == min(n, engines)  # spread out
            assert all(r["temperature"] == 1.0 for _, _, r in samples)
        # sample i of the repeat runs on another replica than sample i of the first pass
        first = sorted((r["seed"], e) for _, e, r in mine if r["kind"] == "first")
        again = sorted((r["seed"] - n, e) for _, e, r in mine if r["kind"] == "repeat")
        assert all(e0 != e1 for (_, e0), (_, e1) in zip(first, again, strict=True))
    seeds = [r["seed"] for _, _, r in requests if r["id"] == "p-0"]
    assert len(set(seeds)) == 2 * n, "every sample its own seed"
    # the repeat pass comes after the whole first pass
    last_first = max(s for s, _, r in requests if r["kind"] == "first")
    assert all(s > last_first for s, _, r in requests if r["kind"] == "repeat")


@pytest.mark.parametrize(("prompts", "n", "engines"), [(2, 4, 2), (3, 1, 2), (4, 2, 3)])
def test_rollouts_together_keep_each_prompts_samples_on_one_replica_and_move_it(
    prompts, n, engines
):
    chosen = [_prompt(f"p{i}", 0, "AB"[i % 2]) for i in range(prompts)]
    plan = plan_samples(chosen, n, engines, temperature=1.0, together=True)
    requests = _requests(plan)
    assert len(requests) == 2 * prompts * n
    where = {}
    for prompt in chosen:
        for kind in ("first", "repeat"):
            samples = [
                (s, e) for s, e, r in requests if r["id"] == prompt["id"] and r["kind"] == kind
            ]
            assert len(samples) == n and len(set(samples)) == 1  # one slot, one replica
            where[prompt["id"], kind] = samples[0]
        # the repeat brings the prompt to a replica that has not generated it
        assert where[prompt["id"], "first"][1] != where[prompt["id"], "repeat"][1]
    # a slot holds a prompt per replica, each replica its own prompt
    for slot in plan:
        ids = [{r["id"] for r in rs} for rs in slot]
        assert all(len(i) <= 1 for i in ids)
        assert len(set().union(*ids)) == sum(map(len, ids))
    assert len(plan) == 2 * -(-prompts // engines)
    seeds = sorted(r["seed"] for _, _, r in requests if r["id"] == "p0-0")
    assert seeds == list(range(2 * n)), "every sample its own seed"


def test_rollouts_refuse_one_engine_one_sample_or_a_negative_temperature():
    prompts = [_prompt("p", 0, "A")]
    for n, engines, temperature in ((4, 1, 1.0), (1, 2, 1.0), (4, 2, -0.5)):
        with pytest.raises(ValueError):
            plan_samples(prompts, n, engines, temperature)
    # together, one sample is a plan; none, or one engine, is not
    for n, engines in ((0, 2), (4, 1)):
        with pytest.raises(ValueError):
            plan_samples(prompts, n, engines, 1.0, together=True)


def test_greedy_rollouts_are_the_same_generation_on_every_replica():
    plan = plan_samples([_prompt("p", 0, "A")], 4, 2, temperature=0.0)
    requests = _requests(plan)
    assert len(requests) == 8 and all(r["temperature"] == 0.0 for _, _, r in requests)
    assert {e for _, e, r in requests if r["kind"] == "first"} == {0, 1}


def test_greedy_traffic_as_passes_keeps_every_request_and_names_its_pass():
    groups = [[_prompt(f"g{g}", i, "AB"[g % 2]) for i in range(2)] for g in range(2)]
    plan = plan_traffic(groups, 2)
    passes = as_passes(plan)
    before, after = _requests(plan), _requests(passes)
    assert [(s, e, r["id"]) for s, e, r in before] == [(s, e, r["id"]) for s, e, r in after]
    assert [r["kind"] for _, _, r in after] == [
        "repeat" if r["kind"] == "repeat" else "first" for _, _, r in before
    ]


def test_plan_replicas_samples_the_named_workloads_and_needs_groups_elsewhere():
    greedy = [_prompt(f"g{g}", i, "AB"[g % 2]) for g in range(2) for i in range(2)]
    rollouts = [_prompt("r0", 0, "A"), _prompt("r0", 0, "A"), _prompt("r1", 0, "B")]
    traffic = plan_replicas(
        {"docs": greedy, "math": rollouts}, {"math": 4}, per_half=1, replicas=2, temperature=1.0
    )
    assert {r["kind"] for _, _, r in _requests(traffic["docs"])} == {"first", "repeat"}
    math = _requests(traffic["math"])
    assert len(math) == 2 * 2 * 4  # r0 once (its repeated line is one prompt) and r1
    assert all(r["temperature"] == 1.0 for _, _, r in math)
    with pytest.raises(InvalidArgumentError, match="--n lonely=N"):
        plan_replicas({"lonely": [_prompt("x", 0, "A")]}, {}, 1, 2, 1.0)
    # one sample cannot be spread over two replicas; together it can
    with pytest.raises(InvalidArgumentError, match="workload math: rollouts need") as e:
        plan_replicas({"math": rollouts}, {"math": 1}, 1, 2, 1.0)
    assert e.value.field == "n"
    alone = plan_replicas({"math": rollouts}, {"math": 1}, 1, 2, 1.0, together=True)
    assert len(_requests(alone["math"])) == 2 * 2


def _entry(speedup, identical, cross=None):
    look = None if cross is None else {"cross_replica_share": cross}
    return {
        "prompts": 2,
        "tok_s_batch1": 10.0 * speedup,
        "speedup_batch1": speedup,
        "ranges": {"speedup_batch1": [speedup, speedup]},
        "identical_batch1": identical,
        "per_step_batch1": {"tokens_per_step": 1.5, "lookahead": look},
    }


def test_the_table_is_by_workload_pass_and_configuration_with_the_issues_fields():
    report = {
        "table": {
            "docs/first": {
                "plain": _entry(1.0, 2),
                "suffix": _entry(1.2, 2),
                "lookahead": _entry(1.3, 2, cross=0.0),
                "lookahead-server": _entry(1.1, 1, cross=0.25),
            },
            "math/repeat": {
                "plain": _entry(1.0, None),
                "lookahead-cluster": _entry(1.4, None, 0.5),
            },
        }
    }
    configs = ["plain", "suffix", "lookahead-private", "lookahead-shared", "lookahead-cluster"]
    table = replicas_table(report, configs)
    first = table["docs"]["first"]
    assert set(first) == {"plain", "suffix", "lookahead-private", "lookahead-shared"}
    assert first["suffix"]["cross_replica_accepted"] is None  # suffix cannot tell
    assert first["plain"]["cross_replica_accepted"] is None
    assert first["lookahead-private"]["cross_replica_accepted"] == 0.0
    shared = first["lookahead-shared"]
    assert shared["speedup"] == 1.1 and shared["tok_s"] == 11.0
    assert shared["identical"] is False and first["suffix"]["identical"] is True
    sampled = table["math"]["repeat"]["lookahead-cluster"]
    assert sampled["identical"] is None and sampled["cross_replica_accepted"] == 0.5


def test_replicas_refuses_bad_configurations_and_one_replica(capsys):
    from lookahead_client.bench.cli import main

    assert main(["replicas", "--workload", "w.jsonl", "--configs", "plain,lookahead"]) == 2
    assert "unknown configuration lookahead;" in capsys.readouterr().err
    assert main(["replicas", "--workload", "w.jsonl", "--replicas", "1"]) == 2
    assert "--replicas: at least 2" in capsys.readouterr().err
