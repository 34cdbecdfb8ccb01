# Shared by the scripts that build the project's Python environments (sourced, not run): the
# installer, the stamp that says whether an environment is up to date, and a fresh environment
# with vLLM's system dependency.
#
# Every environment is installed by uv, not pip: uv keeps each package once in its cache and
# hard-links the environments' files to it, so what the three environments share (torch's CUDA
# libraries, triton, transformers, ...) takes its disk space once, and nothing is kept twice as
# downloaded wheels. The suite's three torch builds fill ~40 GB with pip and its cache, more
# than a CI machine's disk may have free; with uv about half.

UV_VERSION=0.13.9
export UV_LINK_MODE=hardlink
# uv installs sources only; without bytecode every process compiles each module it imports,
# and where PYTHONDONTWRITEBYTECODE is set (as on these machines) it does so on every start:
# importing vLLM took 21.8 s of CPU here without, 9.6 s with. The suite starts dozens of
# engine processes (vLLM, SGLang), so bytecode is compiled once, at install.
export UV_COMPILE_BYTECODE=1
# The cache sits in the checkout, so it is on the environments' filesystem: a hard link cannot
# cross filesystems, and uv would copy every file instead (twice the disk) with a home
# directory elsewhere.
export UV_CACHE_DIR="${UV_CACHE_DIR:-$ROOT/build/uv-cache}"

# Prints the path of the project's uv (build/uv/bin/uv), installing it with pip on first use.
uv_path() {
    local tools="$ROOT/build/uv"
    if [[ "$("$tools/bin/uv" --version 2>/dev/null)" != "uv $UV_VERSION"* ]]; then
        rm -rf "$tools"
        "${PYTHON:-python3}" -m venv "$tools" >&2
        "$tools/bin/python" -m pip install --quiet --disable-pip-version-check \
            "uv==$UV_VERSION" >&2
    fi
    echo "$tools/bin/uv"
}

# Installs into the environment $1 (its path) what the remaining arguments name, with uv's
# `pip install` (same arguments as pip's).
uv_install() {
    local venv=$1
    shift
    "$(uv_path)" pip install --quiet --python "$venv/bin/python" "$@"
}

# Whether the environment $1 was built from inputs whose hash is $2.
venv_is_current() {
    [[ "$(cat "$1/.lookahead-stamp" 2>/dev/null)" == "$2" ]]
}

# Replaces the environment $1 by a fresh one (no pip: uv installs into it); installs libnuma1
# (vLLM's CPU kernels link it) when the system lacks it.
fresh_venv() {
    if ! ldconfig -p | grep -q 'libnuma\.so\.1'; then
        apt-get update -qq && apt-get install -y -qq libnuma1
    fi
    rm -rf "$1"
    "${PYTHON:-python3}" -m venv --without-pip "$1"
}
