#!/usr/bin/env bash
# What would a lock refresh break? Runs the tests against the newest versions pyproject.toml's
# ranges allow, in a venv of its own (.cache/venv-newest), without touching the lock or .venv.
#
#   scripts/test-newest.sh                     every test (needs .ci/run's prerequisites once)
#   scripts/test-newest.sh tests/state -x      pytest arguments of your choice
#
# Prints the versions that differ from the lock first. When it passes, `scripts/lock.sh --upgrade`
# is safe to commit; when it fails, the failures are what the refresh must mend first.
# Not part of .ci/run: its result depends on the day it runs.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="$REPO_ROOT/.cache/venv-newest"
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet --upgrade -e '.[dev]'
echo "== newest versions that differ from requirements/dev.txt:"
"$VENV/bin/python" scripts/check-installed.py requirements/dev.txt || true
echo "== tests"
MCP_LOCK_UNPINNED=1 "$VENV/bin/pytest" -p no:cacheprovider "$@"
