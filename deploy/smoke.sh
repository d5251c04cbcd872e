#!/usr/bin/env bash
# Container smoke test: build the image, run it, call a tool through it; build the Node variant
# and the example images of stdio servers FROM ours, call their servers through the proxy in both
# eras, kill them from inside the container, check restarts, zombies (with a no-tini control) and
# docker stop; then run the compose sidecar pair and call through the sidecar. Prints one PASS/FAIL line per check and exits 0 only
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
#   MCP_SMOKE_NODE_IMAGE       tag of the Node variant   (MCP_SMOKE_IMAGE-node)
#   MCP_SMOKE_EVERYTHING_IMAGE, MCP_SMOKE_TIME_IMAGE  tags of the two examples
#   MCP_SMOKE_SKIP_BUILD=1     use existing images
#   MCP_SMOKE_SKIP_STDIO=1     skip the stdio servers (Node variant and examples)
#   MCP_SMOKE_SKIP_PYTHON=1    skip the Python example only
#   MCP_SMOKE_SKIP_COMPOSE=1   skip the compose part
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
image=${MCP_SMOKE_IMAGE:-mcp-recovery-proxy:smoke}
node_image=${MCP_SMOKE_NODE_IMAGE:-$image-node}
everything_image=${MCP_SMOKE_EVERYTHING_IMAGE:-mcp-recovery-proxy-example:everything}
time_image=${MCP_SMOKE_TIME_IMAGE:-mcp-recovery-proxy-example:time}
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
  # Any other container of this run (they all carry its label).
  docker ps -aq --filter "label=mcp-recovery-proxy.smoke=$project" | xargs -r docker rm -f >/dev/null 2>&1 || true
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
"""Tiny MCP/admin client for the smoke test: `ready URL WAIT_S`, `get URL`, `call URL TOOL JSON`
(2026-07-28), `modern URL METHOD [TOOL JSON [unsupported]]`, `legacy-open URL` (a 2025 session),
`legacy URL SESSION METHOD PARAMS [PROGRESS_STEPS]`."""
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


LEGACY = "2025-11-25"


