"""What the auth end-to-end tests share: the raw MCP messages they send the proxy, and the SDK
servers that do their own authentication (tests/fixtures/protected_server.py over Streamable HTTP,
protected_sse_server.py over legacy SSE), each journaling the credential of what it receives."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.fixtures.helpers import PYTHON, REPO_ROOT, free_port, terminate, wait_port

MODERN = "2026-07-28"
ACCEPT = {"accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def tool_call(name: str, arguments: dict[str, Any], id_: int = 2) -> dict[str, Any]:
    """A 2025 `tools/call` message."""
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def modern_call(name: str, arguments: dict[str, Any], token: str | None = None) -> tuple[dict[str, str], bytes]:
    """The headers and body of a 2026-07-28 `tools/call`. `token`: a bearer token, or a whole
    `Authorization` value when it holds a blank (a malformed or non-Bearer one)."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": name,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    headers = {
        "content-type": "application/json",
        **ACCEPT,
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": name,
    }
    if token is not None:
        headers["authorization"] = token if " " in token else f"Bearer {token}"
    return headers, json.dumps(body).encode()


async def open_session(http: httpx.AsyncClient, url: str, token: str) -> dict[str, str]:
    """A raw 2025 session opened with `token` (initialize, then initialized); its headers."""
    opened = await http.post(url, json=INIT, headers={**ACCEPT, **bearer(token)})
    assert opened.status_code == 200, opened.text
    session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    answer = await http.post(url, json=note, headers={**ACCEPT, **session, **bearer(token)})
    assert answer.status_code == 202
    return session


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST (JSON, or the last `data:` of an event stream)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


@contextlib.contextmanager
def protected_server(script: str, tokens: Path, journal: Path, *, bound_s: float) -> Iterator[int]:
    """Run tests/fixtures/`script` (protected_server.py or protected_sse_server.py) on a free
    loopback port with its tokens file and journal; yields the port once it accepts, and stops
    the server by its pid. Its stderr goes to `server.log` beside the journal."""
    port = free_port()
    with open(journal.parent / "server.log", "ab") as log:
        server = subprocess.Popen(
            [PYTHON, str(REPO_ROOT / "tests" / "fixtures" / script), str(port), str(tokens), str(journal)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        wait_port(port, timeout_s=bound_s)
        yield port
    finally:
        terminate(server)
