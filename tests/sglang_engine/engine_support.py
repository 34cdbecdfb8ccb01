"""What the real-SGLang tests share (no tests here): the engine settings, the prompts, the
named engine runs, and the child process that performs one run.

Each run is a fresh process (``python engine_support.py CONFIG MODEL PROMPTS OUT``) holding at
most one engine: SGLang spawns its scheduler and detokenizer processes, which import the CPU
stand-ins through the kit's ``sitecustomize`` (the child's environment carries it), and one
engine per process keeps the configurations independent. The child writes its results as JSON;
its output (SGLang's logs included) is the run's log.

Configurations:

* ``plain``: ``sgl.Engine`` without speculative decoding (the reference);
* ``ngram``: ``sgl.Engine`` with NGRAM and SGLang's own C++ corpus;
* ``embedded``: ``sgl.Engine`` with NGRAM as it is; lookahead comes in through the plugin entry
  point when the run sets ``LOOKAHEAD_SGLANG`` (``{}``: an embedded drafter);
* ``server``: ``lookahead_client.sglang.Engine`` drafting from a real ``lookahead-server`` on a
  Unix socket that this child starts: a batch, then a streamed generation during which the
  server is killed with SIGKILL, then a batch with the server gone, then one with a new
  server on the same socket;
* ``http``: ``python -m lookahead_client.sglang.launch_server`` (embedded drafter) on a free
  loopback port: one batch through ``POST /generate``, then SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

# check.py's copy-heavy prompts (../shared/sglang-cpu): code to rewrite with a rename, a
# sentence to quote. Copied text is what n-gram drafts get accepted on.
CODE = """def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order["status"] == "paid":
            total += order["amount"]
            count += 1
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average}
"""

CODE2 = """class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()
"""

PASSAGE = (
    "The lighthouse stood on the northern cliff for more than two hundred years. "
    "Every night its keeper climbed the one hundred and twelve steps to light the lamp. "
    "Ships passing through the narrow strait relied on its beam to avoid the rocks below."
)

PROMPTS = [
    "Rewrite this function with the variable `total` renamed to `revenue`. Output only the "
    f"code.\n\n```python\n{CODE}```",
    "Rewrite this class with the attribute `items` renamed to `elements`. Output only the "
    f"code.\n\n```python\n{CODE2}```",
    f"Read the passage and answer by quoting it exactly.\n\nPassage: {PASSAGE}\n\n"
    "Question: What did the keeper do every night? Quote the sentence.",
    "What is the capital of France? Answer in two sentences.",
]
#: The prompts whose answers copy their text (lookahead must get drafts accepted there).
COPY_PROMPTS = (0, 1, 2)
#: The prompt streamed while the lookahead-server is killed (its answer is the longest), and
#: how many of its tokens are out (drafted by the server) when the kill comes.
KILL_PROMPT = 1
KILL_AFTER_TOKENS = 16

SAMPLING = {"temperature": 0.0, "max_new_tokens": 96}

#: ``sgl.Engine`` settings of every configuration (check.py's): the stand-ins need the
#: ``torch_native`` backend with page size 1 and no CUDA graphs; float32 keeps greedy
#: decoding clear of near-ties.
ENGINE = {
    "device": "cpu",
    "dtype": "float32",
    "attention_backend": "torch_native",
    "page_size": 1,
    "disable_cuda_graph": True,
    "max_total_tokens": 4096,
    "max_running_requests": 8,
    # an idle scheduler waits on its sockets instead of spinning: two engines share 2 cores
    "sleep_on_idle": True,
    "log_level": "info",  # lookahead says at info level which drafter it uses
}
SPECULATIVE = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}

#: The named runs the tests read: ``name: (configuration, extra environment)``.
RUNS: dict[str, tuple[str, dict[str, str]]] = {
    "plain": ("plain", {}),
    "ngram": ("ngram", {}),
    "embedded": ("embedded", {"LOOKAHEAD_SGLANG": "{}"}),
    "server": ("server", {}),
    "http": ("http", {}),
    "typo": ("embedded", {"LOOKAHEAD_SGLANG": '{"targte": "unix:///run/l.sock"}'}),
}

#: Seconds to wait for an engine (start, generation, stop); one start is ~35-50 s on 2 cores.
ENGINE_TIMEOUT_S = 600


def engine_kwargs(model: str, *, speculative: bool) -> dict[str, Any]:
    """``sgl.Engine``'s keyword arguments."""
    return {"model_path": model, **ENGINE, **(SPECULATIVE if speculative else {})}


def cli_flags(kwargs: dict[str, Any]) -> list[str]:
    """The same settings as SGLang's command-line flags (``True`` is a bare flag)."""
    flags = []
    for key, value in kwargs.items():
        flags.append("--" + key.replace("_", "-"))
        if value is not True:
            flags.append(str(value))
    return flags


