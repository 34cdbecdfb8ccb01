"""The embedded drafter: the Rust core in this process, no server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lookahead_client._native import NativeDrafter, drafter_defaults
from lookahead_client.types import DraftBatch, DraftTree, EngineCost, StepRequest

__all__ = ["DRAFTER_DEFAULTS", "EmbeddedDrafter"]

#: The core's default drafter settings (``DrafterConfig::default()`` in Rust), by field name:
#: the defaults of :class:`EmbeddedDrafter` and of the engines' ``LookaheadConfig``.
DRAFTER_DEFAULTS: dict[str, Any] = drafter_defaults()


def _tree(raw: tuple[int, list[int], list[int], list[float]]) -> DraftTree:
    root, tokens, parents, scores = raw
    return DraftTree(root, tuple(tokens), tuple(parents), tuple(scores))


class EmbeddedDrafter:
    """A lookahead drafter running in-process over the Rust core.

    It keeps an index of every active request (prompt and outputs) and an n-gram trie shared
    by all requests, and proposes draft trees that combine both. Thread-safe: the core releases
    the GIL, so several threads may step it at once. A step that brings many tokens (new
    prompts) answers before it inserts them into the shared trie; a thread of the drafter's
    own does that while the engine computes, and the next call waits for it, so drafts are
    the same either way.

    Args:
        memory_budget_bytes: bytes the drafter may use in all (shared trie + active requests).
        max_ngram: depth of the shared n-gram trie.
        max_budget: the largest draft budget a call may ask for.
        min_score: nodes whose estimated acceptance probability is lower are not proposed.
        chain: propose single-branch drafts (a chain) instead of trees.
        vocab_size: token ids must be below this.
        max_request_tokens: the most tokens (prompt + output) one request may hold.
        cluster: NATS server URLs (``nats://HOST:PORT``; one string or several): the drafter
            joins that cluster as a member, as a ``lookahead-server --cluster`` does. It still
            drafts in this process, with no call on the step's path, and learns what every
            other member (servers, other engines' embedded drafters) learns, through a thread
            of its own; NATS away or slow never blocks a step. None: it learns only from this
            process. docs/cluster.md.
        cluster_name: the cluster's name (``--cluster-name`` of its servers).
        node_id: this drafter's id in the cluster (None: a random one per process).
        namespace: the namespace its texts belong to (servers that serve it share them).

    Raises:
        InvalidArgumentError: a setting is out of range (``field`` names it).
        LookaheadError: the cluster thread could not start.
    """

    #: The core cuts sized shapes against the engine's cost (see ``Drafter``).
    sizes_drafts = True

    def __init__(
        self,
        *,
        memory_budget_bytes: int = DRAFTER_DEFAULTS["memory_budget_bytes"],
        max_ngram: int = DRAFTER_DEFAULTS["max_ngram"],
        max_budget: int = DRAFTER_DEFAULTS["max_budget"],
        min_score: float = DRAFTER_DEFAULTS["min_score"],
        chain: bool = DRAFTER_DEFAULTS["chain"],
        vocab_size: int = DRAFTER_DEFAULTS["vocab_size"],
        max_request_tokens: int = DRAFTER_DEFAULTS["max_request_tokens"],
        cluster: str | Sequence[str] | None = None,
        cluster_name: str = "default",
        node_id: str | None = None,
        namespace: str = "default",
    ) -> None:
        self._config: dict[str, Any] = {
            "memory_budget_bytes": memory_budget_bytes,
            "max_ngram": max_ngram,
            "max_budget": max_budget,
            "min_score": min_score,
            "chain": chain,
            "vocab_size": vocab_size,
            "max_request_tokens": max_request_tokens,
        }
        servers = [cluster] if isinstance(cluster, str) else cluster
        self._cluster = None if servers is None else list(servers)
        self._native = NativeDrafter(
            **self._config,
            cluster=self._cluster,
            cluster_name=cluster_name,
            node_id=node_id,
            namespace=namespace,
        )

    @property
    def node_id(self) -> str | None:
        """This drafter's id in its cluster (None: not in one)."""
        return self._native.node_id

    @property
    def config(self) -> dict[str, int | float | bool]:
        """The settings this drafter was built with."""
        return dict(self._config)

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        """Begins a request with its prompt.

        Raises:
            RequestAlreadyActiveError: the id is active.
            InvalidArgumentError: a token id is out of range (``field="prompt"``).
        """
        self._native.start(request_id, list(prompt))

    def append(self, request_id: str, tokens: Sequence[int]) -> None:
        """Appends tokens (accepted drafts and the model's own token) to an active request."""
        self._native.append(request_id, list(tokens))

    def draft(self, request_id: str, budget: int = 8) -> DraftTree:
        """Drafts a tree of at most ``budget`` nodes for an active request."""
        return _tree(self._native.draft(request_id, budget))

    def end(self, request_id: str) -> None:
        """Ends a request; its text stays in the shared statistics."""
        self._native.end(request_id)

    def ingest(self, tokens: Sequence[int]) -> None:
        """Loads a finished text (a past output, a document) into the shared statistics."""
        self._native.ingest(list(tokens))

    def step(self, requests: Sequence[StepRequest], cost: EngineCost | None = None) -> DraftBatch:
        """One engine step: feeds every request its new tokens and drafts one tree each
        (sized shapes cut against ``cost``), as NumPy columns.

        Requests are independent: when one is refused the others are still applied, and the
        first refusal is raised after the whole step (with the step's ``batch`` attached, its
        ``errors`` holding every refusal, and the request's ``index``).

        Raises:
            InvalidArgumentError: ``cost`` or a request's ``shape`` is invalid (naming the
                field); nothing was applied.
            LookaheadError: a request was refused (a subclass naming the field).
        """
        items = [
            (
                r.request_id,
                None if r.prompt is None else list(r.prompt),
                list(r.new_tokens),
                r.accepted_last,
                r.finished,
                r.budget,
                r.group,
                int(r.shape),
                float(r.temperature),
                r.offset,
            )
            for r in requests
        ]
        roots, sizes, tokens, parents, scores, held, errors = self._native.step(
            items, None if cost is None else cost.as_tuple()
        )
        batch = DraftBatch(roots, sizes, tokens, parents, scores, held, dict(errors))
        batch.raise_first_error()
        return batch

    def stats(self) -> dict[str, int | float]:
        """Counters: active requests, trie nodes, memory, drafts, reported acceptance...; in a
        cluster also ``cluster_connected``, ``cluster_published_messages`` (batches NATS took),
        ``cluster_consumed_messages`` / ``_tokens`` (other members' batches applied) and
        ``cluster_group_applied_tokens`` (samples of one prompt running elsewhere)."""
        return self._native.stats()

    def __repr__(self) -> str:
        s = self.stats()
        joined = f", cluster={self._cluster}, node_id={self.node_id!r}" if self._cluster else ""
        return (
            f"EmbeddedDrafter(active_requests={s['active_requests']}, "
            f"trie_nodes={s['trie_nodes']}, memory={s['memory_bytes']}/"
            f"{s['memory_budget_bytes']} bytes{joined})"
        )
