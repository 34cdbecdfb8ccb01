"""The replay benchmark: simulator semantics, workload checks, baselines and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

import pytest

from lookahead_client.bench import cli
from lookahead_client.bench.baselines import VllmNgramDrafter
from lookahead_client.bench.baselines.per_request import chain_tree
from lookahead_client.bench.registry import (
    DRAFTERS,
    DrafterOptions,
    UnknownDrafterError,
    get_spec,
)
from lookahead_client.bench.replay import ReplayError, ReplaySettings, accepted_length, replay
from lookahead_client.bench.workload import (
    DEMO_WORKLOAD,
    Request,
    Workload,
    WorkloadError,
    load_workload,
    parse_lines,
)
from lookahead_client.types import Drafter, DraftTree, StepRequest

# --- small drafters used as instruments ----------------------------------------------------------


class Recorder:
    """Proposes nothing; records every step call as (id, prompt?, new tokens, finished)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, bool, tuple[int, ...], bool]]] = []

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        self.calls.append(
            [
                (r.request_id, r.prompt is not None, tuple(r.new_tokens), r.finished)
                for r in requests
            ]
        )
        return [DraftTree.empty() for _ in requests]

    def stats(self) -> dict:
        return {"calls": len(self.calls)}


class Oracle:
    """Knows the responses: drafts the next ``budget`` recorded tokens as a chain."""

    def __init__(self, workload: Workload) -> None:
        self.responses = {r.id: r.response for r in workload.requests}
        self.known: dict[str, int] = {}

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        out = []
        for r in requests:
            pos = self.known.get(r.request_id, 0) + len(r.new_tokens)
            self.known[r.request_id] = pos
            nxt = [] if r.finished else self.responses[r.request_id][pos : pos + r.budget]
            out.append(chain_tree(-1, nxt))
        return out

    def stats(self) -> dict:
        return {}


class Bigram:
    """Remembers, over every stream it is told (prompts and new tokens of all requests), the
    token that followed each token last; drafts by following that map."""

    def __init__(self) -> None:
        self.next: dict[int, int] = {}
        self.last: dict[str, int] = {}

    def _feed(self, rid: str, tokens: Sequence[int]) -> None:
        prev = self.last.get(rid)
        for t in tokens:
            if prev is not None:
                self.next[prev] = t
            prev = t
        self.last[rid] = prev

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        out = []
        for r in requests:
            if r.prompt is not None:
                self._feed(r.request_id, r.prompt)
            self._feed(r.request_id, r.new_tokens)
            chain: list[int] = []
            tok = self.last[r.request_id]
            while not r.finished and len(chain) < r.budget and tok in self.next:
                tok = self.next[tok]
                chain.append(tok)
            out.append(
                DraftTree(-1, tuple(chain), tuple(range(-1, len(chain) - 1)), (1.0,) * len(chain))
            )
        return out

    def stats(self) -> dict:
        return {"bigrams": len(self.next)}


def wl(*requests: tuple) -> Workload:
    """A workload from (id, prompt, response[, after]) tuples."""
    return Workload(
        "test",
        tuple(
            Request(r[0], r[0], tuple(r[1]), tuple(r[2]), r[3] if len(r) > 3 else None)
            for r in requests
        ),
    )


# --- the simulator -------------------------------------------------------------------------------


def test_accepted_length_follows_the_longest_matching_path():
    # root -> 5 -> 6 -> 9 ; root -> 5 -> 7 -> 8 -> 1 ; root -> 4
    tree = DraftTree(0, (5, 4, 6, 7, 9, 8, 1), (-1, -1, 0, 0, 2, 3, 5), (1.0,) * 7)
    assert accepted_length(tree, [5, 7, 8, 1, 3]) == 4
    assert accepted_length(tree, [5, 7, 8, 2]) == 3
    assert accepted_length(tree, [5, 6, 2]) == 2
    assert accepted_length(tree, [4, 5]) == 1
    assert accepted_length(tree, [3]) == 0
    assert accepted_length(tree, [5, 7]) == 2  # capped by what remains
    # A node whose parent does not match never counts, even if its own token would.
    assert accepted_length(DraftTree(0, (1, 2), (-1, 0), (1.0, 1.0)), [9, 2]) == 0
    assert accepted_length(DraftTree.empty(0), [1]) == 0


