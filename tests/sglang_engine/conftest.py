"""Real SGLang 0.5.23 engines on CPU (SmolLM2-135M-Instruct, float32, greedy), made to run
NGRAM speculative decoding here by the stand-in kit of ../shared/sglang-cpu (CPU versions of
the sgl_kernel ops NGRAM calls and a tree-mask ``torch_native`` attention backend, loaded in
every SGLang process by its ``sitecustomize.py``). Run by scripts/test.sh in .venv.

Without SGLang 0.5.23 or the kit these tests fail; they never skip. ``SGLANG_CPU_KIT``
points at another copy of the kit.

Engine starts dominate the time (14-70 s each on 2 cores, most of it importing SGLang in the
launching and the scheduler process), so the engine runs the selected tests need (their
``engine_runs`` marks) start when the session begins, ``SGLANG_ENGINE_RUNS`` (2) at a time,
and each test waits for its own. (Here two at a time took 6.4 min, one at a time 7.2, when
the environment had no bytecode and every process compiled what it imported; with it, 3.5
min two at a time.)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from engine_support import ENGINE_TIMEOUT_S, PROMPTS, RUNS

ROOT = Path(__file__).resolve().parents[2]
KIT = Path(os.environ.get("SGLANG_CPU_KIT", ROOT.parent / "shared" / "sglang-cpu")).resolve()
# Engines running at once (a start leaves a core idle much of the time), each with its share
# of the cores for torch: two on the 2-core CI machines, one thread each.
PARALLEL_RUNS = int(os.environ.get("SGLANG_ENGINE_RUNS", "2"))
TORCH_THREADS = max(1, (os.cpu_count() or 1) // PARALLEL_RUNS)

try:
    _SGLANG = metadata.version("sglang")
except metadata.PackageNotFoundError:
    _SGLANG = None
if _SGLANG != "0.5.23":  # the environment is wrong: say so loudly
    raise pytest.UsageError(
        f"tests/sglang_engine need sglang==0.5.23 (found {_SGLANG}); run them with "
        ".venv/bin/python (scripts/test.sh installs it)"
    )
if not (KIT / "sitecustomize.py").is_file() or not (KIT / "sglang_cpu_standins.py").is_file():
    raise pytest.UsageError(
        f"tests/sglang_engine need the SGLang CPU stand-ins kit at {KIT} "
        "(../shared/sglang-cpu; or set SGLANG_CPU_KIT)"
    )


#: The runs of this session, in the order they ended (for the summary).
FINISHED: list[Run] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "engine_runs(*names): the engine runs (engine_support.RUNS) a test reads"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FINISHED:
        runs = ", ".join(f"{r.name} {r.wall_s:.0f} s" for r in FINISHED)
        terminalreporter.write_line(f"engine runs ({PARALLEL_RUNS} at a time): {runs}")


def engine_env(**extra: str) -> dict[str, str]:
    """The environment of a process that runs SGLang on CPU with the kit's stand-ins."""
    env = dict(os.environ)
    for var in ("LOOKAHEAD_SGLANG", "SGLANG_CPU_STANDINS_IGNORE_TREE", "SGLANG_PLUGINS"):
        env.pop(var, None)  # nothing from the caller's shell may change a configuration
    env.update(SGLANG_USE_CPU_ENGINE="1", SGLANG_CPU_STANDINS="1")
    # more torch threads than cores (engines side by side) makes every step spin and wait
    env["OMP_NUM_THREADS"] = str(TORCH_THREADS)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(KIT), env.get("PYTHONPATH")]))
    # this environment's lookahead-server console script, even when it is not activated
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


class Run:
    """The outcome of one engine run: exit status, log (the child's stdout and stderr,
    SGLang's logs included) and results (None when the child wrote none)."""

    def __init__(self, name: str, returncode: int, log: str, result: Any, wall_s: float) -> None:
        self.name, self.returncode, self.log, self.result = name, returncode, log, result
        self.wall_s = wall_s

    def ok(self) -> dict[str, Any]:
        """The results; a failed run fails the test with the end of its log."""
        if self.returncode != 0 or self.result is None:
            tail = "\n".join(self.log.splitlines()[-60:])
            pytest.fail(f"engine run {self.name!r} failed ({self.returncode}):\n{tail}")
        return self.result


