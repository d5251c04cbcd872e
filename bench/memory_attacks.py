"""The proxy's memory under attack, against the idle proxy: callers that stop reading (what the
proxy buffers for them), oversized or half-sent request heads, and one session holding every session
slot or upstream connection.

Each attack runs against a fresh proxy process (`python -m proxy serve`, HTTP on 127.0.0.1, a
stdio upstream this script writes to a temporary file); the proxy's resident set size is sampled
from /proc every 20 ms, and the script prints, per attack, the idle RSS, the peak during the
attack and the RSS left once it is over (what the proxy still holds), in MiB.

- `listen`: a 2025 session opens its listen stream (GET) and never reads it, while the upstream
  writes log notifications tied to no request (64 KiB each, as fast as it can) for `--seconds`.
- `resume`: `--calls` 2025 calls (8 at a time) whose answers are `--answer-mib` MiB event streams
  (a notification comes first, so each response is an SSE stream kept for resumption); the
  client reads every answer. The buffers are held 30 s after each response.
- `heads` (request heads): one connection sends `--head-mib` MiB of header bytes (a header line that
  never ends), as fast as the proxy takes them, until the proxy answers or closes.
- `halfheads` (request heads): `--half-heads` connections each send half a request head and stay open;
  the attack ends when the proxy has closed all of them (head timeout, `--head-timeout-s`).
- `pipelined` (requests queued on a connection): `--pipelined-conns` connections each send
  `--pipelined` minimal requests (`GET /mcp`, 39 bytes) in one write and read nothing for 3 s,
  then read what comes until the proxy closes or 15 s pass without a byte.
- `inits` (session slots): `--inits` unauthenticated `initialize` calls at once from one address, never
  followed by anything; the attack ends when the proxy has closed every session it accepted
  (`--session-init-timeout-s`). The "tree" columns add the stdio children each session starts.
- `reads` (upstream connections): in front of an HTTP upstream (this script runs one) that never answers
  `resources/read`, one session sends `--reads` of them at once; meanwhile another session makes
  `--others` tool calls one after another, each of which must succeed; the attack ends when every
  read has been answered (with the request timeout's error, `--request-timeout-s`).
- `stalled` (a caller that stops reading, per upstream link): a caller reads its response head and
  then nothing more (a socket with a 16 KiB receive buffer) while the upstream writes
  `--stalled-count` messages of `--stalled-size` bytes for it; the attack ends when the upstream
  wrote the last one. One run per link: `http-post` (a 2025 session's POST response stream, HTTP
  upstream), `http-listen` (its listen stream, fed by the upstream's GET stream), `http-2026` (the
  shared 2026 HTTP link), `sse-post` (a legacy SSE upstream), `stdio-2026` (the shared 2026 stdio
  child). The upstream is the scripted SDK server of the tests (`tests/fixtures/scripted_server.py`,
  its `flood` tool).
Each attack prints what the peer saw (status codes, answers) next to the figures, so a bound that
did not act shows.

`--repo PATH` runs the proxy from another checkout (e.g. the code before a fix) for comparison.
Bounded: every wait has a timeout, the attack lengths are flags, and every process this script
starts is stopped by its pid.

    .venv/bin/python bench/memory_attacks.py [--seconds 10] [--calls 200] [--answer-mib 8]
    .venv/bin/python bench/memory_attacks.py --only heads,halfheads,inits,reads
    .venv/bin/python bench/memory_attacks.py --only stalled [--stalled-count 2000 --stalled-size 16384]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024

UPSTREAM = textwrap.dedent(
    """
    import json, sys, threading, time
    lock = threading.Lock()
    def write(msg):
        data = json.dumps(msg) + "\\n"
        with lock:
            sys.stdout.write(data); sys.stdout.flush()
    def chatter(seconds):
        pad = "x" * 65536
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            write({"jsonrpc": "2.0", "method": "notifications/message",
                   "params": {"level": "info", "data": pad}})
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None or method is None:
            continue
        if method == "server/discover":
            write({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})
        elif method == "initialize":
            write({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": msg["params"]["protocolVersion"],
                   "capabilities": {"tools": {}, "logging": {}}, "serverInfo": {"name": "bench", "version": "1"}}})
        elif method == "tools/list":
            tools = [{"name": n, "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
                     for n in ("chatter", "big")]
            write({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
        elif method == "tools/call":
            args = msg["params"].get("arguments") or {}
            if msg["params"]["name"] == "chatter":
                write({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "ok"}]}})
                threading.Thread(target=chatter, args=(float(args.get("seconds", 5)),), daemon=True).start()
            else:
                write({"jsonrpc": "2.0", "method": "notifications/message",
                       "params": {"level": "info", "data": "starting"}})
                text = "y" * int(args.get("bytes", 1024))
                write({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})
        else:
            write({"jsonrpc": "2.0", "id": mid, "result": {}})
    """
)


# An HTTP MCP upstream (2025 handshake, stateless) that never answers resources/read: it holds the
# request until its client goes away (bounded at 120 s). Its tool `ping_tool` answers at once.
HTTP_UPSTREAM = textwrap.dedent(
    """
    import asyncio, json, sys
    import uvicorn

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        async def answer(status, payload):
            out = json.dumps(payload).encode() if payload is not None else b""
            headers = [(b"content-length", str(len(out)).encode()), (b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": out})
        if scope["method"] != "POST":
            await answer(405, None)
            return
        msg = json.loads(body or b"{}")
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            await answer(202, None)
            return
        if method == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"],
                      "capabilities": {"tools": {}, "resources": {}}, "serverInfo": {"name": "hold", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "ping_tool", "inputSchema": {"type": "object"},
                                 "annotations": {"readOnlyHint": True}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "pong"}]}
        elif method == "resources/read":
            disconnected = asyncio.ensure_future(receive())
            await asyncio.wait([disconnected], timeout=120)
            disconnected.cancel()
            return
        elif method == "ping":
            result = {}
        else:
            await answer(200, {"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})
            return
        await answer(200, {"jsonrpc": "2.0", "id": mid, "result": result})

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def tree_rss_mib(pid: int) -> float:
    """The RSS of `pid` and its direct children (the proxy and its stdio upstreams)."""
    total = rss_mib(pid)
    for child in children(pid):
        try:
            total += rss_mib(child)
        except OSError:
            pass  # it exited meanwhile
    return total


class Sampler:
    """The peak RSS of one process (and of it with its children), sampled every 20 ms on a
    thread until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self.tree_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
                self.tree_peak = max(self.tree_peak, tree_rss_mib(self.pid))
            except OSError:
                return
            self._stop.wait(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


_HELP: dict[Path, str] = {}


def _supported(repo: Path, extra: list[str]) -> list[str]:
    """`extra` (flag and value pairs) without the flags the checkout's proxy does not have: an
    older checkout, run for comparison, has no limit flags and runs with what it had."""
    if repo not in _HELP:
        env = {**os.environ, "PYTHONPATH": str(repo)}
        argv = [sys.executable, "-m", "proxy", "serve", "--help"]
        _HELP[repo] = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=60).stdout
    pairs = zip(extra[::2], extra[1::2], strict=True)
    return [item for flag, value in pairs if flag in _HELP[repo] for item in (flag, value)]


class Proxy:
    def __init__(self, repo: Path, upstream: Path | str | list[str], extra: list[str] | None = None) -> None:
        """`upstream`: a stdio server script or command, or the URL of an HTTP upstream."""
        self.repo = repo
        self.port = free_port()
        self.admin = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        argv = [sys.executable, "-m", "proxy", "serve", "--listen", self.url, "--admin", f"127.0.0.1:{self.admin}"]
        argv += _supported(repo, extra or [])
        if isinstance(upstream, str):
            argv += ["--upstream", upstream]
        elif isinstance(upstream, list):
            argv += ["--", *upstream]
        else:
            argv += ["--", sys.executable, str(upstream)]
        env = {**os.environ, "PYTHONPATH": str(repo)}
        self.proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180  # a stdio upstream on the SDK starts slowly on a busy machine
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.admin}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the proxy did not become ready")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


def open_session(client: httpx.Client, url: str) -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    response = client.post(url, json=init, headers=HEADERS)
    response.raise_for_status()
    headers = {**HEADERS, "mcp-session-id": response.headers["mcp-session-id"]}
    client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


def call(client: httpx.Client, url: str, headers: dict[str, str], i: int, name: str, args: dict) -> int:
    body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": args}}
    response = client.post(url, json=body, headers=headers, timeout=120)
    response.raise_for_status()
    return len(response.content)


def attack_listen(proxy: Proxy, seconds: float) -> None:
    with httpx.Client(timeout=30) as client:
        headers = open_session(client, proxy.url)
        # The listen stream, on a socket this script never reads from.
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k != "accept")
        sock.sendall(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nAccept: text/event-stream\r\n{head}\r\n".encode()
        )
        head_seen = b""
        while b"\r\n\r\n" not in head_seen:  # the stream is attached once its head arrives
            chunk = sock.recv(1024)
            if not chunk:
                raise RuntimeError("the proxy closed the listen stream")
            head_seen += chunk
        assert head_seen.startswith(b"HTTP/1.1 200"), head_seen[:100]
        call(client, proxy.url, headers, 1, "chatter", {"seconds": seconds})
        time.sleep(seconds + 1)
        sock.close()


def attack_resume(proxy: Proxy, calls: int, answer_mib: float) -> None:
    with httpx.Client(timeout=120) as client:
        headers = open_session(client, proxy.url)
        size = int(answer_mib * MIB)
        with ThreadPoolExecutor(8) as pool:
            got = list(
                pool.map(lambda i: call(client, proxy.url, headers, i, "big", {"bytes": size}), range(1, calls + 1))
            )
        assert all(n >= size for n in got), "every answer arrived whole"


def _refused(sock: socket.socket, timeout_s: float = 30.0) -> str:
    """The status line the proxy answered on `sock` before closing it, or how it ended."""
    try:
        sock.settimeout(max(timeout_s, 0.01))
        data = sock.recv(4096)
    except OSError as e:
        return type(e).__name__
    return data.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"


def attack_heads(proxy: Proxy, head_mib: float) -> str:
    """One connection, `head_mib` MiB of one header line that never ends."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
    sock.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nX-Big: ".encode())
    chunk = b"a" * MIB
    sent = 0
    deadline = time.monotonic() + 60  # bounded: a proxy that takes it all slowly is not waited on
    try:
        while sent < head_mib * MIB and time.monotonic() < deadline:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the proxy closed the connection: what it answered is read below
    # A reset may discard the proxy's answer before it is read; the MiB sent says how far it got.
    answer = _refused(sock)
    sock.close()
    return f"{answer}; {sent / MIB:.0f} MiB sent before the close"


def attack_halfheads(proxy: Proxy, count: int, wait_s: float) -> str:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
        sock.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nX-Half: ".encode())
        socks.append(sock)
    answers: dict[str, int] = {}
    deadline = time.monotonic() + wait_s  # one bound for all: a proxy without the timeout keeps them
    for sock in socks:  # each is answered when its head timeout runs out
        answer = _refused(sock, deadline - time.monotonic())
        answers[answer] = answers.get(answer, 0) + 1
        sock.close()
    return ", ".join(f"{n} x {a}" for a, n in sorted(answers.items()))


def attack_pipelined(proxy: Proxy, per_conn: int, conns: int) -> str:
    one = f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\n\r\n".encode()
    socks = []
    for _ in range(conns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a caller that does not read (yet)
        sock.sendall(one * per_conn)
        socks.append(sock)
    time.sleep(3.0)  # nobody reads: what the proxy holds meanwhile is the peak
    answered = 0
    closed = 0
    for sock in socks:
        # 15 s: after seconds of a zero receive window, the proxy's TCP probes it at growing
        # intervals (its persist timer), so the answers of the last socket read can take seconds.
        sock.settimeout(15.0)
        try:
            while chunk := sock.recv(1 << 20):
                answered += chunk.count(b"HTTP/1.1 ")
            closed += 1
        except OSError:
            pass
        sock.close()
    return f"{answered} answers to {per_conn * conns} requests; {closed} of {conns} connections closed by the proxy"


INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}


def attack_inits(proxy: Proxy, count: int, wait_s: float) -> str:
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=count)) as client:
        with ThreadPoolExecutor(count) as pool:
            statuses = list(
                pool.map(lambda _: client.post(proxy.url, json=INIT, headers=HEADERS).status_code, range(count))
            )
        # Until the proxy has closed every accepted session (none was initialized); a spare stdio
        # child it keeps started stays, so /readyz's session count is what is waited on.
        # Bounded: a proxy without the init timeout (an older checkout) keeps them; that is said.
        deadline = time.monotonic() + wait_s
        while (held := client.get(f"http://127.0.0.1:{proxy.admin}/readyz").json().get("sessions")) != 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    counted = {code: statuses.count(code) for code in sorted(set(statuses))}
    return ", ".join(f"{n} x {code}" for code, n in counted.items()) + f"; {held} sessions still open at the end"


