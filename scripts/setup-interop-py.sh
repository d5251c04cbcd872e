#!/usr/bin/env bash
# Install, idempotently, what the interop tests of the proxy's runtime behaviour need:
#   - .cache/interop/venv-mcp19: the Python SDK 1.9 client in a venv of its own (an old client of
#     the 2025-03-26 / 2025-06-18 revisions; the project's own venv holds mcp 2.x)
#   - .cache/interop/server-everything: npm @modelcontextprotocol/server-everything, pinned
#     (`node dist/index.js stdio`: an independent stdio upstream with a long-running operation)
#
# A second run with everything present only checks versions and returns at once.
# Set MCP_INTEROP_FORCE=1 to reinstall.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$REPO_ROOT/.cache/interop"
FORCE="${MCP_INTEROP_FORCE:-0}"

MCP19_SPEC="mcp==1.9.*"
# mcp 1.9 imports a pydantic internal that pydantic 2.12 removed; its own requirement allows it.
MCP19_PYDANTIC="pydantic<2.12"
MCP19_VENV="$CACHE/venv-mcp19"
EVERYTHING_VERSION="2026.8.31"
EVERYTHING_DIR="$CACHE/server-everything"
EVERYTHING_PKG="$EVERYTHING_DIR/node_modules/@modelcontextprotocol/server-everything"

log() { printf '[setup-interop-py] %s\n' "$*" >&2; }
die() { printf '[setup-interop-py] ERROR: %s\n' "$*" >&2; exit 1; }
mkdir -p "$CACHE"

# --- the Python SDK 1.9 client -----------------------------------------------------------
mcp19_ok() {
    "$MCP19_VENV/bin/python" -c 'import importlib.metadata as m, sys, mcp.client.streamable_http
sys.exit(not m.version("mcp").startswith("1.9."))' 2>/dev/null
}
if [ "$FORCE" = 1 ] || ! mcp19_ok; then
    log "creating $MCP19_VENV with $MCP19_SPEC"
    rm -rf "$MCP19_VENV"
    python3 -m venv "$MCP19_VENV"
    "$MCP19_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$MCP19_SPEC" "$MCP19_PYDANTIC"
    mcp19_ok || die "mcp 1.9 not importable from $MCP19_VENV"
fi

# --- server-everything -------------------------------------------------------------------
everything_ok() {
    [ -f "$EVERYTHING_PKG/dist/index.js" ] && grep -q "\"version\": *\"$EVERYTHING_VERSION\"" "$EVERYTHING_PKG/package.json"
}
if [ "$FORCE" = 1 ] || ! everything_ok; then
    command -v npm >/dev/null || die "npm is required to install server-everything"
    log "installing @modelcontextprotocol/server-everything@$EVERYTHING_VERSION into $EVERYTHING_DIR"
    rm -rf "$EVERYTHING_DIR"; mkdir -p "$EVERYTHING_DIR"
    npm install --silent --no-audit --no-fund --prefix "$EVERYTHING_DIR" \
        "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" >&2
    everything_ok || die "server-everything not found at $EVERYTHING_PKG after install"
fi
log "ok: $("$MCP19_VENV/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"))'), server-everything $EVERYTHING_VERSION"
