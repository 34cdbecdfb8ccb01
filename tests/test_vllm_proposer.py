"""The vLLM proposer's own logic, driven the way vLLM's model runner drives it (rows of a
token table, the scheduler's finished ids), without vLLM: chain choice, request identity
across row moves and preemption, ends, and fallback. tests/vllm/ runs it in real vLLM."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.types import DraftTree
from lookahead_client.vllm.chains import best_chain
from lookahead_client.vllm.proposer import LookaheadProposer

K = 4
MAX_LEN = 256


def test_best_chain_takes_the_path_of_highest_total_score() -> None:
    #      root
    #     /    \
    #   a .6    b .5
    #   |       |
    #   c .1    d .45 -- e .4
    tree = DraftTree(0, (10, 20, 30, 40, 50), (-1, -1, 0, 1, 3), (0.6, 0.5, 0.1, 0.45, 0.4))
    chain = best_chain(tree, 8)
    assert chain.tokens == (20, 40, 50) and chain.parents == (-1, 0, 1)
    assert best_chain(tree, 1).tokens == (10,)  # within one node the best is a
    assert best_chain(tree, 2).tokens == (20, 40)
    assert len(best_chain(tree, 0)) == 0 and len(best_chain(DraftTree.empty(3), 4)) == 0


class Recorder:
    """A drafter that records every request it gets and proposes a fixed chain."""

    def __init__(self) -> None:
        self.fed: dict[str, list[int]] = {}
        self.ended: list[str] = []
        self.fail = False

    def step(self, requests):
        if self.fail:
            raise ConnectionError("drafter down")
        out = []
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

    def add(self, rid: str, prompt: list[int]) -> None:
        self.tokens[rid] = list(prompt)
        self.prompt_len[rid] = len(prompt)
        self.rows.append(rid)

    def step(self, emitted: dict[str, list[int]], finished=()) -> list[list[int]]:
        for rid, toks in emitted.items():
            self.tokens[rid].extend(toks)
        batch = SimpleNamespace(
            req_ids=list(self.rows),
            num_prompt_tokens=np.asarray([self.prompt_len[r] for r in self.rows]),
        )
        schedule = SimpleNamespace(
            finished_req_ids=set(finished),
            num_scheduled_tokens={r: 1 for r in self.rows},
            total_num_scheduled_tokens=len(self.rows),
        )
        self.proposer.scheduled(batch, schedule, 0.0)
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
    proposer.guard._next_deadline = None
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


def test_the_sizing_policy_cuts_chains_and_learns_from_acceptance() -> None:
    rec = Recorder()
    runner = Runner(make(rec, sizing=True))
    runner.add("a", [1, 2, 3])
    drafts = runner.step({"a": [4]})
    for _ in range(30):
        drafts = runner.step({"a": drafts[0][:1] + [99]})  # one draft accepted per step
    stats = runner.proposer.stats()
    assert stats["sizing"]["steps"] == 30
    assert stats["accepted_drafts"] > 0
    assert all(len(d) <= K for d in drafts)


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
