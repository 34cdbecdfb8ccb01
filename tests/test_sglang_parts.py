"""The SGLang integration's parts that need no SGLang: the request book, the drafter guard,
the config and the launcher flags. (``test_sglang.py`` runs them inside SGLang's worker.)"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from lookahead_client import EmbeddedDrafter
from lookahead_client.engine.book import RequestBook, RequestView
from lookahead_client.engine.config import REMOTE_QUIET_EVERY, LookaheadConfig
from lookahead_client.engine.config import SGLANG_ENV as ENV_VAR
from lookahead_client.engine.guard import DraftGuard, guard_for, quiet_every_for
from lookahead_client.errors import InvalidArgumentError, UnknownRequestError
from lookahead_client.remote import RemoteDrafter
from lookahead_client.sglang.args import split_argv
from lookahead_client.sglang.step_modes import StepModes
from lookahead_client.types import DraftBatch, DraftShape, DraftTree, StepRequest

# -- plain or verify decode steps ------------------------------------------------------------


def _measure(modes: StepModes, times: list[tuple[bool, int, float]]) -> None:
    """Runs decode steps back to back: (plain?, batch size, seconds) each."""
    now = 0.0
    for plain, bs, seconds in times:
        modes.begin(now)
        modes.started(now, plain=plain, bs=bs)
        now += seconds
    modes.begin(now)  # the next forward closes the last step


def test_step_modes_measure_plain_once_then_follow_the_cheaper_kind():
    modes = StepModes(8)
    # nothing measured: the first step runs plain (no tree pays), then whole trees run
    first = modes.cost(1)
    assert first is not None and first.seconds[1] > 1000 * first.seconds[0]
    assert modes.plain_pays(1)
    _measure(modes, [(True, 1, 0.10)])
    assert modes.cost(1) is None and modes.plain_pays(1)
    _measure(modes, [(False, 1, 0.16)] * 3 + [(True, 1, 0.10)] * 2)
    assert modes.ratio(1) == pytest.approx(1.6)
    cost = modes.cost(1)
    assert cost is not None and cost.padded
    assert cost.tokens == (1, 2, 8) and cost.seconds == pytest.approx((1.0, 1.6, 1.6))
    assert modes.plain_pays(1)
    assert modes.stats() == {
        "plain_steps": 3,
        "verify_steps": 3,
        "plain_seconds": pytest.approx(0.3),
        "verify_seconds": pytest.approx(0.48),
    }


def test_step_modes_keep_verifying_where_the_verify_is_cheaper_and_remeasure_now_and_then():
    modes = StepModes(8, remeasure_every=4)
    _measure(modes, [(False, 2, 0.08), (True, 2, 0.10)])  # a GPU: verify in a graph
    cost = modes.cost(2)
    assert cost is not None and cost.seconds == (1.0, 1.0, 1.0)  # every tree pays
    assert [modes.plain_pays(2) for _ in range(8)] == [False, False, False, True] * 2


def test_step_modes_explore_only_where_the_verify_time_is_stale():
    modes = StepModes(8, stale_after=4)
    assert modes.stale(1) and modes.cost(1).explore_every == 0  # the first step runs plain
    _measure(modes, [(True, 1, 0.1), (False, 1, 0.2)])
    assert modes.cost(1).explore_every == 0  # just measured
    assert modes.stale(2)  # borrowed from batch size 1, never measured itself
    assert modes.cost(2).explore_every == 1  # so the next tree there explores
    _measure(modes, [(True, 1, 0.1)] * 3)
    assert not modes.stale(1)
    _measure(modes, [(True, 1, 0.1)])  # four decode steps since the last verify
    assert modes.stale(1) and modes.cost(1).explore_every == 1
    _measure(modes, [(False, 1, 0.2)])  # the exploring verify measured it again
    assert modes.cost(1).explore_every == 0
    never = StepModes(8, stale_after=0)
    _measure(never, [(True, 1, 0.1), (False, 1, 0.2)])
    assert not never.stale(3) and never.cost(3).explore_every == 0
    with pytest.raises(InvalidArgumentError, match="stale_after"):
        StepModes(8, stale_after=-1)


def test_step_modes_borrow_the_ratio_of_the_nearest_batch_size_and_shrug_off_gaps():
    modes = StepModes(4)
    _measure(modes, [(False, 2, 0.2), (True, 2, 0.1), (False, 6, 0.9), (True, 6, 0.3)])
    assert modes.ratio(1) == pytest.approx(2.0) and modes.ratio(5) == pytest.approx(3.0)
    assert modes.cost(1) is not None and modes.cost(1).tokens == (1, 2, 4)
    # an idle gap before the next request, then steps as before: the median stays
    _measure(modes, [(True, 2, 30.0), (True, 2, 0.1), (True, 2, 0.1)])
    assert modes.seconds(plain=True, bs=2) == pytest.approx(0.1)


def test_step_modes_cost_cuts_weak_trees_whole_and_keeps_strong_ones():
    """The core's padded sizing against the modes' cost: a tree whole, or nothing."""
    dear, cheap = StepModes(8), StepModes(8)
    _measure(dear, [(False, 1, 0.3), (True, 1, 0.1)])  # verifying costs 3 plain steps
    _measure(cheap, [(False, 1, 0.101), (True, 1, 0.1)])
    text = list(range(100, 140))
    d = EmbeddedDrafter(memory_budget_bytes=1 << 22)
    d.ingest(text * 4)
    requests = iter(range(100))

    def nodes(prompt: list[int], modes: StepModes) -> int:
        request = StepRequest(
            f"r{next(requests)}", prompt=prompt, budget=7, shape=DraftShape.SIZED_TREE
        )
        (tree,) = d.step([request], modes.cost(1))
        return len(tree)

    # the request repeats the text: its tree is near certain, worth a dear verify
    assert nodes(text * 3 + text[:10], dear) == 7
    # a fresh request drafts from the ingested text only: weak odds (scores 0.28, 0.08...)
    assert nodes(text[:10], dear) == 0
    assert nodes(text[:10], cheap) > 0


# -- the request book ------------------------------------------------------------------------


def test_book_starts_with_the_prompt_then_sends_only_new_tokens_with_feedback():
    book = RequestBook(budget=7)
    output: list[int] = [5]
    plan = book.plan([RequestView("a", [1, 2, 3, 4], output, [6])])
    (start,) = plan.requests
    assert list(start.prompt) == [1, 2, 3, 4] and list(start.new_tokens) == [5, 6]
    assert start.budget == 7 and start.accepted_last == -1
    book.commit(plan, frozenset())
    book.fed(plan, 0, depth=3, expected=2.5)

    output += [6, 7, 8]  # committed since, plus two spliced tokens
    plan = book.plan([RequestView("a", [1, 2, 3, 4], output, [9, 10])])
    (step,) = plan.requests
    assert step.request_id == start.request_id and step.prompt is None
    assert list(step.new_tokens) == [7, 8, 9, 10] and step.accepted_last == 3
    # Realised against expected acceptance, over the trees whose outcome is known.
    assert (book.accepted_drafts, book.expected_drafts) == (3, 2.5)
    book.commit(plan, frozenset())
    # Not fed last step (a fallback): no feedback.
    book.fed(plan, 0, depth=-1)
    plan = book.plan([RequestView("a", [1, 2, 3, 4], output + [9, 10, 11])])
    assert plan.requests[0].accepted_last == -1
    assert (book.accepted_drafts, book.expected_drafts) == (3, 2.5)


def test_book_acceptance_follows_what_the_engine_accepted_of_the_expected_tokens():
    book = RequestBook(budget=7)
    assert book.acceptance == 1.0  # nothing known: the scores as they are
    output: list[int] = [5]
    view = RequestView("a", [1, 2, 3, 4], output)
    book.commit(book.plan([view]), frozenset())

    def step(expected: float, accepted: int) -> None:
        plan = book.plan([RequestView("a", [1, 2, 3, 4], output)])
        book.commit(plan, frozenset())
        book.fed(plan, 0, depth=7, expected=expected)
        output.extend([9] * (accepted + 1))  # the accepted draft tokens and the bonus

    step(3.0, 0)  # the first tree's outcome is read by the step after it
    for _ in range(100):
        step(3.0, 1)  # a third of what the drafter expected, tree after tree
    assert book.acceptance == pytest.approx(1 / 3, abs=0.05)
    for _ in range(300):
        step(2.0, 2)  # then all of it: the old outcomes fade
    assert book.acceptance == pytest.approx(1.0, abs=0.05)
    for _ in range(2000):
        step(2.0, 0)  # nothing accepted: a floor, so that drafting can come back
    assert book.acceptance == pytest.approx(0.05)


def test_book_acceptance_of_requests_is_their_own_record_from_the_engines_prior():
    book = RequestBook(budget=7)
    outputs: dict[str, list[int]] = {"code": [5], "chat": [5]}

    def views(*rids: str) -> list[RequestView]:
        return [RequestView(r, [1, 2, 3, 4], outputs[r]) for r in rids]

    book.commit(book.plan(views("code", "chat")), frozenset())
    for _ in range(40):  # code accepts all it was promised, chat a fifth
        plan = book.plan(views("code", "chat"))
        book.commit(plan, frozenset())
        book.fed(plan, 0, depth=7, expected=2.0)
        book.fed(plan, 1, depth=7, expected=5.0)
        outputs["code"].extend([9] * 3)  # two draft tokens accepted, and the bonus
        outputs["chat"].extend([9, 8])  # one
    engine = book.acceptance
    assert engine == pytest.approx(3 / 7, abs=0.05)  # the two mixed
    assert book.acceptance_of(views("chat")) == pytest.approx(0.2, abs=0.05)
    assert book.acceptance_of(views("code")) == pytest.approx(1.0, abs=0.05)
    assert book.acceptance_of([RequestView("new", [1], [2])]) == pytest.approx(engine)


def test_book_feeds_a_tail_view_and_never_starts_a_request_from_one():
    """vLLM 0.34 reads only each row's last tokens once the drafter holds the rest."""
    book = RequestBook(budget=4)
    assert book.needs_from("a") == 0
    # a tail cannot start a request: it is not drafted this step, nothing is sent
    plan = book.plan([RequestView("a", (), [3, 4], start=2)])
    assert plan.live == [-1] and plan.requests == []
    plan = book.plan([RequestView("a", [1, 2], [3, 4])])
    book.commit(plan, frozenset())
    book.fed(plan, 0, depth=2)
    assert book.needs_from("a") == 4
    # the tail from position 3 on covers what the drafter lacks: only the new tokens go
    plan = book.plan([RequestView("a", (), [4, 5, 6], start=3)])
    (step,) = plan.requests
    assert list(step.new_tokens) == [5, 6] and step.accepted_last == 1
    book.commit(plan, frozenset())
    assert book.needs_from("a") == 6
    # a tail that misses tokens the drafter lacks is not drafted (and not resynced)
    plan = book.plan([RequestView("a", (), [9], start=8)])
    assert plan.live == [-1] and book.needs_from("a") == 6 and book.resyncs == 0
    with pytest.raises(ValueError, match="starts at 8"):
        RequestView("a", (), [9], start=8).tokens_from(7)
    with pytest.raises(ValueError, match="no prompt"):
        RequestView("a", [1], [2], start=1)


