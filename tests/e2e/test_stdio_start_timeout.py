"""`--stdio-start-timeout-s`: how long a stdio child may take to answer its first request after it
was started (a setting: at a load of ~20 a Python SDK server takes more than the default 10 s).

Real processes: the proxy (`python -m proxy serve`) in front of the scripted SDK server over stdio,
which waits `--start-delay-s` before it serves. A server slower to start than the default but
within the setting is served in both eras; one that never answers in time is reported, in
`/readyz` and the proxy's log, with the setting named.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.anyio]
BOUND_S = 100.0
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


async def test_a_server_that_starts_slowly_within_the_setting_is_served_in_both_eras(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, extra=["--start-delay-s", "3"]),
        extra=["--stdio-start-timeout-s", "60"],
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=BOUND_S)
    try:
        with anyio.fail_after(BOUND_S):
            for mode in ("2026-07-28", "legacy"):
                async with Client(proxy.url, mode=mode) as client:  # type: ignore[arg-type]
                    result = await client.call_tool("echo", {"text": mode})
                assert [c.text for c in result.content if isinstance(c, TextContent)] == [mode], result
        assert journal.events(event="serving"), "the server's slow start was not taken"
    finally:
        proxy.stop()


async def test_a_server_that_does_not_answer_within_the_setting_is_reported_with_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, extra=["--start-delay-s", "600"]),
        extra=["--stdio-start-timeout-s", "1"],
        log_path=tmp_path / "proxy.log",
    )
    proxy.spawn()
    try:
        reasons: list[str] = []
        with anyio.fail_after(BOUND_S):
            async with httpx.AsyncClient(timeout=5.0) as http:
                while not any("--stdio-start-timeout-s" in r for r in reasons):
                    try:
                        ready = await http.get(proxy.admin + "/readyz")
                    except httpx.HTTPError:  # the admin port is not bound yet
                        await anyio.sleep(0.1)
                        continue
                    assert ready.status_code == 503, ready.text
                    reasons = ready.json().get("reasons", [])
                    await anyio.sleep(0.1)
        reason = next(r for r in reasons if "--stdio-start-timeout-s" in r)
        assert "no answer within 1 s of its start" in reason, reasons
        assert "no answer within 1 s of its start (--stdio-start-timeout-s)" in proxy.log_tail(20000)
    finally:
        proxy.stop()
