"""Type stubs of the native module (Rust, PyO3). Use the wrappers in lookahead_client."""

from collections.abc import Sequence
from typing import Any, Self, final

import numpy as np

__all__ = [
    "NativeDrafter",
    "check_drafter_config",
    "drafter_defaults",
    "pack_slots",
    "run_server",
]

_RawTree = tuple[int, list[int], list[int], list[float]]
#: (request_id, prompt or None, new_tokens, accepted_last, finished, budget, group or None,
#: shape, temperature, offset or None)
_StepItem = tuple[
    str, list[int] | None, list[int], int, bool, int, str | None, int, float, int | None
]
#: (tokens, seconds, padded, base_tokens, explore_every, acceptance)
_Cost = tuple[list[int], list[float], bool, int, int, float]
#: (roots, sizes, tokens, parents, scores, held, [(index, exception)])
_StepColumns = tuple[
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    list[tuple[int, Exception]],
]
#: (tokens, mask, placed, depths, expected, [(row, kind, message)])
_Slots = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[tuple[int, str, str]]
]

@final
class NativeDrafter:
    """The embedded drafter's core; see ``lookahead_client.EmbeddedDrafter``."""

    def __new__(
        cls,
        memory_budget_bytes: int | None = None,
        max_ngram: int | None = None,
        max_budget: int | None = None,
        min_score: float | None = None,
        chain: bool | None = None,
        vocab_size: int | None = None,
        max_request_tokens: int | None = None,
        cluster: list[str] | None = None,
        cluster_name: str | None = None,
        node_id: str | None = None,
        namespace: str | None = None,
    ) -> Self: ...
    @property
    def node_id(self) -> str | None: ...
    def start(self, request_id: str, prompt: Sequence[int]) -> None: ...
    def append(self, request_id: str, new_tokens: Sequence[int]) -> None: ...
    def draft(self, request_id: str, budget: int) -> _RawTree: ...
    def end(self, request_id: str) -> None: ...
    def ingest(self, tokens_: Sequence[int]) -> None: ...
    def step(self, items: list[_StepItem], cost: _Cost | None = None) -> _StepColumns: ...
    def stats(self) -> dict[str, int | float]: ...

def run_server(argv: list[str]) -> int:
    """Runs ``lookahead-server`` (``argv[0]`` is the program name) until it shuts down."""

def pack_slots(
    roots: np.ndarray,
    sizes: np.ndarray,
    tokens: np.ndarray,
    parents: np.ndarray,
    scores: np.ndarray,
    rows: np.ndarray,
    expected_roots: np.ndarray,
    num_slots: int,
    vocab_size: int,
) -> _Slots:
    """A step's trees in the slot layout of tree verification; see
    ``lookahead_client.tree.pack_batch``."""

def drafter_defaults() -> dict[str, Any]:
    """The core's default drafter settings (``DrafterConfig::default()``), by field name."""

def check_drafter_config(
    memory_budget_bytes: int | None = None,
    max_ngram: int | None = None,
    max_budget: int | None = None,
    min_score: float | None = None,
    chain: bool | None = None,
    vocab_size: int | None = None,
    max_request_tokens: int | None = None,
) -> None:
    """Checks drafter settings as the core does (None: the core's default); raises
    ``InvalidArgumentError`` naming the first field out of range."""
