"""Lookahead in real SGLang 0.5.23 engines, end to end on CPU.

What is real: SGLang's ``sgl.Engine`` and HTTP server (tokenizer, scheduler and detokenizer
processes; NGRAM speculative decoding with SGLang's own tree construction and greedy tree
verification), the model (SmolLM2-135M-Instruct, float32), lookahead's three ways in (the
``LOOKAHEAD_SGLANG`` plugin entry point, ``lookahead_client.sglang.Engine``, the launcher
``python -m lookahead_client.sglang.launch_server``) and a ``lookahead-server`` process on a
Unix socket, killed with SIGKILL. What stands in: the kit of ../shared/sglang-cpu supplies CPU
versions of the sgl_kernel ops NGRAM calls and a tree-mask ``torch_native`` attention (see
conftest.py); scripts/test.sh runs its op tests next to these.

Every speculative configuration must give plain decoding's greedy tokens exactly, and
lookahead must get drafts accepted on the prompts that copy text (accept length = SGLang's
``completion_tokens / spec_verify_ct``, the bonus token included, > 1). The engine runs are
in ``engine_support.py``; each test reads the runs named by its ``engine_runs`` mark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from engine_support import COPY_PROMPTS, KILL_AFTER_TOKENS, KILL_PROMPT

if TYPE_CHECKING:
    from conftest import EngineRuns

Batch = list[dict[str, Any]]


def assert_same_tokens(got: Batch, plain: Batch, what: str) -> None:
    """Every request's output tokens equal plain decoding's (the first difference shown)."""
    assert len(got) == len(plain)
    for i, (a, b) in enumerate(zip(got, plain, strict=True)):
        x, y = a["output_ids"], b["output_ids"]
        if x != y:
            same = (s == t for s, t in zip(x, y, strict=False))
            k = next((j for j, eq in enumerate(same) if not eq), min(len(x), len(y)))
            pytest.fail(
                f"{what}: prompt {i} differs from plain decoding at output token {k} "
                f"({x[k : k + 5]} vs plain {y[k : k + 5]}; {len(x)} vs {len(y)} tokens)"
            )


def accept_lengths(batch: Batch) -> list[float]:
    """SGLang's accept length per request (its ``spec_accept_length``)."""
    return [r["completion_tokens"] / r["spec_verify_ct"] for r in batch]


def assert_lookahead_drafted(batch: Batch, log: str, drafter: str) -> None:
    """Lookahead's worker was in use (SGLang's scheduler logged it) and its drafts were
    accepted on every prompt that copies text."""
    # SGLang's own corpus gets drafts accepted here too: the log line says whose they were.
    assert f"lookahead: NGRAM drafts come from {drafter}" in log, "lookahead was not active"
    accepts = accept_lengths(batch)
    print(f"accept lengths, lookahead {drafter}:", ", ".join(f"{a:.2f}" for a in accepts))
    assert all(accepts[i] > 1.0 for i in COPY_PROMPTS), accepts


@pytest.mark.engine_runs("ngram")
def test_sglang_ngram_is_token_identical_to_plain(engines: EngineRuns, plain: Batch) -> None:
    """The control: SGLang's own corpus through the same stand-ins."""
    batch = engines["ngram"].ok()["batch"]
    assert_same_tokens(batch, plain, "SGLang NGRAM")
    print("accept lengths, SGLang's corpus:", ", ".join(f"{a:.2f}" for a in accept_lengths(batch)))


@pytest.mark.engine_runs("embedded")
def test_lookahead_embedded_through_the_plugin(engines: EngineRuns, plain: Batch) -> None:
    """``sgl.Engine`` as it is, lookahead switched on by ``LOOKAHEAD_SGLANG='{}'``. Its first
    decode step runs plain (measuring a plain step, see ``step_modes``): the outputs being
    plain decoding's covers that path too."""
    run = engines["embedded"]
    batch = run.ok()["batch"]
    assert_same_tokens(batch, plain, "lookahead embedded")
    assert_lookahead_drafted(batch, run.log, "embedded drafter")
    assert "a decode step without drafts runs plain" in run.log


@pytest.mark.engine_runs("server")
def test_lookahead_server_on_a_unix_socket(engines: EngineRuns, plain: Batch) -> None:
    """``lookahead_client.sglang.Engine`` drafting from a real lookahead-server."""
    run = engines["server"]
    batch = run.ok()["batch"]
    assert_same_tokens(batch, plain, "lookahead-server")
    assert_lookahead_drafted(batch, run.log, "lookahead-server unix://")


@pytest.mark.engine_runs("server")
def test_lookahead_server_killed_mid_generation(engines: EngineRuns, plain: Batch) -> None:
    """SIGKILL of the server while a request decodes: no error, the same tokens; the engine
    keeps serving without drafts, and drafts again once a new server listens."""
    run = engines["server"]
    out = run.ok()
    killed = out["killed"]
    assert not out["server_alive_after_kill"]
    # the kill came mid-generation, after drafted steps, with tokens still to come
    assert killed["tokens_at_kill"] is not None, "the stream ended before the kill"
    assert KILL_AFTER_TOKENS <= killed["tokens_at_kill"] < killed["result"]["completion_tokens"]
    assert_same_tokens([killed["result"]], [plain[KILL_PROMPT]], "stream, server killed")
    assert_same_tokens(out["after_kill"], plain, "batch after the server was killed")
    # nothing drafted: one token from prefill, then one per verify step
    assert all(r["completion_tokens"] == r["spec_verify_ct"] + 1 for r in out["after_kill"])
    assert_same_tokens(out["restarted"], plain, "batch once the server was back")
    assert "answers again" in run.log
    assert_lookahead_drafted(out["restarted"], run.log, "lookahead-server unix://")
    print("times around the kill (s):", {k: round(v, 1) for k, v in out["times_s"].items()})


@pytest.mark.engine_runs("typo")
def test_bad_lookahead_sglang_value_is_refused(engines: EngineRuns) -> None:
    """A typo must not leave lookahead off: ``sgl.Engine`` does not start, and the error
    names the variable and the field. (SGLang's plugin loader logs and swallows a plugin's
    exceptions; tests/test_sglang_parts.py covers bad values without an engine.)"""
    run = engines["typo"]
    assert run.returncode != 0 and run.result is None, "an engine started"
    refusal = [line for line in run.log.splitlines() if "LOOKAHEAD_SGLANG is invalid" in line]
    assert refusal and "'targte'" in refusal[-1], run.log[-3000:]
    assert "Load weight" not in run.log, "refused only after the model was loaded"


@pytest.mark.engine_runs("http")
def test_launcher_over_http(engines: EngineRuns, plain: Batch) -> None:
    """``python -m lookahead_client.sglang.launch_server`` (embedded drafter) answers
    ``POST /generate`` with plain decoding's tokens and drafts accepted, then stops on
    SIGTERM with its SGLang processes."""
    run = engines["http"]
    out = run.ok()
    assert_same_tokens(out["batch"], plain, "the launcher over HTTP")
    assert_lookahead_drafted(out["batch"], run.log, "embedded drafter")
    assert out["processes"] >= 2, "no scheduler or detokenizer process seen"
    assert out["launcher_rc"] == 0, f"the launcher ended with {out['launcher_rc']}"
    assert out["processes_left"] == [], "SGLang processes outlived the launcher"