def test_book_feedback_is_unknown_when_more_was_appended_than_the_tree_held():
    book = RequestBook(budget=7)
    plan = book.plan([RequestView("a", [1, 2], [3])])
    book.commit(plan, frozenset())
    book.fed(plan, 0, depth=1)
    plan = book.plan([RequestView("a", [1, 2], [3, 4, 5, 6])])
    assert plan.requests[0].accepted_last == -1


def test_book_finishes_departed_requests_first_in_the_next_step():
    book = RequestBook(budget=3)
    plan = book.plan([RequestView("a", [1], [2]), RequestView("b", [3], [4])])
    book.commit(plan, frozenset())
    a_id = plan.requests[0].request_id
    book.forget("a")
    plan = book.plan([RequestView("b", [3], [4, 5])])
    assert [(r.request_id, r.finished) for r in plan.requests] == [
        (a_id, True),
        (plan.requests[1].request_id, False),
    ]
    assert plan.ends == 1 and plan.live == [1]
    book.commit(plan, frozenset())
    assert "a" not in book and "b" in book and book.owed_ends == 0


def test_book_restarts_everything_after_a_whole_step_failure():
    book = RequestBook(budget=3)
    plan = book.plan([RequestView("a", [1], [2])])
    book.commit(plan, frozenset())
    old = plan.requests[0].request_id
    book.forget("gone")  # never drafted: nothing owed
    plan = book.plan([RequestView("a", [1], [2, 3])])
    book.commit(plan, None)  # the drafter crashed: a's copy is in doubt
    plan = book.plan([RequestView("a", [1], [2, 3, 4])])
    end, start = plan.requests
    assert (end.request_id, end.finished) == (old, True)
    assert start.request_id != old and list(start.prompt) == [1]
    assert list(start.new_tokens) == [2, 3, 4]
    book.commit(plan, None)  # failing again: the finish is owed again, no request disabled
    plan = book.plan([RequestView("a", [1], [2, 3, 4])])
    assert [r.request_id for r in plan.requests if r.finished] == [old, start.request_id]
    assert plan.live == [2] and book.disabled == 0 and book.resyncs == 1


