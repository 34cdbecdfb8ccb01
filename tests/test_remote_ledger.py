"""The remote client's request ledger without a server: what a step sends, and how answers,
lost requests and outages change what the next step sends."""

from __future__ import annotations

import logging

import pytest

from lookahead_client._proto.lookahead.v1 import lookahead_pb2 as pb
from lookahead_client.errors import InvalidArgumentError, UnknownRequestError
from lookahead_client.remote.fallback import Availability
from lookahead_client.remote.ledger import Ledger
from lookahead_client.types import DraftTree, StepRequest


def answer(
    message: pb.StepRequest,
    trees: dict[int, tuple[int, list[int]]] | None = None,
    errors: dict[int, int] | None = None,
) -> pb.StepResponse:
    """A server answer to ``message``: chain trees {index: (root, tokens)}, errors
    {index: code}; other requests get empty trees rooted at -1."""
    trees, errors = trees or {}, errors or {}
    response = pb.StepResponse(step_id=message.step_id)
    for i in range(len(message.requests)):
        root, tokens = trees.get(i, (-1, []))
        response.roots.append(root)
        response.sizes.append(len(tokens))
        response.tokens.extend(tokens)
        response.parents.extend(range(-1, len(tokens) - 1))
        response.scores.extend([0.5] * len(tokens))
        if i in errors:
            response.errors.add(index=i, code=errors[i], field="request_id", message="lost")
    return response


def started(ledger: Ledger, rid: str, prompt: list[int], group: str | None = None) -> None:
    plan = ledger.plan([StepRequest(rid, prompt=prompt, budget=0, group=group)], "ns", 1)
    assert plan.on_response(answer(plan.first_message())) is None
    plan.result()


def test_a_tracked_request_sends_only_its_new_tokens() -> None:
    ledger = Ledger()
    started(ledger, "a", [1, 2, 3])
    plan = ledger.plan([StepRequest("a", new_tokens=[4], budget=4, accepted_last=2)], "ns", 2)
    message = plan.first_message()
    item = message.requests[0]
    assert (message.namespace, message.step_id) == ("ns", 2)
    assert not item.HasField("prompt") and list(item.new_tokens) == [4]
    assert (item.budget, item.accepted_last, item.reset) == (4, 2, False)
    assert plan.on_response(answer(message, {0: (4, [5, 6])})) is None
    assert plan.result().trees() == [DraftTree(4, (5, 6), (-1, 0), (0.5, 0.5))]
    assert ledger.active["a"].tokens == [1, 2, 3, 4]


def test_a_lost_request_is_resent_within_the_step() -> None:
    ledger = Ledger()
    started(ledger, "a", [1, 2, 3])
    plan = ledger.plan([StepRequest("a", new_tokens=[4], budget=4)], "ns", 2)
    first = plan.first_message()
    again = plan.on_response(answer(first, errors={0: pb.ERROR_CODE_UNKNOWN_REQUEST}))
    assert again is not None
    item = again.requests[0]
    # restarted from its prompt, its output as new tokens (so it stays in its group)
    assert list(item.prompt.tokens) == [1, 2, 3] and item.reset
    assert list(item.new_tokens) == [4]
    assert plan.on_response(answer(again, {0: (4, [9])})) is None
    assert plan.result()[0].tokens == (9,)
    assert ledger.resyncs == 1 and ledger.active["a"].synced


def test_after_an_outage_steps_are_resent_at_their_offsets() -> None:
    ledger = Ledger()
    started(ledger, "a", [1, 2])
    plan = ledger.plan([StepRequest("a", new_tokens=[3], budget=4)], "ns", 2)
    assert plan.first_message().requests[0].offset == 2
    plan.on_unavailable()
    assert plan.result().trees() == [DraftTree.empty(3)]
    # The tokens of the failed step are kept; what the server holds is in doubt.
    plan = ledger.plan([StepRequest("a", new_tokens=[4], budget=4)], "ns", 3)
    plan.unavailable_without_trying()
    assert plan.result().trees() == [DraftTree.empty(4)]
    plan = ledger.plan([StepRequest("a", new_tokens=[5], budget=4)], "ns", 4)
    item = plan.first_message().requests[0]
    # No restart: the unconfirmed tokens go out again from the last offset the server is known
    # to hold (it skips those it applied after all).
    assert not item.reset and not item.HasField("prompt")
    assert item.offset == 2 and list(item.new_tokens) == [3, 4, 5]
    plan.on_response(answer(plan.first_message(), {0: (5, [])}))
    plan.result()
    assert ledger.active["a"].tokens == [1, 2, 3, 4, 5] and ledger.active["a"].held == 5
    assert ledger.resyncs == 0
    # A gap (the server holds less than the ledger thought) restarts the request at once.
    plan = ledger.plan([StepRequest("a", new_tokens=[6], budget=4)], "ns", 5)
    first = plan.first_message()
    gap = answer(first, errors={0: pb.ERROR_CODE_INVALID_ARGUMENT})
    gap.errors[0].field = "offset"
    again = plan.on_response(gap)
    assert again is not None
    item = again.requests[0]
    assert item.reset and list(item.prompt.tokens) == [1, 2]
    assert list(item.new_tokens) == [3, 4, 5, 6] and not item.HasField("offset")


