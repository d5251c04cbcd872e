"""An HTTP upstream restarted under a live 2025 session is re-attached, whichever way it says it
forgot the session: the Python SDK's 404, or the TypeScript SDK's 400 "No valid session ID
provided" (the scripted server's `--forgotten-session-400` answers exactly that body).

The real proxy in a subprocess, a real SDK client, the scripted server as a real process that is
stopped and started again on the same port. While it is down, `/readyz` says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.fixtures.helpers import ScriptedHTTP
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 40.0


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def readyz(proxy: ProxyProcess) -> int:
    try:
        return httpx.get(proxy.admin + "/readyz", timeout=2.0).status_code
    except httpx.HTTPError:
        return 0


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    """Wait for `condition` (checked off the event loop), bounded; polling is the only signal an
    HTTP readiness endpoint gives."""
    deadline = time.monotonic() + timeout_s
    while not await anyio.to_thread.run_sync(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s}s")
        await anyio.sleep(0.05)


@pytest.mark.parametrize("forgets_with", ["400", "404"])
async def test_a_restarted_upstream_is_reattached_for_a_live_session(tmp_path: Path, forgets_with: str) -> None:
    extra = ["--forgotten-session-400"] if forgets_with == "400" else []
    server = ScriptedHTTP(tmp_path / "journal.jsonl", tmp_path / "state.json", extra=extra).start()
    try:
        proxy = ProxyProcess(
            upstream_url=server.url, extra=["--ready-check-interval-s", "0.2"], log_path=tmp_path / "proxy.log"
        ).start()
        try:
            with anyio.fail_after(BOUND_S):
                async with Client(proxy.url, mode="legacy") as client:
                    assert "echo" in {t.name for t in (await client.list_tools()).tools}
                    assert text_of(await client.call_tool("echo", {"text": "before"})) == "before"

                    await anyio.to_thread.run_sync(server.stop)
                    await until(lambda: readyz(proxy) == 503, "unready while the upstream is down")
                    await anyio.to_thread.run_sync(server.start)
                    await until(lambda: readyz(proxy) == 200, "ready again")

                    # the same downstream session: every kind of request recovers, not only tools/call
                    assert "echo" in {t.name for t in (await client.list_tools()).tools}
                    result = await client.call_tool("echo", {"text": "after"})
                    assert not result.is_error, text_of(result)
                    assert text_of(result) == "after"
            if forgets_with == "400":
                assert any(e.get("event") == "http_forgot_session" for e in server.journal.events()), (
                    "the restarted server never answered the old session with 400: the test proved nothing"
                )
        finally:
            proxy.stop()
    finally:
        server.stop()