def test_book_stops_drafting_a_request_the_drafter_refuses_twice():
    book = RequestBook(budget=3)
    plan = book.plan([RequestView("bad", [1], [2]), RequestView("ok", [5], [6])])
    book.commit(plan, frozenset({0}))  # refused on its own
    plan = book.plan([RequestView("bad", [1], [2, 3]), RequestView("ok", [5], [6, 7])])
    assert plan.requests[plan.live[0]].prompt is not None  # started again
    book.commit(plan, frozenset({plan.live[0]}))
    plan = book.plan([RequestView("bad", [1], [2, 3, 4]), RequestView("ok", [5], [6, 7, 8])])
    assert plan.live[0] == -1 and book.disabled == 1
    assert list(plan.requests[plan.live[1]].new_tokens) == [8]
    book.forget("bad")  # it left: a later request with the same id is drafted again
    assert book.disabled == 0


def test_book_commits_the_tokens_counted_when_the_step_was_planned():
    book = RequestBook(budget=3)
    output = [2]
    plan = book.plan([RequestView("a", [1], output)])
    output += [3, 4]  # the engine moved on while the (late) step ran
    book.commit(plan, frozenset())
    plan = book.plan([RequestView("a", [1], output)])
    assert list(plan.requests[0].new_tokens) == [3, 4]


