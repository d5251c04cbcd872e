"""Every 2026 `tools/call` reaches the engine, whatever the upstream is doing.

Real processes: the proxy (shipped default policies) in front of a stdio upstream whose command
exits at once until a flag file exists (a crash-looping server), then runs the scripted SDK server.
A 2026 `tools/call` sent before the upstream ever answered used to get HTTP 503 with a bare
-32603 from the frontend, without an attempt, a classification or a report; it gets the engine's
unresolved result now (transient, not dispatched), and once the upstream runs, its answer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
MODERN = "2026-07-28"
REPORT = "io.mcp-recovery-proxy/unresolved"
BOUND_S = 60.0


def modern_call(name: str, arguments: dict[str, Any], deadline_ms: int) -> tuple[dict[str, str], dict[str, Any]]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.mcp-recovery-proxy/deadlineMs": deadline_ms,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    body["params"]["_meta"] = meta
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": name,
    }
    return headers, body


def wait_alive(proxy: ProxyProcess, timeout_s: float = 60.0) -> None:
    """The proxy answers on both ports (not ready: its upstream is down on purpose). /healthz can
    answer before the MCP listener is bound, so the MCP port is asked too (any HTTP answer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proxy.proc is not None and proxy.proc.poll() is None, proxy.log_tail()
        try:
            if httpx.get(proxy.admin + "/healthz", timeout=1.0).status_code == 200:
                httpx.get(proxy.url, timeout=1.0)
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(proxy.log_tail())


async def test_a_2026_tool_call_before_the_upstream_is_reached_gets_the_engines_answer(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    flag = tmp_path / "upstream-may-run"
    server = scripted_stdio_command(journal.path, tmp_path / "state.json")
    upstream = ["sh", "-c", 'test -e "$0" || exit 3; exec "$@"', str(flag), *server]
    proxy = ProxyProcess(upstream=upstream, log_path=tmp_path / "proxy.log")
    proxy.spawn()
    try:
        wait_alive(proxy)
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            headers, body = modern_call("echo", {"text": "down", "call_id": "down"}, 3000)
            with anyio.fail_after(BOUND_S):
                answer = await http.post(proxy.url, headers=headers, json=body)
            assert answer.status_code == 200, (answer.status_code, answer.text[:500])
            result = answer.json()["result"]
            assert result["isError"] is True
            report = result["_meta"][REPORT]
            assert report["errorCategory"] == "transient"
            assert report["attemptCount"] >= 1
            assert all(step["dispatched"] == "no" for step in report["attemptedSteps"]), report["attemptedSteps"]
            assert report["outcomeUnknown"] is False

            flag.touch()  # the upstream may run now: the next call reaches it through the engine
            headers, body = modern_call("echo", {"text": "up", "call_id": "up"}, 30000)
            with anyio.fail_after(BOUND_S):
                answer = await http.post(proxy.url, headers=headers, json=body)
            assert answer.status_code == 200, (answer.status_code, answer.text[:500])
            result = answer.json()["result"]
            assert result.get("isError") is not True, result
            assert journal.executions("echo", "up") == 1
    finally:
        proxy.stop()
