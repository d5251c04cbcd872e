"""The relay benchmark: direct against through the proxy, HTTP→stdio and HTTP→HTTP, in one run.

    .venv/bin/python bench/relay.py                     # 10 s a leg, concurrency 1 and 16, wait 0 and 5 ms
    .venv/bin/python bench/relay.py --duration 5 --concurrency 16 --wait-ms 5
    .venv/bin/python bench/relay.py --profile bench/out  # then one py-spy leg per topology

Not a test and not in CI (two shared cores, minutes of load). Every leg is a `wrk` run (Debian
package `wrk`; installed with apt-get when missing) posting the same stateless 2026-07-28
`tools/call` (`echo`) with the era's headers, so each request is an independent POST, identical
for the direct and the proxied leg. Legs:

- `direct`      wrk → the SDK's MCPServer over Streamable HTTP (`bench/upstream.py`): the yardstick.
- `http→stdio`  wrk → proxy → the same server over stdio (a child of the proxy). There is no
                "direct over HTTP" for a stdio server, so its baseline is that server served by the
                SDK over HTTP, i.e. the `direct` row: what you would run instead of the proxy.
- `http→http`   wrk → proxy → the very SDK HTTP server of the `direct` row.
- `nginx`       wrk → nginx (Debian's, one foreground process on a generated loopback config,
                keep-alive upstream) → that server: what a bare HTTP hop costs.
- `pyhop`       wrk → a bare TCP byte relay on uvloop (`bench/byte_relay.py`: no HTTP parsed) →
                that server: what a hop written in Python costs when it only moves the bytes.
- `pyterm`      wrk → a minimal terminating relay on uvloop (`bench/term_relay.py`: each request
                and answer parsed, HTTP and JSON, in the protocols' callbacks, nothing else) →
                that server: the least a Python hop that reads each MCP message can spend.
- `http→stdio bridged`  (`--rows bridge`, `--era modern`) wrk → proxy → the same stdio server made
                2025-only by a wrapper (tests/conformance/everything_stdio_2025_only.py, counted as
                the server): each 2026 call goes through the proxy's era bridge onto a 2025 session.
- `mcp-proxy`, `supergateway`   wrk → the peer bridge → the same server over stdio (installed by
                scripts/setup-peers.sh; 2025 sessions only, `--era legacy`).
`--rows` picks among them (default all).

Each leg runs after a short warm-up, bounded by `--duration` and by `--max-requests`. CPU comes
from /proc/PID/stat (utime+stime, all threads) before and after the leg, divided by the completed
requests, per process: the upstream server alone (the SDK HTTP server, or the stdio server found
in the hop's process tree by its command line), and the middle hop's other processes (the proxy
and its stdio guard, nginx, mcp-proxy, supergateway's Node); the direct leg's upstream CPU is
what the yardstick itself costs. `busy%` is the whole machine's CPU use during
the leg (from /proc/stat, 100% = every core): with other work on the machine it tells how noisy a
row is.

Targets: proxy CPU at most 1.0 ms per relayed call on HTTP→stdio and 1.5 ms on
HTTP→HTTP, and at most twice nginx's hop in the same run; the upstream's CPU per call within 5%
of direct's (of the cheapest peer bridge's, over stdio); and with an upstream that waits
(`--wait-ms 5`, asyncio.sleep, not CPU) throughput within 10% of direct. Every process started
here is stopped by its pid, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UPSTREAMS = {"sdk": REPO / "bench" / "upstream.py", "lean": REPO / "bench" / "lean_upstream.py"}
UPSTREAM = UPSTREAMS["lean"]
RELAY = "engine"  # engine: the proxy as shipped; plain / engine-quiet: bench/_plain_relay.py
PYTHON = sys.executable
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
CPU_TARGET_MS = {"http→stdio": 1.0, "http→http": 1.5}
ROWS = ("direct", "nginx", "pyhop", "pyterm", "mcp-proxy", "supergateway", "stdio", "bridge", "http")
# The same stdio server made 2025-only (a wrapper that refuses 2026-07-28 as such a server does), so
# that 2026 calls go through the proxy's era bridge: the `bridge` row, beside the native `stdio` one.
LEGACY_ONLY = REPO / "tests" / "conformance" / "everything_stdio_2025_only.py"
PEER_LEGS = ("mcp-proxy", "supergateway")  # the HTTP→stdio bridges the proxy's stdio row is held against
THROUGHPUT_TARGET = 0.10  # proxied calls/s at most 10% below direct, with a waiting upstream

PROTOCOL = "2026-07-28"
BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "echo",
            "arguments": {"text": "hello"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    },
    separators=(",", ":"),
)
HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": PROTOCOL,
    "Mcp-Method": "tools/call",
    "Mcp-Name": "echo",
}

# A request counts as completed when it is a 200 whose body holds a non-error result; anything
# else is counted apart and the leg is flagged. `done` prints one JSON line the runner parses.
WRK_LUA = r"""
wrk.method = "POST"
wrk.body = [==[%(body)s]==]
%(headers)s
local max_per_thread = tonumber(os.getenv("BENCH_MAX_PER_THREAD") or "0")
local threads = {}
function setup(thread) table.insert(threads, thread); thread:set("tid", #threads) end
function init(args) ok = 0; bad = 0 end
function response(status, headers, body)
  local good = body:find('"result"', 1, true) and not body:find('"isError":true', 1, true)
  if status == 200 and good then
    ok = ok + 1
  else
    bad = bad + 1
  end
  if max_per_thread > 0 and ok + bad >= max_per_thread then wrk.thread:stop() end
end
function done(summary, latency, requests)
  local ok_total, bad_total = 0, 0
  for _, t in ipairs(threads) do ok_total = ok_total + t:get("ok"); bad_total = bad_total + t:get("bad") end
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%%d,"duration_us":%%d,"ok":%%d,"bad":%%d,' ..
    '"connect":%%d,"read":%%d,"write":%%d,"status":%%d,"timeout":%%d,' ..
    '"p50_us":%%d,"p99_us":%%d,"max_us":%%d}\n',
    summary.requests, summary.duration, ok_total, bad_total, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


# --------------------------------------------------------------------------- processes


class Processes:
    """Every process this run starts, stopped by pid (SIGTERM, then SIGKILL) in reverse order."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._extra_pids: set[int] = set()

    def start(
        self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            # A session of its own: Ctrl-C reaches only this script, which then stops them in order.
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd or REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env=env,
            )
        self._procs.append(proc)
        return proc

    def watch(self, pids: Sequence[int]) -> None:
        """Descendants (the stdio guard and upstream) to make sure of after their parent stops."""
        self._extra_pids.update(pids)

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout_s)
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self._procs)):
            self.stop(proc)
        # The proxy's guard stops the stdio upstream when the proxy goes; wait for that, bounded,
        # and only then end a straggler ourselves, by its pid.
        deadline = time.monotonic() + 5.0
        while self._extra_pids and time.monotonic() < deadline:
            self._extra_pids = {p for p in self._extra_pids if _alive(p)}
            time.sleep(0.05)
        for pid in self._extra_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._extra_pids.clear()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def cpu_s(pid: int) -> float:
    """utime+stime of one process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # fields 14 and 15 of stat(5)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of all cores, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    total = sum(vals[:8])
    return total - idle, total


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check, what: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {log}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            if check():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout_s}s; log {log}")
        time.sleep(0.05)


