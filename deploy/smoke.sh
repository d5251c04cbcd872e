#!/usr/bin/env bash
# Container smoke test: build the image, run it, call a tool through it, then run the compose
# sidecar pair and call through the sidecar. Prints one PASS/FAIL line per check and exits 0 only
# when every check passed. Run by hand (it is not part of CI): bash deploy/smoke.sh
#
# - Every container runs with --network=host and binds 127.0.0.1 on free ports; compose adds
#   deploy/compose.host-network.yml for the same reason.
# - Where no registry is reachable the base image comes from ../shared/tools/make-base-image,
#   called only when the base image is missing AND that tool exists; on a normal machine
#   `docker build` pulls the official image.
# - Everything it starts (one container, one compose project) is removed on exit, also on failure
#   or Ctrl-C. Every wait is bounded.
#
# Environment:
#   MCP_SMOKE_IMAGE            tag to build              (mcp-recovery-proxy:smoke)
#   PYTHON_IMAGE               base image build argument (python:3.11-slim-bookworm)
#   MCP_SMOKE_BUILD_TIMEOUT_S  bound on the base image + image build (1800)
#   MCP_SMOKE_WAIT_S           bound on each readiness wait (90)
#   MCP_SMOKE_SKIP_BUILD=1     use an existing MCP_SMOKE_IMAGE
#   MCP_SMOKE_SKIP_COMPOSE=1   skip the compose part
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
image=${MCP_SMOKE_IMAGE:-mcp-recovery-proxy:smoke}
base_image=${PYTHON_IMAGE:-python:3.11-slim-bookworm}
build_timeout=${MCP_SMOKE_BUILD_TIMEOUT_S:-1800}
wait_s=${MCP_SMOKE_WAIT_S:-90}
make_base=${MAKE_BASE_IMAGE:-$repo/../shared/tools/make-base-image}
work=$(mktemp -d "${TMPDIR:-/tmp}/mcp-smoke.XXXXXX")
project="mcpsmoke$$"
failures=0
cid=""          # the container this run started (its name until `docker run` returned the id)
compose=()
compose_up=0
started=$(date +%s)

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
info() { echo "---- $*"; }
elapsed() { echo "$(($(date +%s) - started))s"; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $cid ]]; then
    if [[ $failures -gt 0 ]]; then
      echo "---- container logs (last 40 lines)"; docker logs --tail 40 "$cid" 2>&1 | sed 's/^/    /'
    fi
    docker rm -f "$cid" >/dev/null 2>&1 || true
  fi
  if [[ $compose_up -eq 1 ]]; then
    if [[ $failures -gt 0 ]]; then
      echo "---- compose logs (last 40 lines)"; timeout 30 "${compose[@]}" logs --no-color --tail 40 2>&1 | sed 's/^/    /'
    fi
    timeout 60 "${compose[@]}" down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
  exit "$rc"
}
# Long steps run in the background and are awaited, so a signal is handled at once (bash defers
# traps until a foreground command ends) and the step itself is stopped too.
child=""
bounded() {
  timeout "$@" &
  child=$!
  wait "$child"
  local rc=$?
  child=""
  return "$rc"
}
interrupted() {
  echo "FAIL interrupted"
  if [[ -n $child ]]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi
  exit 130
}
trap cleanup EXIT
trap interrupted INT TERM

finish() {
  if [[ $failures -eq 0 ]]; then
    echo "SMOKE PASS ($(elapsed))"; exit 0
  fi
  echo "SMOKE FAIL: $failures check(s) failed ($(elapsed))"; exit 1
}

# The client side is Python's standard library only (no curl in the images, no proxies).
cat >"$work/client.py" <<'PY'
"""Tiny MCP/admin client for the smoke test: `ready URL WAIT_S`, `get URL`, `call URL TOOL JSON`."""
import json
import sys
import time
import urllib.error
import urllib.request

opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
VERSION = "2026-07-28"


