"""What an engine integration needs to know: which drafter, and how long a step may wait.

A :class:`LookaheadConfig` travels from the process that launches the engine to every process
that drafts (for SGLang pickled with the scheduler entry function or as the
``LOOKAHEAD_SGLANG`` environment variable; for vLLM as ``LOOKAHEAD_VLLM``), where it builds
the drafter. It imports no engine and no torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields

from lookahead_client._native import check_drafter_config
from lookahead_client.embedded import DRAFTER_DEFAULTS
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.types import Drafter

__all__ = ["REMOTE_QUIET_EVERY", "SGLANG_ENV", "VLLM_ENV", "LookaheadConfig"]

#: The environment variable that carries a config to SGLang's plugin hook (JSON).
SGLANG_ENV = "LOOKAHEAD_SGLANG"
#: The environment variable that configures vLLM's ``LookaheadProposer`` (JSON).
VLLM_ENV = "LOOKAHEAD_VLLM"
#: A remote drafter's default :attr:`LookaheadConfig.quiet_every`.
REMOTE_QUIET_EVERY = 4


@dataclass(frozen=True)
class LookaheadConfig:
    """Where an engine process (a SGLang scheduler, a vLLM worker) takes its drafts from.

    Attributes:
        target: ``host:port`` or ``unix:///path`` of a ``lookahead-server``; None builds an
            embedded drafter inside each scheduler process.
        namespace: the namespace (one per model / tokenizer) on the server, or in the
            cluster the embedded drafter joins.
        timeout: the deadline of one drafting step in seconds. Past it the step gets
            root-only trees (plain decoding) and the late answer is used when it arrives.
        memory_budget_bytes: memory of the embedded drafter (per scheduler process).
        max_ngram: n-gram depth of the embedded drafter's shared trie.
        min_score: the embedded drafter drops nodes less likely to be accepted than this.
        chain: the embedded drafter proposes single-branch drafts instead of trees.
        sizing: on by default. vLLM: the drafter's core cuts each step's chains to the
            lengths that maximise the batch's expected tokens per second, against the
            engine's own measured step times and at each request's temperature (zero where
            drafting does not pay, e.g. sampled rollouts whose drafts are rarely accepted).
            Off proposes every chain whole, up to ``num_speculative_tokens``. SGLang, which
            verifies every tree in all its slots: the core keeps a batch's trees only where
            their expected accepted tokens pay for a verify step against a plain one, and a
            batch left without drafts runs as a plain decode step where that is measured
            cheaper (``lookahead_client.sglang.step_modes``). Off verifies every step.
        cluster: NATS server URL(s) (``nats://HOST:PORT``, several comma-separated) that the
            embedded drafter of each engine process joins as a member of a lookahead cluster
            (embedded only): it drafts in process and learns what every replica's drafter and
            every ``lookahead-server --cluster`` of ``cluster_name`` learns, in ``namespace``
            (``EmbeddedDrafter``, docs/cluster.md). None: each process learns alone.
        cluster_name: the cluster's name (``--cluster-name`` of its servers).
        token: bearer token for a server started with ``--auth-tokens`` (remote only; sent
            over a Unix socket or loopback TCP, see ``RemoteDrafter``). Not shown in reprs.
        replica: the engine replica's name, so that the server counts the accepted draft
            tokens that came from other replicas' text; None: the host's name and the engine
            process's id. With ``cluster`` it is the embedded drafter's node id (letters,
            digits, '_' and '-'; None: a random one per process).
        quiet_every: while no request of a step has had a draft token accepted for a while
            (``lookahead_client.engine.book.QUIET_AFTER`` outcomes) and none has a draft to
            verify, the drafter may be called only every ``quiet_every``-th step, and is
            while its measured call costs more than quiet requests' accepted draft tokens
            are worth on the engine's cost curve (``engine.session.DraftSession``); the
            tokens of the steps between go with the next call (the drafter, and through a
            server every replica, still gets every token). A new request is drafted at once.
            1: every step. None (the default): :data:`REMOTE_QUIET_EVERY` for the remote
            client, whose round trip costs milliseconds on a busy host, else 1 (the embedded
            drafter's step costs a fraction of a millisecond); see
            ``engine.guard.quiet_every_for``.
    """

    target: str | None = None
    namespace: str = "default"
    timeout: float = 0.05
    memory_budget_bytes: int = DRAFTER_DEFAULTS["memory_budget_bytes"]
    max_ngram: int = DRAFTER_DEFAULTS["max_ngram"]
    min_score: float = DRAFTER_DEFAULTS["min_score"]
    chain: bool = DRAFTER_DEFAULTS["chain"]
    sizing: bool = True
    cluster: str | None = None
    cluster_name: str = "default"
    token: str | None = field(default=None, repr=False)
    replica: str | None = None
    quiet_every: int | None = None

    def __post_init__(self) -> None:
        if self.target is not None and not self.target.strip():
            raise InvalidArgumentError("target must not be empty (None: embedded)", field="target")
        if not self.namespace:
            raise InvalidArgumentError("namespace must not be empty", field="namespace")
        if not self.timeout > 0:
            raise InvalidArgumentError(
                f"timeout must be > 0 seconds, got {self.timeout}", field="timeout"
            )
        if self.cluster is not None and self.target is not None:
            raise InvalidArgumentError(
                "cluster is the embedded drafter's (a server joins with its own --cluster); "
                "give target or cluster, not both",
                field="cluster",
            )
        quiet = self.quiet_every
        if quiet is not None and (
            isinstance(quiet, bool) or not isinstance(quiet, int) or quiet < 1
        ):
            raise InvalidArgumentError(
                f"quiet_every must be an int >= 1 or None, got {quiet!r}", field="quiet_every"
            )
        # The embedded drafter's settings are checked by the core itself (one home of the
        # ranges): a config the scheduler processes would refuse fails here, at launch.
        for name, kind in (("memory_budget_bytes", int), ("max_ngram", int), ("min_score", float)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | kind) or value < 0:
                raise InvalidArgumentError(
                    f"{name} must be a non-negative {kind.__name__}, got {value!r}", field=name
                )
        check_drafter_config(
            memory_budget_bytes=self.memory_budget_bytes,
            max_ngram=self.max_ngram,
            min_score=self.min_score,
        )

    @property
    def embedded(self) -> bool:
        """True when drafts come from an in-process drafter (no ``target``)."""
        return self.target is None

    def describe(self) -> str:
        """One line for logs: which drafter this config builds."""
        if self.embedded:
            joined = f", cluster {self.cluster_name!r} at {self.cluster}" if self.cluster else ""
            return f"embedded drafter ({self.memory_budget_bytes >> 20} MiB{joined})"
        return f"lookahead-server {self.target} (namespace {self.namespace!r})"

    def build_drafter(self, *, num_slots: int, vocab_size: int, context_len: int = 0) -> Drafter:
        """The drafter of one scheduler process.

        Args:
            num_slots: SGLang's ``speculative_num_draft_tokens`` (the root included); drafts
                have at most ``num_slots - 1`` nodes.
            vocab_size: the target model's vocabulary size.
            context_len: the target model's context length (the embedded drafter accepts
                requests at least that long).
        """
        if self.target is None:  # embedded
            from lookahead_client.embedded import EmbeddedDrafter

            return EmbeddedDrafter(
                memory_budget_bytes=self.memory_budget_bytes,
                max_ngram=self.max_ngram,
                # The core's defaults are floors: a model's vocabulary, context or slots
                # raise them.
                max_budget=max(DRAFTER_DEFAULTS["max_budget"], num_slots - 1),
                min_score=self.min_score,
                chain=self.chain,
                vocab_size=max(DRAFTER_DEFAULTS["vocab_size"], vocab_size),
                max_request_tokens=max(
                    DRAFTER_DEFAULTS["max_request_tokens"], context_len + num_slots
                ),
                cluster=None if self.cluster is None else self.cluster.split(","),
                cluster_name=self.cluster_name,
                node_id=self.replica,
                namespace=self.namespace,
            )
        from lookahead_client.remote import RemoteDrafter

        return RemoteDrafter(
            self.target,
            namespace=self.namespace,
            timeout=self.timeout,
            token=self.token,
            replica=self.replica,
        )

    # -- the environment-variable form ------------------------------------------------------

    def to_env(self) -> str:
        """The JSON form carried by :data:`SGLANG_ENV` and :data:`VLLM_ENV`."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, source: str = "the config") -> LookaheadConfig:
        """Parses :meth:`to_env`'s form (unknown keys are refused, naming them); ``source``
        names where the text came from in errors.

        Raises:
            InvalidArgumentError: not a JSON object, an unknown key, or a bad value.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"{source} is not JSON: {e}", field=source) from None
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"{source} must be a JSON object", field=source)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgumentError(
                f"{source} has unknown keys {unknown}; known: {sorted(known)}",
                field=unknown[0],
            )
        return cls(**data)

    @classmethod
    def from_env(cls, var: str, environ: dict[str, str] | None = None) -> LookaheadConfig | None:
        """The config in the environment variable ``var``, or None when it is unset or empty."""
        text = (os.environ if environ is None else environ).get(var, "").strip()
        return cls.from_json(text, source=var) if text else None
