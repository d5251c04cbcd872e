"""`--stdio-sessions shared` with one shared child (`--stdio-shared-children 1`): two sessions with
calls in flight on it at once, and still nothing of one session reaches another.

The real proxy process in front of the isolation server of test_isolation.py (it holds the first
`tools/call` until a second one arrives, then writes a log line, a progress notification for the
first call's token and a server request tied to no call, then answers both). Two 2025 sessions
each send one call, with the same request id and each with its own progress token: each gets its
own answer and at most its own progress; the log line and the server request, which two sessions
in flight on that child could each be tied to, reach neither (dropped and counted, the shared 2026
link's rule). Sessions do not start processes: the proxy answers each `initialize` from the
child's cached one. (tests/e2e/test_shared_children.py: what is routed when it can be.)
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_isolation import SERVER
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 20.0
BASE = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    script = tmp_path / "isolation_server.py"
    script.write_text(SERVER)
    p = ProxyProcess(
        upstream=[sys.executable, str(script)],
        extra=["--stdio-sessions", "shared", "--stdio-shared-children", "1"],
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=60)
    try:
        yield p
    finally:
        p.stop()


def servers_under(pid: int, script: str = "isolation_server.py") -> int:
    """Processes of the server `script` below the proxy (guards not counted)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    below, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        below += kids
        todo += kids
    count = 0
    for p in below:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(script.encode()) for a in argv) and not any(a.endswith(b"_guard.py") for a in argv):
            count += 1
    return count


async def open_session(http: httpx.AsyncClient, url: str) -> tuple[dict[str, str], dict[str, Any]]:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    opened = await http.post(url, json=init, headers=BASE)
    assert opened.status_code == 200, opened.text
    headers = {**BASE, "mcp-session-id": opened.headers["mcp-session-id"]}
    sent = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert sent.status_code == 202
    return headers, opened.json()["result"]


def dropped_untied(metrics: str) -> float:
    found = re.search(r'^mcp_recovery_dropped_messages_total\{reason="untied"\} (\S+)$', metrics, re.MULTILINE)
    assert found
    return float(found.group(1))


async def test_two_sessions_on_one_shared_child_see_only_their_own_messages(proxy: ProxyProcess) -> None:
    assert proxy.proc is not None
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        before = dropped_untied((await http.get(proxy.admin + "/metrics")).text)
        (alice, result), (bob, _) = await open_session(http, proxy.url), await open_session(http, proxy.url)
        assert alice["mcp-session-id"] != bob["mcp-session-id"]
        assert result["protocolVersion"] == "2025-06-18", "the session's own revision"
        assert result["serverInfo"]["name"] == "isolation", "the child's own answer"
        assert "logging" in result["capabilities"], "per-session log levels are kept by the proxy"

        def call(headers: dict[str, str], name: str, who: str) -> Any:
            body = {
                "jsonrpc": "2.0",
                "id": 7,  # the same id in both sessions
                "method": "tools/call",
                "params": {"name": name, "arguments": {"who": who}, "_meta": {"progressToken": f"{who}-token"}},
            }
            return asyncio.ensure_future(http.post(proxy.url, json=body, headers=headers))

        async with asyncio.timeout(BOUND_S):
            call_a = call(alice, "first", "alice")
            await asyncio.sleep(0)  # let alice's request go first (the order does not decide the test)
            call_b = call(bob, "second", "bob")
            answer_a, answer_b = await asyncio.gather(call_a, call_b)
        after = dropped_untied((await http.get(proxy.admin + "/metrics")).text)
        for _ in range(3):
            await open_session(http, proxy.url)
        level = await http.post(
            proxy.url,
            json={"jsonrpc": "2.0", "id": 9, "method": "logging/setLevel", "params": {"level": "debug"}},
            headers=alice,
        )
        servers = servers_under(proxy.proc.pid)

    texts = {answer_a.text, answer_b.text}
    assert all("private log line" not in text for text in texts), "an untied log line reaches no session"
    assert all("roots/list" not in text for text in texts), "an untied server request reaches no session"
    assert "answer for alice" in answer_a.text and "answer for bob" in answer_b.text
    assert "answer for alice" not in answer_b.text and "answer for bob" not in answer_a.text
    assert "progress of bob" not in answer_a.text and "progress of alice" not in answer_b.text
    assert ("progress of alice" in answer_a.text) != ("progress of bob" in answer_b.text)
    assert '"alice-token"' in answer_a.text or "progress of" not in answer_a.text, "the caller's own token back"
    assert after - before == 2, "the log line and the server request were dropped and counted"
    assert level.json()["result"] == {}, "a session's own level, kept by the proxy"
    # five sessions: the 2026 child of the start-up probe and the one shared child, no more
    assert servers <= 2, f"{servers} server processes for five 2025 sessions"
