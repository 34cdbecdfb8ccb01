"""The engine drafting loop (`engine/session.py`) that SGLang's corpus and vLLM's drafting share,
driven with the real embedded drafter."""

from __future__ import annotations

import logging
import threading
import time

from lookahead_client import EmbeddedDrafter
from lookahead_client.engine.book import QUIET_AFTER, RequestBook, RequestView
from lookahead_client.engine.guard import DraftGuard
from lookahead_client.engine.session import DraftSession
from lookahead_client.processes.server import ServerProcess
from lookahead_client.remote import RemoteDrafter
from lookahead_client.types import DraftShape, EngineCost

LOG = logging.getLogger("test_engine_session")
PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]


def session(drafter, deadline: float | None = None) -> DraftSession:
    return DraftSession(DraftGuard(drafter, deadline), RequestBook(budget=4), LOG)


def test_a_step_drafts_and_the_next_one_checks_the_expectation():
    s = session(EmbeddedDrafter())
    assert s.begin()
    drafts = s.draft([RequestView("r", PROMPT, [8])])
    assert drafts is not None
    index = drafts.tree_of(0)
    tree = drafts.batch.tree(index)
    assert list(tree.tokens[:3]) == [5, 6, 7]  # the prompt's loop, continued
    s.fed(drafts, 0, 2, sum(tree.scores[:2]))
    # the engine accepted both fed tokens: the next step sends them and a bonus token
    assert s.begin()
    s.draft([RequestView("r", PROMPT, [8, 5, 6, 7])])
    stats = s.stats()
    assert stats["steps"] == 2 and stats["tracked_requests"] == 1
    assert stats["accepted_drafts"] == 2
    assert 0 < stats["expected_drafts"] <= 2


def test_a_tree_on_the_wrong_root_starts_the_request_again():
    s = session(EmbeddedDrafter())
    s.begin()
    drafts = s.draft([RequestView("r", PROMPT, [8])])
    assert drafts is not None
    s.refused("r", "root", "root 3 is not the request's last token 8")
    assert s.book.resyncs == 1 and "r" not in s.book
    s.refused("r", "vocab", "token 99999 out of range")  # logged only
    assert s.book.resyncs == 1
    assert s.stats()["problems_root"] == 1 and s.stats()["problems_vocab"] == 1


class Sleepy:
    """The embedded drafter, held up until released."""

    sizes_drafts = True

    def __init__(self) -> None:
        self.inner = EmbeddedDrafter()
        self.release = threading.Event()

    def step(self, requests, cost=None):
        self.release.wait(10)
        return self.inner.step(requests, cost)


def test_a_late_answer_gives_no_drafts_and_is_committed_later():
    drafter = Sleepy()
    s = session(drafter, deadline=0.01)
    assert s.begin()
    assert s.draft([RequestView("r", PROMPT, [8])]) is None  # past the deadline
    assert not s.begin()  # still busy: this step decodes plainly
    drafter.release.set()
    _wait_idle(s)
    assert s.begin()  # the late answer is committed: the book holds the request
    assert "r" in s.book
    assert s.stats()["steps"] == 3


def _wait_idle(s: DraftSession) -> None:
    """Waits (at most 5 s) for the guard's late call to end."""
    for _ in range(500):
        if not s.guard.busy:
            return
        threading.Event().wait(0.01)
    raise AssertionError("the late call never ended")


def test_steps_say_where_their_tokens_start_and_a_drafter_that_holds_otherwise_restarts_them():
    book = RequestBook(budget=4)
    first = book.plan([RequestView("r", PROMPT, [8])])
    assert first.requests[0].prompt is not None and first.requests[0].offset is None
    book.commit(first, frozenset(), held=[len(PROMPT) + 1])
    second = book.plan([RequestView("r", PROMPT, [8, 5])])
    (step,) = second.requests
    assert step.offset == len(PROMPT) + 1 and list(step.new_tokens) == [5]
    # the drafter says it holds one token less than was sent: its copy is wrong
    book.commit(second, frozenset(), held=[len(PROMPT) + 1])
    assert "r" not in book and book.owed_ends == 1
    third = book.plan([RequestView("r", PROMPT, [8, 5, 6])])
    assert third.requests[-1].prompt is not None  # started again from its whole history


def test_the_embedded_drafter_refuses_a_step_that_skips_tokens():
    s = session(EmbeddedDrafter())
    s.begin()
    s.draft([RequestView("r", PROMPT, [8])])
    s.book._tracked["r"].sent += 1  # the book's count goes wrong (a bug elsewhere)
    s.begin()
    assert s.draft([RequestView("r", PROMPT, [8, 5, 6])]) is not None
    assert "r" not in s.book  # refused by offset, so started again next step
    s.begin()
    drafts = s.draft([RequestView("r", PROMPT, [8, 5, 6])])
    assert drafts is not None and drafts.tree_of(0) >= 0 and "r" in s.book


