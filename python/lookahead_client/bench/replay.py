"""The replay simulator: serves a recorded workload to drafters as an engine would.

Semantics (``shared/workloads/FORMAT.md``), and the exact order of events chosen here:

* Requests are dealt round-robin, in file order, to ``R`` replicas (request ``i`` goes to
  replica ``i % R``). Each replica is an engine with ``C`` slots (continuous batching).
* The replicas advance in lockstep rounds: in each round replica 0 does one engine step, then
  replica 1, and so on. Everything is deterministic.
* One engine step of a replica:

  1. **Admit.** Free slots are filled from the replica's queue in file order. A request whose
     ``after`` request has not finished (in an earlier round, on any replica) is skipped, and
     later requests may take the slot. Prefill gives the first response token at once.
     With ``admission="lockstep"`` (an RL rollout step: the samples of a prompt start
     together), the requests of one group in the replica's queue are admitted together, once
     there are free slots for all of them (for a group larger than the slots: as many as fit
     once the replica is idle); later groups wait their turn.
  2. **Draft.** One ``drafter.step`` call carries, in this order: every request of this
     replica that finished in its previous step (``finished=True`` with its last new tokens;
     it gets no draft), then every active request (the tokens it gained since its last step:
     the prefill token on its first step, together with ``prompt``; the budget; and how many
     draft tokens its previous step accepted, ``-1`` on its first step).
  3. **Verify.** Each active request's tree is checked greedily against the recorded
     response: ``accepted`` is the length of the longest root-to-node path whose tokens equal
     the next response tokens. The request advances by ``min(accepted + 1, remaining)``.
     A request that reaches the end of its response frees its slot now (a request admitted in
     the next step may use it) and is reported to the drafter as finished in the next step.

* A request is *finished*, for ``after``, from the round after its last verification. With one
  slot, this costs the next turn of a conversation no extra step: the slot frees and it starts
  in the next step anyway.
* A response of one token (all from prefill) needs no step: it is sent with its prompt and
  ``finished=True`` in the step of its admission and takes no slot.
* Shared drafters (``sharing="shared"``) serve every replica (one ``step`` call per replica
  and round); private ones serve one replica each. With one replica the two are the same.
  Cluster ones (``sharing="cluster"``) serve one replica each, like private ones, but learn
  from each other through the cluster, as fast as it delivers (the replay does not wait).
* With ``group_names``, every request names its workload group as its drafter group
  (``StepRequest.group``); without, drafters group requests by prompt on their own.

Figure of merit: MAT = sum(accepted) / sum(steps), over all requests. It is also reported by
phase: steps that start in the first half of their response, and the others (late in a
rollout, the siblings ahead have the most to give).

A :class:`StepHook` may stand between the drafter and the verification of each engine step
(``lookahead-bench sizing`` uses one to cut trees with the sizing policy and to time each
step with a measured cost curve): it gets the step's trees and may return others, and is told
which nodes were accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lookahead_client.types import Drafter, DraftTree, StepRequest

from .workload import Request, Workload

__all__ = [
    "ADMISSION",
    "SHARING",
    "ReplayError",
    "ReplaySettings",
    "ReplayResult",
    "StepHook",
    "accepted_length",
    "accepted_nodes",
    "replay",
]

#: The values of ``ReplaySettings.sharing``; "n/a" is what one replica reports. "cluster":
#: one drafter per replica, each on its own server, the servers joined through NATS.
SHARING = ("shared", "private", "cluster")
#: The values of ``ReplaySettings.admission``.
ADMISSION = ("continuous", "lockstep")


class ReplayError(RuntimeError):
    """A drafter broke the protocol during a replay (wrong number of trees, too many nodes)."""


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """One engine configuration.

    Attributes:
        budget: the most draft nodes per tree (B).
        concurrency: slots per replica (C).
        replicas: engines the requests are dealt to (R).
        sharing: "shared" (one drafter for all replicas), "private" (one each, apart) or
            "cluster" (one each, learning from each other through the cluster).
        admission: "continuous" (any free slot takes the next request) or "lockstep" (the
            requests of a group start together).
        group_names: requests name their workload group as their drafter group.
    """

    budget: int = 8
    concurrency: int = 1
    replicas: int = 1
    sharing: str = "shared"
    admission: str = "continuous"
    group_names: bool = False

    def __post_init__(self) -> None:
        for name in ("budget", "concurrency", "replicas"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {self.sharing!r}")
        if self.admission not in ADMISSION:
            raise ValueError(f"admission must be one of {ADMISSION}, got {self.admission!r}")

    @property
    def drafters_needed(self) -> int:
        """How many drafter instances the replay uses."""
        return 1 if self.sharing == "shared" else self.replicas

    @property
    def sharing_label(self) -> str:
        """``sharing``, or "n/a" with one replica (shared and private are the same then)."""
        return self.sharing if self.replicas > 1 else "n/a"


@dataclass(slots=True)
class ReplayResult:
    """What a replay measured.

    Attributes:
        requests: requests served.
        steps: verification steps, summed over requests.
        accepted: accepted draft tokens, summed over steps.
        wall_s: seconds for the whole replay.
        drafter_s: seconds spent inside ``drafter.step``.
        setup_s: seconds spent making the drafters (part of ``wall_s``).
        engine_steps: engine steps (one ``drafter.step`` call each), summed over replicas.
        drafter_stats: ``stats()`` of each drafter instance at the end.
        phase_steps, phase_accepted: ``steps`` and ``accepted`` split by phase: steps that
            start in the first half of their response, then the others.
        expected: what the drafter's scores expected of the verified trees: the sum of their
            node scores (a node's score is the probability that its path is accepted, so the
            sum is the tree's expected accepted length).
    """

    requests: int = 0
    steps: int = 0
    accepted: int = 0
    expected: float = 0.0
    phase_steps: list[int] = field(default_factory=lambda: [0, 0])
    phase_accepted: list[int] = field(default_factory=lambda: [0, 0])
    wall_s: float = 0.0
    drafter_s: float = 0.0
    setup_s: float = 0.0
    engine_steps: int = 0
    drafter_stats: list[dict] = field(default_factory=list)

    @property
    def mat(self) -> float:
        """Mean accepted tokens per step (0 when there was no step)."""
        return self.accepted / self.steps if self.steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens the target emits per step: MAT + 1."""
        return self.mat + 1.0

    @property
    def accepted_over_expected(self) -> float | None:
        """Accepted draft tokens over the drafter's expected count: 1.0 when its scores are
        calibrated (None when it expected nothing, e.g. a drafter without scores)."""
        return self.accepted / self.expected if self.expected > 0 else None

    def phase_mat(self, phase: int) -> float:
        """MAT of the steps of one phase (0: first half of the responses, 1: second half)."""
        steps = self.phase_steps[phase]
        return self.phase_accepted[phase] / steps if steps else 0.0


def accepted_length(tree: DraftTree, target: Sequence[int]) -> int:
    """The length of the longest root-to-node path of ``tree`` spelling a prefix of ``target``.

    Nodes are in breadth-first order (parents first), so one pass suffices.
    """
    tokens, parents = tree.tokens, tree.parents
    limit = len(target)
    depth = [0] * len(tokens)  # depth of a matching node, 0 for a node off the target
    best = 0
    for i, tok in enumerate(tokens):
        p = parents[i]
        d = 0 if p < 0 else depth[p]
        if (p < 0 or d) and d < limit and tok == target[d]:
            depth[i] = d + 1
            if d >= best:
                best = d + 1
    return best


def accepted_nodes(tree: DraftTree, target: Sequence[int]) -> list[int]:
    """The nodes on the longest root-to-node path spelling a prefix of ``target`` (the path
    :func:`accepted_length` measures; the first one found among equally long ones), from
    the root down."""
    tokens, parents = tree.tokens, tree.parents
    depth = [0] * len(tokens)  # depth of a matching node, 0 for a node off the target
    best, leaf = 0, -1
    for i, tok in enumerate(tokens):
        p = parents[i]
        d = 0 if p < 0 else depth[p]
        if (p < 0 or d) and d < len(target) and tok == target[d]:
            depth[i] = d + 1
            if d + 1 > best:
                best, leaf = d + 1, i
    path = []
    while leaf >= 0:
        path.append(leaf)
        leaf = parents[leaf]
    return path[::-1]


class StepHook(Protocol):
    """Sees every engine step of a replay between drafting and verification."""

    def before(
        self, trees: list[DraftTree], cached: list[int], remaining: list[int]
    ) -> list[DraftTree]:
        """The trees to verify, one per active request.

        Args:
            trees: the drafter's trees.
            cached: each request's tokens so far (prompt and response).
            remaining: the response tokens each request still has to produce.
        """

    def after(self, trees: list[DraftTree], accepted: list[list[int]]) -> None:
        """The verified trees and, for each, the indices of its accepted nodes."""


class _Live:
    """A request being served (or finished, waiting to be reported to the drafter)."""

    __slots__ = ("req", "pos", "new", "first", "accepted_last", "steps", "accepted")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.pos = 1  # response tokens known: the first comes from prefill
        self.new: list[int] = [req.response[0]]  # not yet told to the drafter
        self.first = True  # the drafter has not seen the prompt yet
        self.accepted_last = -1
        self.steps = 0
        self.accepted = 0

    def step_request(self, budget: int, finished: bool, group_names: bool) -> StepRequest:
        req = StepRequest(
            self.req.id,
            self.new,
            0 if finished else budget,
            self.req.prompt if self.first else None,
            self.accepted_last,
            finished,
            self.req.group if group_names and self.first else None,
        )
        self.first = False
        self.new = []
        return req


class _Engine:
    """One replica: a queue, ``C`` slots and the requests to report as finished."""

    __slots__ = ("queue", "active", "finished", "drafter")

    def __init__(self, queue: list[Request], drafter: Drafter) -> None:
        self.queue = queue
        self.active: list[_Live] = []
        self.finished: list[_Live] = []
        self.drafter = drafter

    def admit(self, slots: int, done: set[str], finished_now: list[str], lockstep: bool) -> int:
        """Fills free slots (see the module docstring); returns how many requests started."""
        free = slots - len(self.active)
        if free <= 0 or not self.queue:
            return 0
        if lockstep:
            group = self.queue[0].group
            size = next((i for i, r in enumerate(self.queue) if r.group != group), len(self.queue))
            if size > free and (self.active or size <= slots):
                return 0  # the group waits until it can start together
            free = min(size, free)
        started = 0
        kept: list[Request] = []
        for i, req in enumerate(self.queue):
            if free <= 0 or (lockstep and req.group != self.queue[0].group):
                kept.extend(self.queue[i:])
                break
            if req.after is not None and req.after not in done:
                kept.append(req)
                continue
            live = _Live(req)
            started += 1
            if len(req.response) == 1:
                self.finished.append(live)
                finished_now.append(req.id)
            else:
                self.active.append(live)
                free -= 1
        self.queue = kept
        return started


def _hooked(hook: StepHook, active: list[_Live], trees: list[DraftTree]) -> list[DraftTree]:
    """Runs the hook around the step's verification (the accepted nodes are those the
    replay's own verification will find)."""
    cached = [len(live.req.prompt) + live.pos for live in active]
    remaining = [len(live.req.response) - live.pos for live in active]
    trees = list(hook.before(trees, cached, remaining))
    if len(trees) != len(active):
        raise ReplayError(f"step hook returned {len(trees)} trees for {len(active)} requests")
    accepted = [
        accepted_nodes(tree, live.req.response[live.pos :])
        for live, tree in zip(active, trees, strict=True)
    ]
    hook.after(trees, accepted)
    return trees


def replay(
    workload: Workload,
    drafter_factory: Callable[[], Drafter],
    settings: ReplaySettings,
    progress: Callable[[int], object] | None = None,
    hook: StepHook | None = None,
) -> ReplayResult:
    """Replays ``workload`` against fresh drafters made by ``drafter_factory``.

    Args:
        workload: the requests, in arrival order.
        drafter_factory: makes one drafter; called once (shared) or once per replica (private).
        settings: budget, concurrency, replicas and sharing.
        progress: called now and then with the response tokens produced since its last call.
        hook: sees each engine step's trees before verification (see :class:`StepHook`).

    Returns:
        The summed steps and accepted tokens, timings and the drafters' stats.

    Raises:
        ReplayError: a drafter returned the wrong number of trees or a tree over budget.
        RuntimeError: the workload cannot finish (an ``after`` chain that never resolves).
    """
    t0 = time.perf_counter()
    budget, slots = settings.budget, settings.concurrency
    lockstep, names = settings.admission == "lockstep", settings.group_names
    drafters = [drafter_factory() for _ in range(settings.drafters_needed)]
    setup_s = time.perf_counter() - t0
    engines = [
        _Engine(list(workload.requests[r :: settings.replicas]), drafters[r % len(drafters)])
        for r in range(settings.replicas)
    ]
    result = ReplayResult()
    done: set[str] = set()
    drafter_s = 0.0
    unreported = 0  # tokens produced but not yet passed to ``progress``
    while True:
        finished_now: list[str] = []
        produced = 0
        for engine in engines:
            produced += engine.admit(slots, done, finished_now, lockstep)  # a prefill token each
            if not (engine.active or engine.finished):
                continue
            batch = [live.step_request(budget, True, names) for live in engine.finished]
            batch += [live.step_request(budget, False, names) for live in engine.active]
            for live in engine.finished:
                result.requests += 1
                result.steps += live.steps
                result.accepted += live.accepted
            reported = len(engine.finished)
            engine.finished = []
            t = time.perf_counter()
            trees = engine.drafter.step(batch)
            drafter_s += time.perf_counter() - t
            result.engine_steps += 1
            if len(trees) != len(batch):
                raise ReplayError(
                    f"drafter returned {len(trees)} trees for a step of {len(batch)} requests"
                )
            still: list[_Live] = []
            active_trees = trees[reported:]
            for live, tree in zip(engine.active, active_trees, strict=True):
                if len(tree.tokens) > budget:
                    raise ReplayError(
                        f"drafter returned {len(tree.tokens)} nodes for request "
                        f"{live.req.id!r} with budget {budget}"
                    )
            if hook is not None and engine.active:
                active_trees = _hooked(hook, engine.active, active_trees)
            for live, tree in zip(engine.active, active_trees, strict=True):
                response, pos = live.req.response, live.pos
                acc = accepted_length(tree, response[pos : pos + budget])
                advance = min(acc + 1, len(response) - pos)
                live.new = list(response[pos : pos + advance])
                live.pos = pos + advance
                live.steps += 1
                live.accepted += acc
                live.accepted_last = acc
                result.expected += sum(tree.scores)
                phase = 0 if 2 * pos < len(response) else 1
                result.phase_steps[phase] += 1
                result.phase_accepted[phase] += acc
                produced += advance
                if live.pos == len(response):
                    engine.finished.append(live)
                    finished_now.append(live.req.id)
                else:
                    still.append(live)
            engine.active = still
        done.update(finished_now)
        unreported += produced
        if not any(e.active or e.finished for e in engines):
            waiting = [r.id for e in engines for r in e.queue][:5]
            if not waiting:
                break
            raise RuntimeError(f"replay stuck: requests {waiting} wait on 'after' forever")
        if progress is not None and unreported >= 4096:
            progress(unreported)
            unreported = 0
    if progress is not None and unreported:
        progress(unreported)
    result.drafter_s = drafter_s
    result.setup_s = setup_s
    result.drafter_stats = [dict(d.stats()) for d in drafters]
    result.wall_s = time.perf_counter() - t0
    return result
