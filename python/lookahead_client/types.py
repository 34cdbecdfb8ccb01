"""Value types shared by every drafter: what an engine sends per request and what it gets back."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, overload, runtime_checkable

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["DraftBatch", "DraftShape", "DraftTree", "Drafter", "EngineCost", "StepRequest"]


class DraftShape(IntEnum):
    """The shape of a request's draft (numbered as ``DraftShape`` in the proto)."""

    #: A tree of at most ``budget`` nodes.
    TREE = 0
    #: The best path, at most ``budget`` tokens.
    CHAIN = 1
    #: A tree of zero up to ``budget`` nodes, chosen against the step's :class:`EngineCost`.
    SIZED_TREE = 2
    #: A chain of zero up to ``budget`` tokens, chosen against the step's :class:`EngineCost`.
    SIZED_CHAIN = 3


@dataclass(frozen=True, slots=True)
class EngineCost:
    """An engine's step time by the tokens it verifies, for the sized shapes of a step.

    The drafter cuts sized drafts to the lengths that maximise the step's expected tokens per
    second (zero when plain decoding wins). Checked by the drafter: a bad curve is refused
    with :class:`~lookahead_client.errors.InvalidArgumentError` naming ``cost.tokens`` or
    ``cost.seconds``.

    Attributes:
        tokens: tokens verified by a step, strictly increasing, each >= 1; the time is linear
            between points and beyond the last.
        seconds: the step's seconds at each point: finite, > 0, non-decreasing.
        padded: every row verifies as many slots as the widest (one width for the batch: the
            Hugging Face loop, SGLang); otherwise every request its own length (vLLM).
        base_tokens: tokens the step verifies without drafts (0: one per request).
        explore_every: every this many steps, draft one step beyond the best choice (ragged:
            the batch's next-best token; padded: one width wider) so the curve stays
            measured where the choice is made (0: never).
        acceptance: what the engine measured of the drafter's scores (accepted over expected
            draft tokens of the step's requests, :meth:`RequestBook.acceptance_of
            <lookahead_client.engine.book.RequestBook.acceptance_of>`); the choice weighs
            every score by it. Finite and >= 0; 1 (or 0) takes the scores as they are.
    """

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    padded: bool = False
    base_tokens: int = 0
    explore_every: int = 0
    acceptance: float = 1.0

    def as_tuple(self) -> tuple[list[int], list[float], bool, int, int, float]:
        """The form the native drafter takes."""
        return (
            [int(t) for t in self.tokens],
            [float(s) for s in self.seconds],
            bool(self.padded),
            int(self.base_tokens),
            int(self.explore_every),
            float(self.acceptance),
        )


