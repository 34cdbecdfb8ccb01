# Shared by the scripts that build the vLLM environments (sourced, not run): the stamp that
# says whether an environment is up to date, and a fresh environment with vLLM's system
# dependency.

# Whether the environment $1 was built from inputs whose hash is $2.
venv_is_current() {
    [[ "$(cat "$1/.lookahead-stamp" 2>/dev/null)" == "$2" ]]
}

# Replaces the environment $1 by a fresh one with an up-to-date pip; installs libnuma1
# (vLLM's CPU kernels link it) when the system lacks it.
fresh_venv() {
    if ! ldconfig -p | grep -q 'libnuma\.so\.1'; then
        apt-get update -qq && apt-get install -y -qq libnuma1
    fi
    rm -rf "$1"
    "${PYTHON:-python3}" -m venv "$1"
    "$1/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
}