def test_book_finishes_a_request_that_left_while_its_start_was_running():
    book = RequestBook(budget=3)
    plan = book.plan([RequestView("a", [1], [2])])
    book.forget("a")
    book.commit(plan, frozenset())
    assert "a" not in book
    (end,) = book.plan([]).requests
    assert end.request_id == plan.requests[0].request_id and end.finished


def test_book_starts_again_a_request_that_shrank():
    book = RequestBook(budget=3)
    plan = book.plan([RequestView("a", [1, 2], [3, 4])])
    book.commit(plan, frozenset())
    old = plan.requests[0].request_id
    plan = book.plan([RequestView("a", [1, 2], [3])])
    (start,) = plan.requests
    assert start.prompt is not None and start.request_id != old and book.resyncs == 1
    book.commit(plan, frozenset())
    assert [(r.request_id, r.finished) for r in book.plan([]).requests] == [(old, True)]


def test_request_view_copies_only_the_tail():
    view = RequestView("a", [1, 2, 3], [4, 5], [6])
    assert view.total == 6
    assert view.tokens_from(0) == [1, 2, 3, 4, 5, 6]
    assert view.tokens_from(2) == [3, 4, 5, 6]
    assert view.tokens_from(5) == [6] and view.tokens_from(6) == []
    assert view.generated() == [4, 5, 6]


# -- the guard -------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Scripted:
    """A drafter whose next step does what the test says."""

    def __init__(self) -> None:
        self.action = "ok"
        self.calls = 0
        self.release = threading.Event()

    def step(self, requests, cost=None):
        self.calls += 1
        if self.action == "raise":
            raise RuntimeError("boom")
        if self.action == "refuse":
            error = UnknownRequestError("unknown request", field="request_id")
            batch = DraftBatch.from_trees([DraftTree.empty(1) for _ in requests], {0: error})
            batch.raise_first_error()
        if self.action == "short":
            return []
        if self.action == "block":
            self.release.wait(5)
        return [DraftTree(1, (2,), (-1,), (0.5,)) for _ in requests]


REQS = [StepRequest("a", new_tokens=[1]), StepRequest("b", new_tokens=[1])]