class EngineRuns:
    """Runs ``engine_support.py`` children in the background, ``PARALLEL_RUNS`` at a time."""

    def __init__(self, model: str, prompts_file: Path, workdir: Path) -> None:
        self.model, self.prompts_file, self.workdir = model, prompts_file, workdir
        self._pool = ThreadPoolExecutor(PARALLEL_RUNS, thread_name_prefix="engine-run")
        self._futures: dict[str, Future[Run]] = {}
        self._ids = itertools.count()
        self._running: set[subprocess.Popen[str]] = set()

    def start(self, name: str) -> None:
        """Queues the run ``name`` (once)."""
        if name not in self._futures:
            self._futures[name] = self._pool.submit(self._run, name)

    def __getitem__(self, name: str) -> Run:
        """The run ``name``, waiting for it (started now if it was not)."""
        self.start(name)
        return self._futures[name].result()

    def _run(self, name: str) -> Run:
        config, env = RUNS[name]
        out = self.workdir / f"{next(self._ids)}-{name}.json"
        cmd = [sys.executable, str(Path(__file__).with_name("engine_support.py")), config]
        cmd += [self.model, str(self.prompts_file), str(out)]
        # its own process group: on a timeout the engine's scheduler processes go with it
        proc = subprocess.Popen(
            cmd,
            env=engine_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._running.add(proc)
        t0 = time.monotonic()
        try:
            log, _ = proc.communicate(timeout=ENGINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            log, _ = proc.communicate()
            log += f"\ntimed out after {ENGINE_TIMEOUT_S} s"
        finally:
            self._running.discard(proc)
        result = json.loads(out.read_text()) if out.exists() else None
        run = Run(name, proc.returncode, log, result, time.monotonic() - t0)
        FINISHED.append(run)
        return run

    def close(self) -> None:
        """Stops what still runs (runs no test waited for, after a failure or an interrupt)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(self._running):
            _kill_group(proc)
        self._pool.shutdown(wait=True)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to the run's process group (the child and the engine processes it started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def model() -> str:
    """SmolLM2-135M-Instruct as a Hugging Face folder (float32), in the checkout's cache
    shared with the engine benchmarks (converting the GGUF takes ~30 s)."""
    from lookahead_client.bench.engine_bench import MODEL_DIR, ensure_model

    return str(ensure_model(ROOT / MODEL_DIR))


@pytest.fixture(scope="session")
def prompt_ids(model: str) -> list[list[int]]:
    """The prompts with the model's chat template applied, as token ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    return [
        list(tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=False))
        for c in chats
    ]


@pytest.fixture(scope="session")
def engines(
    request: pytest.FixtureRequest,
    model: str,
    prompt_ids: list[list[int]],
    tmp_path_factory: pytest.TempPathFactory,
):
    """The engine runs, the selected tests' started at once (plain first: all compare to it)."""
    workdir = tmp_path_factory.mktemp("sglang-engine")
    prompts_file = workdir / "prompts.json"
    prompts_file.write_text(json.dumps(prompt_ids))
    runs = EngineRuns(model, prompts_file, workdir)
    wanted = [m.args for item in request.session.items for m in item.iter_markers("engine_runs")]
    for name in ["plain", *itertools.chain.from_iterable(wanted)]:
        runs.start(name)
    yield runs
    runs.close()


@pytest.fixture(scope="session")
def plain(engines: EngineRuns) -> list[dict[str, Any]]:
    """SGLang's greedy outputs without speculative decoding: the reference of every test."""
    batch = engines["plain"].ok()["batch"]
    assert all(r["completion_tokens"] > 4 for r in batch), "the reference answers are too short"
    return batch
