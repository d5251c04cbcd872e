"""A caller that stops reading while the upstream keeps writing, on every upstream link: the
proxy holds a bounded number of bytes for it, drops (and counts) the rest, and a link other
callers share is not paused for it.

The real proxy process in front of the scripted SDK server over real pipes and sockets. The
stalled caller is a raw socket with a small receive buffer that reads its response head and then
nothing more; the upstream's `flood` tool writes 1000 messages of 16 KiB (16 MiB) for it, 16
times the proxy's stream bound set here (`--stream-buffer-bytes` 1 MiB). Every wait is bounded:
on the upstream's journal (`flooded` once it wrote the last one) or on an HTTP answer.

Links: an HTTP upstream's 2025 POST response stream and its GET listen stream, the HTTP shared
2026 link, a legacy SSE upstream's session stream, and the shared 2026 stdio child. (A 2025
session's own stdio child is paused instead: tests/upstream/stdio/test_backpressure.py.)
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.test_limits import HEADERS, INIT, INITIALIZED
from tests.fixtures.helpers import ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(120)]
BOUND_S = 60.0
MIB = 1024 * 1024
COUNT, SIZE = 1000, 16 * 1024
EXTRA = ["--stream-buffer-bytes", str(MIB)]
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def proxy_for(kind: str, tmp: Path) -> Iterator[tuple[ProxyProcess, Journal]]:
    journal = tmp / "journal.jsonl"
    log = tmp / "proxy.log"
    if kind == "stdio":
        with ProxyProcess(upstream=scripted_stdio_command(journal), extra=EXTRA, log_path=log) as p:
            yield p, Journal(journal)
        return
    with ScriptedHTTP(journal, transport=kind) as server:
        url = ("sse+" if kind == "sse" else "") + server.url
        with ProxyProcess(upstream_url=url, extra=EXTRA, log_path=log) as p:
            yield p, Journal(journal)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def dropped(metrics: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^mcp_recovery_dropped_messages_total\{reason="(\w+)"\} (\S+)$', metrics, re.MULTILINE)
    }


class Stalled:
    """A request whose response the caller stops reading once its head arrived."""

    def __init__(self, port: int, method: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        self.sock.settimeout(BOUND_S)
        self.sock.connect(("127.0.0.1", port))
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        length = f"content-length: {len(body)}\r\n" if body else ""
        self.sock.sendall(f"{method} /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{head}{length}\r\n".encode() + body)

    def read_head(self) -> bytes:
        seen = b""
        while b"\r\n\r\n" not in seen:
            chunk = self.sock.recv(1024)
            assert chunk, "the proxy closed the stream before its head"
            seen += chunk
        return seen

    def close(self) -> None:
        self.sock.close()


def flood_call(progress: str | None, related: bool, call_id: str, modern: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = dict(MODERN_META) if modern else {}
    if progress is not None:
        meta["progressToken"] = progress
    args = {"count": COUNT, "size": SIZE, "related": related, "call_id": call_id}
    return {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "flood", "arguments": args, "_meta": meta},
    }


def modern_headers(name: str) -> dict[str, str]:
    return {**HEADERS, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": name}


async def open_session(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    r = await http.post(url, json=INIT, headers=HEADERS)
    assert r.status_code == 200, r.text
    session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await http.post(url, json=INITIALIZED, headers={**HEADERS, **session})
    return session


def modern_echo(text: str) -> dict[str, Any]:
    params = {"name": "echo", "arguments": {"text": text}, "_meta": MODERN_META}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


LINKS = [
    ("http", "post"),  # a 2025 session's POST response stream (its own upstream SSE response)
    ("http", "listen"),  # a 2025 session's listen stream, fed by its upstream GET stream
    ("http", "2026"),  # the shared 2026 link (one POST per request)
    ("sse", "post"),  # a legacy SSE upstream: the session's one stream carries everything
    ("stdio", "2026"),  # the shared 2026 stdio child
]


@pytest.mark.parametrize(("kind", "stream"), LINKS, ids=[f"{k}-{s}" for k, s in LINKS])
async def test_a_caller_that_stops_reading_costs_the_proxy_a_bounded_number_of_bytes(
    tmp_path: Path, kind: str, stream: str
) -> None:
    for proxy, journal in proxy_for(kind, tmp_path):
        assert proxy.proc is not None
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            if stream == "2026":
                # The proxy loads its 2026 protocol models at the first 2026 request (megabytes of
                # them): one before the idle figure, so that the growth measured is the flood's.
                r = await http.post(proxy.url, json=modern_echo("warm"), headers=modern_headers("echo"))
                assert "warm" in r.text, r.text
            before = dropped((await http.get(proxy.admin + "/metrics")).text)
            idle_mib = rss_mib(proxy.proc.pid)
            call_id = f"{kind}-{stream}"
            stalled: Stalled | None = None
            try:
                with anyio.fail_after(BOUND_S):
                    if stream == "2026":
                        body = json.dumps(flood_call("slow", True, call_id, modern=True)).encode()
                        stalled = Stalled(proxy.port, "POST", modern_headers("flood"), body)
                    else:
                        session = await open_session(http, proxy.url)
                        if stream == "post":
                            body = json.dumps(flood_call("slow", True, call_id)).encode()
                            stalled = Stalled(proxy.port, "POST", {**HEADERS, **session}, body)
                        else:
                            get = {"accept": "text/event-stream", **session}
                            stalled = Stalled(proxy.port, "GET", get)
                            assert stalled.read_head().startswith(b"HTTP/1.1 200")
                            r = await http.post(
                                proxy.url, json=flood_call(None, False, call_id), headers={**HEADERS, **session}
                            )
                            assert "flooding" in r.text, r.text
                    if stream != "listen":
                        assert stalled.read_head().startswith(b"HTTP/1.1 200")
                    await journal.await_for(
                        lambda j, c=call_id: j.events(tool="flood", event="flooded", call=c), timeout_s=BOUND_S
                    )
                    if stream == "2026":
                        # The shared link was not paused for the stalled caller: another is answered.
                        r = await http.post(proxy.url, json=modern_echo("still here"), headers=modern_headers("echo"))
                        assert "still here" in r.text, r.text
                    # The upstream wrote its last message; the proxy may still be reading them.
                    floods, again_at = 1, anyio.current_time() + 15
                    while True:
                        after = dropped((await http.get(proxy.admin + "/metrics")).text)
                        if sum(after.values()) - sum(before.values()) >= COUNT // 2:
                            break
                        if stream == "listen" and floods < 3 and anyio.current_time() > again_at:
                            # Nothing of the flood reached the proxy (one run in five, on the
                            # code of a724336 too). Most likely, not confirmed: the SDK's server
                            # drops a message tied to no request while its own GET stream to the
                            # proxy is not yet registered, right after the session opened. The
                            # same flood once more, at most twice.
                            again = flood_call(None, False, f"{call_id}-{floods}")
                            await http.post(proxy.url, json=again, headers={**HEADERS, **session})
                            floods, again_at = floods + 1, anyio.current_time() + 15
                        await anyio.sleep(0.05)  # polled: /metrics offers no event
                    peak_mib = rss_mib(proxy.proc.pid)
            finally:
                if stalled is not None:
                    stalled.close()
        shed = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
        print(f"{kind}-{stream}: dropped {shed}, RSS idle {idle_mib:.0f} MiB, after {peak_mib:.0f} MiB")
        # At most the 1 MiB bound was queued, plus what the kernel's socket buffers took (on
        # loopback up to a few MiB): most of the 16 MiB was dropped, each message counted by why.
        assert sum(shed.values()) >= COUNT // 2, shed
        if stream == "listen":
            assert shed["listen_closed"] > 0, shed
        else:
            assert shed["stream_full"] >= COUNT // 2, shed
        # 16 MiB written for a caller that reads nothing: the proxy grew by a fraction of it.
        assert peak_mib - idle_mib < 12, (idle_mib, peak_mib)
