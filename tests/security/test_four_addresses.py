"""Four addresses cannot starve the proxy, through the real process.

Any local process can pick source addresses in 127.0.0.0/8. Here four of them (127.0.0.2..5)
take every session slot (each session with its listen stream open, as an SDK client keeps it) and
fill both ports' connections with half-sent request heads, renewing them between probes. A fifth
caller (127.0.0.6) still gets a session and an answer, and `/healthz` answers 200 on every probe:
at the session cap the least recently used idle session is closed, at the connection cap a
connection without a complete request head. The caps are set small so the test reaches them
(`--max-sessions 8`, `--max-connections 32`); the upstream is the demo server over HTTP.
Every wait is bounded (socket timeouts, httpx timeouts, the test timeout).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.demo_http import demo_over_http
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
ATTACKERS = [f"127.0.0.{i}" for i in range(2, 6)]
HALF_OPEN_PER_ADDRESS = 8
MAX_CONNECTIONS = 32
MAX_SESSIONS = 8


def half_open(address: str, port: int) -> socket.socket:
    """A connection from `address` that sends half a request head and then nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n")  # and never the blank line
    return sock


def client_from(address: str) -> httpx.Client:
    return httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address=address))


def open_session(http: httpx.Client, url: str) -> dict[str, str]:
    r = http.post(url, json=INIT, headers=HEADERS)
    assert r.status_code == 200, r.text
    session = {"mcp-session-id": r.headers["mcp-session-id"]}
    assert http.post(url, json=INITIALIZED, headers={**HEADERS, **session}).status_code == 202
    return session


@contextlib.contextmanager
def listening(address: str, url: str, session: dict[str, str]) -> Iterator[None]:
    """The session's GET listen stream held open from `address` (a request that runs)."""
    with client_from(address) as http, http.stream("GET", url, headers={**HEADERS, **session}) as response:
        assert response.status_code == 200
        yield


def test_four_addresses_cannot_take_every_session_and_connection_from_a_fifth_caller_or_the_probes(
    tmp_path: Path,
) -> None:
    extra = ["--max-sessions", str(MAX_SESSIONS), "--max-connections", str(MAX_CONNECTIONS), "--head-timeout-s", "60"]
    held: list[socket.socket] = []
    with (
        demo_over_http() as upstream,
        ProxyProcess(upstream_url=upstream, extra=extra, log_path=tmp_path / "proxy.log") as proxy,
        contextlib.ExitStack() as streams,
    ):
        try:
            # Every session slot, two per address, each with its listen stream open.
            for address in ATTACKERS:
                with client_from(address) as http:
                    for _ in range(MAX_SESSIONS // len(ATTACKERS)):
                        streams.enter_context(listening(address, proxy.url, open_session(http, proxy.url)))
            with httpx.Client(timeout=30) as probe:
                assert probe.get(proxy.admin + "/readyz").json()["sessions"] == MAX_SESSIONS
                for round_ in range(5):
                    # The four fill (again) every connection of both ports with half-sent heads.
                    for port in (proxy.port, proxy.admin_port):
                        for address in ATTACKERS:
                            held += [half_open(address, port) for _ in range(HALF_OPEN_PER_ADDRESS)]
                    r = probe.get(proxy.admin + "/healthz")
                    assert r.status_code == 200, (round_, r.text)
                # The fifth caller, on the MCP port: a session (an idle one of theirs closed for it)
                # and a tool call answered.
                with client_from("127.0.0.6") as fifth:
                    session = open_session(fifth, proxy.url)
                    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo"}}
                    call["params"]["arguments"] = {"text": "fifth"}  # type: ignore[index]
                    r = fifth.post(proxy.url, json=call, headers={**HEADERS, **session})
                    assert r.status_code == 200 and "fifth" in r.text, r.text
                metrics = probe.get(proxy.admin + "/metrics").text
                assert "mcp_recovery_sessions_evicted_total 1.0" in metrics
                assert 'mcp_recovery_http_refused_total{reason="head_pending"}' in metrics
                assert probe.get(proxy.admin + "/healthz").status_code == 200
        finally:
            for sock in held:
                sock.close()
