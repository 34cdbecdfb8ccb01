"""``vllm serve`` as users run it, with ``"method": "lookahead"`` and a real lookahead-server:
completions through the ``openai`` client (plain, streamed, ``n > 1``) give the greedy output
of a plain ``vllm serve``, vLLM's Prometheus ``/metrics`` count accepted draft tokens, and
killing the lookahead-server mid-stream fails no request and changes no output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from lookahead_client.processes.child import free_tcp_port
from lookahead_client.processes.server import ServerProcess

MAX_TOKENS = 32


@contextmanager
def vllm_serve(model: str, speculative_config: dict | None = None):
    """A ``vllm serve`` process on a free port (its default multiprocess engine); yields the
    base URL once ``/health`` answers."""
    port = free_tcp_port()
    cmd = [
        str(Path(sys.executable).with_name("vllm")),
        "serve",
        model,
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--skip-tokenizer-init",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        "4",
        "--seed",
        "0",
    ]
    if speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(speculative_config)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    log = open(Path(model) / f"serve-{port}.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({proc.returncode}); see {log.name}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not start; see {log.name}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def complete(url: str, model: str, prompt: list[int], **kwargs) -> list[list[int]]:
    """The token ids of every choice of one completion."""
    response = client(url).completions.create(
        model=model,
        prompt=prompt,
        max_tokens=kwargs.pop("max_tokens", MAX_TOKENS),
        temperature=kwargs.pop("temperature", 0.0),
        extra_body={"return_token_ids": True, "ignore_eos": True},
        **kwargs,
    )
    return [list(c.token_ids) for c in response.choices]


def streamed(url: str, model: str, prompt: list[int], after_chunks=None) -> list[int]:
    """The token ids of a streamed completion; ``after_chunks`` runs after the 3rd chunk."""
    stream = client(url).completions.create(
        model=model,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    out: list[int] = []
    for i, chunk in enumerate(stream):
        for choice in chunk.choices:
            out.extend(getattr(choice, "token_ids", None) or [])
        if i == 2 and after_chunks is not None:
            after_chunks()
    return out


def accepted_tokens(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total")
    )


def test_vllm_serve_with_a_lookahead_server(tiny_model: str, prompts: list[list[int]]) -> None:
    chosen = prompts[1:4]
    with vllm_serve(tiny_model) as url:
        plain = [complete(url, tiny_model, p)[0] for p in chosen]
    assert all(len(t) == MAX_TOKENS for t in plain)
    with ServerProcess(tcp=False) as server:
        spec = {
            "method": "lookahead",
            "num_speculative_tokens": 4,
            "speculator_options": {"target": server.unix_target},
        }
        with vllm_serve(tiny_model, spec) as url:
            assert [complete(url, tiny_model, p)[0] for p in chosen] == plain
            assert streamed(url, tiny_model, chosen[0]) == plain[0]
            sampled = complete(url, tiny_model, chosen[1], n=2, temperature=0.8, seed=3)
            assert [len(t) for t in sampled] == [MAX_TOKENS, MAX_TOKENS]
            assert accepted_tokens(url) > 0, "vLLM's metrics count accepted draft tokens"
            # kill -9 of the lookahead-server mid-stream: no error, the same output
            assert streamed(url, tiny_model, chosen[2], after_chunks=server.kill) == plain[2]
            assert not server.alive()
            assert complete(url, tiny_model, chosen[0]) == [plain[0]]
