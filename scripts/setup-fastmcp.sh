#!/usr/bin/env bash
# Install FastMCP (PyPI `fastmcp`, pinned) in its own venv, idempotently, for the "do no harm"
# tests (tests/interop/test_do_no_harm.py): a FastMCP server as the upstream and FastMCP's own
# Client, whose ToolError shows only the first content block of an isError result.
#
# Its own venv: FastMCP brings many dependencies (and its own console scripts) that the project's
# venv does not need; the tests run tests/interop/fastmcp_server.py and fastmcp_client.py with it.
#
# Cache: ${MCP_FASTMCP_CACHE:-<repo>/.cache/fastmcp}  (venv/, gitignored via .cache/)
# A second run with the pinned version in place only checks it. MCP_INTEROP_FORCE=1 reinstalls.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/install.sh
. "$REPO_ROOT/scripts/lib/install.sh"
CACHE="${MCP_FASTMCP_CACHE:-$REPO_ROOT/.cache/fastmcp}"
# The physical path: a checkout whose .cache is a link to another's must write (in venv
# scripts and manifest.json) paths that stay valid when that checkout is gone.
mkdir -p "$CACHE" && CACHE="$(cd "$CACHE" && pwd -P)"
FORCE="${MCP_INTEROP_FORCE:-0}"
FASTMCP="fastmcp==4.1.6"
VENV="$CACHE/venv"

log() { printf '[setup-fastmcp] %s\n' "$*" >&2; }
die() { printf '[setup-fastmcp] ERROR: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is required"
mkdir -p "$CACHE"

CHECK="import importlib.metadata as m, fastmcp.client, fastmcp.server; raise SystemExit(0 if m.version('fastmcp') == '${FASTMCP##*==}' else 1)"
# A venv's entry-point scripts name, in their #!, the path the venv was created at: one created
# through another checkout's path (a linked .cache) breaks when that checkout goes. Rebuilt then.
made_here() { grep -q -- "-m venv $1\$" "$1/pyvenv.cfg" 2>/dev/null; }
good() { [ -x "$VENV/bin/python" ] && made_here "$VENV" && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; }

if [ "$FORCE" = 1 ] || ! good; then
    # check-then-act under a lock: two runs at once leave one good venv
    exec 9>"$VENV.lock"
    flock 9
    if [ "$FORCE" = 1 ] || ! good; then
        log "creating $VENV with $FASTMCP"
        rm -rf "$VENV"
        python3 -m venv "$VENV"
        venv_install "$VENV" -c "$REPO_ROOT/requirements/tools/fastmcp.txt" "$FASTMCP" >&2
        good || die "$VENV is not usable after install"
    fi
    exec 9>&-
fi
echo "fastmcp ready: $VENV ($FASTMCP)"
