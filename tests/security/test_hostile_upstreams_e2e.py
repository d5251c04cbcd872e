"""Hostile stdio upstreams through the real proxy process, for real SDK clients of both eras
(docs/security.md, "Hostile upstreams"): what the caller sees, and that the proxy serves the next
request. The link-level checks are in test_hostile_upstreams.py.

Policies give the hostile call a deadline far beyond the test's own bound: a call that ends inside
the bound ended because the proxy saw the upstream's failure, not because a timer ran out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from tests.fixtures.helpers import PYTHON
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

HOSTILE_STDIO = str(Path(__file__).resolve().parents[1] / "fixtures" / "hostile_stdio.py")
BOUND_S = 60.0
POLICY = "tools: [poke]\nattempts: 1\ndeadline: 300s\nattempt_timeout: 300s\nidle_timeout: null\n"
REPORT = "io.mcp-recovery-proxy/unresolved"


@pytest.fixture(scope="module")
def escaping(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Path]]:
    tmp = tmp_path_factory.mktemp("hostile-escape")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "poke.yaml").write_text(POLICY)
    pid_file = tmp / "grandchild.pid"
    command = [PYTHON, HOSTILE_STDIO, "--mode", "escape", "--pid-file", str(pid_file)]
    extra = ["--policies", str(tmp / "policies"), "--request-timeout-s", "300"]
    with ProxyProcess(upstream=command, extra=extra, log_path=tmp / "proxy.log") as proxy:
        yield proxy, pid_file


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_server_that_escapes_with_its_pipes_gets_an_unresolved_result_and_the_next_request_is_served(
    escaping: tuple[ProxyProcess, Path], mode: str
) -> None:
    proxy, pid_file = escaping
    pid_file.unlink(missing_ok=True)
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=mode) as client:
            await client.list_tools()
            result: Any = await client.call_tool("poke", {})
            # the next request of the same client: a new child answers it
            tools = await client.list_tools()
    assert result.is_error
    report = result.meta[REPORT]
    (step,) = report["attemptedSteps"]
    # what happened, said as it happened: the server's end (not a timeout), its effect unknown
    assert step["outcome"] == "transport_error" and step["dispatched"] == "unknown", report
    assert "exited" in step["detail"], report
    assert [tool.name for tool in tools.tools] == ["poke"]
    grandchild = int(pid_file.read_text())
    try:
        for _ in range(int(BOUND_S / 0.05)):  # the guard ends it before it exits itself
            if not _alive(grandchild):
                break
            await anyio.sleep(0.05)
        assert not _alive(grandchild), "the process that left the group outlived its server"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)
    assert proxy.proc is not None and proxy.proc.poll() is None


async def test_a_tool_name_of_200000_characters_stays_out_of_metrics_and_log_lines(tmp_path: Path) -> None:
    """An upstream listing one tool named with 200,000 characters, called three times through the
    proxy with --log-json --call-log all, made a 216,657-character log line per call and a 10.8 MB
    /metrics (54 series each carrying the name). The call is served; the name is no label and no
    log line carries it whole."""
    name = "t" * 200_000
    command = [PYTHON, HOSTILE_STDIO, "--mode", "long-name"]
    extra = ["--log-json", "--call-log", "all"]
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    with ProxyProcess(upstream=command, extra=extra, log_path=tmp_path / "proxy.log") as proxy:
        with anyio.fail_after(BOUND_S):
            async with httpx.AsyncClient(timeout=BOUND_S) as http:
                r = await http.post(proxy.url, json=init, headers=headers)
                assert r.status_code == 200, r.text[:300]
                headers["mcp-session-id"] = r.headers["mcp-session-id"]
                headers["mcp-protocol-version"] = "2025-11-25"
                ack = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                assert (await http.post(proxy.url, json=ack, headers=headers)).status_code == 202
                listing = await http.post(
                    proxy.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers
                )
                assert name in listing.text, "the listing itself is relayed as the upstream sent it"
                for i in range(3):
                    call = {
                        "jsonrpc": "2.0",
                        "id": 2 + i,
                        "method": "tools/call",
                        "params": {"name": name, "arguments": {}},
                    }
                    answer = await http.post(proxy.url, json=call, headers=headers)
                    assert answer.status_code == 200 and "real" in answer.text, answer.text[:300]
                scrape = (await http.get(proxy.admin + "/metrics")).text
        assert proxy.log_path is not None
        log = proxy.log_path.read_text(errors="replace")
    assert 'tool="other"' in scrape and "t" * 200 not in scrape
    assert len(scrape) < 200_000, len(scrape)
    calls = [json.loads(line) for line in log.splitlines() if '"logger": "proxy.calls"' in line]
    assert len(calls) == 3 and all(c["outcome"] == "success" for c in calls), log[-2000:]
    assert all(len(line) < 20_000 for line in log.splitlines()), max(len(line) for line in log.splitlines())
    assert all(len(line) < 2000 for line in log.splitlines() if '"logger": "proxy.calls"' in line)