def test_oracle_mat_is_hand_computed():
    # Response of 10, B=4: prefill gives 1; step 1 accepts 4 (advance 5 -> 6 known); step 2
    # accepts the last 4 (advance min(5, 4)). Response of 3: one step accepting 2.
    w = wl(("a", [1], range(100, 110)), ("b", [2], [7, 8, 9]))
    result = replay(w, lambda: Oracle(w), ReplaySettings(budget=4))
    assert (result.requests, result.steps, result.accepted) == (2, 3, 10)
    assert result.mat == pytest.approx(10 / 3)
    assert result.tokens_per_step == pytest.approx(1 + 10 / 3)


class HalfSure(Oracle):
    """The oracle's drafts with every score halved: right every time, half as sure."""

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        return [
            DraftTree(t.root, t.tokens, t.parents, tuple(s / 2 for s in t.scores))
            for t in super().step(requests, cost)
        ]


def test_accepted_over_expected_compares_acceptance_with_the_scores():
    w = wl(("a", [1], range(100, 110)), ("b", [2], [7, 8, 9]))
    sure = replay(w, lambda: Oracle(w), ReplaySettings(budget=4))
    assert sure.expected == pytest.approx(10.0)  # every drafted token, score 1, accepted
    assert sure.accepted_over_expected == pytest.approx(1.0)
    half = replay(w, lambda: HalfSure(w), ReplaySettings(budget=4))
    assert half.accepted == sure.accepted
    assert half.accepted_over_expected == pytest.approx(2.0)  # scores too low by half
    nothing = replay(w, Recorder, ReplaySettings(budget=4))
    assert nothing.expected == 0.0 and nothing.accepted_over_expected is None


def test_drafter_proposing_nothing_has_mat_zero():
    w = wl(("a", [1], range(10)), ("b", [2], range(4)))
    for concurrency in (1, 2):
        result = replay(w, Recorder, ReplaySettings(budget=8, concurrency=concurrency))
        assert (result.steps, result.accepted, result.mat) == (9 + 3, 0, 0.0)


def test_step_calls_with_two_slots_follow_the_documented_order():
    w = wl(("r1", [1], [10, 11, 12]), ("r2", [2], [20, 21]), ("r3", [3], [30, 31]))
    drafters: list[Recorder] = []

    def make() -> Recorder:
        drafters.append(Recorder())
        return drafters[-1]

    result = replay(w, make, ReplaySettings(budget=4, concurrency=2))
    assert drafters[0].calls == [
        [("r1", True, (10,), False), ("r2", True, (20,), False)],
        # r2 finished in the previous step: reported first; r3 takes its slot at once.
        [("r2", False, (21,), True), ("r1", False, (11,), False), ("r3", True, (30,), False)],
        [("r1", False, (12,), True), ("r3", False, (31,), True)],
    ]
    assert (result.steps, result.engine_steps, result.requests) == (4, 3, 3)


def test_after_waits_without_blocking_later_requests():
    w = wl(
        ("a", [1], [5, 5, 5, 5]),
        ("b", [2], [6, 6], "a"),
        ("d", [4], [9]),  # all from prefill: no step, no slot
        ("c", [3], [7, 7]),
    )
    rec = Recorder()
    result = replay(w, lambda: rec, ReplaySettings(budget=2, concurrency=2))
    assert rec.calls == [
        [("d", True, (9,), True), ("a", True, (5,), False), ("c", True, (7,), False)],
        [("c", False, (7,), True), ("a", False, (5,), False)],
        [("a", False, (5,), False)],
        # a finished in the previous round: b may start now, after a's last tokens.
        [("a", False, (5,), True), ("b", True, (6,), False)],
        [("b", False, (6,), True)],
    ]
    assert (result.requests, result.steps) == (4, 3 + 1 + 1)


def test_replicas_get_requests_round_robin_in_lockstep():
    w = wl(*[(f"r{i}", [i], [i, i, i]) for i in range(5)])
    drafters: list[Recorder] = []

    def make() -> Recorder:
        drafters.append(Recorder())
        return drafters[-1]

    replay(w, make, ReplaySettings(budget=2, replicas=2, sharing="private"))
    assert len(drafters) == 2
    seen = [sorted({rid for call in d.calls for rid, *_ in call}) for d in drafters]
    assert seen == [["r0", "r2", "r4"], ["r1", "r3"]]

    drafters.clear()
    replay(w, make, ReplaySettings(budget=2, replicas=2, sharing="shared"))
    assert len(drafters) == 1
    firsts = [call[0][0] for call in drafters[0].calls[:4]]
    assert firsts == ["r0", "r1", "r0", "r1"]  # replica 0's step, then replica 1's