def ready(url: str, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with opener.open(url, timeout=3) as r:
                print(r.read().decode())
                return 0
        except urllib.error.HTTPError as e:
            last = f"{e.code} {e.read().decode()[:200]}"
        except OSError as e:
            last = repr(e)
        time.sleep(0.5)
    print(f"not ready after {wait_s:.0f}s: {last}")
    return 1


def get(url: str) -> int:
    with opener.open(url, timeout=5) as r:
        body = r.read().decode()
        ctype = r.headers.get("content-type", "")
        extra = ""
        if ctype.startswith("text/plain"):  # the Prometheus exposition
            extra = f", {sum(1 for x in body.splitlines() if x.startswith('mcp_recovery_'))} mcp_recovery_* samples"
        print(f"{r.status}, {len(body)} bytes{extra}, {ctype}")
        return 0 if r.status == 200 else 1


def policies(url: str, tool: str, wait_s: float) -> int:
    """Wait until the active policy set (GET /policies) names `tool`; print its version."""
    deadline = time.monotonic() + wait_s
    seen = "no answer"
    while time.monotonic() < deadline:
        try:
            with opener.open(url, timeout=3) as r:
                body = json.loads(r.read())
            seen = f"version {body.get('version')}, files {[f.rsplit('/', 1)[-1] for f in body.get('files', [])]}"
            if tool in body.get("tools", {}):
                print(f"{seen}, reloads {body.get('reloads')}")
                return 0
        except (OSError, ValueError) as e:
            seen = repr(e)
        time.sleep(0.5)
    print(f"{tool!r} not in the active policies after {wait_s:.0f}s: {seen}")
    return 1


def call(url: str, tool: str, arguments: str) -> int:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": json.loads(arguments),
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": "tools/call",
            "Mcp-Name": tool,
        },
    )
    try:
        with opener.open(req, timeout=60) as r:
            raw = r.read().decode()
            ctype = r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        print(f"HTTP {e.code}: {e.read().decode()[:300]}")
        return 1
    if ctype.startswith("text/event-stream"):  # the response is the last JSON-RPC message with our id
        msgs = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:") and line[5:].strip()]
        msgs = [m for m in msgs if m.get("id") == 1]
        raw = json.dumps(msgs[-1]) if msgs else raw
    message = json.loads(raw)
    print(json.dumps(message)[:400])
    result = message.get("result")
    return 0 if isinstance(result, dict) and not result.get("isError") else 1


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "ready":
        sys.exit(ready(args[0], float(args[1])))
    if cmd == "get":
        sys.exit(get(args[0]))
    if cmd == "policies":
        sys.exit(policies(args[0], args[1], float(args[2])))
    sys.exit(call(*args))
PY

