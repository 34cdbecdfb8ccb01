"""The vLLM proposer's own logic, driven the way vLLM's model runner drives it (rows of a
token table, the scheduler's finished ids), without vLLM: chain choice, request identity
across row moves and preemption, ends, and fallback. tests/vllm/ runs it in real vLLM."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.types import DraftShape, DraftTree, StepRequest
from lookahead_client.vllm.proposer import LookaheadProposer

K = 4
MAX_LEN = 256


class Recorder:
    """A drafter that records every request it gets and proposes a fixed chain."""

    def __init__(self) -> None:
        self.fed: dict[str, list[int]] = {}
        self.ended: list[str] = []
        self.fail = False
        self.asked: list[StepRequest] = []

    def step(self, requests, cost=None):
        if self.fail:
            raise ConnectionError("drafter down")
        out = []
        self.asked.extend(requests)
        for r in requests:
            seq = self.fed.setdefault(r.request_id, [])
            if r.prompt is not None:
                assert not seq, "a started id is started again"
                seq.extend(r.prompt)
            seq.extend(r.new_tokens)
            if r.finished:
                self.ended.append(r.request_id)
                out.append(DraftTree.empty())
            else:
                out.append(DraftTree(seq[-1], (7, 8, 9), (-1, 0, 1), (0.9, 0.8, 0.7)))
        return out

    def by_request(self) -> dict[str, list[int]]:
        """Fed tokens per engine request id (drafter ids are ``prefix:rid:generation``)."""
        out: dict[str, list[int]] = {}
        for drafter_id, seq in self.fed.items():
            rid = drafter_id.split(":")[1]
            assert rid not in out, f"{rid} was started twice"
            out[rid] = seq
        return out


class Runner:
    """What vLLM's model runner keeps and shows the proposer: a token table with a row per
    scheduled request, and each step's scheduler output."""

    def __init__(self, proposer: LookaheadProposer) -> None:
        self.proposer = proposer
        self.rows: list[str] = []
        self.tokens: dict[str, list[int]] = {}
        self.prompt_len: dict[str, int] = {}
        self.temperature: dict[str, float] = {}

    def add(self, rid: str, prompt: list[int], temperature: float = 0.0) -> None:
        self.tokens[rid] = list(prompt)
        self.prompt_len[rid] = len(prompt)
        self.temperature[rid] = temperature
        self.rows.append(rid)

    def step(
        self,
        emitted: dict[str, list[int]],
        finished=(),
        *,
        scheduled: dict[str, int] | None = None,
        clock: list[float] | None = None,
        seconds: tuple[float, float] = (0.0, 0.0),
    ) -> list[list[int]]:
        """One engine step. ``scheduled``: tokens the step ran per request (default one
        each); ``clock``: a fake ``time.perf_counter`` the step advances by ``seconds``
        (before the forward pass, then the pass) and the hook reads (None: untimed)."""
        for rid, toks in emitted.items():
            self.tokens[rid].extend(toks)
        batch = SimpleNamespace(
            req_ids=list(self.rows),
            num_prompt_tokens=np.asarray([self.prompt_len[r] for r in self.rows]),
            # vLLM marks greedy rows with a negative temperature
            temperature_cpu=np.asarray([self.temperature[r] or -1.0 for r in self.rows]),
        )
        scheduled = scheduled or {r: 1 for r in self.rows}
        schedule = SimpleNamespace(
            finished_req_ids=set(finished),
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()),
        )
        started = None  # untimed: the tests give the cost
        if clock is not None:
            clock[0] += seconds[0]
            started = clock[0]
            clock[0] += seconds[1]
        self.proposer.scheduled(batch, schedule, started)
        table = np.zeros((len(self.rows), MAX_LEN), dtype=np.int32)
        counts = np.zeros(len(self.rows), dtype=np.int32)
        for i, rid in enumerate(self.rows):
            seq = self.tokens[rid]
            table[i, : len(seq)] = seq
            counts[i] = len(seq)
        sampled = [emitted.get(rid, []) for rid in self.rows]
        return self.proposer.propose(sampled, counts, table)


def make(recorder: Recorder, sizing: bool = False) -> LookaheadProposer:
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: 1000),
    )
    proposer = LookaheadProposer(vllm_config, LookaheadConfig(sizing=sizing))
    proposer.guard.drafter = recorder
    proposer.guard.deadline = None  # inline, so that the test is deterministic
    return proposer


