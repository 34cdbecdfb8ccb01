"""Type stubs of the native module (Rust, PyO3). Use the wrappers in lookahead_client."""

from collections.abc import Sequence

_RawTree = tuple[int, list[int], list[int], list[float]]
_StepItem = tuple[str, list[int] | None, list[int], int, bool, int]

class NativeDrafter:
    """The embedded drafter's core; see ``lookahead_client.EmbeddedDrafter``."""

    def __init__(
        self,
        memory_budget_bytes: int,
        max_ngram: int,
        max_budget: int,
        min_score: float,
        chain: bool,
        vocab_size: int,
        max_request_tokens: int,
    ) -> None: ...
    def start(self, request_id: str, prompt: Sequence[int]) -> None: ...
    def append(self, request_id: str, new_tokens: Sequence[int]) -> None: ...
    def draft(self, request_id: str, budget: int) -> _RawTree: ...
    def end(self, request_id: str) -> None: ...
    def ingest(self, tokens_: Sequence[int]) -> None: ...
    def step(self, items: list[_StepItem]) -> list[_RawTree | Exception]: ...
    def stats(self) -> dict[str, int | float]: ...

def run_server(argv: list[str]) -> int:
    """Runs ``lookahead-server`` (``argv[0]`` is the program name) until it shuts down."""
