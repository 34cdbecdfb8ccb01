"""Which tokens of each engine request the drafter already has, and what to send it next.

Engines show their drafters a request's last few tokens (SGLang's NGRAM corpus) or a row of
a token table (vLLM's proposers). The drafter gets the whole request instead: the prompt the
first time the request is drafted, then each step the tokens appended since (accepted drafts,
the model's own token, and under SGLang's overlap scheduler the not-yet-committed tokens it
splices in), the previous step's accepted count, and a finish when the request leaves.

A request's tokens are seen as three pieces (:class:`RequestView`): the prompt
(``origin_input_ids_unpadded``), the committed outputs (``output_ids``) and the spliced tail.
The book remembers how many tokens the drafter holds (``sent``) and sends the rest. When the
drafter's copy is in doubt (a failed step, tokens that do not line up), the request is started
again under a fresh drafter id with everything known, and the old id is finished.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lookahead_client.types import DraftShape, StepRequest

if TYPE_CHECKING:
    import numpy as np

    #: A piece of a request's tokens: a list, or the engine's own array.
    Tokens = Sequence[int] | np.ndarray

__all__ = ["RequestView", "StepPlan", "RequestBook"]

# After this many consecutive failed steps a request is no longer drafted (root-only trees).
_MAX_FAILURES = 2
# The most finishes kept for a drafter that keeps failing (the oldest are dropped).
_MAX_OWED_ENDS = 4096
# The recent acceptance (RequestBook.acceptance): each fed tree's outcome is weighed down by
# this per tree after it (about the last 100 trees count), from a prior of a few expected
# tokens all accepted; never below the floor, which would take every draft away for good.
_ACCEPTANCE_MEMORY = 0.99
_ACCEPTANCE_PRIOR = 4.0
_ACCEPTANCE_FLOOR = 0.05
# A request is quiet (see RequestBook.quiet) after this many outcomes in a row that accepted
# no draft token: at temperature 1, drafts of a small model's samples are rarely accepted.
QUIET_AFTER = 8


def _floored_ratio(accepted: float, expected: float) -> float:
    """Accepted over expected draft tokens, never below the acceptance floor."""
    return max(accepted / expected, _ACCEPTANCE_FLOOR)


def _ints(piece: Tokens) -> list[int]:
    """A piece of a request as Python ints (vLLM's pieces are numpy rows)."""
    tolist = getattr(piece, "tolist", None)
    return tolist() if tolist is not None else list(piece)


class RequestView:
    """The tokens of one request at one step: ``prompt + output + spliced``.

    The pieces may be lists or numpy arrays, and may be the engine's live sequences (SGLang
    appends to ``output_ids`` in place, vLLM to its token table); the view covers the first
    :attr:`total` tokens, counted when it is made.

    A *tail* view (``start > 0``) holds only the tokens from position ``start`` on (its
    ``prompt`` piece is empty): enough to feed a request the drafter holds up to ``start`` or
    later, never to start one (the book leaves such a request undrafted for the step).
    """

    __slots__ = ("rid", "prompt", "output", "spliced", "total", "temperature", "start", "_lens")

    def __init__(
        self,
        rid: str,
        prompt: Tokens,
        output: Tokens,
        spliced: Tokens = (),
        temperature: float = 0.0,
        start: int = 0,
    ) -> None:
        if start > 0 and len(prompt) > 0:
            raise ValueError("a tail view (start > 0) has no prompt piece")
        self.rid = rid
        #: The request's sampling temperature (0: greedy).
        self.temperature = temperature
        self.prompt = prompt
        self.output = output
        self.spliced = spliced
        #: The position of the view's first token (0: the whole request).
        self.start = start
        self._lens = (len(prompt), len(output), len(spliced))
        #: The number of tokens known when the view was made.
        self.total = start + sum(self._lens)

    def tokens_from(self, start: int) -> list[int]:
        """The tokens at positions ``start..total`` (only those are copied).

        Raises:
            ValueError: ``start`` is before the view's first token.
        """
        if start < self.start:
            raise ValueError(f"the view of {self.rid!r} starts at {self.start}, not {start}")
        out: list[int] = []
        offset = self.start
        for piece, n in zip((self.prompt, self.output, self.spliced), self._lens, strict=True):
            if start < offset + n:
                out.extend(_ints(piece[max(start - offset, 0) : n]))
            offset += n
        return out

    def generated(self) -> list[int]:
        """Everything after the prompt."""
        return self.tokens_from(self._lens[0])

    def __repr__(self) -> str:
        return f"RequestView({self.rid!r}, total={self.total})"


@dataclass(slots=True)
class _Tracked:
    drafter_id: str
    sent: int  # tokens of the request the drafter holds (prompt included)
    fed_depth: int = -1  # depth of the drafter's tree the engine got last; -1: none / fallback
    fed_step: int = -1  # the step that tree was fed in
    fed_expected: float = 0.0  # the sum of that tree's scores (its expected accepted length)
    fed_weight: float = 1.0  # the acceptance weight the drafter's sizing gave those scores
    # over the request's fed trees whose outcome is known: draft tokens accepted, and expected
    accepted: int = 0
    expected: float = 0.0
    # known outcomes in a row that accepted no draft token (reset by one that did)
    barren: int = 0


@dataclass(slots=True)
class StepPlan:
    """The drafter requests of one step and what is needed to commit their outcome.

    ``requests`` holds first the finishes owed (``ends`` of them), then one entry per drafted
    request; ``live[i]`` is the index in ``requests`` of the ``i``-th view's entry (-1: that
    request is not drafted).
    """

    step: int
    views: list[RequestView]
    requests: list[StepRequest] = field(default_factory=list)
    ends: int = 0
    live: list[int] = field(default_factory=list)
    starts: set[int] = field(default_factory=set)
    #: The weight the drafter's sizing gave this step's scores (see
    #: :meth:`RequestBook.acceptance_of`; 1: none).
    acceptance: float = 1.0


class RequestBook:
    """The per-request state of one scheduler process's drafter client.

    Only one plan is outstanding at a time (:meth:`plan`, then :meth:`commit` once its outcome
    is known); :meth:`forget` may be called in between.

    Args:
        budget: the draft nodes asked for each request (SGLang's slots minus the root, or
            vLLM's speculative tokens).
        shape: the shape asked for every request (vLLM: a chain, sized by default).
    """

    def __init__(self, budget: int, shape: DraftShape = DraftShape.TREE) -> None:
        self.budget = budget
        self.shape = shape
        self._tracked: dict[str, _Tracked] = {}
        self._failures: dict[str, int] = {}
        self._disabled: set[str] = set()
        self._owed_ends: list[str] = []
        # Requests that left while the last plan was outstanding.
        self._gone: set[str] = set()
        self._steps = itertools.count()
        # Drafter ids are unique to this process, so that engines sharing one server never
        # collide even when clients choose their own request ids.
        self._prefix = uuid.uuid4().hex[:8]
        self._generation = itertools.count(1)
        #: Requests started again after their drafter state was in doubt.
        self.resyncs = 0
        #: Over the fed trees whose outcome is known: draft tokens the engine accepted, and what
        #: the drafter's scores expected (the sum of the trees' scores; the drafter's
        #: calibration is good when the two agree), and that sum weighed as the sizing weighed
        #: it (the odds the drafts were cut on: they were right when it agrees too).
        self.accepted_drafts = 0
        self.expected_drafts = 0.0
        self.weighted_expected_drafts = 0.0
        self._recent = [_ACCEPTANCE_PRIOR, _ACCEPTANCE_PRIOR]  # accepted, expected
        #: Trees fed to quiet requests (:meth:`quiet`, empty ones included), and the draft
        #: tokens the engine accepted of them: what a drafter call gives a quiet request.
        self.quiet_draws = 0
        self.quiet_accepted = 0

    @property
    def acceptance(self) -> float:
        """Accepted over expected draft tokens of the recently fed trees (recent ones weigh
        most; 1 before any outcome): how far the drafter's scores hold for this engine."""
        return _floored_ratio(*self._recent)

    def acceptance_of(self, views: Sequence[RequestView]) -> float:
        """Accepted over expected draft tokens of these requests' own fed trees, from a prior
        of a few expected tokens at the engine's :attr:`acceptance` (so a new request starts
        from the engine's record and soon has its own). The engines hand it to the drafter's
        sizing with the step's cost (:attr:`~lookahead_client.types.EngineCost.acceptance`):
        a chat request is weighed by how its own drafts fare, not by the code before it."""
        accepted, expected = _ACCEPTANCE_PRIOR * self.acceptance, _ACCEPTANCE_PRIOR
        tracked = self._tracked
        for view in views:
            t = tracked.get(view.rid)
            if t is not None:
                accepted += t.accepted
                expected += t.expected
        return _floored_ratio(accepted, expected)

    @property
    def quiet_yield(self) -> float:
        """Draft tokens accepted per tree fed to a quiet request, from a prior of one
        accepted token in one tree (so an engine calls the drafter on quiet steps until its
        own record says they give little): what a drafter call on a quiet step is worth, in
        tokens per request (:class:`~lookahead_client.engine.session.DraftSession`)."""
        return (self.quiet_accepted + 1) / (self.quiet_draws + 1)

    def __len__(self) -> int:
        return len(self._tracked)

    def __contains__(self, rid: str) -> bool:
        return rid in self._tracked

    def needs_from(self, rid: str) -> int | None:
        """The position from which the next :meth:`plan` needs ``rid``'s tokens: the tokens
        the drafter holds (prompt included), 0 when it holds none (the request starts from its
        whole history), None when ``rid`` is no longer drafted."""
        if rid in self._disabled:
            return None
        t = self._tracked.get(rid)
        return 0 if t is None else t.sent

    def quiet(self, views: Sequence[RequestView]) -> bool:
        """True when a drafter step over ``views`` can wait without losing anything it
        could teach or be taught: every request is known to the drafter, got no draft to
        verify last time (so no outcome is owed), and none of its last :data:`QUIET_AFTER`
        outcomes accepted a draft token (or it is no longer drafted). New requests are
        never quiet: they are drafted at once."""
        tracked = self._tracked
        for view in views:
            if view.rid in self._disabled:
                continue
            t = tracked.get(view.rid)
            if t is None or t.fed_depth > 0 or t.barren < QUIET_AFTER:
                return False
        return True

    def pass_step(self) -> None:
        """An engine step went by without a drafter step (:meth:`quiet`): its tokens go
        with the next plan, and the outcome of the tree fed before it is not read."""
        next(self._steps)

    @property
    def disabled(self) -> int:
        """Requests no longer drafted because the drafter kept refusing them."""
        return len(self._disabled)

    @property
    def owed_ends(self) -> int:
        """Finishes waiting for the next step."""
        return len(self._owed_ends)

    def _new_id(self, rid: str) -> str:
        return f"{self._prefix}:{rid}:{next(self._generation)}"

    # -- planning ---------------------------------------------------------------------------

    def plan(self, views: Sequence[RequestView]) -> StepPlan:
        """The drafter requests for one step over ``views`` (one per request of the batch)."""
        plan = StepPlan(step=next(self._steps), views=list(views))
        self._gone.clear()
        plan.requests = [StepRequest(i, budget=0, finished=True) for i in self._owed_ends]
        plan.ends = len(self._owed_ends)
        self._owed_ends = []
        for i, view in enumerate(plan.views):
            if view.rid in self._disabled:
                plan.live.append(-1)
                continue
            t = self._tracked.get(view.rid)
            if t is not None and t.sent > view.total:
                self.resync(view.rid)  # fewer tokens than the drafter holds: our copy is wrong
                t = None
            if view.start > (0 if t is None else t.sent):
                plan.live.append(-1)  # a tail that cannot start it, or misses tokens: next step
                continue
            plan.live.append(len(plan.requests))
            if t is None:
                plan.starts.add(i)
                plan.requests.append(
                    StepRequest(
                        self._new_id(view.rid),
                        new_tokens=view.generated(),
                        budget=self.budget,
                        prompt=_ints(view.prompt),
                        shape=self.shape,
                        temperature=view.temperature,
                    )
                )
                continue
            new = view.tokens_from(t.sent)
            accepted = len(new) - 1
            if t.fed_step != plan.step - 1 or not 0 <= accepted <= t.fed_depth:
                accepted = -1
            else:
                self.accepted_drafts += accepted
                self.expected_drafts += t.fed_expected
                self.weighted_expected_drafts += t.fed_expected * t.fed_weight
                t.accepted += accepted
                t.expected += t.fed_expected
                if t.barren >= QUIET_AFTER:
                    self.quiet_accepted += accepted
                t.barren = 0 if accepted > 0 else t.barren + 1
                if t.fed_expected > 0:
                    recent = self._recent
                    recent[0] = _ACCEPTANCE_MEMORY * recent[0] + accepted
                    recent[1] = _ACCEPTANCE_MEMORY * recent[1] + t.fed_expected
            plan.requests.append(
                StepRequest(
                    t.drafter_id,
                    new_tokens=new,
                    budget=self.budget,
                    accepted_last=accepted,
                    shape=self.shape,
                    temperature=view.temperature,
                    offset=t.sent,  # a drafter holding other than that refuses the step
                )
            )
        return plan

    # -- outcomes ---------------------------------------------------------------------------

    def commit(
        self, plan: StepPlan, failed: frozenset[int] | None, held: Sequence[int] | None = None
    ) -> None:
        """Records what the drafter holds after ``plan`` ran.

        A request the drafter refused on its own (an index in ``failed``) is started again;
        refused again, it is no longer drafted. When the whole step failed (``failed`` is
        None: the drafter crashed or was cut off) every request is started again and the
        finishes are sent again, without counting against the requests. A request the drafter
        says it holds other than all that was sent (``held``) is started again too.

        Args:
            plan: the step.
            failed: indices into ``plan.requests`` whose drafter state is in doubt (None: all).
            held: per request of ``plan``, the tokens the drafter holds after the step, when
                it says (:attr:`~lookahead_client.types.DraftBatch.held`).
        """
        whole = failed is None
        if whole:
            self._owed_ends[:0] = [r.request_id for r in plan.requests[: plan.ends]]
            del self._owed_ends[: max(0, len(self._owed_ends) - _MAX_OWED_ENDS)]
        for i, view in enumerate(plan.views):
            index = plan.live[i]
            if index < 0:
                continue
            rid, request = view.rid, plan.requests[index]
            bad = failed is None or index in failed
            # the drafter holds other than all that was sent: its copy is wrong
            differs = not bad and held is not None and int(held[index]) != view.total
            if i in plan.starts:
                if bad or rid in self._gone:
                    self._owed_ends.append(request.request_id)  # it may hold part of it
                    if bad and not whole:
                        self._failed(rid)
                    continue
                if differs:
                    self._owed_ends.append(request.request_id)
                    self._failed(rid)  # counted: a drafter that keeps differing stops it
                    continue
                self._tracked[rid] = _Tracked(request.request_id, view.total)
            else:
                t = self._tracked.get(rid)
                if t is None or t.drafter_id != request.request_id:
                    continue  # it left (or was restarted) while the step ran
                if bad:
                    if whole:
                        self.resync(rid)
                    else:
                        self._failed(rid)
                    continue
                if differs:
                    self._failed(rid)
                    continue
                t.sent = view.total
            self._failures.pop(rid, None)

    def _failed(self, rid: str) -> None:
        n = self._failures[rid] = self._failures.get(rid, 0) + 1
        if n >= _MAX_FAILURES:
            self.forget(rid)
            self._disabled.add(rid)  # the drafter keeps refusing it: decode it plainly
        else:
            self.resync(rid)

    def resync(self, rid: str) -> None:
        """The drafter's copy of ``rid`` is in doubt: finish it, start it again next step."""
        if rid in self._tracked:
            self._release(rid)
            self.resyncs += 1

    def fed(self, plan: StepPlan, index: int, depth: int, expected: float = 0.0) -> None:
        """The engine got, for the ``index``-th view of ``plan``, a drafter tree of ``depth``
        levels (-1: a root-only fallback instead) whose scores sum to ``expected``."""
        t = self._tracked.get(plan.views[index].rid)
        if t is not None:
            if depth >= 0 and t.barren >= QUIET_AFTER:
                self.quiet_draws += 1
            t.fed_depth, t.fed_step, t.fed_expected = depth, plan.step, expected
            t.fed_weight = plan.acceptance

    def _release(self, rid: str) -> None:
        t = self._tracked.pop(rid, None)
        if t is not None:
            self._owed_ends.append(t.drafter_id)

    def forget(self, rid: str) -> None:
        """The request left: its drafter id is finished with the next step."""
        if rid not in self._tracked:
            self._gone.add(rid)
        self._release(rid)
        self._disabled.discard(rid)
        self._failures.pop(rid, None)

    def forget_all(self) -> None:
        """Every request left (the engine flushed its cache)."""
        for rid in list(self._tracked) + list(self._disabled):
            self.forget(rid)