def test_guard_failures_fall_back_warn_once_back_off_and_recover(caplog):
    drafter, clock = _Scripted(), _Clock()
    guard = DraftGuard(drafter, None, clock=clock, min_backoff=1.0, max_backoff=4.0)
    assert guard.run(REQS).ok
    drafter.action = "raise"
    with caplog.at_level(logging.INFO, logger="lookahead_client"):
        outcome = guard.run(REQS)
        assert outcome.batch is None and outcome.failed is None and "boom" in outcome.error
        assert not guard.ready  # backing off: steps are not sent
        clock.now += 1.0
        assert guard.ready and guard.run(REQS).batch is None
        clock.now += 1.0
        assert not guard.ready  # the backoff doubled
        clock.now += 1.0
        drafter.action = "ok"
        assert guard.ready and guard.run(REQS).ok
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING, logging.INFO]
    assert guard.stats()["outages"] == 1 and drafter.calls == 4


def test_guard_keeps_the_other_trees_when_one_request_is_refused():
    drafter = _Scripted()
    drafter.action = "refuse"
    outcome = DraftGuard(drafter, None).run(REQS)
    assert outcome.failed == frozenset({0}) and len(outcome.batch) == 2 and not outcome.ok


def test_guard_keeps_the_embedded_drafters_other_trees_when_one_request_is_refused():
    drafter = EmbeddedDrafter(vocab_size=100)
    requests = [
        StepRequest("a", prompt=[1, 2, 3, 1, 2], new_tokens=[3], budget=4),
        StepRequest("b", prompt=[1, 2], new_tokens=[100], budget=4),  # outside the vocabulary
    ]
    outcome = DraftGuard(drafter, None).run(requests)
    assert outcome.failed == frozenset({1}) and "InvalidArgumentError" in outcome.error
    assert len(outcome.batch) == 2 and outcome.batch.tree(0).tokens[:2] == (1, 2)
    assert len(outcome.batch.tree(1)) == 0


def test_guard_calls_a_wrappers_own_step():
    class Wrapper:  # instruments step, hands everything else to the drafter
        def __init__(self, drafter):
            self.drafter, self.calls = drafter, 0

        def step(self, requests, cost=None):
            self.calls += 1
            return self.drafter.step(requests, cost)

        def __getattr__(self, name):
            return getattr(self.drafter, name)

    wrapper = Wrapper(EmbeddedDrafter(vocab_size=100))
    outcome = DraftGuard(wrapper, None).run([StepRequest("a", prompt=[1, 2, 1], new_tokens=[2])])
    assert outcome.ok and wrapper.calls == 1


def test_guard_treats_a_wrong_number_of_trees_as_a_failure():
    drafter = _Scripted()
    drafter.action = "short"
    outcome = DraftGuard(drafter, None).run(REQS)
    assert outcome.batch is None and "0 trees for 2" in outcome.error


def test_guard_deadline_and_late_answer():
    drafter = _Scripted()
    drafter.action = "block"
    guard = DraftGuard(drafter, 0.01)
    outcome = guard.run(REQS, token="first")
    assert outcome.late and guard.busy and not guard.ready
    assert guard.collect() == []
    drafter.release.set()
    for _ in range(100):
        if not guard.busy:
            break
        threading.Event().wait(0.01)
    ((token, late),) = guard.collect()
    assert token == "first" and late.ok and guard.ready
    drafter.action = "ok"
    assert guard.run(REQS).ok and guard.stats()["late_steps"] == 1


# -- config and flags ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("timeout", 0),
        ("namespace", ""),
        ("target", " "),
        ("max_ngram", 0),
        # Refused by the core's own check (MAX_NGRAM_RANGE is 2..=64): a launcher used to
        # pass it and every scheduler process fail on it.
        ("max_ngram", 1),
        ("max_ngram", 65),
        ("max_ngram", "8"),
        ("min_score", 1.5),
        ("min_score", -0.1),
        ("memory_budget_bytes", 0),
        ("memory_budget_bytes", 1024),  # below the core's fixed tables
        ("memory_budget_bytes", -1),
        ("quiet_every", 0),
        ("quiet_every", True),
        ("quiet_every", 2.0),
    ],
)
def test_config_names_the_bad_field(field, value):
    with pytest.raises(InvalidArgumentError) as e:
        LookaheadConfig(**{field: value})
    assert e.value.field == field


def test_config_defaults_are_the_cores():
    from lookahead_client._native import drafter_defaults

    core = drafter_defaults()
    assert core["min_score"] == 0.02  # the f32's decimal form, not 0.0199999...
    config = LookaheadConfig()
    for name in ("memory_budget_bytes", "max_ngram", "min_score", "chain"):
        assert getattr(config, name) == core[name]
    assert EmbeddedDrafter().config == core