async def _reads(proxy: Proxy, count: int, others: int, wait_s: float) -> str:
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def session() -> dict[str, str]:
            response = await client.post(proxy.url, json=INIT, headers=HEADERS)
            response.raise_for_status()
            headers = {**HEADERS, "mcp-session-id": response.headers["mcp-session-id"]}
            await client.post(
                proxy.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
            )
            return headers

        hog, other = await session(), await session()

        async def read(i: int) -> str:
            body = {"jsonrpc": "2.0", "id": i, "method": "resources/read", "params": {"uri": f"hold://{i}"}}
            text = (await client.post(proxy.url, json=body, headers=hog)).text
            if '"code":-32001' in text:
                return "timeout error"
            # Grouped by code: the texts differ by id.
            try:
                return f"error {json.loads(text)['error']['code']}"
            except (ValueError, KeyError, TypeError):
                return "answer " + text[:40]

        reads = [asyncio.ensure_future(read(i)) for i in range(1, count + 1)]
        await asyncio.sleep(1.0)  # the reads are in: the hog holds its share of the upstream
        ok, slowest = 0, 0.0
        for i in range(others):
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "ping_tool", "arguments": {}}}
            started = time.monotonic()
            try:
                response = await client.post(proxy.url, json=body, headers=other, timeout=15)
                ok += '"pong"' in response.text
            except httpx.TimeoutException:
                pass  # not answered within 15 s: counted as failed
            slowest = max(slowest, time.monotonic() - started)
        # Bounded: a proxy without the request timeout (an older checkout) leaves them unanswered.
        await asyncio.wait(reads, timeout=wait_s)
        answers = [r.result() if r.done() and not r.exception() else "unanswered" for r in reads]
        for r in reads:
            r.cancel()
    counted = {a: answers.count(a) for a in sorted(set(answers))}
    return (
        f"{', '.join(f'{n} x {a}' for a, n in counted.items())}; "
        f"other session: {ok} of {others} calls answered, slowest {slowest:.2f} s"
    )