def test_through_a_server_that_restarts_the_book_starts_lost_requests_again():
    """The book sends offsets and keeps the text: the remote client keeps no copy of it, and
    a request the restarted server lost comes back to the book as a refusal, which starts it
    again from the engine's tokens; drafting goes on."""
    with ServerProcess() as server:
        drafter = RemoteDrafter(server.unix_target, namespace="session", timeout=5.0)
        s = session(drafter)
        output = [8]
        for _ in range(3):
            assert s.begin()
            assert s.draft([RequestView("r", PROMPT, output)]) is not None
            output = output + [5]
        (tracked,) = drafter._ledger.active.values()
        assert tracked.tokens == [] and tracked.held == len(PROMPT) + 3  # no copy kept
        server.restart()
        s.begin()
        drafts = s.draft([RequestView("r", PROMPT, output)])
        assert drafts is not None and drafts.tree_of(0) < 0  # refused: undrafted this step
        assert s.book.resyncs == 1 and "r" not in s.book
        output = output + [6]
        s.begin()
        drafts = s.draft([RequestView("r", PROMPT, output)])
        assert drafts is not None and drafts.tree_of(0) >= 0 and "r" in s.book
        assert len(drafts.batch.tree(drafts.tree_of(0))) > 0  # drafted from the prompt again
        drafter.close()


def test_the_expectation_is_also_kept_as_sizing_weighed_it():
    """With a cost, each tree's expected tokens also count at the weight the drafter's
    sizing gave them (the request's measured acceptance at that step)."""
    s = DraftSession(
        DraftGuard(EmbeddedDrafter(), None), RequestBook(4, DraftShape.SIZED_TREE), LOG
    )
    flat = EngineCost((1,), (1.0,))  # every token costs nothing: trees stay whole
    output = [8]
    expected = weighted = 0.0
    for step in range(6):
        assert s.begin()
        view = RequestView("r", PROMPT, output)
        drafts = s.draft([view], flat)
        assert drafts is not None
        weight = drafts.plan.acceptance  # the request's record, read as the step was planned
        assert weight == s.book.acceptance_of([view])
        tree = drafts.batch.tree(drafts.tree_of(0))
        score = float(tree.scores[0])
        s.fed(drafts, 0, 1, score)
        output.append(99)  # never the drafted token: nothing accepted
        if step < 5:  # the last tree's outcome is read by a step not taken
            expected, weighted = expected + score, weighted + score * weight
    stats = s.stats()
    assert stats["accepted_drafts"] == 0
    assert stats["expected_drafts"] == round(expected, 2)
    assert stats["weighted_expected_drafts"] == round(weighted, 2) < round(expected, 2)


class Counting:
    """The embedded drafter, counting its steps."""

    sizes_drafts = True

    def __init__(self) -> None:
        self.inner = EmbeddedDrafter()
        self.calls = 0

    def step(self, requests, cost=None):
        self.calls += 1
        return self.inner.step(requests, cost)


def _engine_step(
    s: DraftSession, views: list[RequestView], depth: int = 0, cost: EngineCost | None = None
) -> bool:
    """One engine step that verifies at most ``depth`` tokens of each tree; True when the
    drafter was called (the step has drafts)."""
    assert s.begin()
    drafts = s.draft(views, cost)
    if drafts is None:
        return False
    for j in range(len(views)):
        index = drafts.tree_of(j)
        s.fed(drafts, j, -1 if index < 0 else min(depth, len(drafts.batch.tree(index))))
    return True