def post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, object, list[dict]]:
    """POST one JSON-RPC message; the status, the response headers and every message answered
    (one JSON body, or each `data:` of an event stream)."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
    )
    try:
        r = opener.open(req, timeout=60)
    except urllib.error.HTTPError as e:
        r = e
    with r:
        raw = r.read().decode()
        ctype = r.headers.get("content-type", "")
        status, hdrs = r.status if hasattr(r, "status") else r.code, r.headers
    if ctype.startswith("text/event-stream"):
        msgs, data = [], []
        for line in raw.splitlines() + [""]:
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                joined = "\n".join(data).strip()
                if joined:
                    msgs.append(json.loads(joined))
                data = []
        return status, hdrs, msgs
    return status, hdrs, [json.loads(raw)] if raw.strip() else []


def legacy_open(url: str) -> int:
    """A 2025-11-25 session: initialize, then notifications/initialized; prints the session id."""
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "smoke", "version": "1"}}
    status, hdrs, msgs = post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}, {})
    sid = hdrs.get("mcp-session-id")
    result = next((m.get("result") for m in msgs if m.get("id") == 0), None)
    if status != 200 or not sid or not isinstance(result, dict):
        print(f"initialize: HTTP {status}, session {sid!r}, {json.dumps(msgs)[:300]}")
        return 1
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    status, _, _ = post(url, note, {"Mcp-Session-Id": sid, "MCP-Protocol-Version": LEGACY})
    if status != 202:
        print(f"notifications/initialized: HTTP {status}")
        return 1
    info = result.get("serverInfo", {})
    print(f"{sid} {result.get('protocolVersion')} {info.get('name')} {info.get('version')}")
    return 0


def legacy(url: str, sid: str, method: str, params: str, want_progress: str = "0") -> int:
    """One request on a 2025 session. With want_progress N, a progress token goes along and at
    least N notifications/progress for it must arrive before the answer."""
    body_params = json.loads(params)
    token = f"smoke-{time.monotonic_ns()}"
    if int(want_progress):
        body_params["_meta"] = {"progressToken": token}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": body_params}
    status, _, msgs = post(url, body, {"Mcp-Session-Id": sid, "MCP-Protocol-Version": LEGACY})
    answer = next((m for m in msgs if m.get("id") == 7), {})
    progress = [
        m["params"].get("progress")
        for m in msgs
        if m.get("method") == "notifications/progress" and m.get("params", {}).get("progressToken") == token
    ]
    return _report(status, answer, progress, int(want_progress))


def modern(url: str, method: str, tool: str = "", arguments: str = "{}", expect: str = "result") -> int:
    """One stateless 2026-07-28 request (tools/list, or tools/call of TOOL). expect=unsupported:
    the answer must be the -32022 refusal of a server that speaks only the 2025 revisions."""
    params: dict = {"_meta": {"io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": {}}}
    headers = {"MCP-Protocol-Version": VERSION, "Mcp-Method": method}
    if tool:
        params.update(name=tool, arguments=json.loads(arguments))
        headers["Mcp-Name"] = tool
    status, _, msgs = post(url, {"jsonrpc": "2.0", "id": 9, "method": method, "params": params}, headers)
    answer = next((m for m in msgs if m.get("id") == 9), {})
    if expect == "unsupported":
        error = answer.get("error", {})
        supported = (error.get("data") or {}).get("supported", [])
        print(f"HTTP {status}: {json.dumps(error)[:300]}")
        return 0 if error.get("code") == -32022 and LEGACY in supported else 1
    return _report(status, answer, [], 0)


def metric(url: str, name: str) -> int:
    """Print the sum of every sample of the metric NAME on the Prometheus page at URL."""
    with opener.open(url, timeout=5) as r:
        lines = r.read().decode().splitlines()
    print(f"{sum(float(x.rsplit(None, 1)[-1]) for x in lines if x.startswith((name + ' ', name + '{'))):g}")
    return 0


def _report(status: int, answer: dict, progress: list, want_progress: int) -> int:
    result = answer.get("result")
    if isinstance(result, dict) and "tools" in result:
        shown = f"{len(result['tools'])} tools: {', '.join(sorted(t['name'] for t in result['tools']))[:300]}"
    else:
        shown = json.dumps(answer)[:300]
    print(f"HTTP {status}, {shown}" + (f", progress {progress}" if want_progress else ""))
    ok = isinstance(result, dict) and not result.get("isError")
    return 0 if ok and len(progress) >= want_progress else 1


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "metric":
        sys.exit(metric(*args))
    if cmd == "legacy-open":
        sys.exit(legacy_open(*args))
    if cmd == "legacy":
        sys.exit(legacy(*args))
    if cmd == "modern":
        sys.exit(modern(*args))
    if cmd == "ready":
        sys.exit(ready(args[0], float(args[1])))
    if cmd == "get":
        sys.exit(get(args[0]))
    if cmd == "policies":
        sys.exit(policies(args[0], args[1], float(args[2])))
    sys.exit(call(*args))
PY

client() { timeout $((wait_s + 30)) python3 "$work/client.py" "$@"; }

# Run inside a container (`docker exec -i ID python - ARGS < procs.py`): the image has Python but
# no procps. Reads /proc of the container's own PID namespace.
cat >"$work/procs.py" <<'PY'
"""`table`: pid ppid state command of every process; `zombies`: those in state Z (exit 1 if any);
`find TEXT`: pids whose command line contains TEXT (guards excluded unless TEXT names the guard);
`ppid PID`; `kill SIGNAL PID...`."""
import os
import signal
import sys


def procs():
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
        yield int(entry), int(ppid), state, cmd or f"[{name}]"


cmd, *args = sys.argv[1:]
if cmd == "table":
    for pid, ppid, state, line in sorted(procs()):
        print(f"{pid:>6} {ppid:>6} {state} {line[:150]}")
elif cmd == "zombies":
    found = [f"{pid} (parent {ppid}) {line[:80]}" for pid, ppid, state, line in procs() if state == "Z"]
    print("; ".join(found) or "none")
    sys.exit(1 if found else 0)
elif cmd == "starts":  # the command line starts with TEXT (tini's and the proxy's name it later)
    print(" ".join(str(p) for p, _, s, line in sorted(procs()) if line.startswith(args[0]) and s != "Z"))
elif cmd == "find":
    guard = "_guard.py" in args[0]
    print(" ".join(str(p) for p, _, s, line in sorted(procs()) if args[0] in line and s != "Z" and (guard or "_guard.py" not in line)))
elif cmd == "ppid":
    print(next((ppid for pid, ppid, _, _ in procs() if pid == int(args[0])), ""))
elif cmd == "kill":
    for pid in args[1:]:
        os.kill(int(pid), getattr(signal, args[0]))
PY
# procs ID ARGS...: the helper above, run in container ID.
procs() { local id=$1; shift; timeout 30 docker exec -i "$id" python - "$@" <"$work/procs.py"; }

# Poll (bounded by MCP_SMOKE_WAIT_S) until `procs ID ARGS` prints something other than "" / WANTED_NOT.
# until_procs ID EXPECT_RC ARGS...: until the helper exits with EXPECT_RC; prints its last output.
until_procs() {
  local id=$1 want=$2 out="" rc=0 deadline=$(($(date +%s) + wait_s)); shift 2
  while :; do
    out=$(procs "$id" "$@" 2>&1); rc=$?
    [[ $rc == "$want" ]] && { echo "$out"; return 0; }
    [[ $(date +%s) -ge $deadline ]] && { echo "$out"; return 1; }
    sleep 0.5
  done
}

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
if out=$(timeout 60 docker run --rm --network=host --entrypoint /opt/venv/bin/python \
    -v "$repo/requirements/runtime.txt:/tmp/runtime.txt:ro" -v "$repo/scripts/check-installed.py:/tmp/check.py:ro" \
    "$image" /tmp/check.py --exact /tmp/runtime.txt 2>&1); then
  pass "the image's packages are the lock's pins: $out"
else
  fail "the image's packages differ from requirements/runtime.txt:"; echo "$out" | sed 's/^/    /'
fi
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
# stdio servers in the sidecar image: the Node variant with the npm reference server-everything
# (deploy/examples/node-everything), and the plain image with mcp-server-time in a venv of its own
# (deploy/examples/python-time). Pinned as in tests/interop (tests/deploy checks they agree).
SERVER_EVERYTHING_VERSION=2026.8.31
MCP_SERVER_TIME_VERSION=2026.10.19
everything_cmd="node /usr/local/bin/mcp-server-everything"  # how the server's processes look in ps
if [[ ${MCP_SMOKE_SKIP_STDIO:-0} == 1 ]]; then
  echo "SKIP stdio servers in the image (MCP_SMOKE_SKIP_STDIO=1)"
else
info "build the Node variant and the example images FROM ours"
if [[ ${MCP_SMOKE_SKIP_BUILD:-0} != 1 ]]; then
  t0=$(date +%s)
  if bounded "$build_timeout" docker build --network=host --build-arg "PYTHON_IMAGE=$base_image" \
      --build-arg VARIANT=node -t "$node_image" "$repo" >"$work/build-node.log" 2>&1; then
    pass "docker build --build-arg VARIANT=node $node_image ($(($(date +%s) - t0))s)"
  else
    fail "docker build $node_image (last lines of the log follow)"; tail -30 "$work/build-node.log" | sed 's/^/    /'
    finish
  fi
  t0=$(date +%s)
  if bounded "$build_timeout" docker build --network=host --build-arg "PROXY_IMAGE=$node_image" \
      --build-arg "SERVER_EVERYTHING_VERSION=$SERVER_EVERYTHING_VERSION" -t "$everything_image" \
      "$repo/deploy/examples/node-everything" >"$work/build-everything.log" 2>&1; then
    pass "docker build $everything_image FROM $node_image, server-everything@$SERVER_EVERYTHING_VERSION ($(($(date +%s) - t0))s)"
  else
    fail "docker build $everything_image (last lines of the log follow)"; tail -30 "$work/build-everything.log" | sed 's/^/    /'
    finish
  fi
  t0=$(date +%s)
  if [[ ${MCP_SMOKE_SKIP_PYTHON:-0} == 1 ]]; then
    :
  elif bounded "$build_timeout" docker build --network=host --build-arg "PROXY_IMAGE=$image" \
      --build-arg "MCP_SERVER_TIME_VERSION=$MCP_SERVER_TIME_VERSION" -t "$time_image" \
      "$repo/deploy/examples/python-time" >"$work/build-time.log" 2>&1; then
    pass "docker build $time_image FROM $image, mcp-server-time==$MCP_SERVER_TIME_VERSION ($(($(date +%s) - t0))s)"
  else
    fail "docker build $time_image (last lines of the log follow)"; tail -30 "$work/build-time.log" | sed 's/^/    /'
    finish
  fi
fi
stdio_images=("$node_image" "$everything_image")
[[ ${MCP_SMOKE_SKIP_PYTHON:-0} == 1 ]] || stdio_images+=("$time_image")
for img in "${stdio_images[@]}"; do
  docker image inspect "$img" >/dev/null 2>&1 || { fail "image $img is missing"; finish; }
done
versions=$(timeout 60 docker run --rm --network=host --entrypoint sh "$node_image" -c 'node --version && npm --version' 2>&1 | tr '\n' ' ')
if [[ $versions =~ ^v([0-9]+)\. ]] && [[ ${BASH_REMATCH[1]} -ge 20 ]]; then
  pass "Node variant: node and npm ${versions% } (server-everything's dependencies need Node >= 20)"
else
  fail "Node variant: node/npm versions: $versions"
fi
entry=$(docker image inspect -f '{{json .Config.Entrypoint}}' "$everything_image")
[[ $entry == *tini* ]] && pass "entrypoint $entry (tini is PID 1)" || fail "entrypoint $entry (expected tini)"

# run_sidecar NAME IMAGE [COMMAND...]: start IMAGE (its own CMD unless one is given) on free
# loopback ports, with the docker run options in the array sidecar_opts.
sidecar_opts=()
run_sidecar() {
  local name=$1 img=$2; shift 2
  mcp_port=$(free_port); admin_port=$(free_port)
  cid="$project-$name"
  cid=$(docker run -d --name "$project-$name" --network=host --read-only --tmpfs /tmp --cap-drop ALL \
    --security-opt no-new-privileges:true \
    -e MCP_RECOVERY_LISTEN="http://127.0.0.1:$mcp_port/mcp" -e MCP_RECOVERY_ADMIN="127.0.0.1:$admin_port" \
    --label mcp-recovery-proxy.smoke="$project" "${sidecar_opts[@]}" "$img" "$@" 2>"$work/run.err") \
    || { cid="$project-$name"; fail "docker run $img: $(cat "$work/run.err")"; return 1; }
  mcp="http://127.0.0.1:$mcp_port/mcp"; admin="http://127.0.0.1:$admin_port"
  if out=$(client ready "$admin/readyz" "$wait_s"); then
    pass "$name: container ${cid:0:12} ready: $out"
  else
    fail "$name: /readyz: $out"; return 1
  fi
}

restarts() { client metric "$admin/metrics" mcp_recovery_upstream_restarts_total 2>/dev/null || echo 0; }
# until_noticed R0 PIDS [both]: wait (bounded) until the proxy has dealt with the death of server
# processes (PIDS were alive before): it counted a restart above R0 (a session's child), or a
# server process not in PIDS runs (the warm pool refilled); with `both`, both. Prints what it saw.
until_noticed() {
  local r0=$1 pids=" $2 " both=${3:-} r now p counted fresh deadline=$(($(date +%s) + wait_s))
  while :; do
    r=$(restarts); now=$(procs "$cid" starts "$everything_cmd")
    fresh=""
    for p in $now; do [[ $pids == *" $p "* ]] || fresh+="$p "; done
    counted=0; python3 -c "import sys; sys.exit(0 if float('$r') > float('$r0') else 1)" && counted=1
    if [[ $both == both && $counted == 1 && -n $fresh ]] || [[ $both != both && ($counted == 1 || -n $fresh) ]]; then
      echo "restarts $r0 -> $r, server processes now: $now (new: ${fresh:-none})"; return 0
    fi
    [[ $(date +%s) -ge $deadline ]] && { echo "restarts $r0 -> $r, server processes: $now"; return 1; }
    sleep 0.5
  done
}

# orphan: SIGKILL one server's guard, so that the server is re-parented to PID 1, then
# SIGKILL the server. Prints the orphan's pid; the caller judges whether it was reaped.
orphan() {
  local guard server ppid deadline
  guard=$(procs "$cid" find _guard.py | awk '{print $1}')
  [[ -n $guard ]] || { echo "no guard process found"; return 1; }
  server=$(procs "$cid" table | awk -v g="$guard" '$2 == g {print $1; exit}')
  [[ -n $server ]] || { echo "guard $guard has no child"; return 1; }
  procs "$cid" kill SIGKILL "$guard"
  deadline=$(($(date +%s) + wait_s))
  while ppid=$(procs "$cid" ppid "$server"); [[ $ppid != 1 ]]; do
    [[ $(date +%s) -ge $deadline ]] && { echo "server $server was not re-parented to PID 1 (parent '$ppid')"; return 1; }
    sleep 0.2
  done
  procs "$cid" kill SIGKILL "$server"
  echo "$server"
}

info "server-everything (Node, stdio) as the proxy's child in $everything_image"
if run_sidecar everything "$everything_image"; then
  pid1=$(procs "$cid" table | awk '$1 == 1 {print $4, $5, $6}')
  [[ $pid1 == *tini* ]] && pass "PID 1 in the container: $pid1" || fail "PID 1 in the container: $pid1"
  if sid_line=$(client legacy-open "$mcp"); then
    sid=${sid_line%% *}
    pass "2025-11-25 session opened through the proxy: $sid_line"
  else
    fail "2025-11-25 initialize: $sid_line"; sid=none
  fi
  if out=$(client legacy "$mcp" "$sid" tools/list '{}') && grep -q "trigger-long-running-operation" <<<"$out"; then
    pass "2025 tools/list: $out"
  else
    fail "2025 tools/list: $out"
  fi
  if out=$(client legacy "$mcp" "$sid" tools/call '{"name": "echo", "arguments": {"message": "hello from node"}}') \
      && grep -q "hello from node" <<<"$out"; then
    pass "2025 tools/call echo: $out"
  else
    fail "2025 tools/call echo: $out"
  fi
  if out=$(client legacy "$mcp" "$sid" tools/call \
      '{"name": "trigger-long-running-operation", "arguments": {"duration": 2, "steps": 4}}' 4); then
    pass "2025 tools/call trigger-long-running-operation with progress relayed: $out"
  else
    fail "2025 tools/call trigger-long-running-operation (4 progress notifications expected): $out"
  fi
  # server-everything speaks the 2025 revisions only: a 2026-07-28 request is served through the
  # proxy's era bridge (a 2025 session of the proxy's; docs/deploy.md, "Eras").
  if out=$(client modern "$mcp" tools/list) && grep -q "echo" <<<"$out"; then
    pass "2026-07-28 tools/list of this 2025-only server, through the era bridge: $out"
  else
    fail "2026-07-28 tools/list of a 2025-only server through the era bridge: $out"
  fi
  if out=$(client modern "$mcp" tools/call echo '{"message": "hi"}') && grep -q "Echo: hi" <<<"$out"; then
    pass "2026-07-28 tools/call echo through the era bridge: $out"
  else
    fail "2026-07-28 tools/call echo through the era bridge: $out"
  fi

  # Kill every server process from inside the container: the guards reap them, the proxy
  # restarts a child, the session's next call works, and nothing is left as a zombie.
  before=$(procs "$cid" starts "$everything_cmd")
  if [[ -n $before ]]; then
    r0=$(restarts)
    procs "$cid" kill SIGKILL $before
    if out=$(until_noticed "$r0" "$before" both); then
      pass "server processes $before killed (SIGKILL) in the container; the proxy restarted: $out"
    else
      fail "no restart after killing $before: $out"
    fi
    if out=$(client legacy "$mcp" "$sid" tools/call '{"name": "echo", "arguments": {"message": "after the kill"}}') \
        && grep -q "after the kill" <<<"$out"; then
      pass "the session's next call is answered by a new child: $out"
    else
      fail "call after killing the server processes $before: $out"
    fi
  else
    fail "no server-everything process found in the container"
  fi
  if out=$(until_procs "$cid" 0 zombies); then pass "no zombie after the kill: $out"; else fail "zombies after the kill: $out"; fi

  # An orphan: the server outlives its guard and dies as a child of PID 1, which must reap it.
  r0=$(restarts); before=$(procs "$cid" starts "$everything_cmd")
  if orphan_pid=$(orphan); then
    if out=$(until_procs "$cid" 0 zombies); then
      pass "orphaned server $orphan_pid (guard killed, re-parented to PID 1, then killed) reaped by tini: zombies $out"
    else
      fail "orphaned server $orphan_pid left a zombie: $out"
    fi
  else
    fail "orphan set-up: $orphan_pid"
  fi
  out=$(until_noticed "$r0" "$before") || fail "the proxy did not notice the orphan's death: $out"
  if out=$(client legacy "$mcp" "$sid" tools/call '{"name": "echo", "arguments": {"message": "after the orphan"}}') \
      && grep -q "after the orphan" <<<"$out"; then
    pass "the session is served again after the orphan's death: $out"
  else
    fail "call after the orphan's death: $out"
  fi
  echo "---- processes in the container before docker stop"; procs "$cid" table | sed 's/^/    /'

  # docker stop: SIGTERM reaches the proxy through tini; it drains (no call in flight), stops its
  # children and exits 0, well within the shutdown grace (20 s) and docker's timeout (40 s).
  t0=$(date +%s)
  timeout 90 docker stop -t 40 "$cid" >/dev/null 2>&1
  took=$(($(date +%s) - t0))
  state=$(docker inspect -f '{{.State.Status}} exit {{.State.ExitCode}} oom {{.State.OOMKilled}}' "$cid" 2>&1)
  if [[ $state == "exited exit 0 oom false" && $took -lt 40 ]]; then
    pass "docker stop: $state after ${took}s (within the 40 s grace)"
  else
    fail "docker stop: $state after ${took}s"
  fi
  docker rm -f "$cid" >/dev/null 2>&1 && cid=""
fi

# The same orphan without an init (the entrypoint overridden, the proxy as PID 1): the check above
# must be able to see a zombie, and tini is what prevents it.
info "control: $everything_image without tini (the proxy as PID 1)"
sidecar_opts=(--entrypoint mcp-recovery-proxy)  # an overridden entrypoint drops the CMD: give it again
if run_sidecar control "$everything_image" serve -- mcp-server-everything stdio; then
  # A session, so that a child (and its guard) surely runs: the warm spare may not have started.
  client legacy-open "$mcp" >/dev/null || fail "control: 2025-11-25 initialize"
  if orphan_pid=$(orphan); then
    if out=$(until_procs "$cid" 1 zombies); then
      pass "control: without an init the orphan stays a zombie ($out): the zombie check sees one"
    else
      fail "control: no zombie without tini ($out): the zombie check proves nothing"
    fi
  else
    fail "control: orphan set-up: $orphan_pid"
  fi
  docker rm -f "$cid" >/dev/null 2>&1 && cid=""
fi
sidecar_opts=()

if [[ ${MCP_SMOKE_SKIP_PYTHON:-0} == 1 ]]; then
  echo "SKIP the Python example (MCP_SMOKE_SKIP_PYTHON=1)"
else
info "mcp-server-time (Python, stdio, its own venv) as the proxy's child in $time_image"
if run_sidecar time "$time_image"; then
  if out=$(client modern "$mcp" tools/list) && grep -q "get_current_time" <<<"$out"; then
    pass "2026-07-28 tools/list: $out"
  else
    fail "2026-07-28 tools/list: $out"
  fi
  if out=$(client modern "$mcp" tools/call get_current_time '{"timezone": "UTC"}') && grep -q '"timezone' <<<"$out"; then
    pass "2026-07-28 tools/call get_current_time: $out"
  else
    fail "2026-07-28 tools/call get_current_time: $out"
  fi
  if sid_line=$(client legacy-open "$mcp"); then
    sid=${sid_line%% *}; pass "2025-11-25 session opened: $sid_line"
  else
    fail "2025-11-25 initialize: $sid_line"; sid=none
  fi
  if out=$(client legacy "$mcp" "$sid" tools/call '{"name": "get_current_time", "arguments": {"timezone": "Europe/Paris"}}') \
      && grep -q "Europe/Paris" <<<"$out"; then
    pass "2025 tools/call get_current_time: $out"
  else
    fail "2025 tools/call get_current_time: $out"
  fi
  if out=$(timeout 60 docker exec "$cid" sh -c '/opt/venv/bin/pip check && /opt/server/bin/pip check' 2>&1); then
    pass "the proxy's venv and the server's venv are each consistent (pip check): $(tr '\n' ' ' <<<"$out")"
  else
    fail "pip check: $out"
  fi
  if out=$(until_procs "$cid" 0 zombies); then pass "no zombie: $out"; else fail "zombies: $out"; fi
  t0=$(date +%s)
  timeout 90 docker stop -t 40 "$cid" >/dev/null 2>&1
  took=$(($(date +%s) - t0))
  state=$(docker inspect -f '{{.State.Status}} exit {{.State.ExitCode}} oom {{.State.OOMKilled}}' "$cid" 2>&1)
  if [[ $state == "exited exit 0 oom false" && $took -lt 40 ]]; then
    pass "docker stop: $state after ${took}s"
  else
    fail "docker stop: $state after ${took}s"
  fi
  docker rm -f "$cid" >/dev/null 2>&1 && cid=""
fi
fi
fi

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