def test_shared_drafter_learns_across_replicas_private_does_not():
    # Replica 0 serves r0 then r2, replica 1 serves r1 then r3; r2 repeats r1's response and
    # r3 repeats r0's. Private: nothing to reuse (12 steps, 0 accepted). Shared: r2 starts in
    # round 4 on replica 0, when r1's last token (23) is not told yet: draft [21, 22], 2
    # accepted in one step; r3 (replica 1, later in round 4) has all of r0: 3 accepted.
    w = wl(
        ("r0", [1], [10, 11, 12, 13]),
        ("r1", [2], [20, 21, 22, 23]),
        ("r2", [3], [20, 21, 22, 23]),
        ("r3", [4], [10, 11, 12, 13]),
    )
    private = replay(w, Bigram, ReplaySettings(budget=4, replicas=2, sharing="private"))
    assert (private.steps, private.accepted) == (12, 0)
    shared = replay(w, Bigram, ReplaySettings(budget=4, replicas=2, sharing="shared"))
    assert (shared.steps, shared.accepted) == (8, 5)
    assert shared.mat == pytest.approx(0.625)
    # With one replica, shared and private are the same; results say "n/a".
    assert ReplaySettings(replicas=1, sharing="private").sharing_label == "n/a"
    assert ReplaySettings(replicas=2, sharing="private").drafters_needed == 2


def test_protocol_violations_are_reported():
    w = wl(("a", [1], [1, 2, 3]))

    class TooBig(Recorder):
        def step(self, requests, cost=None):
            return [DraftTree(-1, (1, 2, 3), (-1, 0, 1), (1.0,) * 3) for _ in requests]

    class TooFew(Recorder):
        def step(self, requests, cost=None):
            return []

    with pytest.raises(ReplayError, match="3 nodes .* budget 2"):
        replay(w, TooBig, ReplaySettings(budget=2))
    with pytest.raises(ReplayError, match="0 trees"):
        replay(w, TooFew, ReplaySettings(budget=2))
    with pytest.raises(ValueError, match="sharing"):
        ReplaySettings(sharing="both")


# --- workload files ------------------------------------------------------------------------------


def _error(lines: list[str]) -> WorkloadError:
    with pytest.raises(WorkloadError) as info:
        parse_lines(lines, source="w.jsonl")
    return info.value


def test_workload_errors_name_the_line_and_field():
    ok = '{"id": "a", "group": "g", "prompt": [1], "response": [2]}'
    err = _error([ok, "{not json"])
    assert (err.line, err.field) == (2, None) and "w.jsonl:2" in str(err)
    err = _error([ok, '{"id": "b", "group": "g", "prompt": [1]}'])
    assert (err.line, err.field) == (2, "response")
    err = _error(['{"id": "a", "group": "g", "prompt": [1, -3], "response": [2]}'])
    assert (err.line, err.field) == (1, "prompt") and "prompt'[1] = -3" in str(err)
    err = _error(['{"id": "a", "group": "g", "prompt": [1], "response": []}'])
    assert err.field == "response"
    err = _error([ok, ok])
    assert (err.line, err.field) == (2, "id")
    err = _error([ok, '{"id": "b", "group": "g", "prompt": [1], "response": [2], "after": "z"}'])
    assert (err.line, err.field) == (2, "after")
    err = _error(['{"id": "a", "group": "g", "prompt": [1], "response": [2], "afer": "z"}'])
    assert err.field == "afer"
    err = _error(['{"id": "a", "group": "g", "prompt": [true], "response": [2]}'])
    assert err.field == "prompt"


def test_demo_workload_loads_whole_groups(tmp_path):
    demo = load_workload(DEMO_WORKLOAD)
    assert demo.name == "demo" and len(demo.requests) == 72
    groups = [r.group for r in demo.requests]
    # Groups are contiguous and whole (code-edit: 2 per module, CHAMP: 4 models per prompt).
    assert all(groups.count(g) in (2, 4) for g in groups)
    assert len(load_workload(DEMO_WORKLOAD, limit=5).requests) == 5
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "missing.jsonl")