client() { timeout $((wait_s + 30)) python3 "$work/client.py" "$@"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Wait for a container's Docker health status to become healthy (bounded).
wait_healthy() {
  local id=$1 deadline=$(($(date +%s) + wait_s)) status=""
  while [[ $(date +%s) -lt $deadline ]]; do
    status=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id" 2>/dev/null)
    [[ $status == healthy || $status == none ]] && break
    sleep 2
  done
  echo "$status"
}

# ---------------------------------------------------------------------------------------------
info "prerequisites"
for tool in docker python3 timeout; do
  command -v "$tool" >/dev/null || { fail "prerequisite: $tool is not installed"; finish; }
done
if ! docker info >/dev/null 2>&1; then
  if [[ -x $make_base ]]; then
    info "no Docker engine answers: $make_base starts one"
    bounded "$build_timeout" "$make_base" "$base_image" || { fail "make-base-image (engine start)"; finish; }
  fi
  docker info >/dev/null 2>&1 || { fail "no Docker engine answers (docker info)"; finish; }
fi
pass "docker engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"

# ---------------------------------------------------------------------------------------------
if [[ ${MCP_SMOKE_SKIP_BUILD:-0} != 1 ]]; then
  info "build $image (base $base_image)"
  if ! docker image inspect "$base_image" >/dev/null 2>&1 && [[ -x $make_base ]]; then
    info "base image $base_image missing: building the local stand-in (first time: several minutes)"
    if bounded "$build_timeout" "$make_base" "$base_image"; then
      pass "base image $base_image built by make-base-image"
    else
      fail "base image $base_image (make-base-image)"; finish
    fi
  fi
  t0=$(date +%s)
  if bounded "$build_timeout" docker build --network=host --build-arg "PYTHON_IMAGE=$base_image" \
      -t "$image" "$repo" >"$work/build.log" 2>&1; then
    pass "docker build $image ($(($(date +%s) - t0))s)"
  else
    fail "docker build $image (last lines of the log follow)"; tail -30 "$work/build.log" | sed 's/^/    /'
    finish
  fi
fi
docker image inspect "$image" >/dev/null 2>&1 || { fail "image $image is missing"; finish; }

user=$(docker image inspect -f '{{.Config.User}}' "$image")
[[ -n $user && $user != root && $user != 0* ]] && pass "image runs as non-root user $user" \
  || fail "image user is '$user' (expected non-root)"
if out=$(timeout 60 docker run --rm --network=host "$image" policies check /etc/mcp-recovery/policies 2>&1); then
  pass "shipped policies in /etc/mcp-recovery/policies: $out"
else
  fail "policies check /etc/mcp-recovery/policies: $out"
fi

# ---------------------------------------------------------------------------------------------
info "docker run (default CMD: the demo, stdio upstream) with a hardened runtime"
mcp_port=$(free_port); admin_port=$(free_port)
cid="$project-run"
cid=$(docker run -d --name "$project-run" --network=host --read-only --tmpfs /tmp --cap-drop ALL \
  --security-opt no-new-privileges:true \
  -e MCP_RECOVERY_LISTEN="http://127.0.0.1:$mcp_port/mcp" \
  -e MCP_RECOVERY_ADMIN="127.0.0.1:$admin_port" \
  --label mcp-recovery-proxy.smoke="$project" "$image" 2>"$work/run.err") \
  || { cid="$project-run"; fail "docker run: $(cat "$work/run.err")"; finish; }
pass "container started ${cid:0:12} (MCP 127.0.0.1:$mcp_port, admin 127.0.0.1:$admin_port)"

if out=$(client ready "http://127.0.0.1:$admin_port/readyz" "$wait_s"); then
  pass "/readyz 200: $out"
else
  fail "/readyz: $out"
fi
if out=$(client get "http://127.0.0.1:$admin_port/healthz" 2>&1); then pass "/healthz $out"; else fail "/healthz: $out"; fi
if out=$(client call "http://127.0.0.1:$mcp_port/mcp" echo '{"text": "hello through the container"}' 2>&1) \
    && grep -q "hello through the container" <<<"$out"; then
  pass "tools/call echo (2026-07-28) through the container: $out"
else
  fail "tools/call echo through the container: $out"
fi
if out=$(client call "http://127.0.0.1:$mcp_port/mcp" lookup_customer '{"customer_id": "c-42"}' 2>&1); then
  pass "tools/call lookup_customer (fails twice upstream) recovered within one call: ${out:0:300}"
else
  echo "INFO tools/call lookup_customer did not recover within one call (retries not active?): ${out:0:200}"
fi
if out=$(client get "http://127.0.0.1:$admin_port/metrics" 2>&1) && ! grep -q " 0 mcp_recovery_" <<<"$out"; then
  pass "/metrics $out"
else
  fail "/metrics (200 with mcp_recovery_* samples expected): $out"
fi
status=$(wait_healthy "$cid")
[[ $status == healthy ]] && pass "Docker HEALTHCHECK reports healthy" || fail "Docker HEALTHCHECK status: $status"
docker rm -f "$cid" >/dev/null 2>&1 && cid=""

# ---------------------------------------------------------------------------------------------
if [[ ${MCP_SMOKE_SKIP_COMPOSE:-0} == 1 ]]; then
  echo "SKIP compose (MCP_SMOKE_SKIP_COMPOSE=1)"; finish
fi
info "docker compose: the proxy as a sidecar of an HTTP MCP server (host-network override)"
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose)
elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  info "installing docker-compose from the distribution"
  (apt-get update -qq && apt-get install -y -qq docker-compose) >/dev/null 2>&1
  command -v docker-compose >/dev/null && compose=(docker-compose)
