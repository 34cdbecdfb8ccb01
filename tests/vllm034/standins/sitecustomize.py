"""Loaded by Python at start-up in every process whose PYTHONPATH starts with this folder (so
also in the engine and worker processes vLLM starts). Runs the next ``sitecustomize`` on the
path (scripts/test.sh puts the shared build's Triton shim there), then arms the kernel
stand-ins of ``vllm034_cpu_standins`` where they are wanted (its docstring says when)."""

import importlib.util
import sys
from pathlib import Path

_here = Path(__file__).resolve().parent
_rest = [p for p in sys.path if p and Path(p).resolve() != _here]
for _entry in _rest:
    _next = Path(_entry) / "sitecustomize.py"
    if _next.is_file():
        _spec = importlib.util.spec_from_file_location("_next_sitecustomize", _next)
        assert _spec is not None and _spec.loader is not None
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break

import vllm034_cpu_standins  # noqa: E402  (this folder is on sys.path)

if vllm034_cpu_standins.wanted():
    vllm034_cpu_standins.install()
