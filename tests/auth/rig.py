"""What the auth end-to-end tests share: the raw MCP messages they send the proxy, and the SDK
servers that do their own authentication (tests/fixtures/protected_server.py over Streamable HTTP,
protected_sse_server.py over legacy SSE), each journaling the credential of what it receives."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
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


async def open_session(
    http: httpx.AsyncClient, url: str, token: str, capabilities: dict[str, Any] | None = None
) -> dict[str, str]:
    """A raw 2025 session opened with `token` (initialize, then initialized); its headers.
    `capabilities`: the client's (none by default)."""
    init = INIT if capabilities is None else {**INIT, "params": {**INIT["params"], "capabilities": capabilities}}
    opened = await http.post(url, json=init, headers={**ACCEPT, **bearer(token)})
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


async def sse_messages(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an event stream as they arrive (events without data skipped)."""
    async for line in response.aiter_lines():
        if line.startswith("data:") and line[5:].strip():
            yield json.loads(line[5:])


async def answer_the_servers_request(
    http: httpx.AsyncClient, url: str, owner: str, intruders: list[tuple[str | None, int]], bound_s: float
) -> tuple[list[httpx.Response], str]:
    """`owner` opens a session (with elicitation) and calls the fixture's `ask` tool, whose server
    asks it a question (`elicitation/create`) mid-call. While the call waits for the answer, each
    intruder (a token, or None for no credential) posts an answer to that request on the owner's
    session, then the owner answers. Returns the intruders' responses (their `expect`ed status is
    checked here, with the body of each) and the call's result text: whose answer reached the
    server. The session is deleted by its owner at the end."""
    session = await open_session(http, url, owner, {"elicitation": {}})
    mine = {**ACCEPT, **session, **bearer(owner)}
    refused: list[httpx.Response] = []
    with anyio.fail_after(bound_s):
        async with http.stream("POST", url, json=tool_call("ask", {"question": "who?"}, 7), headers=mine) as call:
            assert call.headers["content-type"].startswith("text/event-stream"), call.headers
            messages = sse_messages(call)
            asked = await anext(messages)
            assert asked.get("method") == "elicitation/create", asked
            for token, expect in intruders:
                credential = bearer(token) if token is not None else {}
                forged = {"jsonrpc": "2.0", "id": asked["id"], "result": answer_by(f"from {token}")}
                answer = await http.post(url, json=forged, headers={**ACCEPT, **session, **credential})
                assert answer.status_code == expect, (token, answer.status_code, answer.text)
                refused.append(answer)
            own = {"jsonrpc": "2.0", "id": asked["id"], "result": answer_by("from the owner")}
            accepted = await http.post(url, json=own, headers=mine)
            assert accepted.status_code == 202, accepted.text
            result = [m async for m in messages if m.get("id") == 7]
    await http.delete(url, headers={**session, **bearer(owner)})
    assert len(result) == 1 and "result" in result[0], result
    return refused, str(result[0]["result"]["content"][0]["text"])


def answer_by(text: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"answer": text}}


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