def test_a_quiet_batch_calls_the_drafter_every_few_steps_and_sends_it_every_token():
    """A request none of whose last QUIET_AFTER outcomes accepted a draft token, and that
    has no draft to verify, is quiet: the drafter is called every ``quiet_every``-th step
    with the tokens of the steps between. A new request, a draft to verify, or an accepted
    token ends it."""
    drafter = Counting()
    s = DraftSession(DraftGuard(drafter, None), RequestBook(budget=4), LOG, quiet_every=4)
    output = [8]

    def grow() -> list[RequestView]:
        output.append(100 + len(output))  # never drafted: nothing is accepted
        return [RequestView("r", PROMPT, list(output))]

    # the start, then QUIET_AFTER outcomes that accepted nothing
    called = [_engine_step(s, grow()) for _ in range(1 + QUIET_AFTER)]
    assert all(called) and s.book.quiet([RequestView("r", PROMPT, output)])
    called = [_engine_step(s, grow()) for _ in range(8)]
    assert called == [False, False, False, True] * 2
    assert s.stats()["quiet_steps"] == 6 and drafter.calls == 1 + QUIET_AFTER + 2
    # every token reached the drafter (a drafter holding otherwise restarts the request)
    assert s.book.resyncs == 0 and s.book.needs_from("r") == len(PROMPT) + len(output)

    # a new request in the batch is drafted at once
    assert _engine_step(s, [*grow(), RequestView("new", PROMPT, [8])])
    s.book.forget("new")
    assert [_engine_step(s, grow()) for _ in range(4)] == [False, False, False, True]
    # a tree to verify: the next step calls, to read its outcome
    s.book._tracked["r"].fed_depth = 2
    assert _engine_step(s, grow())


def test_an_accepted_draft_token_ends_the_quiet():
    drafter = Counting()
    s = DraftSession(DraftGuard(drafter, None), RequestBook(budget=4), LOG, quiet_every=4)
    output = [8]
    for _ in range(1 + QUIET_AFTER):  # quiet, as above
        output.append(100 + len(output))
        _engine_step(s, [RequestView("r", PROMPT, list(output))])
    assert s.book.quiet([RequestView("r", PROMPT, output)])
    # the engine verifies a one-token draft and accepts it: the prompt's loop, 5 after 8
    s.book._tracked["r"].fed_depth = 1
    output += [5, 6]
    assert _engine_step(s, [RequestView("r", PROMPT, list(output))])
    assert s.book._tracked["r"].barren == 0
    assert not s.book.quiet([RequestView("r", PROMPT, output)])
    # a token accepted of a quiet request's tree: what calls on quiet steps are worth
    assert s.book.quiet_accepted == 1 and s.book.quiet_draws >= 1
    assert s.stats()["quiet_accepted"] == 1


class Slow(Counting):
    """The embedded drafter, counting its steps, each of which takes ``seconds`` at least."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def step(self, requests, cost=None):
        time.sleep(self.seconds)
        return super().step(requests, cost)


def _quiet_steps_called(s: DraftSession, steps: int, cost: EngineCost) -> list[bool]:
    """Whether each of ``steps`` engine steps called the drafter, after the request went
    quiet (never a token accepted)."""
    output = [8]

    def grow() -> list[RequestView]:
        output.append(100 + len(output))
        return [RequestView("r", PROMPT, list(output))]

    for _ in range(1 + QUIET_AFTER):
        assert _engine_step(s, grow(), cost=cost)
    assert s.book.quiet(grow())
    return [_engine_step(s, grow(), cost=cost) for _ in range(steps)]


def test_a_quiet_step_calls_a_drafter_worth_its_time():
    """With a cost curve, a quiet step is skipped only while the drafter's measured call
    costs more than what quiet requests' trees have been accepting is worth (a token's
    share of the plain step): a call in microseconds against a second's step is always
    made."""
    s = DraftSession(DraftGuard(Counting(), None), RequestBook(budget=4), LOG, quiet_every=4)
    called = _quiet_steps_called(s, 8, EngineCost((1, 2), (1.0, 1.01)))
    assert called == [True] * 8 and s.stats()["quiet_steps"] == 0
    assert s.book.quiet_draws >= 8 and s.book.quiet_accepted == 0
    assert s.call_seconds is not None and 0 < s.call_seconds < 0.5


def test_quiet_steps_are_skipped_once_barren_trees_make_a_call_not_worth_its_time():
    """A 10 ms call against a 1 s step: worth it while the quiet requests' record is short
    (the prior: one token accepted in one tree), then, as their trees keep being barren,
    not: from there every ``quiet_every``-th step calls. A step as short as the call skips
    from the start."""
    s = DraftSession(DraftGuard(Slow(0.01), None), RequestBook(budget=4), LOG, quiet_every=4)
    called = _quiet_steps_called(s, 150, EngineCost((1, 2), (1.0, 1.01)))
    first_skip = called.index(False)
    assert 5 < first_skip < 120  # the yield falls below 1 / 100 after ~100 barren trees
    assert called[first_skip : first_skip + 8] == [False, False, False, True] * 2
    short = DraftSession(DraftGuard(Slow(0.01), None), RequestBook(budget=4), LOG, quiet_every=4)
    called = _quiet_steps_called(short, 8, EngineCost((1, 2), (0.001, 0.0011)))
    assert called == [False, False, False, True] * 2