@dataclass(frozen=True, slots=True)
class DraftTree:
    """A tree of draft tokens hanging under the last known token of a request.

    The root (``root``, the last token of the request's context) is not a node. Nodes are in
    breadth-first order, so every parent precedes its children.

    Attributes:
        root: the last known token of the request (the token the engine feeds next), or -1
            when the drafter does not know the request's context.
        tokens: the draft token of each node.
        parents: the parent of each node as an index into ``tokens``; -1 means the root.
        scores: the drafter's estimate of the probability that the path from the root to the
            node is accepted (non-increasing along every path).
    """

    root: int
    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    scores: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (len(self.tokens) == len(self.parents) == len(self.scores)):
            raise ValueError(
                "DraftTree: tokens, parents and scores must have the same length, got "
                f"{len(self.tokens)}, {len(self.parents)}, {len(self.scores)}"
            )
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"DraftTree: parents[{i}]={p} must be -1 or a node before {i}")

    @classmethod
    def _trusted(
        cls, root: int, tokens: tuple[int, ...], parents: tuple[int, ...], scores: tuple[float, ...]
    ) -> DraftTree:
        """A tree from columns valid by construction (a drafter's batch), without the O(n)
        checks of ``__init__``: about 3x cheaper, which counts at 64 trees a step."""
        tree = object.__new__(cls)
        _set_root(tree, root)
        _set_tokens(tree, tokens)
        _set_parents(tree, parents)
        _set_scores(tree, scores)
        return tree

    @classmethod
    def empty(cls, root: int = -1) -> DraftTree:
        """A tree with no draft nodes: the engine decodes normally."""
        return cls(root)

    def __len__(self) -> int:
        return len(self.tokens)

    def select(self, nodes: Sequence[int]) -> DraftTree:
        """The tree of the nodes at indices ``nodes``, in that order, renumbered. Every
        selected node's parent must be selected before it (ValueError otherwise)."""
        slot = {old: new for new, old in enumerate(nodes)}
        try:
            parents = tuple(-1 if self.parents[i] < 0 else slot[self.parents[i]] for i in nodes)
        except KeyError as e:
            raise ValueError(f"DraftTree.select: the parent {e.args[0]} is not selected") from None
        return DraftTree(
            self.root,
            tuple(self.tokens[i] for i in nodes),
            parents,
            tuple(self.scores[i] for i in nodes),
        )

    @property
    def depth(self) -> int:
        """The number of nodes on the longest root-to-node path (0 for an empty tree)."""
        depths = self.depths()
        return max(depths, default=0)

    def depths(self) -> list[int]:
        """The depth of each node (children of the root have depth 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def paths(self) -> list[list[int]]:
        """The token path from the root to each node (the root token excluded)."""
        out: list[list[int]] = []
        for tok, p in zip(self.tokens, self.parents, strict=True):
            out.append(([] if p < 0 else out[p]) + [tok])
        return out

    def __repr__(self) -> str:
        if not self.tokens:
            return f"DraftTree(root={self.root}, empty)"
        lines = [f"DraftTree(root={self.root}, nodes={len(self)}, depth={self.depth})"]
        children: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            children.setdefault(p, []).append(i)

        def walk(parent: int, indent: str) -> None:
            for i in children.get(parent, []):
                lines.append(f"{indent}{self.tokens[i]} ({self.scores[i]:.2f})")
                walk(i, indent + "  ")

        walk(-1, "  ")
        return "\n".join(lines)


_set_root = DraftTree.root.__set__  # type: ignore[attr-defined, misc]
_set_tokens = DraftTree.tokens.__set__  # type: ignore[attr-defined, misc]
_set_parents = DraftTree.parents.__set__  # type: ignore[attr-defined, misc]
_set_scores = DraftTree.scores.__set__  # type: ignore[attr-defined, misc]


@dataclass(slots=True)
class StepRequest:
    """One request's part of an engine step.

    Attributes:
        request_id: the engine's id of the request (unique while it is active).
        new_tokens: tokens appended to the request since the last step (accepted draft tokens
            plus the token the target model emitted).
        budget: the most draft nodes wanted (the root excluded); 0 asks for no draft.
        prompt: the prompt, given the first time the request is seen (starts it).
        accepted_last: how many draft tokens of the previous step's tree were accepted
            (feedback for metrics and adaptive drafting; -1 when unknown).
        finished: the request is over after ``new_tokens``; no draft is returned.
        shape: the draft's shape (:class:`DraftShape`; default a tree of ``budget`` nodes).
        temperature: the request's sampling temperature (0: greedy). The drafter's scores are
            calibrated at it: a sampling engine accepts a draft token with the model's
            probability of it, so drafts are worth less at high temperatures.
        offset: the number of tokens (prompt included) the request holds before
            ``new_tokens``, as the engine knows it. With it a step sent twice (a retry) changes
            nothing: tokens the drafter holds are checked and skipped; a step that would leave
            a gap is refused (``InvalidArgumentError``, ``field="offset"``, the message saying
            how many tokens the drafter holds). With ``prompt`` it must be the prompt's length.
            None: the tokens are appended.
        group: read with ``prompt`` (when the request starts): the group the request belongs
            to. Requests of one group draft from each other's outputs, running and finished
            (samples of one prompt side by side: RL rollouts, ``n > 1``, best-of-n). ``None``:
            the group of the requests with the same prompt, which needs no name. A name
            (at most 256 bytes) groups requests with any prompts, such as an agent's calls.
    """

    request_id: str
    new_tokens: Sequence[int] = ()
    budget: int = 8
    prompt: Sequence[int] | None = None
    accepted_last: int = -1
    finished: bool = False
    group: str | None = None
    shape: DraftShape = DraftShape.TREE
    temperature: float = 0.0
    offset: int | None = None


@dataclass(frozen=True, eq=False)
class DraftBatch(Sequence[DraftTree]):
    """The trees of one step, what every drafter's ``step`` returns: NumPy columns (the
    layout of ``StepResponse`` in the proto) that read as a sequence of :class:`DraftTree`.

    Tree ``i`` has root ``roots[i]`` and the ``sizes[i]`` nodes starting at ``offsets[i]`` of
    ``tokens``, ``parents`` (indices within the tree, -1: the root) and ``scores``. A request
    that failed has an empty tree and its exception in ``errors``. ``held`` (when the
    drafter reports it) is the tokens each request holds after the step (0: failed or ended).

    Engines read the columns directly (a chain's tokens are ``batch.nodes(i)``); ``batch[i]``
    (or iterating) gives a :class:`DraftTree` for code that wants one. The columns are taken
    as a drafter writes them (valid trees): trees read back from them are not checked again
    (:meth:`from_trees` checks its trees).
    """

    roots: np.ndarray
    sizes: np.ndarray
    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    held: np.ndarray | None = None
    errors: dict[int, Exception] = field(default_factory=dict)
    offsets: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        # through a list: faster than NumPy's cumsum for the few trees of a step
        n = len(self.sizes)
        sums = itertools.accumulate(self.sizes.tolist(), initial=0)
        object.__setattr__(self, "offsets", np.fromiter(sums, dtype=np.int64, count=n + 1))

    @classmethod
    def from_trees(
        cls, trees: Sequence[DraftTree], errors: dict[int, Exception] | None = None
    ) -> DraftBatch:
        """The batch of ``trees`` (a drafter that answers with :class:`DraftTree` objects),
        with the dtypes of the native step: int64 roots and tokens, uint32 sizes, int32
        parents, float32 scores.

        Raises:
            InvalidArgumentError: an item is not a :class:`DraftTree` (``field="trees"``).
        """
        for i, tree in enumerate(trees):
            if not isinstance(tree, DraftTree):
                raise InvalidArgumentError(
                    f"trees[{i}] is a {type(tree).__name__}, not a DraftTree", field="trees"
                )
        return cls(
            np.fromiter((t.root for t in trees), dtype=np.int64, count=len(trees)),
            np.fromiter((len(t) for t in trees), dtype=np.uint32, count=len(trees)),
            np.fromiter((x for t in trees for x in t.tokens), dtype=np.int64),
            np.fromiter((x for t in trees for x in t.parents), dtype=np.int32),
            np.fromiter((x for t in trees for x in t.scores), dtype=np.float32),
            errors=dict(errors or {}),
        )

    def __len__(self) -> int:
        return len(self.sizes)

    @overload
    def __getitem__(self, index: int) -> DraftTree: ...

    @overload
    def __getitem__(self, index: slice) -> list[DraftTree]: ...

    def __getitem__(self, index: int | slice) -> DraftTree | list[DraftTree]:
        if isinstance(index, slice):
            return [self.tree(i) for i in range(len(self))[index]]
        return self.tree(index)

    def nodes(self, i: int) -> np.ndarray:
        """The draft tokens of tree ``i``, breadth-first (a chain's tokens in order)."""
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def tree(self, i: int) -> DraftTree:
        """Tree ``i`` as a :class:`DraftTree` (negative ``i`` counts from the end).

        Raises:
            IndexError: there is no tree ``i``.
        """
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"DraftBatch: tree {i} of {n}")
        i %= n
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return DraftTree._trusted(
            int(self.roots[i]),
            tuple(self.tokens[a:b].tolist()),
            tuple(self.parents[a:b].tolist()),
            tuple(self.scores[a:b].tolist()),
        )

    def trees(self) -> list[DraftTree]:
        """Every tree as a :class:`DraftTree`."""
        # one conversion per column, then tuple slices: ~5x cheaper than tree(i) per tree
        roots, offsets = self.roots.tolist(), self.offsets.tolist()
        tokens = tuple(self.tokens.tolist())
        parents = tuple(self.parents.tolist())
        scores = tuple(self.scores.tolist())
        new = DraftTree._trusted
        return [
            new(roots[i], tokens[a:b], parents[a:b], scores[a:b])
            for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:], strict=True))
        ]

    def __iter__(self) -> Iterator[DraftTree]:
        return iter(self.trees())

    def __eq__(self, other: object) -> bool:
        """The same trees, and the same requests refused."""
        if not isinstance(other, DraftBatch):
            return NotImplemented
        return self.trees() == other.trees() and self.errors.keys() == other.errors.keys()

    def raise_first_error(self) -> None:
        """Raises the refusal of the first refused request, if any, with this batch attached
        as its ``batch`` and the request's index as its ``index`` (what every drafter's
        ``step`` does after applying the whole step)."""
        if self.errors:
            index = min(self.errors)
            error = self.errors[index]
            error.batch = self  # type: ignore[attr-defined]
            error.index = index  # type: ignore[attr-defined]
            raise error

    def __repr__(self) -> str:
        return (
            f"DraftBatch(trees={len(self)}, nodes={len(self.tokens)}, errors={sorted(self.errors)})"
        )


@runtime_checkable
class Drafter(Protocol):
    """What every drafter offers: the embedded one, the remote one, the baselines.

    A drafter that cuts sized shapes (``DraftShape.SIZED_*``) against the engine's ``cost``
    itself says so with a class attribute ``sizes_drafts = True`` (lookahead's drafters: their
    core does); the others take ``cost``, ignore it and propose whole trees, which the caller
    cuts (the HF loop's :class:`~lookahead_client.hf.sizing.SizingPolicy`).
    """

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        """Begins a request with its prompt."""

    def step(self, requests: Sequence[StepRequest], cost: EngineCost | None = None) -> DraftBatch:
        """One engine step: feeds each request its new tokens and returns one tree each
        (sized shapes cut against ``cost``).

        Requests are independent: when one is refused the others are still applied, and the
        first refusal is raised after the whole step, carrying the step's trees as ``batch``
        (every refusal in its ``errors``) and the refused request's position as ``index``
        (-1: the whole step was refused, nothing applied); see
        :meth:`DraftBatch.raise_first_error`."""

    def end(self, request_id: str) -> None:
        """Ends a request; its text stays available to later requests."""

    def stats(self) -> dict[str, int | float]:
        """Counters describing the drafter (memory, nodes, requests...)."""
