# Sourced by the set-up scripts: install into a venv with uv when it is there, else with pip.
#
#   venv_install VENV PIP-ARGS...     e.g. venv_install "$VENV" -c constraints.txt fastmcp==3.1.0
#
# uv (pinned in the lock, so in .venv after the dev set-up; or UV=/path/to/uv) installs the same
# pins as pip from the same index, in seconds where pip takes tens of seconds of CPU: on a two-core
# CI machine that CPU is taken from the steps running beside it. Without uv (a set-up script run
# before the dev venv exists) pip does it.
venv_install() {
    local venv="$1"; shift
    local uv="${UV:-${REPO_ROOT:?}/.venv/bin/uv}"
    if [ -x "$uv" ]; then
        "$uv" pip install --quiet --python "$venv/bin/python" "$@"
    else
        PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --quiet "$@"
    fi
}