fi
if [[ ${#compose[@]} -eq 0 ]]; then
  fail "neither 'docker compose' nor docker-compose is available"; finish
fi
compose+=(-p "$project" -f "$repo/docker-compose.yml" -f "$repo/deploy/compose.host-network.yml")

# The proxy's policy folder, laid out the way the kubelet writes a ConfigMap volume: files in a
# timestamped folder, `..data` pointing at it, and top-level links through `..data`.
cm=$work/configmap
mkdir -p "$cm/..2026_01_01_00_00_00.1"
cp "$repo/policies/defaults.yaml" "$cm/..2026_01_01_00_00_00.1/"
ln -s ..2026_01_01_00_00_00.1 "$cm/..data"
ln -s ..data/defaults.yaml "$cm/defaults.yaml"
chmod -R a+rX "$work"   # the container runs as uid 10001
export MCP_SMOKE_POLICIES_DIR=$cm

export MCP_RECOVERY_PROXY_IMAGE=$image
export MCP_SMOKE_UPSTREAM_PORT=$(free_port) MCP_SMOKE_MCP_PORT=$(free_port) MCP_SMOKE_ADMIN_PORT=$(free_port)
if out=$(timeout 60 "${compose[@]}" config -q 2>&1); then pass "compose config valid"; else fail "compose config: $out"; fi
compose_up=1
if bounded $((wait_s * 3)) "${compose[@]}" up -d --no-build >"$work/compose-up.log" 2>&1; then
  pass "compose up (upstream healthy, then proxy started)"
else
  fail "compose up: $(tail -5 "$work/compose-up.log")"; finish
fi
if out=$(client ready "http://127.0.0.1:$MCP_SMOKE_ADMIN_PORT/readyz" "$wait_s"); then
  pass "sidecar /readyz 200: $out"
else
  fail "sidecar /readyz: $out"
fi
if out=$(client call "http://127.0.0.1:$MCP_SMOKE_MCP_PORT/mcp" echo '{"text": "hello through the sidecar"}' 2>&1) \
    && grep -q "hello through the sidecar" <<<"$out"; then
  pass "tools/call echo through the sidecar to the HTTP upstream: $out"
else
  fail "tools/call echo through the sidecar: $out"
fi
if out=$(client get "http://127.0.0.1:$MCP_SMOKE_ADMIN_PORT/metrics" 2>&1) && ! grep -q " 0 mcp_recovery_" <<<"$out"; then
  pass "sidecar /metrics $out"
else
  fail "sidecar /metrics (200 with mcp_recovery_* samples expected): $out"
fi
# A ConfigMap update as the kubelet performs it: a new timestamped folder, an atomic rename of a
# new `..data` link over the old one, links for new keys, then the old folder goes.
new="..2026_01_01_00_01_00.2"
mkdir "$cm/$new"
cp "$repo/policies/defaults.yaml" "$cm/$new/"
cp "$repo/policies/examples/refund.yaml" "$cm/$new/refund.yaml"
chmod -R a+rX "$cm/$new"
ln -s "$new" "$cm/..data_tmp" && mv -T "$cm/..data_tmp" "$cm/..data"
ln -s ..data/refund.yaml "$cm/refund.yaml"
rm -rf "$cm/..2026_01_01_00_00_00.1"
if out=$(client policies "http://127.0.0.1:$MCP_SMOKE_ADMIN_PORT/policies" refund 30 2>&1); then
  pass "policy hot reload through a ConfigMap-style ..data swap: $out"
else
  fail "policy hot reload through a ConfigMap-style ..data swap: $out"
fi
proxy_id=$(timeout 30 "${compose[@]}" ps -q proxy 2>/dev/null)
status=$(wait_healthy "$proxy_id")
[[ $status == healthy ]] && pass "sidecar healthcheck reports healthy" || fail "sidecar healthcheck status: $status"

finish
