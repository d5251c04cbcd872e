"""Callers that misbehave on purpose, as any caller on the network (or the client on stdin) could.

Each test drives one attack against the real proxy (its process, or its frontend in-process in
front of a real stdio upstream) and checks the three things docs/security.md ("Hostile callers")
promises: the attacker gets a clear, bounded answer; other callers keep being served (a
well-behaved client in the same test, judged by outcomes, never by durations); and what the
attack made the proxy hold returns to its bound. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from proxy import jsonrpc
from proxy.frontend.stdio import STDOUT_BUFFER_BYTES, StdioFrontend
from proxy.frontend.uvicorn_h1 import MAX_PIPELINED
from tests.fixtures.helpers import PYTHON, REPO_ROOT
from tests.fuzz.rig import Rig, proxy_rig
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = pytest.mark.slow

BOUND_S = 60.0
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


def _line(message: Any) -> bytes:
    return json.dumps(message).encode() + b"\n"


# -- the stdio frontend (`--listen stdio`) ---------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_stdio_line_past_the_size_limit_gets_one_error_and_the_next_lines_are_served(tmp_path: Path) -> None:
    """A 17 MiB line (the limit is 16 MiB) used to end the whole stdio session: the frontend
    answered its error and stopped reading stdin, which is the client's way to say "stop"."""
    command = scripted_stdio_command(tmp_path / "journal.jsonl")
    with open(tmp_path / "proxy.log", "wb") as log:  # noqa: ASYNC230 - before anything runs
        proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            "proxy",
            "serve",
            "--listen",
            "stdio",
            "--",
            *command,
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            limit=1 << 20,
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        with anyio.fail_after(BOUND_S):
            proc.stdin.write(_line(INIT))
            await proc.stdin.drain()
            assert json.loads(await proc.stdout.readline())["id"] == 1
            huge = b'{"jsonrpc":"2.0","id":99,"method":"ping","params":{"pad":"' + b"x" * (17 << 20) + b'"}}\n'
            proc.stdin.write(huge + _line({"jsonrpc": "2.0", "id": 2, "method": "ping"}))
            await proc.stdin.drain()
            first = json.loads(await proc.stdout.readline())
            assert first["id"] is None and first["error"]["code"] == jsonrpc.INVALID_REQUEST, first
            assert "size limit" in first["error"]["message"]
            assert len(first["error"]["message"]) < 200
            # the line after it is served, and so is the session (one error for the line, not one
            # per 16 MiB of it, nor a parse error for its tail)
            assert json.loads(await proc.stdout.readline()) == {"jsonrpc": "2.0", "id": 2, "result": {}}
            proc.stdin.write(_line({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
            await proc.stdin.drain()
            listed = json.loads(await proc.stdout.readline())
            assert listed["id"] == 3 and any(t["name"] == "echo" for t in listed["result"]["tools"])
            proc.stdin.close()
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


class _PacedLines:
    """stdin for `StdioFrontend.run`: each line is handed out once the requests read before it
    were answered (so the answers pile up in stdout one by one, as from a client that writes its
    next request without reading), noting how much waited in stdout at that moment."""

    def __init__(self, lines: list[bytes], frontend: StdioFrontend, transport: asyncio.WriteTransport) -> None:
        self._lines = list(lines)
        self._frontend = frontend
        self._transport = transport
        self.waiting_at_read: list[int] = []
        self.exhausted = asyncio.Event()

    async def _next(self) -> bytes:
        while self._frontend._tasks:
            await asyncio.wait(set(self._frontend._tasks))
        self.waiting_at_read.append(self._transport.get_write_buffer_size())
        if not self._lines:
            self.exhausted.set()
            return b""
        return self._lines.pop(0)

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        line = await self._next()
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        return line

    async def readline(self) -> bytes:  # what the frontend called before the fix
        return await self._next()


class _Writer(asyncio.StreamWriter):
    """stdout's writer, telling when the proxy waits for the client to read."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.waiting = asyncio.Event()

    async def drain(self) -> None:
        self.waiting.set()
        await super().drain()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with proxy_rig(tmp_path_factory.mktemp("hostile")) as rig:
        yield rig


@pytest.mark.timeout(120)
def test_a_stdio_client_that_never_reads_stdout_is_no_longer_read_from_past_the_bound(rig: Rig) -> None:
    """Answers are always written (notifications are dropped past the bound), so a client that
    keeps writing requests and never reads its stdout grew the proxy's write buffer by every
    answer: 150 answers of 60 KiB were all held. Now the frontend reads no further line while the
    bound is exceeded, and goes on once the client reads."""

    async def scenario() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        pipe = open(write_fd, "wb", buffering=0)  # noqa: ASYNC230 - a pipe's end: the transport owns it
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
        writer = _Writer(transport, protocol, None, loop)
        frontend = StdioFrontend(rig.service)
        frontend._legacy = rig.service.sessions[rig.session_id]  # the rig's open session serves them
        text = "x" * 30_000  # the answer carries it twice (content and structuredContent)
        lines = [
            _line(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": text}},
                }
            )
            for i in range(150)
        ]
        reader = _PacedLines(lines, frontend, transport)
        run = asyncio.create_task(frontend.run(reader, writer))  # type: ignore[arg-type]
        received = bytearray()
        try:
            # The client reads nothing until the proxy waits for it to (or, without backpressure,
            # until it has read every request, or ended)
            waits = [asyncio.ensure_future(e.wait()) for e in (writer.waiting, reader.exhausted)]
            await asyncio.wait([run, *waits], return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            # now the client reads everything, until the proxy is done
            read_end = open(read_fd, "rb", buffering=0)  # noqa: ASYNC230 - a pipe, read when readable
            drained = asyncio.Event()

            def readable() -> None:
                chunk = read_end.read(1 << 20)
                if chunk:
                    received.extend(chunk)
                else:
                    drained.set()

            loop.add_reader(read_fd, readable)
            await run
            transport.close()
            await drained.wait()
            loop.remove_reader(read_fd)
            read_end.close()
        finally:
            if not run.done():
                run.cancel()
        answers = [json.loads(line) for line in bytes(received).splitlines()]
        ok = sum(1 for a in answers if "result" in a and not a["result"].get("isError"))
        return reader.waiting_at_read, ok

    try:
        waiting, answered = rig.run(scenario(), 90)
    finally:
        rig.service.draining = False  # stdin's end drained the shared service: take it out again
        rig.service._drained = None
    assert answered == 150, "every request is answered once the client reads"
    # One answer (about 60 KiB) may be written after the frontend looked, and before the read.
    assert max(waiting) <= STDOUT_BUFFER_BYTES + 70_000, f"read a line with {max(waiting)} bytes waiting in stdout"


# -- the HTTP frontend, through the real proxy process ----------------------------------------------


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp = tmp_path_factory.mktemp("hostile-http")
    extra = ["--call-log", "all"]
    with ProxyProcess(
        upstream=scripted_stdio_command(tmp / "journal.jsonl"), extra=extra, log_path=tmp / "proxy.log"
    ) as p:
        yield p


def _raw(port: int, data: bytes) -> bytes:
    """Send `data` on a new connection and read until the proxy closes it (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def _post(body: bytes, extra: bytes = b"", *, length: bool = True) -> bytes:
    head = (
        b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"accept: application/json, text/event-stream\r\nconnection: close\r\n" + extra
    )
    if length:
        head += b"content-length: %d\r\n" % len(body)
    return head + b"\r\n" + body


def _session(proxy: ProxyProcess) -> str:
    with httpx.Client(timeout=30) as http:
        r = http.post(proxy.url, json=INIT, headers=HEADERS)
        assert r.status_code == 200, r.text
        sid = r.headers["mcp-session-id"]
        ack = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert http.post(proxy.url, json=ack, headers={**HEADERS, "mcp-session-id": sid}).status_code == 202
        return sid


PING = b'{"jsonrpc":"2.0","id":2,"method":"ping"}'


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "header",
    [
        b"mcp-session-id: {other}",
        b"authorization: Bearer aaaaaaaaaaaaaaaa\r\nauthorization: Bearer bbbbbbbbbbbbbbbb",
        b"last-event-id: aaaa:1\r\nlast-event-id: bbbb:2",
        b"content-type: text/plain",  # a second one: `_post` writes application/json already
    ],
    ids=["session-id", "authorization", "last-event-id", "content-type"],
)
def test_a_header_that_names_one_thing_given_twice_is_refused(proxy: ProxyProcess, header: bytes) -> None:
    """Two Mcp-Session-Id (or Authorization, Last-Event-ID, Content-Type) headers: the proxy read
    the last, an ingress or gateway in front may read the first. Refused, as two Hosts are, rather
    than judged on either."""
    mine, other = _session(proxy), _session(proxy)
    extra = b"mcp-session-id: " + mine.encode() + b"\r\n" + header.replace(b"{other}", other.encode()) + b"\r\n"
    answer = _raw(proxy.port, _post(PING, extra))
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"Duplicate" in answer
    # the same request with the header once is served
    good = _raw(proxy.port, _post(PING, b"mcp-session-id: " + mine.encode() + b"\r\n"))
    assert good.startswith(b"HTTP/1.1 200 "), good[:300]


@pytest.mark.timeout(120)
def test_a_session_id_with_a_control_character_is_400_and_a_non_ascii_one_is_unknown(proxy: ProxyProcess) -> None:
    """A control character in a session id never reaches the app (the parser refuses the head,
    400); a non-ASCII one is read but names no session (404, as any unknown id): neither is taken
    for the session whose id it contains."""
    mine = _session(proxy).encode()
    for control in (b"\x01", b"\x1b", b"\x00"):
        named = mine[:8] + control + mine[8:]
        answer = _raw(proxy.port, _post(PING, b"mcp-session-id: " + named + b"\r\n"))
        assert answer.startswith(b"HTTP/1.1 400 "), (control, answer[:200])
    for suffix in (b"\xc3\xa9", b"\xff"):
        answer = _raw(proxy.port, _post(PING, b"mcp-session-id: " + mine + suffix + b"\r\n"))
        assert answer.startswith(b"HTTP/1.1 404 "), (suffix, answer[:300])
    # the id as issued is still served
    good = _raw(proxy.port, _post(PING, b"mcp-session-id: " + mine + b"\r\n"))
    assert good.startswith(b"HTTP/1.1 200 "), good[:300]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "request_bytes",
    [
        _post(PING, b"content-length: %d\r\n" % len(PING)),  # two Content-Length
        _post(PING, b"transfer-encoding: chunked\r\n"),  # Transfer-Encoding and Content-Length
        _post(b"zz\r\nabc\r\n0\r\n\r\n", b"transfer-encoding: chunked\r\n", length=False),  # bogus chunk size
        _post(b"ffffffffffffffffffff\r\nabc\r\n", b"transfer-encoding: chunked\r\n", length=False),  # overflowing
    ],
    ids=["two-content-length", "te-and-cl", "bogus-chunk-size", "overflowing-chunk-size"],
)
def test_ambiguous_or_bogus_framing_is_refused_400_and_others_are_served(
    proxy: ProxyProcess, request_bytes: bytes
) -> None:
    """Request smuggling's raw material: the parser (llhttp, strict) refuses each with 400 and
    closes; nothing reaches the app, and the next caller is served."""
    answer = _raw(proxy.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    with httpx.Client(timeout=30) as http:
        assert http.post(proxy.url, json=INIT, headers=HEADERS).status_code == 200


def _read_until_closed(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


@pytest.mark.timeout(120)
def test_one_address_holding_connections_leaves_the_port_to_other_callers(tmp_path: Path) -> None:
    """Slowloris: connections that hold a place and send nothing, then half a request head. One
    address opening as many as the port takes must not have every other caller answered 503 "too
    many connections" (for as long as it renews them before its head timeout). With a cap per
    address (opt-in), one address holds at most its share: each connection past it closes that
    address's longest waiting one without a complete head (closed without an answer: it asked
    nothing), and another address (127.0.0.1, loopback too) is served meanwhile, on both ports."""
    cap, total = 4, 16
    extra = ["--max-connections", str(total), "--max-connections-per-client", str(cap), "--head-timeout-s", "60"]
    with ProxyProcess(
        upstream=scripted_stdio_command(tmp_path / "journal.jsonl"), extra=extra, log_path=tmp_path / "proxy.log"
    ) as proxy:
        for port in (proxy.port, proxy.admin_port):
            held: list[socket.socket] = []
            try:
                for _ in range(total):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.settimeout(30)
                    sock.bind(("127.0.0.2", 0))
                    sock.connect(("127.0.0.1", port))
                    held.append(sock)
                # The refused ones are answered as soon as they are accepted; wait (bounded) for
                # them, whichever they are.
                refused: dict[socket.socket, bytes] = {}
                deadline = time.monotonic() + 30
                while len(refused) < total - cap and time.monotonic() < deadline:
                    readable, _, _ = select.select([s for s in held if s not in refused], [], [], 1.0)
                    for sock in readable:
                        refused[sock] = _read_until_closed(sock)
                assert len(refused) == total - cap, f"{len(refused)} refused"
                # each sent nothing yet: closed without an answer (a 503 is for a half-sent head)
                answers = list(refused.values())
                assert all(r == b"" for r in answers), answers[:2]
                kept = [sock for sock in held if sock not in refused]
                for sock in kept:
                    sock.sendall(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n")  # and never the rest
                # another caller is served while the first `cap` are still held open
                with httpx.Client(timeout=30) as http:
                    if port == proxy.port:
                        assert http.post(proxy.url, json=INIT, headers=HEADERS).status_code == 200
                    else:
                        assert http.get(proxy.admin + "/healthz").status_code == 200
                        metrics = http.get(proxy.admin + "/metrics").text
                        assert 'mcp_recovery_http_refused_total{reason="head_pending"}' in metrics
                for sock in kept:
                    sock.setblocking(False)
                    with pytest.raises(BlockingIOError):
                        sock.recv(1)  # still open, nothing answered yet: its head is not complete
            finally:
                for sock in held:
                    sock.close()


def test_a_websocket_upgrade_is_an_ordinary_request_and_holds_no_place_of_its_address(tmp_path: Path) -> None:
    """uvicorn's default served WebSockets (uvicorn[standard] brings `websockets`): an upgrade
    request left the proxy's bounded protocol for uvicorn's WebSocket one, was answered 500 with
    an error line ("ASGI callable returned without completing handshake"), and stayed counted
    against its address once closed, so `--max-connections-per-client` upgrades had every later
    request from that address refused 503. MCP has no WebSocket transport: on both ports an
    upgrade is an ordinary request, answered and closed, and the address is served after many."""
    cap = 2
    extra = ["--max-connections-per-client", str(cap)]
    log = tmp_path / "proxy.log"
    with ProxyProcess(upstream=scripted_stdio_command(tmp_path / "journal.jsonl"), extra=extra, log_path=log) as proxy:
        for port, target, expected in (
            (proxy.port, b"/mcp", b"HTTP/1.1 406"),
            (proxy.admin_port, b"/healthz", b"HTTP/1.1 200"),
        ):
            upgrade = (
                b"GET " + target + b" HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
            )
            for _ in range(3 * cap):
                with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                    sock.sendall(upgrade)
                    answer = sock.recv(65536)
                assert answer.startswith(expected), answer[:200]
                assert b"101 Switching Protocols" not in answer
        with httpx.Client(timeout=30) as http:
            assert http.post(proxy.url, json=INIT, headers=HEADERS).status_code == 200
            assert http.get(proxy.admin + "/healthz").status_code == 200
    text = log.read_text()
    assert "ERROR" not in text and "handshake" not in text, text[-2000:]
    assert "Unsupported upgrade request" not in text and "WebSocket library" not in text


# -- what a caller's text does to the log -----------------------------------------------------------


@pytest.mark.parametrize("json_lines", [False, True], ids=["plain", "json"])
def test_a_callers_text_in_a_log_line_stays_one_bounded_line(json_lines: bool) -> None:
    """A method name is the caller's text, and some log lines quote it (a notification the
    upstream link could not take, a request that failed): a line break in it forged a log line of
    the proxy's own, and its length (up to the 4 MiB body) went into the line whole."""
    import io
    import logging

    from proxy.telemetry.logsetup import MAX_MESSAGE_CHARS, JsonFormatter, SecretScrubbingFormatter

    inner = JsonFormatter() if json_lines else logging.Formatter("%(levelname)s %(name)s: %(message)s")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(SecretScrubbingFormatter(inner))
    logger = logging.getLogger("proxy.relay.hostile-test")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)  # its own level: not whatever an earlier test left on `proxy`
    try:
        method = "notifications/x\n2026-12-02 09:00:00,000 ERROR proxy.admin: forged\x1b[2J" + "m" * (1 << 20)
        logger.info("could not relay %s upstream: %s", method, "closed")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("relaying %s failed", "a\nb")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    lines = stream.getvalue().splitlines()
    first = lines[0]
    assert "forged" in first and "\x1b" not in first, "the forged line stays inside the real one"
    assert len(first) < MAX_MESSAGE_CHARS + 200
    if not json_lines:
        assert lines[1] == "ERROR proxy.relay.hostile-test: relaying a\\nb failed"
        assert lines[2] == "Traceback (most recent call last):", "a traceback keeps its lines"


# -- attacks that already held, pinned (each answered clearly; the next caller is served) ----------

MODERN_HEADERS = {**HEADERS, "mcp-protocol-version": "2026-07-28"}
MODERN_META = {jsonrpc.META_PROTOCOL_VERSION: "2026-07-28", jsonrpc.META_CLIENT_CAPABILITIES: {}}


@pytest.mark.timeout(120)
def test_batches_and_ids_that_are_not_ids_get_a_json_rpc_error_in_both_eras(proxy: ProxyProcess) -> None:
    sid = _session(proxy)
    legacy = {**HEADERS, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
    ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
    modern_ping = {**ping, "params": {"_meta": MODERN_META}}
    with httpx.Client(timeout=30) as http:
        for body, headers in (([ping, ping], legacy), ([modern_ping], {**MODERN_HEADERS, "mcp-method": "ping"})):
            r = http.post(proxy.url, json=body, headers=headers)
            assert r.status_code == 400 and r.json()["error"]["code"] == jsonrpc.INVALID_REQUEST, r.text
        for bad in (1.5, None, {"a": 1}, [1], 10**30):
            r = http.post(proxy.url, content=json.dumps({**ping, "id": bad}), headers=legacy)
            assert r.status_code == 400 and r.json()["id"] is None, (bad, r.text)
        for good in ("x" * 10_000, 2**64 - 1, -(2**63)):  # echoed as sent
            r = http.post(proxy.url, content=json.dumps({**ping, "id": good}), headers=legacy)
            assert r.status_code == 200 and r.json() == {"jsonrpc": "2.0", "id": good, "result": {}}, r.text[:200]


@pytest.mark.timeout(120)
def test_pipelined_requests_http_1_0_and_a_body_cut_short_are_handled_and_others_served(proxy: ProxyProcess) -> None:
    sid = _session(proxy).encode()
    one = _post(PING, b"mcp-session-id: " + sid + b"\r\n").replace(b"connection: close\r\n", b"")
    # 30 requests in one write on one keep-alive connection: 30 answers, in order
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.sendall(one * 30)
        data = b""
        while data.count(b"HTTP/1.1 200 ") < 30:
            chunk = sock.recv(65536)
            assert chunk, data[-300:]
            data += chunk
    assert data.count(b'{"jsonrpc":"2.0","id":2,"result":{}}') == 30
    # HTTP/1.0
    answer = _raw(
        proxy.port, _post(PING, b"mcp-session-id: " + sid + b"\r\n").replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1)
    )
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'"result":{}}'), answer[:300]
    # a Content-Length larger than what comes, then the caller closes its side: nothing relayed,
    # the connection closed, and the next caller served
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.sendall(
            _post(PING, b"mcp-session-id: " + sid + b"\r\n").replace(b"content-length: 40", b"content-length: 4000")
        )
        sock.shutdown(socket.SHUT_WR)
        assert _read_until_closed(sock) == b""
    with httpx.Client(timeout=30) as http:
        assert http.post(proxy.url, json=INIT, headers=HEADERS).status_code == 200


@pytest.mark.timeout(120)
def test_requests_pipelined_past_the_bound_are_not_taken_and_the_connection_closes_once_the_rest_are_answered(
    proxy: ProxyProcess,
) -> None:
    """uvicorn parses every request of a read at once and queues each behind the running one (a
    request cycle of about 7 KB): 0.8 MB of minimal pipelined requests held 48 MB on one
    connection, and a client reading its answers kept the queue growing. At most MAX_PIPELINED
    wait; past that nothing more is parsed from the connection, and it closes once the requests it
    took (the running one and those queued) are answered, in order. A client that pipelines
    retries the rest on a new connection (RFC 9112 9.3.2)."""
    sid = _session(proxy).encode()
    one = _post(PING, b"mcp-session-id: " + sid + b"\r\n").replace(b"connection: close\r\n", b"")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.sendall(one * 2000)
        data = _read_until_closed(sock)
    taken = MAX_PIPELINED + 1
    assert data.count(b"HTTP/1.1 200 ") == taken, data.count(b"HTTP/1.1 200 ")
    assert data.count(b'{"jsonrpc":"2.0","id":2,"result":{}}') == taken
    with httpx.Client(timeout=30) as http:
        assert http.post(proxy.url, json=INIT, headers=HEADERS).status_code == 200
        metrics = http.get(proxy.admin + "/metrics").text
    assert 'mcp_recovery_http_refused_total{reason="pipelined"} 1.0' in metrics


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_cancellation_naming_another_sessions_request_id_cancels_nothing(proxy: ProxyProcess) -> None:
    """Request ids are the client's own and repeat across sessions: a `notifications/cancelled`
    reaches only its own session's requests."""
    alice, bob = _session(proxy), _session(proxy)
    read = {"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": "slow://alice-read/2"}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "mine"}}
    with anyio.fail_after(BOUND_S):
        async with httpx.AsyncClient(timeout=30) as http:
            pending = asyncio.ensure_future(
                http.post(proxy.url, json=read, headers={**HEADERS, "mcp-session-id": alice})
            )
            r = await http.post(proxy.url, json=cancel, headers={**HEADERS, "mcp-session-id": bob})
            assert r.status_code == 202
            # and a tools/call id bob never sent: nothing to cancel either
            r = await http.post(
                proxy.url,
                json={**cancel, "params": {"requestId": "no-such-call"}},
                headers={**HEADERS, "mcp-session-id": bob},
            )
            assert r.status_code == 202
            answer = await pending
            assert answer.status_code == 200 and "slept 2" in answer.text, answer.text[:300]


@pytest.mark.timeout(300)
def test_distinct_bogus_tool_names_create_no_metric_series_and_no_raw_log_lines(proxy: ProxyProcess) -> None:
    """Label cardinality: 300 distinct made-up tool names (with a line break, an escape sequence
    and a bidi override each) become the one `other` label; the log keeps one line per event."""
    sid = _session(proxy)
    headers = {**HEADERS, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
    with httpx.Client(timeout=60) as http:
        before = http.get(proxy.admin + "/metrics").text
        for i in range(300):
            name = f"bogus-{i}\n2026-12-02 00:00:00,000 ERROR forged\x1b[31m\u202e"
            call = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": {}}}
            r = http.post(proxy.url, json=call, headers=headers)
            assert r.status_code == 200, r.text[:300]
        after = http.get(proxy.admin + "/metrics").text
    assert "bogus" not in after
    assert len(after.splitlines()) - len(before.splitlines()) < 100, "a bounded number of new series"
    assert proxy.log_path is not None
    for line in proxy.log_path.read_text(errors="replace").splitlines():
        assert not line.startswith("2026-12-02 00:00:00,000 ERROR forged"), line
