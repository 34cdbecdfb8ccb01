#!/usr/bin/env bash
# Builds .venv-vllm034, the environment of the vLLM 0.34 tests: the CPU build of vLLM 0.34 in
# ../shared/vllm-cpu-0.34 (PyPI has none) on its pinned packages, pytest and the gRPC health
# client (the tests start a real lookahead-server), and this package (editable, no
# dependencies: its Rust extension is the one the main .venv built; the editable install
# registers its vllm.general_plugins entry point). Rebuilt only when this script or the shared
# build changes. Engines need tests/vllm034/standins, then the build's shim, on PYTHONPATH
# (scripts/test.sh sets it).
#
# Usage: scripts/vllm034_env.sh   (scripts/test.sh runs it; docs/vllm.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/venv_common.sh
source scripts/venv_common.sh
VENV=.venv-vllm034
SHARED="${VLLM034_DIR:-$ROOT/../shared/vllm-cpu-0.34}"
WHEEL="$SHARED/vllm-0.34.0+cpu-cp311-cp311-linux_x86_64.whl"
for f in "$WHEEL" "$SHARED/constraints.txt" "$SHARED/shim/sitecustomize.py"; do
    [[ -f "$f" ]] || { echo "vllm034_env: $f is missing (see docs/vllm.md)" >&2; exit 1; }
done
# The build's kernels need AVX-512: on a CPU with AVX2 only (an AMD EPYC seen 2026-12-07) they
# die with SIGILL under every name vLLM loads. There the tests run vLLM on the PyTorch
# stand-ins of tests/vllm034/standins instead (armed by its sitecustomize; scripts/test.sh).
if ! grep -q avx512f /proc/cpuinfo; then
    echo "vllm034_env: this CPU lacks AVX-512, which the build's kernels need: the vLLM 0.34" \
        "tests will run on the PyTorch stand-ins of tests/vllm034/standins"
fi
stamp=$(cat scripts/vllm034_env.sh "$SHARED/constraints.txt" | sha256sum | cut -c1-16)-$(
    sha256sum "$WHEEL" | cut -c1-16)

if ! venv_is_current "$VENV" "$stamp"; then
    echo "building $VENV (vLLM 0.34.0 CPU build, torch 2.14.0; a few minutes the first time)"
    fresh_venv "$VENV"
    py="$VENV/bin/python"
    uv_install "$VENV" -r "$SHARED/constraints.txt"
    uv_install "$VENV" --no-deps "$WHEEL"
    uv_install "$VENV" "pytest>=8" "grpcio-health-checking>=1.81.1" \
        -c "$SHARED/constraints.txt"
    PYTHONPATH="$SHARED/shim" "$py" -c "import vllm; assert vllm.__version__.startswith('0.34')"
    echo "$stamp" >"$VENV/.lookahead-stamp"
fi
uv_install "$VENV" --no-deps -e .
# The build holds only vllm._C, the kernels vLLM loads on a CPU with avx512_bf16. Without it
# vLLM imports vllm._C_AVX512 instead (vllm/platforms/cpu.py), which is not there, and every
# kernel is missing. The tests' float32 models run none of _C's BF16 instructions, so on such
# a CPU _C is installed under that name too (measured on an AVX-512 Xeon without BF16: the
# vLLM 0.34 tests pass; an instruction the CPU lacks would kill the engine, loudly).
kernels="$VENV/lib/python3.11/site-packages/vllm"
if grep -q avx512f /proc/cpuinfo && ! grep -q avx512_bf16 /proc/cpuinfo; then
    echo "vllm034_env: this CPU lacks avx512_bf16; vLLM loads the build's _C as _C_AVX512"
    ln -sf _C.abi3.so "$kernels/_C_AVX512.abi3.so"
fi
