"""An HTTP upstream on the TypeScript SDK restarted under live proxied 2025 sessions: an upstream
that forgot a session is re-attached, not blamed on the caller (docs/recovery.md, "A session the
upstream forgot").

Our TS-SDK server (tests/interop/ts_http_server.mjs) keeps sessions in its process, so after a
restart it answers the proxy's old upstream session id with 400 "No valid session ID provided"
(the SDK example's answer), not 404. Both clients keep their own session with the proxy across
the restart:
- while the upstream is down, the admin port's /readyz answers 503;
- once it is back on the same port, each client's next call on its unchanged session succeeds,
  answered by the new process (its pid), and `tools/list` works again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.fixtures.helpers import free_port
from tests.interop.harness import Call, Prerequisites, Process, Target, TsClient, started, ts_http_server
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.interop]
BOUND_S = 60.0
READY_BOUND_S = 20.0


@pytest.fixture
def upstream_and_proxy(prereq: Prerequisites, tmp_path: Path) -> Iterator[tuple[int, list[Process], ProxyProcess]]:
    port = free_port()
    servers = [ts_http_server(prereq, port).start()]
    try:
        # A short re-probe interval so /readyz follows the upstream within the test's bound.
        proxy = ProxyProcess(
            upstream_url=f"http://127.0.0.1:{port}/mcp",
            extra=["--ready-check-interval-s", "0.2"],
            log_path=tmp_path / "proxy.log",
        )
        with started(proxy):
            yield port, servers, proxy
    finally:
        for server in servers:
            server.stop()


def readyz(proxy: ProxyProcess) -> int:
    return httpx.get(proxy.admin + "/readyz", timeout=2.0).status_code


async def wait_readyz(proxy: ProxyProcess, status: int) -> None:
    """Poll /readyz until it answers `status`, bounded (the proxy has no event to wait on)."""
    deadline = time.monotonic() + READY_BOUND_S
    last = None
    while time.monotonic() < deadline:
        last = await anyio.to_thread.run_sync(readyz, proxy)
        if last == status:
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"/readyz stayed {last}, not {status}, for {READY_BOUND_S}s; log: {proxy.log_tail()}")


def text_of(result: object) -> str:
    return "".join(c.text for c in getattr(result, "content", []) if isinstance(c, TextContent))


async def test_a_restarted_ts_sdk_upstream_is_reattached_under_live_sessions(
    prereq: Prerequisites, upstream_and_proxy: tuple[int, list[Process], ProxyProcess]
) -> None:
    port, servers, proxy = upstream_and_proxy
    first_pid = servers[0].pid
    ts = await anyio.to_thread.run_sync(TsClient, prereq, Target(url=proxy.url))
    try:
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode="legacy") as py:
                assert text_of(await py.call_tool("whoami", {})) == str(first_pid)
                before = await anyio.to_thread.run_sync(ts.call, Call("whoami"))
                assert before.ok and before.texts == str(first_pid), before

                servers[0].stop()  # by its pid
                await wait_readyz(proxy, 503)

                servers.append(await anyio.to_thread.run_sync(ts_http_server(prereq, port).start))
                second_pid = servers[-1].pid
                await wait_readyz(proxy, 200)

                # The same client sessions, unchanged: the proxy must have re-attached upstream.
                after = await py.call_tool("whoami", {})
                assert not after.is_error and text_of(after) == str(second_pid), (after, proxy.log_tail())
                assert {t.name for t in (await py.list_tools()).tools} == {"echo", "forecast", "whoami"}
                forecast = await py.call_tool("forecast", {"city": "Oslo"})
                assert forecast.structured_content == {"city": "Oslo", "temperature": 4}

                ts_after = await anyio.to_thread.run_sync(ts.call, Call("whoami"))
                assert ts_after.ok and ts_after.texts == str(second_pid), (ts_after, proxy.log_tail())
                listed = await anyio.to_thread.run_sync(ts.command, {"op": "listTools"})
                assert listed["ok"], listed
    finally:
        await anyio.to_thread.run_sync(ts.close)