def port_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


def ready(admin_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=1.0) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


# --------------------------------------------------------------------------- wrk


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    print("bench: `wrk` is missing; installing the Debian package `wrk` with apt-get ...", file=sys.stderr)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    cmd = [*sudo, "apt-get", "install", "-y", "wrk"]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update"], stdout=subprocess.DEVNULL)
        subprocess.run(cmd, stdout=subprocess.DEVNULL)
    found = shutil.which("wrk")
    if not found:
        sys.exit("bench: could not install `wrk`; install it (apt-get install wrk) and run again")
    return found


@dataclass
class WrkResult:
    requests: int
    ok: int
    bad: int
    errors: int
    duration_s: float
    p50_ms: float
    p99_ms: float


def run_wrk(wrk: str, lua: Path, url: str, concurrency: int, duration_s: float, max_requests: int) -> WrkResult:
    threads = 1  # one wrk thread drives 16 connections easily and leaves the cores to what we measure
    env = {**os.environ, "BENCH_MAX_PER_THREAD": str(max_requests // threads if max_requests else 0)}
    argv = [
        wrk,
        "-t",
        str(threads),
        "-c",
        str(concurrency),
        "-d",
        f"{max(1, round(duration_s))}s",
        "--timeout",
        "10s",
        "-s",
        str(lua),
        url,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=duration_s + 60).stdout
    m = re.search(r"^BENCH (\{.*\})$", out, re.M)
    if not m:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    d = json.loads(m.group(1))
    return WrkResult(
        requests=d["requests"],
        ok=d["ok"],
        bad=d["bad"],
        errors=d["connect"] + d["read"] + d["write"] + d["timeout"],
        duration_s=d["duration_us"] / 1e6,
        p50_ms=d["p50_us"] / 1000,
        p99_ms=d["p99_us"] / 1000,
    )


def write_lua(path: Path, session_id: str | None = None) -> Path:
    """The wrk script: the 2026 request, or (with `session_id`) the 2025 one inside that session."""
    if session_id is None:
        body, hdrs = BODY, HEADERS
    else:
        body, hdrs = LEGACY_BODY, {**LEGACY_HEADERS, "Mcp-Session-Id": session_id}
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in hdrs.items())
    script = WRK_LUA % {"body": body, "headers": headers}
    if session_id is not None:
        # Within a 2025 session every request needs an id of its own: the server ties each answer
        # to its request by id, and sixteen requests in flight with one id get each other's
        # answers (or none). A 2026 request stands alone, so its one body serves every request.
        head, tail = body.split('"id":1', 1)
        script += LEGACY_IDS_LUA % {"head": head + '"id":', "tail": tail}
    path.write_text(script)
    return path


LEGACY_IDS_LUA = r"""
local sent = 0
function request()
  sent = sent + 1
  local id = string.format("%%d", tid * 1000000000 + sent)
  return wrk.format(nil, nil, nil, [==[%(head)s]==] .. id .. [==[%(tail)s]==])
end
"""


LEGACY_PROTOCOL = "2025-11-25"
LEGACY_BODY = json.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hello"}}},
    separators=(",", ":"),
)
LEGACY_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": LEGACY_PROTOCOL,
}