def test_rows_that_move_never_mix_requests_and_every_token_is_fed_once() -> None:
    rec = Recorder()
    runner = Runner(make(rec))
    runner.add("a", [1, 2, 3])
    runner.add("b", [4, 5])
    assert runner.step({"a": [10], "b": [20]}) == [[7, 8, 9], [7, 8, 9]]
    runner.add("c", [6])  # c in prefill: no sampled token, no draft, not started yet
    assert runner.step({"a": [7, 8, 11], "b": [21]})[2] == []
    # a finishes; vLLM moves the last row (c) into its place.
    runner.rows = ["c", "b"]
    drafts = runner.step({"c": [30], "b": [22, 23]}, finished={"a"})
    assert drafts == [[7, 8, 9], [7, 8, 9]]
    # b is preempted (leaves the rows without finishing), later resumes in another row.
    runner.rows = ["c"]
    runner.step({"c": [31]})
    runner.rows = ["b", "c"]
    runner.step({"b": [24], "c": [32]})
    runner.rows = []
    runner.step({}, finished={"b", "c"})
    fed = rec.by_request()
    assert fed == {rid: runner.tokens[rid] for rid in ("a", "b", "c")}, (
        "each request's prompt and outputs, in order, once"
    )
    assert sorted(r.split(":")[1] for r in rec.ended) == ["a", "b", "c"]
    assert runner.proposer.book.resyncs == 0


def test_a_failing_drafter_gives_empty_drafts_and_is_restarted_cleanly() -> None:
    rec = Recorder()
    runner = Runner(make(rec))
    runner.add("a", [1, 2, 3])
    runner.step({"a": [4]})
    rec.fail = True
    assert runner.step({"a": [5]}) == [[]]
    rec.fail = False
    runner.proposer.guard._retry_at = 0.0  # skip the backoff
    assert runner.step({"a": [6]}) == [[7, 8, 9]]
    # the drafter's copy was in doubt: the request was started again with all it had
    assert rec.fed[max(rec.fed)][-6:] == [1, 2, 3, 4, 5, 6]


def test_requests_ask_for_chains_at_their_temperature() -> None:
    rec = Recorder()
    runner = Runner(make(rec, sizing=True))
    runner.add("greedy", [1, 2, 3])
    runner.add("hot", [4, 5], temperature=0.8)
    runner.step({"greedy": [4], "hot": [6]})
    asked = {r.request_id.split(":")[1]: r for r in rec.asked}
    assert asked["greedy"].temperature == 0.0 and asked["hot"].temperature == pytest.approx(0.8)
    assert {r.shape for r in rec.asked} == {DraftShape.SIZED_CHAIN}
    assert all(r.budget == K for r in rec.asked)


def embedded(sizing: bool) -> LookaheadProposer:
    """A proposer over a real embedded drafter, stepped inline."""
    proposer = make(Recorder(), sizing=sizing)
    proposer.guard.drafter = LookaheadConfig().build_drafter(num_slots=K + 1, vocab_size=1000)
    return proposer


@pytest.mark.parametrize(
    ("seconds_at_64", "drafted"),
    [(64.0, False), (1.0, True)],
    ids=["every-token-costs-a-step", "flat"],
)
def test_sized_chains_follow_the_engine_cost(seconds_at_64: float, drafted: bool) -> None:
    proposer = embedded(sizing=True)
    runner = Runner(proposer)
    text = [11, 12, 13, 14, 15, 16, 17] * 12
    runner.add("a", text[:40])
    # before two step sizes are measured the core keeps whole chains (which measures them)
    drafts = runner.step({"a": text[40:41]})
    assert len(drafts[0]) == K
    assert proposer.cost is not None and proposer.stats()["cost_curve_ms"] is None
    proposer.cost.observe(1, 1.0)
    proposer.cost.observe(64, seconds_at_64)
    # the feed refits on its own thread, a step behind: start that refit and let it finish
    assert proposer.cost.curve(1) is None
    proposer.cost.settle()
    drafts = runner.step({"a": drafts[0][:2] + text[43:44]})
    assert (len(drafts[0]) == K) is drafted, drafts
    if not drafted:
        assert proposer.stats()["sized_away"] >= K
    # what the chains were sized against, for a step of 1 to K + 1 tokens
    curve = proposer.stats()["cost_curve_ms"]
    assert len(curve) == K + 1 and curve[0] == pytest.approx(1000.0, rel=0.05)
    assert curve == sorted(curve) and (curve[-1] > 1.5 * curve[0]) is not drafted