# --- baselines -----------------------------------------------------------------------------------


def _propose(drafter, context: list[int], budget: int) -> tuple[int, ...]:
    drafter.start("q", context[:-1])
    (tree,) = drafter.step([StepRequest("q", context[-1:], budget)])
    drafter.end("q")
    assert tree.parents == tuple(range(-1, len(tree) - 1))  # a chain
    return tree.tokens


def _brute_force_vllm(context: list[int], min_n: int, max_n: int, k: int) -> tuple[int, ...]:
    """The specification, literally: the longest n whose suffix occurs earlier (ending before
    the last token), its earliest occurrence, the tokens after it."""
    total = len(context)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = context[total - n :]
        for start in range(0, total - n):
            if context[start : start + n] == suffix:
                return tuple(context[start + n : start + n + k])
    return ()


def test_prompt_lookup_matches_vllm_semantics():
    d = VllmNgramDrafter(min_n=2, max_n=3)
    assert _propose(d, [1, 2, 3, 4, 2, 3], 4) == (4, 2, 3)  # vLLM's own docstring example
    d = VllmNgramDrafter()
    assert _propose(d, [7, 8, 1, 7, 8, 2, 7, 8], 3) == (1, 7, 8)  # earliest, not most recent
    assert _propose(d, [2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 3) == (9, 1, 2)  # longest n first
    assert _propose(VllmNgramDrafter(1, 2), [2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 3) == (8, 1, 2)
    assert _propose(d, [4, 5, 6, 4, 5], 8) == (6, 4, 5)  # cut at the end of the context
    assert _propose(d, [1, 2, 3], 8) == ()
    assert _propose(d, [9, 9], 4) == (9,)


def test_prompt_lookup_agrees_with_brute_force_while_tokens_arrive():
    import random

    rng = random.Random(7)
    for _ in range(30):
        seq = [rng.randrange(4) for _ in range(rng.randrange(2, 60))]
        cut = rng.randrange(1, len(seq))
        d = VllmNgramDrafter()
        d.start("q", seq[:cut])
        pos = cut
        while pos < len(seq):
            step = rng.randrange(1, 4)
            new = seq[pos : pos + step]
            pos += len(new)
            (tree,) = d.step([StepRequest("q", new, 5)])
            assert tree.tokens == _brute_force_vllm(seq[:pos], 1, 5, 5), seq[:pos]


def test_prompt_lookup_reproduces_code_edit_reference():
    # Issue author's figure with the released code: prompt lookup, C=1, B=8, code-edit: 4.975.
    w = load_workload(DEMO_WORKLOAD, limit=16)  # the demo starts with all of code-edit.jsonl
    assert {r.group for r in w.requests} >= {"wsgiref.util", "threading"}
    result = replay(
        w, lambda: get_spec("prompt-lookup").factory(DrafterOptions(8)), ReplaySettings(8)
    )
    assert (result.steps, result.accepted) == (1123, 5587)
    assert round(result.mat, 3) == 4.975


def test_suffix_decoding_drafter_drives_arctic_inference():
    spec = get_spec("suffix")
    spec.check(DrafterOptions(8))  # fails loudly with the install command when it is missing
    d = spec.factory(DrafterOptions(8))
    d.start("a", [1, 2, 3, 4, 5, 6, 7, 8])
    (tree,) = d.step([StepRequest("a", [1, 2, 3], 8)])
    # The prompt tree has 1 2 3 -> 4 5 6 7 8; the drafted chain follows it.
    assert tree.tokens[:3] == (4, 5, 6) and tree.parents[:3] == (-1, 0, 1)
    assert all(a >= b for a, b in zip(tree.scores, tree.scores[1:], strict=False))
    (done,) = d.step([StepRequest("a", [4], 8, finished=True)])
    assert len(done) == 0 and d.stats()["cached_responses"] == 1


def test_sglang_ngram_corpus_is_driven_like_its_worker():
    from lookahead_client.bench.baselines import SglangNgramDrafter

    plain = SglangNgramDrafter(4, capacity=10_000)
    (tree,) = plain.step([StepRequest("a", [1], 4, prompt=[1, 2, 3, 4, 5, 6])])
    # Nothing inserted yet: SGLang pads with token 0 under the root; one such node is kept.
    assert (tree.tokens, tree.parents) == ((0,), (-1,))
    # The first tail went in after the draft: 1 -> 2 -> 3 -> 4 is known now.
    (tree,) = plain.step([StepRequest("b", [1], 4, prompt=[9])])
    assert (tree.tokens, tree.parents) == ((2, 3, 4, 5), (-1, 0, 1, 2))

    whole = SglangNgramDrafter(8, insert_prompt=True, capacity=10_000)
    whole.start("a", list(range(1, 11)))
    whole.start("b", [1, 2, 3, 44, 55, 66, 77, 88, 99, 100])
    (tree,) = whole.step([StepRequest("c", [3], 8, prompt=[7, 1, 2])])
    assert sorted(map(tuple, tree.paths())) == sorted(
        [(4,), (4, 5), (4, 5, 6), (4, 5, 6, 7), (44,), (44, 55), (44, 55, 66), (44, 55, 66, 77)]
    )
    (tree,) = whole.step([StepRequest("c", [4], 4)])  # a smaller budget cuts the tree
    assert len(tree) == 4
    (done,) = whole.step([StepRequest("c", [5], 0, finished=True)])
    assert len(done) == 0 and whole.stats()["active_requests"] == 2


# --- registry and command line -------------------------------------------------------------------


def test_registry_names_and_errors():
    assert {"lookahead", "prompt-lookup", "suffix", "sglang", "sglang-prompt", "remote"} <= set(
        DRAFTERS
    )
    with pytest.raises(UnknownDrafterError, match="known: lookahead"):
        get_spec("nope")
    for name in ("prompt-lookup", "prompt-lookup-recent", "lookahead"):
        assert isinstance(get_spec(name).factory(DrafterOptions(8)), Drafter), name
    # The gRPC client is only made here (it connects on its first step).
    remote = get_spec("remote").factory(DrafterOptions(8, target="unix:///tmp/nowhere.sock"))
    assert isinstance(remote, Drafter) and "nowhere.sock" in remote.target


def test_cli_end_to_end_on_the_demo(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["replay", "--drafter", "prompt-lookup", "--budget", "4,8", "--concurrency", "1,4"]
    argv += ["--replicas", "1,2", "--sharing", "shared,private", "--limit", "12"]
    argv += ["--no-progress", "--json", str(out), "--plot", str(png)]
    assert cli.main(argv) == 0
    rows = json.loads(out.read_text())["results"]
    # 2 budgets x 2 concurrencies x (R=1 + R=2 shared + R=2 private)
    assert len(rows) == 2 * 2 * 3
    fields = {"workload", "drafter", "budget", "concurrency", "replicas", "sharing", "mat"}
    fields |= {"steps", "accepted", "requests", "wall_s", "drafter_stats"}
    for row in rows:
        assert fields <= set(row) and row["requests"] == 12 and row["workload"] == "demo"
        assert row["mat"] == pytest.approx(row["accepted"] / row["steps"])
        assert row["sharing"] == ("n/a" if row["replicas"] == 1 else row["sharing"])
        assert len(row["drafter_stats"]) == (2 if row["sharing"] == "private" else 1)
    assert {r["sharing"] for r in rows} == {"n/a", "shared", "private"}
    # A per-request drafter does not care about concurrency, replicas or sharing.
    assert len({(r["budget"], r["mat"]) for r in rows}) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["workload", "drafter", "B"]
    assert sum(line.startswith("demo") for line in table) == 12


def test_cli_reports_usage_errors(tmp_path, capsys):
    assert cli.main(["replay", "--drafter", "nope", "--no-progress"]) == 2
    assert "unknown drafter 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "group": "g", "prompt": [1], "response": "x"}\n')
    assert cli.main(["replay", "--drafter", "prompt-lookup", "--workload", str(bad)]) == 2
    assert f"{bad}:1: field 'response'" in capsys.readouterr().err
    assert cli.main(["replay", "--drafter", "remote", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--target" in err or "RemoteDrafter" in err


def test_python_dash_m_runs_the_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "lookahead_client.bench", "replay", "--drafter", "prompt-lookup"]
        + ["--budget", "8", "--limit", "3", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["workload", "drafter", "B"]
    assert lines[1].split()[:3] == ["demo", "prompt-lookup", "8"]
