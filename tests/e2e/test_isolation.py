"""Isolation on the shared 2026 link: what the upstream writes for one caller never reaches another.

The real proxy process in front of a small stdio server over real pipes. The server holds the
first `tools/call` until a second one arrives, then writes a log line (which stdio cannot tie to
a request), a progress notification for the first call's token (which it can), and a server
request that came with no call; only then it answers both. Before the fix, the log line went to
whichever request stream had opened last: the other caller's. A call of `solo` writes a log line
and answers at once: with one request in flight that asked for log messages, the line is its own.
"""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 20.0

SERVER = textwrap.dedent(
    """
    import json, sys
    held = []
    def write(msg):
        sys.stdout.write(json.dumps(msg) + "\\n"); sys.stdout.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue
        if method is None:
            continue  # a client's answer to our server request
        if method == "server/discover":
            write({"jsonrpc": "2.0", "id": mid, "result": {
                "supportedVersions": ["2026-07-28", "2025-11-25"], "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "isolation", "version": "1"}}})
        elif method == "initialize":
            write({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "isolation", "version": "1"}}})
        elif method == "tools/list":
            tool = lambda n: {"name": n, "inputSchema": {"type": "object"},
                              "annotations": {"readOnlyHint": True}}
            write({"jsonrpc": "2.0", "id": mid, "result": {"tools": [tool("first"), tool("second")]}})
        elif method == "tools/call" and msg["params"]["name"] == "solo":
            who = msg["params"]["arguments"]["who"]
            write({"jsonrpc": "2.0", "method": "notifications/message",
                   "params": {"level": "info", "data": f"log line of solo {who}"}})
            write({"jsonrpc": "2.0", "id": mid, "result": {
                "content": [{"type": "text", "text": "answer for " + who}], "isError": False}})
        elif method == "tools/call":
            held.append(msg)
            if len(held) < 2:
                continue
            first = held[0]
            who = first["params"]["arguments"]["who"]
            write({"jsonrpc": "2.0", "method": "notifications/message",
                   "params": {"level": "info", "data": f"private log line of {who}"}})
            token = first["params"].get("_meta", {}).get("progressToken")
            if token is not None:
                write({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": {"progressToken": token, "progress": 1, "message": f"progress of {who}"}})
            write({"jsonrpc": "2.0", "id": "srv-1", "method": "roots/list", "params": {}})
            for call in held:
                text = "answer for " + call["params"]["arguments"]["who"]
                write({"jsonrpc": "2.0", "id": call["id"], "result": {
                    "content": [{"type": "text", "text": text}], "isError": False}})
            held.clear()
        else:
            write({"jsonrpc": "2.0", "id": mid, "result": {}})
    """
)

MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"roots": {}},
}


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    script = tmp_path / "isolation_server.py"
    script.write_text(SERVER)
    with ProxyProcess(upstream=[sys.executable, str(script)], log_path=tmp_path / "proxy.log") as p:
        yield p


def _modern_call(name: str, who: str, progress: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    meta: dict[str, Any] = dict(MODERN_META)
    if progress is not None:
        meta["progressToken"] = progress
    body = {
        "jsonrpc": "2.0",
        "id": 1,  # the same id for both callers: 2026 ids need not be unique across clients
        "method": "tools/call",
        "params": {"name": name, "arguments": {"who": who}, "_meta": meta},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": name,
    }
    return body, headers


def _dropped_untied(metrics: str) -> float:
    found = re.search(r'^mcp_recovery_dropped_messages_total\{reason="untied"\} (\S+)$', metrics, re.MULTILINE)
    assert found, "the drop counter is exported"
    return float(found.group(1))


async def test_a_log_line_of_one_2026_caller_reaches_no_other(proxy: ProxyProcess) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        before = _dropped_untied((await http.get(proxy.admin + "/metrics")).text)
        body_a, headers_a = _modern_call("first", "alice", progress="alice-token")
        body_b, headers_b = _modern_call("second", "bob", progress="bob-token")
        call_a = asyncio.ensure_future(http.post(proxy.url, json=body_a, headers=headers_a))
        # The upstream holds alice's call until bob's arrives; bob's stream is the newer one.
        await asyncio.sleep(0)  # let alice's request go first (the order does not decide the test)
        call_b = asyncio.ensure_future(http.post(proxy.url, json=body_b, headers=headers_b))
        async with asyncio.timeout(BOUND_S):
            answer_a, answer_b = await asyncio.gather(call_a, call_b)
        after = _dropped_untied((await http.get(proxy.admin + "/metrics")).text)

    texts = {answer_a.text, answer_b.text}
    assert all("private log line" not in text for text in texts), "an untied log line reaches nobody"
    assert all("roots/list" not in text for text in texts), "an untied server request reaches nobody"
    # What can be tied still routes: each answer to its caller, the progress (of whichever call
    # reached the upstream first) by its token to that caller only.
    assert "answer for alice" in answer_a.text and "answer for bob" in answer_b.text
    assert "answer for alice" not in answer_b.text and "answer for bob" not in answer_a.text
    assert "progress of bob" not in answer_a.text and "progress of alice" not in answer_b.text
    assert ("progress of alice" in answer_a.text) != ("progress of bob" in answer_b.text)
    assert after - before == 2, "the log line and the server request were dropped and counted"


async def test_a_2025_session_keeps_getting_its_own_childs_untied_messages(proxy: ProxyProcess) -> None:
    """A 2025 session has its own child: nobody else can have caused its log lines."""
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        base = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        opened = await http.post(proxy.url, json=init, headers=base)
        assert opened.status_code == 200
        headers = {**base, "mcp-session-id": opened.headers["mcp-session-id"]}
        await http.post(proxy.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)

        def call(i: int, name: str, who: str) -> Any:
            body = {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {"name": name, "arguments": {"who": who}},
            }
            return asyncio.ensure_future(http.post(proxy.url, json=body, headers=headers))

        async with asyncio.timeout(BOUND_S):
            first = call(1, "first", "alice")
            await asyncio.sleep(0)
            second = call(2, "second", "alice-again")
            answers = await asyncio.gather(first, second)
    joined = "".join(a.text for a in answers)
    assert "private log line of alice" in joined, "the session's own log line reaches the session"


async def test_a_log_line_reaches_the_one_2026_caller_in_flight_that_asked_for_logs(proxy: ProxyProcess) -> None:
    """Stdio cannot tie a log line to a request, but a 2026 server logs only for a request that
    asked (`logLevel`) and writes its lines before its answer: with that one request in flight the
    line is its own. Before the fix every 2026 caller of a stdio upstream lost all its log lines
    (seen with the TypeScript SDK v2 server, tests/interop/test_ts2_server.py)."""
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        before = _dropped_untied((await http.get(proxy.admin + "/metrics")).text)
        asked, headers = _modern_call("solo", "alice", progress=None)
        asked["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = "info"
        not_asked, _ = _modern_call("solo", "bob", progress=None)
        async with asyncio.timeout(BOUND_S):
            answer_asked = await http.post(proxy.url, json=asked, headers=headers)
            answer_not_asked = await http.post(proxy.url, json=not_asked, headers=headers)
        after = _dropped_untied((await http.get(proxy.admin + "/metrics")).text)
    assert "log line of solo alice" in answer_asked.text and "answer for alice" in answer_asked.text
    # a line no request asked for still reaches nobody (a server that logs regardless)
    assert "log line of solo bob" not in answer_not_asked.text and "answer for bob" in answer_not_asked.text
    assert after - before == 1