def open_session(url: str) -> str:
    """A 2025 session for the legacy legs: initialize, then notifications/initialized."""
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY_PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "bench-relay", "version": "1"},
        },
    }
    hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    request = urllib.request.Request(url, data=json.dumps(init).encode(), headers=hdrs, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        session_id = response.headers.get("Mcp-Session-Id")
        response.read()
    if not session_id:
        raise RuntimeError(f"{url} answered initialize without an Mcp-Session-Id")
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    hdrs = {**hdrs, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": LEGACY_PROTOCOL}
    request = urllib.request.Request(url, data=json.dumps(note).encode(), headers=hdrs, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
    return session_id


# --------------------------------------------------------------------------- legs


@dataclass
class Leg:
    run: int
    wait_ms: float
    leg: str  # direct | http→stdio | http→http
    concurrency: int
    calls: int
    bad: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    proxy_cpu_ms: float | None  # per call
    upstream_cpu_ms: float  # per call: the SDK server (direct, http→http) or the stdio guard+child
    busy_pct: float
    notes: list[str] = field(default_factory=list)


def measure(
    wrk: str,
    lua: Path,
    *,
    url: str,
    concurrency: int,
    args: argparse.Namespace,
    processes: Callable[[], tuple[list[int], list[int]]],
) -> tuple[WrkResult, float | None, float, float, list[int]]:
    """One leg: warm up, then wrk with CPU read before and after. `processes()` names the middle
    hop's pids and the upstream server's, read after the warm-up (a hop may start children in it:
    a 2025 session's, a pool's). CPU figures in seconds: the hop's (None without a hop) and the
    upstream's; last, the upstream servers that appeared during the measured leg (not counted:
    their CPU would include their own start)."""
    if args.warmup > 0:
        run_wrk(wrk, lua, url, concurrency, args.warmup, 0)
    hop_pids, upstream_pids = processes()
    p0 = sum(cpu_s(p) for p in hop_pids)
    u0 = sum(cpu_s(p) for p in upstream_pids)
    m0 = machine_cpu()
    res = run_wrk(wrk, lua, url, concurrency, args.duration, args.max_requests)
    m1 = machine_cpu()
    p1 = sum(cpu_s(p) for p in hop_pids)
    u1 = sum(cpu_s(p) for p in upstream_pids)
    busy = 100.0 * (m1[0] - m0[0]) / max(1, m1[1] - m0[1])
    late = [p for p in processes()[1] if p not in upstream_pids]
    return res, (p1 - p0) if hop_pids else None, u1 - u0, busy, late


def start_upstream_http(
    procs: Processes, wait_ms: float, workdir: Path, json_answers: bool = False
) -> tuple[subprocess.Popen[bytes], int]:
    """The upstream over HTTP; `json_answers`: the SDK server answers a 2025 session's POSTs with
    a JSON body instead of an event stream (its `json_response` switch)."""
    port = free_port()
    log = workdir / f"upstream-http-{port}.log"
    argv = [PYTHON, str(UPSTREAM), "--transport", "http", "--port", str(port), "--wait-ms", str(wait_ms)]
    proc = procs.start([*argv, *(["--json-response"] if json_answers else [])], log)
    wait_until(lambda: port_open(port), "SDK HTTP upstream", proc, log)
    return proc, port


NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid %(dir)s/nginx.pid;
error_log %(dir)s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %(dir)s/body;
    proxy_temp_path %(dir)s/proxy;
    fastcgi_temp_path %(dir)s/fastcgi;
    uwsgi_temp_path %(dir)s/uwsgi;
    scgi_temp_path %(dir)s/scgi;
    upstream mcp { server 127.0.0.1:%(up_port)d; keepalive 64; }
    server {
        listen 127.0.0.1:%(port)d;
        location / {
            proxy_pass http://mcp;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_read_timeout 60s;
        }
    }
}
"""


def ensure_nginx() -> str:
    """Debian's `nginx`, installed with apt-get when missing (its service is not what we run: the
    benchmark starts its own, in the foreground, on a generated config)."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found:
        return found
    print("bench: `nginx` is missing; installing the Debian package `nginx` with apt-get ...", file=sys.stderr)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    cmd = [*sudo, "apt-get", "install", "-y", "nginx"]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update"], stdout=subprocess.DEVNULL)
        subprocess.run(cmd, stdout=subprocess.DEVNULL)
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not found:
        sys.exit("bench: could not install `nginx`; install it (apt-get install nginx) or leave out --rows nginx")
    return found


def start_nginx(procs: Processes, up_port: int, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """nginx in the foreground, one process (no master), on loopback in front of the upstream:
    HTTP/1.1 keep-alive to it, unbuffered (event streams pass as they come)."""
    port = free_port()
    home = workdir / f"nginx-{port}"
    home.mkdir()
    conf = home / "nginx.conf"
    conf.write_text(NGINX_CONF % {"dir": home, "up_port": up_port, "port": port})
    log = workdir / f"nginx-{port}.log"
    proc = procs.start([ensure_nginx(), "-p", str(home), "-e", str(home / "error.log"), "-c", str(conf)], log)
    wait_until(lambda: port_open(port), "nginx", proc, log)
    return proc, port


PEERS = REPO / ".cache" / "peers" / "manifest.json"


def peer(name: str) -> dict[str, str]:
    """The peer bridges' entry points, as scripts/setup-peers.sh installed them."""
    if not PEERS.exists():
        sys.exit(f"bench: the {name} row needs scripts/setup-peers.sh (it installs mcp-proxy and supergateway)")
    return dict(json.loads(PEERS.read_text()))


def start_mcp_proxy(procs: Processes, stdio_cmd: Sequence[str], workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """mcp-proxy (PyPI) serving the stdio server over Streamable HTTP at /mcp (stateful)."""
    port = free_port()
    log = workdir / f"mcp-proxy-{port}.log"
    argv = [peer("mcp-proxy")["mcp_proxy"], "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    proc = procs.start([*argv, "--", *stdio_cmd], log)
    wait_until(lambda: port_open(port), "mcp-proxy", proc, log)
    return proc, port


def start_supergateway(
    procs: Processes, stdio_cmd: Sequence[str], workdir: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """supergateway (npm) serving the stdio server over Streamable HTTP at /mcp, `--stateful` (a
    child per session, as the proxy's 2025 sessions have)."""
    port = free_port()
    log = workdir / f"supergateway-{port}.log"
    m = peer("supergateway")
    argv = [m["node"], m["supergateway"], "--stdio", shlex.join(stdio_cmd), "--outputTransport", "streamableHttp"]
    argv += ["--stateful", "--port", str(port), "--logLevel", "none"]
    proc = procs.start(argv, log)
    wait_until(lambda: port_open(port), "supergateway", proc, log)
    return proc, port


def start_proxy(
    procs: Processes, upstream: Sequence[str] | str, workdir: Path, extra: Sequence[str], tree: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """A proxy in front of `upstream`; with `tree`, the proxy of that checkout (an older commit,
    say) instead of this one's, run by the same interpreter and dependencies."""
    port, admin = free_port(), free_port()
    log = workdir / f"proxy-{port}.log"
    entry = ["-m", "proxy"] if RELAY == "engine" else [str((tree or REPO) / "bench" / "_plain_relay.py")]
    argv = [PYTHON, *entry, "serve", "--listen", f"http://127.0.0.1:{port}/mcp", "--admin", f"127.0.0.1:{admin}"]
    argv += list(extra)
    argv += ["--upstream", upstream] if isinstance(upstream, str) else ["--", *upstream]
    env = {**os.environ, "BENCH_RELAY": RELAY}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)  # ahead of this checkout's editable install
    proc = procs.start(argv, log, env=env, cwd=tree)
    wait_until(lambda: ready(admin), "proxy", proc, log, timeout_s=60)
    return proc, port


def start_python_relay(procs: Processes, row: str, up_port: int, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A Python yardstick hop in front of the upstream: `pyhop`, bench/byte_relay.py (parses
    nothing), or `pyterm`, bench/term_relay.py (parses each message, no more)."""
    script = {"pyhop": "byte_relay.py", "pyterm": "term_relay.py"}[row]
    port = free_port()
    log = workdir / f"{row}-{port}.log"
    proc = procs.start([PYTHON, str(REPO / "bench" / script), str(port), str(up_port)], log)
    wait_until(lambda: port_open(port), script, proc, log)
    return proc, port


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


@dataclass
class Hop:
    """One row's path: the URL wrk posts to, the middle hop's process (its tree, less the upstream
    server, is the hop's CPU; None for the direct row) and the upstream server's pid (None: a
    stdio server, found in the hop's tree when the leg starts, since a 2025 session may start it)."""

    leg: str
    url: str
    hop: subprocess.Popen[bytes] | None
    server_pid: int | None


def run_once(
    run: int, wait_ms: float, args: argparse.Namespace, wrk: str, lua: Path, procs: Processes, workdir: Path
) -> list[Leg]:
    legs: list[Leg] = []
    started: list[subprocess.Popen[bytes]] = []
    up, up_port = start_upstream_http(procs, wait_ms, workdir, args.json_answers)
    started.append(up)
    up_url = f"http://127.0.0.1:{up_port}/mcp"
    stdio_cmd = [PYTHON, str(UPSTREAM), "--transport", "stdio", "--wait-ms", str(wait_ms)]
    hops: list[Hop] = []
    try:
        for row in args.rows:
            if row == "direct":
                hops.append(Hop("direct", up_url, None, up.pid))
            elif row in ("pyhop", "pyterm"):
                py, py_port = start_python_relay(procs, row, up_port, workdir)
                hops.append(Hop(row, f"http://127.0.0.1:{py_port}/mcp", py, up.pid))
            elif row == "nginx":
                nx, nx_port = start_nginx(procs, up_port, workdir)
                started.append(nx)
                hops.append(Hop("nginx", f"http://127.0.0.1:{nx_port}/mcp", nx, up.pid))
            elif row in PEER_LEGS and args.era == "modern":
                # Neither peer serves a request without a session (2026-07-28): 2025 rows only.
                print(f"  {row}: left out of the modern era (it needs a 2025 session); --era legacy measures it")
            elif row == "mcp-proxy":
                mp, mp_port = start_mcp_proxy(procs, stdio_cmd, workdir)
                started.append(mp)
                hops.append(Hop("mcp-proxy", f"http://127.0.0.1:{mp_port}/mcp", mp, None))
            elif row == "supergateway":
                sg, sg_port = start_supergateway(procs, stdio_cmd, workdir)
                started.append(sg)
                hops.append(Hop("supergateway", f"http://127.0.0.1:{sg_port}/mcp", sg, None))
            elif row == "stdio":
                px, port = start_proxy(procs, stdio_cmd, workdir, args.proxy_arg)
                started.append(px)
                hops.append(Hop("http→stdio", f"http://127.0.0.1:{port}/mcp", px, None))
                if args.baseline_tree is not None:  # the same leg through the baseline checkout's proxy
                    bx, bport = start_proxy(procs, stdio_cmd, workdir, args.proxy_arg, tree=args.baseline_tree)
                    started.append(bx)
                    hops.append(Hop("http→stdio base", f"http://127.0.0.1:{bport}/mcp", bx, None))
            elif row == "bridge" and args.era == "legacy":
                print("  bridge: left out of the legacy era (2025 calls need no bridge); --era modern measures it")
            elif row == "bridge":
                px, port = start_proxy(procs, [PYTHON, str(LEGACY_ONLY), *stdio_cmd[1:]], workdir, args.proxy_arg)
                started.append(px)
                hops.append(Hop("http→stdio bridged", f"http://127.0.0.1:{port}/mcp", px, None))
            elif row == "http":
                px, port = start_proxy(procs, up_url, workdir, args.proxy_arg)
                started.append(px)
                hops.append(Hop("http→http", f"http://127.0.0.1:{port}/mcp", px, up.pid))
                if args.baseline_tree is not None:
                    bx, bport = start_proxy(procs, up_url, workdir, args.proxy_arg, tree=args.baseline_tree)
                    started.append(bx)
                    hops.append(Hop("http→http base", f"http://127.0.0.1:{bport}/mcp", bx, up.pid))
        # Odd runs take the rows in their order, even runs in reverse: this VM's speed drifts by
        # 10-30% within minutes, and a fixed order would hand that drift to whichever row is last.
        order = hops if run % 2 else hops[::-1]
        for conc in args.concurrency:
            for h in order:
                leg_lua = lua
                if args.era == "legacy":  # one 2025 session per leg (its own stdio child behind a bridge)
                    leg_lua = write_lua(workdir / f"legacy-{run}-{conc}-{len(legs)}.lua", open_session(h.url))

                def processes(h: Hop = h) -> tuple[list[int], list[int]]:
                    tree = descendants(h.hop.pid) if h.hop is not None else []
                    if h.hop is not None:
                        procs.watch(tree)
                    servers = [h.server_pid] if h.server_pid is not None else stdio_servers(tree)
                    return ([] if h.hop is None else [h.hop.pid, *(p for p in tree if p not in servers)]), servers

                res, p_cpu, u_cpu, busy, late = measure(
                    wrk, leg_lua, url=h.url, concurrency=conc, args=args, processes=processes
                )
                servers = processes()[1]
                calls = res.ok
                leg = Leg(
                    run=run,
                    wait_ms=wait_ms,
                    leg=h.leg,
                    concurrency=conc,
                    calls=calls,
                    bad=res.bad + res.errors,
                    calls_per_s=calls / res.duration_s if res.duration_s else 0.0,
                    p50_ms=res.p50_ms,
                    p99_ms=res.p99_ms,
                    proxy_cpu_ms=None if p_cpu is None else 1000 * p_cpu / max(1, calls),
                    upstream_cpu_ms=1000 * u_cpu / max(1, calls),
                    busy_pct=busy,
                )
                if leg.bad:
                    leg.notes.append(f"{leg.bad} failed requests")
                if not calls:
                    leg.notes.append("no call answered")
                if not servers:
                    leg.notes.append("no upstream server process found")
                if late:
                    leg.notes.append(f"{len(late)} upstream process(es) started during the leg, their CPU not counted")
                legs.append(leg)
                print(
                    f"  run {run} wait {wait_ms:g} ms  {h.leg:<15} c={conc:<3} {leg.calls_per_s:8.0f} calls/s "
                    f"p50 {leg.p50_ms:6.2f} ms  p99 {leg.p99_ms:6.2f} ms  "
                    f"hop CPU {fmt(leg.proxy_cpu_ms, '.3f')} ms/call  "
                    f"upstream CPU {leg.upstream_cpu_ms:.3f} ms/call  busy {busy:3.0f}%"
                    + (f"  ({'; '.join(leg.notes)})" if leg.notes else ""),
                    flush=True,
                )
    finally:
        for p in reversed(started):
            procs.stop(p)
    return legs


def stdio_servers(tree: Sequence[int]) -> list[int]:
    """The stdio upstream servers among `tree`: the processes running the upstream script itself
    (`python UPSTREAM ...`), not the guard, shell or bridge whose command line merely names it; the
    2025-only wrapper of the `bridge` row counts as the server it stands for."""
    found = []
    ours = (str(UPSTREAM).encode(), str(LEGACY_ONLY).encode())
    for pid in tree:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and Path(argv[0].decode()).name.startswith("python") and argv[1] in ours:
            found.append(pid)
    return found


def verdicts(legs: list[Leg]) -> list[tuple[Leg, str, str]]:
    """Each leg with its comparison to direct and, for the proxy's, its verdicts against the
    targets: its own CPU per call (`CPU_TARGET_MS`), at most twice nginx's hop CPU in the same run
    (`hop≤2x nginx`), the upstream's CPU per call within 5% of what it spends without the proxy
    (`up≤+5%`: direct for http→http, the cheapest peer bridge for http→stdio), and with a waiting
    upstream throughput within 10% of direct."""
    key = lambda x: (x.run, x.wait_ms, x.concurrency)  # noqa: E731
    direct = {key(x): x for x in legs if x.leg == "direct"}
    nginx = {key(x): x for x in legs if x.leg == "nginx"}
    peers: dict[tuple[int, float, int], float] = {}
    for x in legs:
        if x.leg in PEER_LEGS and x.calls:
            k = key(x)
            peers[k] = min(peers.get(k, x.upstream_cpu_ms), x.upstream_cpu_ms)
    out = []
    for x in legs:
        if x.leg == "direct":
            out.append((x, "baseline", ""))
            continue
        d = direct.get(key(x))
        ratio = x.calls_per_s / d.calls_per_s if d and d.calls_per_s else 0.0
        # without a direct leg in the run (--rows without direct) there is nothing to compare with
        cmp_ = f"{100 * (ratio - 1):+.1f}% calls/s, p50 {x.p50_ms - d.p50_ms:+.2f} ms" if d else "-"
        checks = []
        target = CPU_TARGET_MS.get(x.leg.removesuffix(" base"))
        if target is not None:
            checks.append(f"CPU≤{target:g}: {'PASS' if (x.proxy_cpu_ms or 0) <= target else 'FAIL'}")
            n = nginx.get(key(x))
            if n is not None and n.proxy_cpu_ms:
                checks.append(f"hop≤2x nginx: {'PASS' if (x.proxy_cpu_ms or 0) <= 2 * n.proxy_cpu_ms else 'FAIL'}")
            base = peers.get(key(x)) if x.leg.startswith("http→stdio") else (d.upstream_cpu_ms if d else None)
            if base:
                checks.append(f"up≤+5%: {'PASS' if x.upstream_cpu_ms <= 1.05 * base else 'FAIL'}")
            if x.wait_ms > 0 and d:
                checks.append(f"thr≥-10%: {'PASS' if ratio >= 1 - THROUGHPUT_TARGET else 'FAIL'}")
        if x.bad or not x.calls:
            checks.append("ERRORS")
        out.append((x, cmp_, "  ".join(checks)))
    return out


def print_table(legs: list[Leg]) -> None:
    head = (
        f"{'run':>3} {'wait':>5} {'leg':<15} {'c':>3} {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'hop ms/call':>13} {'upstr ms/call':>13} {'busy':>5}  {'vs direct':<30} targets"
    )
    print(head)
    print("-" * len(head))
    for x, cmp_, checks in verdicts(legs):
        print(
            f"{x.run:>3} {x.wait_ms:>4g}ms {x.leg:<15} {x.concurrency:>3} {x.calls_per_s:>8.0f} "
            f"{x.p50_ms:>7.2f} {x.p99_ms:>7.2f} "
            f"{fmt(x.proxy_cpu_ms, '.3f'):>13} {x.upstream_cpu_ms:>13.3f} {x.busy_pct:>4.0f}%  {cmp_:<30} {checks}"
        )


def print_medians(legs: list[Leg]) -> None:
    """With several runs: each proxied leg's median change of calls/s against its own run's direct
    leg, and the throughput verdict on that median. One 8-second leg moves a couple of points
    either way on a shared two-core VM; the median of interleaved runs is the steadier reading."""
    runs = {x.run for x in legs}
    if len(runs) < 2:
        return
    direct = {(x.run, x.wait_ms, x.concurrency): x for x in legs if x.leg == "direct"}
    changes: dict[tuple[float, str, int], list[float]] = collections.defaultdict(list)
    for x in legs:
        d = direct.get((x.run, x.wait_ms, x.concurrency))
        if x.leg != "direct" and d is not None and d.calls_per_s:
            changes[(x.wait_ms, x.leg, x.concurrency)].append(x.calls_per_s / d.calls_per_s - 1)
    if not changes:
        return  # no direct leg in these rows
    print(f"\nmedian over {len(runs)} runs (calls/s against the same run's direct leg):")
    for (wait, leg, conc), values in sorted(changes.items()):
        values.sort()
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        spread = ", ".join(f"{100 * v:+.1f}%" for v in values)
        verdict = f"  thr≥-10%: {'PASS' if median >= -THROUGHPUT_TARGET else 'FAIL'}" if wait > 0 else ""
        print(f"  {wait:>4g}ms {leg:<15} c={conc:<3} median {100 * median:+.1f}%  ({spread}){verdict}")


# --------------------------------------------------------------------------- profile


def profile(args: argparse.Namespace, wrk: str, lua: Path, procs: Processes, workdir: Path) -> None:
    """One extra leg per topology with py-spy attached (not measured: sampling costs CPU too)."""
    py_spy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("bench: py-spy is missing; install it with `.venv/bin/pip install py-spy`", file=sys.stderr)
        return
    out_dir = Path(args.profile)
    out_dir.mkdir(parents=True, exist_ok=True)
    up, up_port = start_upstream_http(procs, args.profile_wait_ms, workdir, args.json_answers)
    stdio_cmd = [PYTHON, str(UPSTREAM), "--transport", "stdio", "--wait-ms", str(args.profile_wait_ms)]
    conc = args.profile_concurrency
    try:
        for name, target in (("http-stdio", stdio_cmd), ("http-http", f"http://127.0.0.1:{up_port}/mcp")):
            px, port = start_proxy(procs, target, workdir, args.proxy_arg)
            procs.watch(descendants(px.pid))
            url = f"http://127.0.0.1:{port}/mcp"
            run_wrk(wrk, lua, url, conc, max(args.warmup, 1.0), 0)
            secs = int(args.duration)
            raw, svg = out_dir / f"profile-{name}.txt", out_dir / f"profile-{name}.svg"
            spies = [
                subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "--nonblocking",
                        "-r",
                        "200",
                        "-d",
                        str(secs),
                        "-p",
                        str(px.pid),
                        "-f",
                        fmt_,
                        "-o",
                        str(path),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                for fmt_, path in (("raw", raw), ("flamegraph", svg))
            ]
            res = run_wrk(wrk, lua, url, conc, secs + 1, 0)
            for spy in spies:
                try:
                    spy.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(spy.pid, signal.SIGKILL)
                    spy.wait()
            procs.stop(px)
            print(f"\nprofile {name} (c={conc}, {res.ok} calls under py-spy): {raw}, {svg}")
            if raw.exists():
                (out_dir / f"profile-{name}.json").write_text(json.dumps(hotspots(raw, args.top), indent=1))
                print_hotspots(raw, args.top)
    finally:
        procs.stop(up)


IDLE_LEAVES = ("EpollSelector.select (selectors.py)",)
# Layers, for an exclusive split: a sample goes to the layer of the frame nearest its leaf that
# belongs to one (so the proxy's app does not count as "uvicorn" because uvicorn calls it).
LAYERS = (
    ("pipe write syscalls (asyncio _UnixWritePipeTransport.write)", ("_UnixWritePipeTransport.write",)),
    ("socket write syscalls (asyncio _SelectorSocketTransport.write)", ("_SelectorSocketTransport.write",)),
    ("importlib (an import attempted per call)", ("importlib._bootstrap",)),
    ("logging", ("logging/__init__.py",)),
    ("h11 + uvicorn (downstream HTTP server)", ("uvicorn/", "h11/")),
    ("httpx + httpcore (upstream HTTP client)", ("httpx/", "httpcore/")),
    ("anyio", ("anyio/",)),
    ("mcp SDK", ("(mcp/",)),
    ("orjson / json", ("orjson", "(json/")),
    ("proxy/frontend", ("proxy/frontend/",)),
    ("proxy/engine + recovery + policy", ("proxy/core/engine.py", "proxy/recovery/", "proxy/policy/")),
    ("proxy/relay + jsonrpc + service", ("proxy/core/relay.py", "proxy/jsonrpc.py", "proxy/core/service.py")),
    ("proxy/upstream", ("proxy/upstream/",)),
    ("proxy/telemetry", ("proxy/telemetry/",)),
)
# Inclusive markers: the share of busy samples with such a frame anywhere on the stack.
MARKERS = {
    "httpcore current_async_library (a failed `import sniffio` per call)": ("current_async_library",),
    "httpcore pool: _assign_requests_to_connections": ("_assign_requests_to_connections",),
    "httpcore pool: has_expired / is_socket_readable": ("has_expired",),
    "mcp.shared.inbound classify_inbound_request": ("classify_inbound_request",),
    "proxy engine _Call.run (the attempt loop)": ("_Call.run",),
}


def hotspots(raw: Path, top: int) -> dict[str, object]:
    """Self and inclusive shares from py-spy's collapsed stacks, of busy (not idle-in-epoll) samples."""
    self_c: collections.Counter[str] = collections.Counter()
    file_c: collections.Counter[str] = collections.Counter()
    marker_c: collections.Counter[str] = collections.Counter()
    layer_c: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        if frames[-1].endswith(IDLE_LEAVES):
            idle += count
            continue
        total += count
        self_c[_short(frames[-1])] += count
        m = re.search(r"\((.*?)\)$", frames[-1])
        file_c[_short(m.group(1)) if m else frames[-1]] += count
        joined = ";".join(frames)
        for frame in reversed(frames):
            layer = next((name for name, needles in LAYERS if any(k in frame for k in needles)), None)
            if layer:
                layer_c[layer] += count
                break
        else:
            layer_c["event loop / stdlib"] += count
        for name, needles in MARKERS.items():
            if any(k in joined for k in needles):
                marker_c[name] += count
    share = lambda c: round(100 * c / total, 1) if total else 0.0  # noqa: E731
    return {
        "busy_samples": total,
        "idle_samples": idle,
        "self_by_function": [(f, share(c)) for f, c in self_c.most_common(top)],
        "self_by_file": [(f, share(c)) for f, c in file_c.most_common(top)],
        "layers": [(name, share(c)) for name, c in layer_c.most_common()],
        "inclusive": [(name, share(marker_c[name])) for name in MARKERS],
    }


def print_hotspots(raw: Path, top: int) -> None:
    h = hotspots(raw, top)
    print(f"  {h['busy_samples']} busy samples (+{h['idle_samples']} idle in epoll, left out); shares of busy CPU")
    print("  self time by function:")
    for f, pct in h["self_by_function"]:
        print(f"    {pct:5.1f}%  {f}")
    print("  self time by file:")
    for f, pct in h["self_by_file"]:
        print(f"    {pct:5.1f}%  {f}")
    print("  by layer (exclusive: the layer nearest the leaf; sums to 100%):")
    for name, pct in h["layers"]:
        print(f"    {pct:5.1f}%  {name}")
    print("  inclusive (the frame anywhere on the stack):")
    for name, pct in h["inclusive"]:
        print(f"    {pct:5.1f}%  {name}")


def _short(frame: str) -> str:
    return re.sub(r"/\S*?/(site-packages|lib/python3\.\d+|work/main)/", "", frame)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per measured leg (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of unmeasured load before each leg")
    parser.add_argument("--max-requests", type=int, default=500_000, help="stop a leg after this many responses")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--wait-ms", type=float, nargs="+", default=[0.0, 5.0], help="upstream wait per call")
    parser.add_argument("--runs", type=int, default=1, help="repeat the whole matrix")
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every leg as JSON here")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        metavar="DIR",
        help="also run each proxied leg through the proxy of another checkout (`git worktree add DIR COMMIT`), "
        "legs interleaved, so a change is measured against its baseline in one run",
    )
    parser.add_argument("--profile", metavar="DIR", help="after the legs, profile the proxy with py-spy into DIR")
    parser.add_argument("--profile-only", action="store_true", help="skip the measured legs")
    parser.add_argument("--top", type=int, default=15, help="hotspots to print per profile")
    parser.add_argument(
        "--upstream",
        choices=sorted(UPSTREAMS),
        default="lean",
        help="lean: bench/lean_upstream.py, a hand-written echo that only waits (default); "
        "sdk: bench/upstream.py, the SDK's MCPServer (1-2 ms of CPU per call itself)",
    )
    parser.add_argument(
        "--relay",
        choices=["engine", "plain", "engine-quiet"],
        default="engine",
        help="the proxy as shipped (default); plain: tools/call without the recovery engine; "
        "engine-quiet: the engine without telemetry (both via bench/_plain_relay.py)",
    )
    parser.add_argument(
        "--era",
        choices=["modern", "legacy"],
        default="modern",
        help="modern: stateless 2026-07-28 POSTs (default); legacy: 2025-11-25 calls inside one session per leg",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=list(ROWS),
        default=list(ROWS),
        help="which paths to measure (default all): direct, an nginx hop, a bare Python byte relay (pyhop), "
        "a minimal terminating Python relay (pyterm), "
        "mcp-proxy and supergateway "
        "(HTTP→stdio peers, scripts/setup-peers.sh), and the proxy's http→stdio (stdio) and http→http (http)",
    )
    parser.add_argument(
        "--json-answers",
        action="store_true",
        help="the SDK HTTP upstream answers 2025 POSTs with JSON bodies, not event streams (--upstream sdk, "
        "--era legacy): what an event-stream answer costs each hop",
    )
    parser.add_argument(
        "--fill-idle",
        action="store_true",
        help="run one SCHED_IDLE spinner per CPU through the legs: the machine is then 100%% busy in every leg, "
        "so a hop that leaves the CPUs idle is not charged for the wake-ups of an idle VM (docs/benchmarks.md)",
    )
    parser.add_argument("--profile-concurrency", type=int, default=16, help="concurrency of the py-spy legs")
    parser.add_argument("--profile-wait-ms", type=float, default=0.0, help="upstream wait of the py-spy legs")
    args = parser.parse_args(argv)
    if args.json_answers and args.upstream != "sdk":
        parser.error("--json-answers is a switch of the SDK's server: use it with --upstream sdk")
    global UPSTREAM, RELAY
    UPSTREAM = UPSTREAMS[args.upstream]
    RELAY = args.relay

    # Ctrl-C (even when started from a shell that ignores SIGINT in the background) and SIGTERM
    # both take the orderly path: KeyboardInterrupt, then every process stopped by pid.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    wrk = ensure_wrk()
    procs = Processes()
    legs: list[Leg] = []
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        workdir = Path(tmp)
        lua = write_lua(workdir / "tools_call.lua")
        try:
            print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}; load average {_loadavg()}")
            print(
                f"legs: {args.duration:g} s each after {args.warmup:g} s warm-up, wrk -t1, "
                f"concurrency {args.concurrency}, upstream wait {args.wait_ms} ms, "
                f"upstream {args.upstream} ({UPSTREAM.name}), relay {RELAY}, era {args.era}\n",
                flush=True,
            )
            if args.fill_idle:
                fill_idle(procs, workdir)
            if not args.profile_only:
                for run in range(1, args.runs + 1):
                    for wait_ms in args.wait_ms:
                        legs += run_once(run, wait_ms, args, wrk, lua, procs, workdir)
                print()
                print_table(legs)
                print_medians(legs)
                print(f"\nload average after: {_loadavg()}")
                if args.json:
                    args.json.write_text(json.dumps([asdict(x) for x in legs], indent=1, ensure_ascii=False))
            if args.profile:
                profile(args, wrk, lua, procs, workdir)
        except KeyboardInterrupt:
            print("\nbench: interrupted; stopping what it started", file=sys.stderr)
            if legs:
                print_table(legs)
            return 130
        finally:
            procs.stop_all()
    return 0


# A spinner at the lowest scheduling class: it runs only on a CPU nothing else wants. Started in a
# session of its own (as every process here is), so with the kernel's autogroup scheduling its group
# would weigh as much as the proxy's: it lowers that group's weight as well. It ends by
# itself when the benchmark that started it is gone, or after six hours, whichever comes first.
SPINNER = """
import contextlib, os, time
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
    f.write("19")  # its session's scheduling group at the lowest weight too (with autogroup on)
parent, end = os.getppid(), time.monotonic() + 6 * 3600
while os.getppid() == parent and time.monotonic() < end:
    for _ in range(100_000):
        pass
"""


def fill_idle(procs: Processes, workdir: Path) -> None:
    """`--fill-idle`: one SCHED_IDLE spinner per CPU, stopped by pid with everything else."""
    for n in range(os.cpu_count() or 1):
        procs.start([PYTHON, "-c", SPINNER], workdir / f"spinner-{n}.log")
    print(f"fill-idle: {os.cpu_count()} SCHED_IDLE spinner(s) running through the legs", flush=True)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    sys.exit(main())