def results(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the tests compare of SGLang's per-request results (``sgl.Engine.generate`` and
    HTTP ``/generate`` give the same dicts)."""
    return [
        {
            "output_ids": list(o["output_ids"]),
            "completion_tokens": o["meta_info"]["completion_tokens"],
            "spec_verify_ct": o["meta_info"].get("spec_verify_ct", 0),
        }
        for o in outputs
    ]


def _generate(engine: Any, ids: list[list[int]]) -> list[dict[str, Any]]:
    return results(engine.generate(input_ids=ids, sampling_params=SAMPLING))


def _run_engine(config: str, model: str, ids: list[list[int]]) -> dict[str, Any]:
    import sglang as sgl

    engine = sgl.Engine(**engine_kwargs(model, speculative=config != "plain"))
    try:
        return {"batch": _generate(engine, ids)}
    finally:
        engine.shutdown()


def _streamed_with_kill(engine: Any, ids: list[int], kill: Any) -> dict[str, Any]:
    """One streamed generation; ``kill`` runs once ``KILL_AFTER_TOKENS`` tokens are out."""
    last, tokens_at_kill = None, None
    for chunk in engine.generate(input_ids=ids, sampling_params=SAMPLING, stream=True):
        # intermediate chunks hold SGLang's live list: read its length now
        if tokens_at_kill is None and len(chunk["output_ids"]) >= KILL_AFTER_TOKENS:
            tokens_at_kill = len(chunk["output_ids"])
            kill()
        last = chunk
    assert last is not None
    return {"result": results([last])[0], "tokens_at_kill": tokens_at_kill}


def _run_server(model: str, ids: list[list[int]]) -> dict[str, Any]:
    from lookahead_client.processes.server import ServerProcess
    from lookahead_client.sglang import Engine, LookaheadConfig

    with ServerProcess(tcp=False) as server:
        # A generous step deadline: on a loaded 2-core machine a late step decodes without
        # drafts (still correct) and would blur the accept length the test checks.
        lookahead = LookaheadConfig(target=server.unix_target, timeout=0.5)
        engine = Engine(lookahead=lookahead, **engine_kwargs(model, speculative=True))
        try:
            out: dict[str, Any] = {"batch": _generate(engine, ids)}
            t0 = time.monotonic()
            out["killed"] = _streamed_with_kill(engine, ids[KILL_PROMPT], server.kill)
            out["server_alive_after_kill"] = server.alive()
            t1 = time.monotonic()
            out["after_kill"] = _generate(engine, ids)
            t2 = time.monotonic()
            server.start()  # a fresh server on the same socket: drafting resumes
            out["restarted"] = _generate(engine, ids)
            out["times_s"] = {
                "stream": t1 - t0,
                "after_kill": t2 - t1,
                "restarted": time.monotonic() - t2,
            }
            return out
        finally:
            engine.shutdown()


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 5) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=timeout) as r:
        text = r.read().decode()
    return json.loads(text) if text else None


def _run_http(model: str, ids: list[list[int]]) -> dict[str, Any]:
    import psutil  # an SGLang dependency

    from lookahead_client.processes.child import free_tcp_port

    port = free_tcp_port()
    cmd = [sys.executable, "-m", "lookahead_client.sglang.launch_server", "--port", str(port)]
    proc = subprocess.Popen(cmd + cli_flags(engine_kwargs(model, speculative=True)))
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + ENGINE_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the launcher exited with {proc.returncode}")
            try:
                _http(f"{url}/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("the launcher did not start in time") from None
                time.sleep(1)
        children = psutil.Process(proc.pid).children(recursive=True)
        out["processes"] = len(children)
        body = {"input_ids": ids, "sampling_params": SAMPLING}
        out["batch"] = results(_http(f"{url}/generate", body, timeout=ENGINE_TIMEOUT_S))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out["launcher_rc"] = proc.wait(60)
        except subprocess.TimeoutExpired:  # reported as None: it ignored SIGTERM
            proc.kill()
            proc.wait()
            out["launcher_rc"] = None
        out["processes_left"] = [c.pid for c in children if _alive(c)]
    return out


def _alive(process: Any) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main() -> None:
    """``python engine_support.py CONFIG MODEL PROMPTS_JSON OUT_JSON``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("config", choices=sorted({config for config, _ in RUNS.values()}))
    ap.add_argument("model")
    ap.add_argument("prompts", help="JSON file: the prompts' token ids")
    ap.add_argument("out", help="JSON file written with the results")
    args = ap.parse_args()
    ids = json.loads(Path(args.prompts).read_text())
    t0 = time.monotonic()
    if args.config == "server":
        out = _run_server(args.model, ids)
    elif args.config == "http":
        out = _run_http(args.model, ids)
    else:
        out = _run_engine(args.config, args.model, ids)
    out["wall_s"] = time.monotonic() - t0
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