def test_the_cost_curve_gets_whole_decode_steps_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step is timed from the proposer's last answer to its next call (the scheduler's
    share included), and a step that holds a prefill is left out of the curve."""
    from lookahead_client.vllm import proposer as proposer_module

    clock = [100.0]
    monkeypatch.setattr(proposer_module.time, "perf_counter", lambda: clock[0])
    proposer = make(Recorder(), sizing=True)
    assert proposer.cost is not None
    seen = []
    monkeypatch.setattr(proposer.cost, "observe", lambda t, s, **kw: seen.append((t, s)))
    runner = Runner(proposer)
    runner.add("a", [1, 2, 3])
    # a's prefill: the first call, nothing to time from
    runner.step({"a": [4]}, scheduled={"a": 3}, clock=clock, seconds=(0.01, 0.5))
    # a decodes: scheduler 4 ms, forward 30 ms
    runner.step({"a": [5]}, clock=clock, seconds=(0.004, 0.03))
    assert seen == [(1, pytest.approx(0.034))]
    # b's prefill beside a's decode: not a decode step's cost
    runner.add("b", [1, 2, 3])
    runner.step({"a": [6], "b": [9]}, scheduled={"a": 1, "b": 3}, clock=clock, seconds=(0, 0.4))
    assert len(seen) == 1 and proposer.stats()["prefill_steps"] == 1
    runner.step({"a": [7], "b": [10]}, clock=clock, seconds=(0.005, 0.035))
    assert seen[1:] == [(2, pytest.approx(0.04))]


def test_without_sizing_chains_are_whole() -> None:
    proposer = embedded(sizing=False)
    assert proposer.cost is None
    runner = Runner(proposer)
    text = [11, 12, 13, 14, 15, 16, 17] * 12
    runner.add("a", text[:40])
    assert len(runner.step({"a": text[40:41]})[0]) == K


def test_a_bad_config_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from lookahead_client.errors import InvalidArgumentError

    monkeypatch.setenv("LOOKAHEAD_VLLM", '{"targte": "unix:///x"}')
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: 1000),
    )
    with pytest.raises(InvalidArgumentError) as e:
        LookaheadProposer(vllm_config)
    assert e.value.field == "targte"


def test_the_execute_model_hook_never_raises_into_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafter whose ``scheduled`` raises does not fail vLLM's step: the hook logs once and
    runs the step."""
    import sys
    import types

    from lookahead_client.vllm import hook

    class GPUModelRunner:
        def execute_model(self, scheduler_output):
            return ("stepped", scheduler_output)

    module = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    module.GPUModelRunner = GPUModelRunner
    for name in ("vllm", "vllm.v1", "vllm.v1.worker"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", module)
    assert hook.install()

    class Broken:
        def scheduled(self, *args):
            raise RuntimeError("drafter bug")

    runner = GPUModelRunner()
    runner.drafter, runner.input_batch = Broken(), None
    assert runner.execute_model("step-1") == ("stepped", "step-1")


class Wrong(Recorder):
    """A recorder whose trees are wrong for some requests: ``bad_root`` hangs under a token
    that is not the request's last, ``bad_vocab`` proposes ids outside the vocabulary."""

    def step(self, requests, cost=None):
        trees = super().step(requests, cost)
        out = []
        for r, t in zip(requests, trees, strict=True):
            rid = r.request_id.split(":")[1]
            if rid == "bad_root" and t.tokens:
                t = DraftTree(t.root + 1, t.tokens, t.parents, t.scores)
            elif rid == "bad_vocab" and t.tokens:
                t = DraftTree(t.root, (7, 5000, 9), t.parents, t.scores)
            out.append(t)
        return out


def test_wrong_trees_are_not_proposed_and_a_wrong_root_restarts_the_request() -> None:
    rec = Wrong()
    runner = Runner(make(rec))
    for rid in ("good", "bad_root", "bad_vocab"):
        runner.add(rid, [1, 2, 3])
    drafts = runner.step({"good": [10], "bad_root": [11], "bad_vocab": [12]})
    assert drafts == [[7, 8, 9], [], []]
    stats = runner.proposer.stats()
    assert stats["problems_root"] == 1 and stats["problems_vocab"] == 1
    # the wrong root means the drafter's copy is wrong: that request is started again
    assert runner.proposer.book.resyncs == 1
    runner.step({"good": [13], "bad_root": [14], "bad_vocab": [15]})
    assert len([r for r in rec.asked if r.prompt is not None]) == 4  # 3 starts + 1 restart


def test_proposer_time_is_reported_by_batch_size_with_its_median_and_p99() -> None:
    runner = Runner(make(Recorder()))
    runner.add("a", [1, 2, 3])
    for t in range(5):
        runner.step({"a": [10 + t]})
    runner.add("b", [4, 5])
    runner.step({"a": [20], "b": [30]})
    timing = runner.proposer.stats()["timing"]
    assert timing["1"]["calls"] == 5 and timing["2"]["calls"] == 1
    one = timing["1"]
    assert 0 < one["proposer_p50_ms"] <= one["proposer_p99_ms"]
    assert one["proposer_p50_ms"] <= 5 * one["proposer_ms"]  # a median, not a sum
