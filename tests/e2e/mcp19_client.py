"""A small client on the Python SDK 1.9 (revision 2025-03-26), run by the interop tests with the
interpreter of .cache/interop/venv-mcp19 (it imports nothing of this project).

Usage: python mcp19_client.py URL. It lists tools and calls `echo`, `slow_progress` (with a
progress callback: the answer comes as an event stream) and `log_then_answer` (a logging
notification on the way), and prints one JSON line with what it got. Everything the SDK logs goes
to stderr with its level, which the test compares between a direct and a proxied run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def main(url: str) -> None:
    progress: list[float] = []
    logs: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None = None) -> None:
        progress.append(value)

    async def on_log(params: object) -> None:
        logs.append(str(getattr(params, "data", "")))

    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write, logging_callback=on_log) as session:
            init = await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            echo = await session.call_tool("echo", {"text": "old client"})
            slow = await session.call_tool(
                "slow_progress", {"steps": 3, "delay_s": 0.02}, progress_callback=on_progress
            )
            logged = await session.call_tool("log_then_answer", {"message": "hello"})
    print(
        json.dumps(
            {
                "protocolVersion": init.protocolVersion,
                "tools": tools,
                "echo": [c.text for c in echo.content if c.type == "text"],
                "slow": [c.text for c in slow.content if c.type == "text"],
                "slow_error": slow.isError,
                "progress": progress,
                "logged": [c.text for c in logged.content if c.type == "text"],
                "logs": logs,
            }
        )
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1]))
