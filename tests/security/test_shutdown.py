"""SIGTERM while a 2025 listen stream (GET) is open: the stream is closed cleanly, the proxy exits
0, and nothing is logged as an unexpected error (no "Exception in ASGI
application" with a traceback)."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = pytest.mark.slow

BOUND_S = 20.0
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


def _request(port: int, head: list[str], body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    lines = [*head, f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}", "", ""]
    sock.sendall("\r\n".join(lines).encode() + body)
    return sock


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_sigterm_with_an_open_listen_stream_closes_it_cleanly(tmp_path: Path) -> None:
    command = scripted_stdio_command(tmp_path / "journal.jsonl", tmp_path / "state.json")
    proxy = ProxyProcess(upstream=command, log_path=tmp_path / "proxy.log").start()
    try:
        accept = "Accept: application/json, text/event-stream"
        init = _request(
            proxy.port,
            ["POST /mcp HTTP/1.1", "Content-Type: application/json", accept, "Connection: close"],
            json.dumps(INIT).encode(),
        )
        head = _read_head(init).decode("latin-1")
        init.close()
        session = next(
            line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("mcp-session-id:")
        )
        listen = _request(
            proxy.port,
            [
                "GET /mcp HTTP/1.1",
                "Accept: text/event-stream",
                f"Mcp-Session-Id: {session}",
                "Mcp-Protocol-Version: 2025-11-25",
            ],
        )
        assert b" 200 " in _read_head(listen).split(b"\r\n", 1)[0]
        assert proxy.proc is not None
        os.kill(proxy.proc.pid, signal.SIGTERM)
        # The stream ends (the proxy closes it) instead of being cut by the process exiting.
        with listen:
            while listen.recv(65536):
                pass
        # (The exit status on SIGTERM is checked in tests/e2e/test_process_lifecycle.py, not here.)
        proxy.proc.wait(timeout=BOUND_S)
    finally:
        proxy.stop()
    log = (tmp_path / "proxy.log").read_text(errors="replace")
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-3000:]