def test_a_caller_that_sends_offsets_keeps_the_text_and_gets_the_loss_back() -> None:
    """The engines' book sends offsets and keeps each request's tokens: the ledger keeps only
    those the server has not confirmed, and a request the server lost is refused back to the
    caller (which starts it again from its own tokens) instead of re-sent from a copy."""
    ledger = Ledger()
    started(ledger, "a", [1, 2, 3])
    plan = ledger.plan([StepRequest("a", new_tokens=[4], budget=4, offset=3)], "ns", 2)
    plan.on_response(answer(plan.first_message(), {0: (4, [5])}))
    plan.result()
    tracked = ledger.active["a"]
    assert (tracked.tokens, tracked.held) == ([], 4)
    # An outage: the unconfirmed tokens stay until the server confirms them.
    plan = ledger.plan([StepRequest("a", new_tokens=[5], budget=4, offset=4)], "ns", 3)
    plan.first_message()
    plan.on_unavailable()
    assert (tracked.tokens, tracked.held) == ([5], 4)
    plan = ledger.plan([StepRequest("a", new_tokens=[6], budget=4, offset=5)], "ns", 4)
    item = plan.first_message().requests[0]
    assert item.offset == 4 and list(item.new_tokens) == [5, 6]
    plan.on_response(answer(plan.first_message(), {0: (6, [])}))
    plan.result()
    assert (tracked.tokens, tracked.held) == ([], 6)
    # Lost by the server: nothing to re-send it from, so the caller hears of it.
    plan = ledger.plan(
        [StepRequest("b", prompt=[7], budget=4), StepRequest("a", new_tokens=[7], offset=6)],
        "ns",
        5,
    )
    again = plan.on_response(
        answer(plan.first_message(), {0: (7, [8])}, errors={1: pb.ERROR_CODE_UNKNOWN_REQUEST})
    )
    assert again is None
    with pytest.raises(UnknownRequestError) as info:
        plan.result()
    assert info.value.index == 1 and list(info.value.batch.errors) == [1]
    assert info.value.batch[0].tokens == (8,)
    assert "a" not in ledger.active and ledger.resyncs == 0


def test_a_start_in_doubt_is_restarted_with_reset() -> None:
    ledger = Ledger()
    plan = ledger.plan([StepRequest("a", prompt=[1, 2], new_tokens=[3], budget=4)], "ns", 1)
    plan.first_message()
    plan.on_unavailable()
    plan = ledger.plan([StepRequest("a", new_tokens=[4], budget=4)], "ns", 2)
    item = plan.first_message().requests[0]
    assert item.reset and list(item.prompt.tokens) == [1, 2]
    assert list(item.new_tokens) == [3, 4]


def test_a_resent_request_keeps_its_group() -> None:
    ledger = Ledger()
    started(ledger, "a", [1, 2], group="rollout-3")
    assert (
        ledger.plan([StepRequest("b", prompt=[1], group="g")], "ns", 2)
        .first_message()
        .requests[0]
        .group
        == "g"
    )
    plan = ledger.plan([StepRequest("a", new_tokens=[3], budget=4)], "ns", 3)
    first = plan.first_message()
    assert first.requests[0].group == "", "the group is sent with the prompt only"
    again = plan.on_response(answer(first, errors={0: pb.ERROR_CODE_UNKNOWN_REQUEST}))
    assert again is not None and again.requests[0].group == "rollout-3"


