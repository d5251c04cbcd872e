"""/readyz says ready only once the MCP listener accepts connections.

The admin server and the MCP server start side by side; the MCP server binds its socket only after
its lifespan start-up (the upstream probe) completed. /readyz answered 200 in between, and a client
told "ready" got a refused connection (seen once in CI as ConnectionRefused right after /readyz
200). This test holds the MCP server between its start-up and its bind, the way a busy machine
does, and asks /readyz in that window: the real proxy (`proxy.server.run`) in this process, a real
stdio upstream, real sockets.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.frontend.http.app import McpHttpApp
from proxy.server import run
from proxy.settings import Settings
from tests.fixtures.helpers import free_port
from tests.proxy_process import scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(60)]


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_readyz_waits_for_the_mcp_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = asyncio.Event()
    held = asyncio.Event()
    lifespan = McpHttpApp._lifespan

    async def held_lifespan(self: McpHttpApp, receive: Any, send: Any) -> None:
        async def gated_send(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                held.set()  # the service has started (and probed): uvicorn binds once this is sent
                await gate.wait()
            await send(message)

        await lifespan(self, receive, gated_send)

    monkeypatch.setattr(McpHttpApp, "_lifespan", held_lifespan)
    port, admin_port = free_port(), free_port()
    settings = Settings(
        listen=f"http://127.0.0.1:{port}/mcp",
        admin=f"127.0.0.1:{admin_port}",
        upstream_command=shlex.join(scripted_stdio_command(tmp_path / "journal.jsonl")),
        shutdown_grace_s=1,
    )
    proxy = asyncio.create_task(run(settings))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin_port}", timeout=5) as admin:
            async with asyncio.timeout(30):
                await held.wait()
                while True:  # the admin server may still be binding its own socket
                    try:
                        answer = await admin.get("/readyz")
                        break
                    except httpx.ConnectError:
                        await asyncio.sleep(0.05)
            assert _refused(port)
            assert answer.status_code == 503, answer.text
            assert answer.json()["reasons"] == ["MCP listener not accepting connections yet"]

            gate.set()
            async with asyncio.timeout(30):
                while (await admin.get("/readyz")).status_code != 200:  # noqa: ASYNC110 (polled as a probe does)
                    await asyncio.sleep(0.01)
            assert not _refused(port)  # the first "ready" can be believed at once
    finally:
        gate.set()
        # The proxy's own graceful stop (its handler is installed: this is the main thread), so
        # that it stops its upstream child as it would in production.
        os.kill(os.getpid(), signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proxy == 0