def test_config_round_trips_through_the_environment():
    config = LookaheadConfig(target="unix:///run/lookahead.sock", namespace="m", timeout=0.02)
    assert LookaheadConfig.from_env(ENV_VAR, {ENV_VAR: config.to_env()}) == config
    assert LookaheadConfig.from_env(ENV_VAR, {}) is None
    assert LookaheadConfig.from_env(ENV_VAR, {ENV_VAR: "{}"}) == LookaheadConfig()
    with pytest.raises(InvalidArgumentError) as e:
        LookaheadConfig.from_env(ENV_VAR, {ENV_VAR: '{"targte": "x"}'})
    assert e.value.field == "targte"


def test_plugin_stops_the_process_on_a_bad_config(monkeypatch):
    # SGLang's load_plugins() swallows a plugin's exceptions, but not SystemExit
    # (tests/sglang_engine checks the real engine refuses to start).
    from lookahead_client.sglang.plugin import register

    monkeypatch.setenv(ENV_VAR, '{"timeout": 0}')
    with pytest.raises(SystemExit, match=f"{ENV_VAR} is invalid: timeout must be > 0"):
        register()


def test_the_packages_drafters_are_called_inline_and_other_drafters_behind_a_deadline():
    class Embedded(EmbeddedDrafter):
        def step(self, requests, cost=None):
            self.thread = threading.current_thread()
            return super().step(requests, cost)

    config = LookaheadConfig(timeout=0.02)
    drafter = Embedded(vocab_size=1000)
    inline = guard_for(config, drafter)
    assert inline.deadline is None
    outcome = inline.run([StepRequest("r", prompt=[1, 2, 3], new_tokens=[4], budget=4)])
    assert outcome.ok
    assert drafter.thread is threading.current_thread()
    assert guard_for(config, _Scripted()).deadline == 0.02
    remote_config = LookaheadConfig(target="unix:///nowhere", timeout=0.02)
    assert guard_for(remote_config, _Scripted()).deadline == 0.02
    remote = remote_config.build_drafter(num_slots=8, vocab_size=1000)
    assert guard_for(remote_config, remote).deadline is None
    remote.close()


def test_a_remote_client_is_called_every_few_steps_while_quiet_and_others_every_step():
    remote_config = LookaheadConfig(target="unix:///nowhere", timeout=0.02)
    remote = remote_config.build_drafter(num_slots=8, vocab_size=1000)
    assert quiet_every_for(remote_config, remote) == REMOTE_QUIET_EVERY > 1
    assert quiet_every_for(LookaheadConfig(), EmbeddedDrafter()) == 1
    assert quiet_every_for(remote_config, _Scripted()) == 1
    every = LookaheadConfig(target="unix:///nowhere", quiet_every=1)
    assert quiet_every_for(every, remote) == 1  # the config's own value wins
    assert quiet_every_for(LookaheadConfig(quiet_every=3), EmbeddedDrafter()) == 3
    remote.close()


def test_an_inline_remote_client_on_a_silent_server_answers_empty_trees_by_its_deadline(
    tmp_path,
):
    # A socket that takes connections and never answers: a stuck server, not a dead one.
    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    config = LookaheadConfig(target=f"unix://{path}", timeout=0.05)
    drafter = RemoteDrafter(config.target, timeout=config.timeout, connect_timeout=0.2)
    guard = guard_for(config, drafter)
    requests = [StepRequest("a", prompt=[1, 2, 3], budget=4)]
    try:
        for expected_bound in (0.2, 0.05, 0.05):  # the first call connects
            t0 = time.monotonic()
            outcome = guard.run(requests)
            assert time.monotonic() - t0 < expected_bound + 0.5
            assert outcome.ok and all(len(tree) == 0 for tree in outcome.batch)
    finally:
        drafter.close()
        listener.close()