def attack_reads(proxy: Proxy, count: int, others: int, wait_s: float) -> str:
    return asyncio.run(_reads(proxy, count, others, wait_s))


SCRIPTED = REPO / "tests" / "fixtures" / "scripted_server.py"
LINKS = ("http-post", "http-listen", "http-2026", "sse-post", "stdio-2026")
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _dropped(client: httpx.Client, proxy: Proxy) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in client.get(f"http://127.0.0.1:{proxy.admin}/metrics").text.splitlines():
        if line.startswith("mcp_recovery_dropped_messages_total{"):
            out[line.split('"')[1]] = float(line.split()[-1])
    return out


def _flooded(journal: Path, call_id: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            for line in journal.read_text().splitlines():
                event = json.loads(line)
                if event.get("event") == "flooded" and event.get("call") == call_id:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return False


def attack_stalled(proxy: Proxy, link: str, journal: Path, count: int, size: int) -> str:
    """A caller that stops reading on `link` while the upstream writes `count` x `size` bytes."""
    call_id = f"stalled-{link}-{time.monotonic_ns()}"
    args = {"count": count, "size": size, "call_id": call_id}
    with httpx.Client(timeout=60) as client:
        before = _dropped(client, proxy)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.settimeout(60)
        sock.connect(("127.0.0.1", proxy.port))
        try:
            if link.endswith("2026"):
                params = {
                    "name": "flood",
                    "arguments": {**args, "related": True},
                    "_meta": {**MODERN_META, "progressToken": "p"},
                }
                headers = {
                    "accept": "application/json, text/event-stream",
                    "content-type": "application/json",
                    "mcp-protocol-version": "2026-07-28",
                    "mcp-method": "tools/call",
                    "mcp-name": "flood",
                }
            else:
                headers = {**open_session(client, proxy.url), "content-type": "application/json"}
                params = {"name": "flood", "arguments": {**args, "related": True}, "_meta": {"progressToken": "p"}}
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()
            if link == "http-listen":
                head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k not in ("accept", "content-type"))
                sock.sendall(
                    f"GET /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: text/event-stream\r\n{head}\r\n".encode()
                )
                seen = b""
                while b"\r\n\r\n" not in seen:
                    chunk = sock.recv(1024)
                    if not chunk:
                        return "the proxy closed the listen stream at once"
                    seen += chunk
                background = {**params, "arguments": {**args, "related": False}}
                call_body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": background}
                client.post(proxy.url, json=call_body, headers=headers).raise_for_status()
            else:
                head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                sock.sendall(
                    f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n{head}content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
            done = _flooded(journal, call_id, 120)
        finally:
            sock.close()
        after = _dropped(client, proxy)
    shed = {k: int(v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0)}
    wrote = f"{count} x {size // 1024} KiB written" + ("" if done else " (not all within 120 s)")
    return f"{wrote}; dropped {shed or 'nothing'}"


def measure_stalled(repo: Path, tmp: Path, link: str, count: int, size: int) -> dict[str, Any]:
    kind = link.split("-")[0]
    journal = tmp / f"journal-{link}.jsonl"
    extra = ["--request-timeout-s", "120"]
    if kind == "stdio":
        command = [sys.executable, str(SCRIPTED), "--transport", "stdio", "--journal", str(journal)]
        return measure(repo, command, link, lambda p: attack_stalled(p, link, journal, count, size), extra)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SCRIPTED), "--transport", kind, "--journal", str(journal), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {kind} upstream did not start") from None
                time.sleep(0.05)
        url = ("sse+" if kind == "sse" else "") + f"http://127.0.0.1:{port}/" + ("sse" if kind == "sse" else "mcp")
        return measure(repo, url, link, lambda p: attack_stalled(p, link, journal, count, size), extra)
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(server.pid, signal.SIGKILL)
                server.wait(10)