def test_finishes_lost_in_an_outage_are_owed_and_sent_later() -> None:
    ledger = Ledger()
    started(ledger, "a", [1, 2])
    started(ledger, "b", [7])
    plan = ledger.plan([StepRequest("a", budget=0, finished=True)], "ns", 2)
    plan.first_message()
    plan.on_unavailable()
    assert "a" not in ledger.active and list(ledger.pending_ends) == ["a"]
    plan = ledger.plan([StepRequest("b", new_tokens=[8], budget=2)], "ns", 3)
    message = plan.first_message()
    assert [(r.request_id, r.finished) for r in message.requests] == [("b", False), ("a", True)]
    plan.on_response(answer(message, errors={1: pb.ERROR_CODE_UNKNOWN_REQUEST}))
    assert len(plan.result()) == 1 and not ledger.pending_ends
    # Restarting an id whose finish is owed replaces whatever the server holds.
    ledger.owe_end("c")
    plan = ledger.plan([StepRequest("c", prompt=[1], budget=0)], "ns", 4)
    assert plan.first_message().requests[0].reset


def test_refusals_raise_after_the_whole_step() -> None:
    ledger = Ledger()
    started(ledger, "a", [1])
    plan = ledger.plan(
        [
            StepRequest("a", new_tokens=[2], budget=4),
            StepRequest("ghost", new_tokens=[2], budget=4),
        ],
        "ns",
        2,
    )
    plan.on_response(
        answer(plan.first_message(), {0: (2, [3])}, errors={1: pb.ERROR_CODE_UNKNOWN_REQUEST})
    )
    with pytest.raises(UnknownRequestError) as info:
        plan.result()
    assert info.value.index == 1 and info.value.batch[0].tokens == (3,)
    assert ledger.active["a"].tokens == [1, 2]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (StepRequest("a", new_tokens=[2**63]), "new_tokens"),
        (StepRequest("a", new_tokens=["x"]), "new_tokens"),  # type: ignore[list-item]
        (StepRequest("a", prompt=[-(2**64)]), "prompt"),
        (StepRequest("a", budget=2**31), "budget"),
    ],
)
def test_values_that_cannot_travel_are_refused_naming_the_field(
    request_: StepRequest, field: str
) -> None:
    plan = Ledger().plan([request_], "ns", 1)
    with pytest.raises(InvalidArgumentError) as info:
        plan.first_message()
    assert info.value.field == field


def test_a_malformed_answer_counts_as_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger()
    started(ledger, "a", [1])
    plan = ledger.plan([StepRequest("a", new_tokens=[2], budget=4)], "ns", 2)
    plan.first_message()
    with caplog.at_level(logging.ERROR):
        assert plan.on_response(pb.StepResponse(roots=[1, 2], sizes=[0, 0])) is None
    assert plan.result().trees() == [DraftTree.empty(2)]
    # in doubt: the server is known to hold only the prompt; the step goes out again
    assert ledger.active["a"].held == 1 and ledger.active["a"].tokens == [1, 2]
    assert "does not describe" in caplog.text


def test_availability_backs_off_and_logs_transitions_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    a = Availability("t", min_backoff=0.1, max_backoff=0.4, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="lookahead_client.remote"):
        a.failed("refused")
        assert not a.should_try()
        now[0] = 0.1
        assert a.should_try()
        a.failed("refused")  # backoff doubles: 0.2
        now[0] = 0.25
        assert not a.should_try()
        a.failed("refused")  # 0.4, the maximum
        a.failed("refused")
        now[0] = 0.25 + 0.39
        assert not a.should_try()
        a.succeeded()
        a.succeeded()
    assert a.up and a.outages == 1 and a.fallback_steps == 4
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_the_batch_carries_what_the_server_says_it_holds_only_when_it_said_it_for_all() -> None:
    ledger = Ledger()
    started(ledger, "a", [1, 2, 3])
    plan = ledger.plan(
        [StepRequest("a", new_tokens=[4], offset=3), StepRequest("b", prompt=[5, 6])], "ns", 2
    )
    response = answer(plan.first_message(), {0: (4, [5])})
    response.held.extend([4, 2])
    plan.on_response(response)
    assert plan.result().held.tolist() == [4, 2]
    # A refused request holds 0; the others keep the server's count.
    plan = ledger.plan(
        [StepRequest("a", new_tokens=[5]), StepRequest("x", new_tokens=[1])], "ns", 3
    )
    response = answer(plan.first_message(), errors={1: pb.ERROR_CODE_INVALID_ARGUMENT})
    response.held.extend([5, 0])
    plan.on_response(response)
    with pytest.raises(InvalidArgumentError) as info:
        plan.result()
    assert info.value.batch.held.tolist() == [5, 0]
    # Unanswered (the server was unreachable): nothing is known.
    plan = ledger.plan([StepRequest("a", new_tokens=[6])], "ns", 4)
    plan.unavailable_without_trying()
    assert plan.result().held is None
