"""Helpers of the SGLang tests (no tests here): making the installed SGLang importable on a
machine without an NVIDIA driver, a published SGLang config for a tiny model, real SGLang
request objects, and small drafters that fail on purpose.

SGLang 0.5.23's CUDA wheel imports ``sgl_kernel``, whose ``common_ops`` library links the
driver library ``libcuda.so.1`` for a single symbol (``cuPointerGetAttribute``) and so cannot
be loaded where no driver is installed. Like the CUDA toolkit's ``stubs/libcuda.so``, a stub
with that symbol (answering CUDA_ERROR_NO_DEVICE) lets the library load; no GPU code runs in
these tests. Where a real driver is present it is used instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lookahead_client.types import DraftTree, StepRequest

#: Set in the environment of spawned test processes: load the stub before anything else.
STUB_ENV = "LOOKAHEAD_TEST_LIBCUDA_STUB"

_STUB_SOURCE = """
/* Stand-in for the NVIDIA driver library on machines without one (tests only). */
int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
    (void)data; (void)attribute; (void)ptr;
    return 100; /* CUDA_ERROR_NO_DEVICE */
}
"""

VOCAB = 512


def _build_stub() -> Path:
    digest = hashlib.sha256(_STUB_SOURCE.encode()).hexdigest()[:12]
    out_dir = Path(tempfile.gettempdir()) / f"lookahead-libcuda-stub-{digest}"
    lib = out_dir / "libcuda.so.1"
    if lib.exists():
        return lib
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError(
            "no C compiler (cc/gcc) to build the libcuda stub the SGLang tests "
            "need on a machine without an NVIDIA driver"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "stub.c"
    src.write_text(_STUB_SOURCE)
    tmp = out_dir / f"libcuda.so.1.{os.getpid()}"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)],
        check=True,
    )
    os.replace(tmp, lib)
    return lib


def ensure_sglang_importable() -> None:
    """Loads the NVIDIA driver library, or the stub where there is none, before SGLang."""
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return
    except OSError:
        pass
    lib = os.environ.get(STUB_ENV) or str(_build_stub())
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    os.environ[STUB_ENV] = lib  # spawned test processes load it too (see the end of module)


def write_tiny_model_config(directory: Path) -> Path:
    """A model directory with only a config (SGLang's settings read it; no weights)."""
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(directory)
    return directory


def server_args(model_dir: Path, **overrides: Any):
    """SGLang's ``ServerArgs`` for NGRAM on the tiny model (CPU device, no tokenizer)."""
    from sglang.srt.server_args import ServerArgs

    settings = dict(
        model_path=str(model_dir),
        speculative_algorithm="NGRAM",
        skip_tokenizer_init=True,
        device="cpu",
        speculative_num_draft_tokens=8,
    )
    settings.update(overrides)
    return ServerArgs(**settings)


class TargetWorkerStandIn:
    """What ``NGRAMWorker.__init__`` reads from SGLang's ``TpModelWorker`` (which needs a GPU
    and a loaded model): its model runner's vocabulary size and batch limit, and what SGLang's
    ``mambaish_config`` reads of the model's config (a Llama: no hybrid state)."""

    def __init__(self, vocab_size: int = VOCAB) -> None:
        from transformers import LlamaConfig

        self.model_runner = SimpleNamespace(
            model_config=SimpleNamespace(
                vocab_size=vocab_size,
                hf_config=LlamaConfig(vocab_size=vocab_size),
                linear_attn_registry_result=None,
            ),
            max_running_requests=48,
        )
        self.tokenizer = None


def make_req(rid: str, prompt: Sequence[int], output: Sequence[int] = ()):
    """A real SGLang ``Req`` with ``prompt`` and committed ``output`` tokens."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=256, temperature=0))
    req.output_ids.extend(output)
    return req


def decode_batch(reqs: list, spliced: Sequence[Sequence[int]] | None = None, stride: int = 8):
    """A real SGLang decode ``ScheduleBatch``; ``spliced`` gives each request's accepted
    tokens of the previous round not yet in ``output_ids`` (the overlap scheduler's
    ``spec_info``)."""
    import torch
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.ngram_info import NgramVerifyInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch = ScheduleBatch(
        reqs=reqs,
        has_grammar=False,
        forward_mode=ForwardMode.DECODE,
        spec_algorithm=SpeculativeAlgorithm.NGRAM,
    )
    if spliced is not None:
        tokens = torch.zeros(len(reqs), stride, dtype=torch.int64)
        for i, accepted in enumerate(spliced):
            tokens[i, : len(accepted)] = torch.tensor(accepted, dtype=torch.int64)
        batch.spec_info = NgramVerifyInput(
            draft_token_num=stride,
            new_seq_lens=torch.tensor([len(r.origin_input_ids) for r in reqs]),
            accept_tokens=tokens.reshape(-1),
            accept_lens=torch.tensor([len(a) for a in spliced], dtype=torch.int32),
        )
    return batch


# -- drafters with known failures (they wrap a real drafter) ---------------------------------


class RecordingDrafter:
    """Passes every call to ``inner`` and keeps the step requests it saw."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.steps: list[list[StepRequest]] = []

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        self.steps.append(list(requests))
        return self.inner.step(requests, cost)

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        self.inner.start(request_id, prompt)

    def end(self, request_id: str) -> None:
        self.inner.end(request_id)

    def ingest(self, tokens: Sequence[int]) -> None:
        self.inner.ingest(tokens)

    def stats(self) -> dict:
        return self.inner.stats()


class BrokenDrafter(RecordingDrafter):
    """Raises ``RuntimeError`` from ``step`` while ``broken`` is set."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.broken = False

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        if self.broken:
            self.steps.append(list(requests))
            raise RuntimeError("drafter crashed (test)")
        return super().step(requests, cost)


class SlowDrafter(RecordingDrafter):
    """Sleeps ``delay`` seconds before each step while ``delay`` > 0."""

    def __init__(self, inner: Any, delay: float = 0.0) -> None:
        super().__init__(inner)
        self.delay = delay

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        if self.delay > 0:
            time.sleep(self.delay)
        return super().step(requests, cost)


class ForeignVocabDrafter(RecordingDrafter):
    """Answers with trees whose tokens are outside the model's vocabulary (as a server
    namespace of another model would)."""

    def step(self, requests: Sequence[StepRequest], cost=None) -> list[DraftTree]:
        trees = super().step(requests, cost)
        return [
            DraftTree(t.root, (VOCAB + 7,), (-1,), (0.9,)) if not r.finished else t
            for t, r in zip(trees, requests, strict=True)
        ]


# -- the scheduler probe of the activation test (runs in a spawned process) ----------------


def probe_scheduler(model_dir: str, conn) -> None:
    """Does what SGLang's scheduler entry does up to building its speculative worker class,
    and sends back which class it got."""
    ensure_sglang_importable()
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import publish
    from sglang.srt.speculative.ngram_worker import NGRAMWorker
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    load_plugins()  # SGLang's scheduler entry starts with this; it applies the hooks
    args = server_args(Path(model_dir))
    publish(args, role="scheduler")
    cls = SpeculativeAlgorithm.NGRAM.create_worker(args)
    conn.send(
        {
            "name": f"{cls.__module__}.{cls.__qualname__}",
            "is_ngram_worker": issubclass(cls, NGRAMWorker),
            "config": getattr(cls, "lookahead_config", None),
            "pid": os.getpid(),
        }
    )
    conn.close()


if os.environ.get(STUB_ENV):  # a spawned test process: before SGLang is imported
    ensure_sglang_importable()