def measure(
    repo: Path, upstream: Path | str | list[str], name: str, run, extra: list[str] | None = None
) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    proxy = Proxy(repo, upstream, extra)
    try:
        time.sleep(1.0)
        idle = rss_mib(proxy.proc.pid)
        idle_tree = tree_rss_mib(proxy.proc.pid)
        started = time.monotonic()
        with Sampler(proxy.proc.pid) as sampler:
            seen = run(proxy)
            time.sleep(0.5)
        after = rss_mib(proxy.proc.pid)
        return {
            "idle_mib": idle,
            "peak_mib": sampler.peak,
            "after_mib": after,
            "idle_tree_mib": idle_tree,
            "peak_tree_mib": sampler.tree_peak,
            "seconds": time.monotonic() - started,
            "seen": seen or "",
        }
    finally:
        proxy.stop()


class HttpUpstream:
    """The holding HTTP upstream above, as a process of this script (stopped by its pid)."""

    def __init__(self, script: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the HTTP upstream did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


ATTACKS = ("listen", "resume", "heads", "halfheads", "pipelined", "inits", "reads", "stalled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose proxy runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the upstream chatters")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--answer-mib", type=float, default=8.0)
    parser.add_argument("--head-mib", type=float, default=1024.0, help="header bytes of the `heads` attack")
    parser.add_argument("--half-heads", type=int, default=1000)
    parser.add_argument("--head-timeout-s", type=float, default=10.0, help="the proxy's, for `halfheads`")
    parser.add_argument("--pipelined", type=int, default=20000, help="requests per connection of `pipelined`")
    parser.add_argument("--pipelined-conns", type=int, default=4)
    parser.add_argument("--inits", type=int, default=64)
    parser.add_argument("--session-init-timeout-s", type=float, default=10.0, help="the proxy's, for `inits`")
    parser.add_argument("--reads", type=int, default=100)
    parser.add_argument("--others", type=int, default=20, help="the other session's calls during `reads`")
    parser.add_argument("--request-timeout-s", type=float, default=10.0, help="the proxy's, for `reads`")
    parser.add_argument("--stalled-count", type=int, default=2000, help="messages written for the stalled caller")
    parser.add_argument("--stalled-size", type=int, default=16384, help="bytes of each")
    parser.add_argument("--links", default=",".join(LINKS), help=f"`stalled`: a subset of {','.join(LINKS)}")
    parser.add_argument("--only", default=",".join(ATTACKS), help=f"a comma-separated subset of {','.join(ATTACKS)}")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = [a for a in args.only.split(",") if a]
    unknown = set(chosen) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory() as tmp:
        upstream = Path(tmp) / "chatty_upstream.py"
        upstream.write_text(UPSTREAM)
        results: dict[str, dict[str, Any]] = {}
        if "listen" in chosen:
            results["listen"] = measure(args.repo, upstream, "listen", lambda p: attack_listen(p, args.seconds))
        if "resume" in chosen:
            results["resume"] = measure(
                args.repo, upstream, "resume", lambda p: attack_resume(p, args.calls, args.answer_mib)
            )
        if "heads" in chosen:
            results["heads"] = measure(args.repo, upstream, "heads", lambda p: attack_heads(p, args.head_mib))
        if "halfheads" in chosen:
            results["halfheads"] = measure(
                args.repo,
                upstream,
                "halfheads",
                lambda p: attack_halfheads(p, args.half_heads, 3 * args.head_timeout_s + 10),
                ["--head-timeout-s", str(args.head_timeout_s)],
            )
        if "pipelined" in chosen:
            results["pipelined"] = measure(
                args.repo, upstream, "pipelined", lambda p: attack_pipelined(p, args.pipelined, args.pipelined_conns)
            )
        if "inits" in chosen:
            results["inits"] = measure(
                args.repo,
                upstream,
                "inits",
                lambda p: attack_inits(p, args.inits, 3 * args.session_init_timeout_s + 10),
                ["--session-init-timeout-s", str(args.session_init_timeout_s)],
            )
        if "reads" in chosen:
            script = Path(tmp) / "holding_upstream.py"
            script.write_text(HTTP_UPSTREAM)
            held = HttpUpstream(script)
            try:
                results["reads"] = measure(
                    args.repo,
                    held.url,
                    "reads",
                    lambda p: attack_reads(p, args.reads, args.others, 3 * args.request_timeout_s + 10),
                    ["--request-timeout-s", str(args.request_timeout_s)],
                )
            finally:
                held.stop()
        if "stalled" in chosen:
            for link in [x for x in args.links.split(",") if x]:
                results[f"stalled {link}"] = measure_stalled(
                    args.repo, Path(tmp), link, args.stalled_count, args.stalled_size
                )
    if args.json:
        print(json.dumps(results))
        return
    print(f"proxy from {args.repo}")
    print(
        f"{'attack':<22} {'idle MiB':>9} {'peak MiB':>9} {'after MiB':>10} {'growth':>8} "
        f"{'tree idle':>10} {'tree peak':>10} {'seconds':>8}  what the peer saw"
    )
    for name, r in results.items():
        growth = r["peak_mib"] - r["idle_mib"]
        print(
            f"{name:<22} {r['idle_mib']:>9.0f} {r['peak_mib']:>9.0f} {r['after_mib']:>10.0f} {growth:>+8.0f} "
            f"{r['idle_tree_mib']:>10.0f} {r['peak_tree_mib']:>10.0f} {r['seconds']:>8.1f}  {r['seen']}"
        )


if __name__ == "__main__":
    main()