def test_config_builds_the_drafter_it_describes():
    drafter = LookaheadConfig(memory_budget_bytes=8 << 20).build_drafter(
        num_slots=100, vocab_size=1000
    )
    assert isinstance(drafter, EmbeddedDrafter) and drafter.config["max_budget"] == 99
    remote = LookaheadConfig(
        target="unix:///nowhere.sock", namespace="n", timeout=0.02
    ).build_drafter(num_slots=12, vocab_size=1000)
    assert isinstance(remote, RemoteDrafter)
    assert (remote.namespace, remote.timeout) == ("n", 0.02)
    # nothing listens on port 1: the member drafts meanwhile, and says where it joins
    member = LookaheadConfig(
        cluster="nats://127.0.0.1:1", cluster_name="c", replica="r0", namespace="n"
    ).build_drafter(num_slots=12, vocab_size=1000)
    assert isinstance(member, EmbeddedDrafter) and member.node_id == "r0"
    assert member.stats()["cluster_connected"] is False


def test_launcher_flags_are_split_from_sglang_flags():
    config, rest = split_argv(
        [
            "--model-path",
            "m",
            "--lookahead-chain",
            "--tp",
            "2",
            "--lookahead-namespace=llama",
            "--lookahead-max-ngram",
            "8",
        ]
    )
    assert config == LookaheadConfig(namespace="llama", max_ngram=8, chain=True)
    assert rest == ["--model-path", "m", "--tp", "2", "--speculative-algorithm", "NGRAM"]
    assert split_argv(["--lookahead-no-sizing"])[0] == LookaheadConfig(sizing=False)
    assert split_argv(["--lookahead-quiet-every", "1"])[0] == LookaheadConfig(quiet_every=1)
    joined = split_argv(["--lookahead-cluster", "nats://h:4222", "--lookahead-cluster-name", "c"])
    assert joined[0] == LookaheadConfig(cluster="nats://h:4222", cluster_name="c")
    with pytest.raises(InvalidArgumentError) as e:
        split_argv(["--lookahead-cluster", "nats://h:4222", "--lookahead-target", "unix:///s"])
    assert e.value.field == "cluster"
    _, rest = split_argv(["--speculative-algorithm=ngram", "--lookahead-t", "x"])
    assert rest == ["--speculative-algorithm=ngram", "--lookahead-t", "x"]  # no abbreviations
    with pytest.raises(InvalidArgumentError) as e:
        split_argv(["--speculative-algorithm", "EAGLE3"])
    assert e.value.field == "speculative_algorithm"
    with pytest.raises(InvalidArgumentError) as e:
        split_argv(["--lookahead-timeout", "-1"])
    assert e.value.field == "timeout"


def test_token_comes_from_a_file_and_stays_out_of_reprs(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    config, _ = split_argv(
        ["--lookahead-target", "unix:///x.sock", "--lookahead-token-file", str(path)]
    )
    assert config.token == "s3cret" and "s3cret" not in repr(config)
    assert config.build_drafter(num_slots=12, vocab_size=100).token == "s3cret"
    path.write_text("")
    with pytest.raises(InvalidArgumentError) as e:
        split_argv(["--lookahead-token-file", str(path)])
    assert e.value.field == "token_file"


# -- tensor parallelism: the first rank drafts, the others receive its arrays ----------------


def _tp_rank(rank: int, init_file: str, results) -> None:
    """One tensor-parallel rank: a corpus that drafts (rank 0) or receives (rank 1)."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from lookahead_client.sglang.corpus import DrafterCorpus, StepContext, broadcast_share

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    guard = DraftGuard(EmbeddedDrafter(memory_budget_bytes=8 << 20), 1.0) if rank == 0 else None
    corpus = DrafterCorpus(
        num_slots=6, guard=guard, vocab_size=1000, share=broadcast_share(rank, 0, dist.group.WORLD)
    )
    prompt = [5, 6, 7, 8, 9, 10, 11, 50, 51, 5, 6, 7]
    req = SimpleNamespace(rid="r", origin_input_ids_unpadded=prompt, output_ids=[])
    corpus.attach(StepContext([req], lambda: [], 6))
    tokens, mask = corpus.batch_get(["r"], [prompt[-4:]], [len(prompt)])
    results.put((rank, tokens.tolist(), mask.tolist()))
    dist.destroy_process_group()


def test_tensor_parallel_ranks_receive_the_first_ranks_drafts(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_tp_rank, args=(r, str(tmp_path / "init"), results)) for r in range(2)
    ]
    for p in procs:
        p.start()
    got = dict(
        (rank, (tokens, mask)) for rank, tokens, mask in (results.get(timeout=120) for _ in procs)
    )
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got[0] == got[1]
    assert got[0][0][:5] == [7, 8, 9, 10, 11]  # root, then the prompt's own continuation
