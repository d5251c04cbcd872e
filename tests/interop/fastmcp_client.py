"""FastMCP's own `Client` (PyPI `fastmcp`, scripts/setup-fastmcp.sh) calling one tool, as a user of
it would: run with the python of that venv, never imported by pytest.

Usage: fastmcp_client.py URL TOOL ARGS_JSON [COUNT]
The client lists the tools first, as an agent does before it calls one: the proxy reads a tool's
annotations (read-only: retried) from a listing, and this one is through before the first call.
Prints one JSON line per call: {"ok": true, "texts": [...]} or, when the client raised (FastMCP
raises `ToolError` for an isError result, with the text of the FIRST content block only),
{"ok": false, "type": "ToolError", "message": str(exc)}.
Stderr logs each HTTP request the client makes and its transport's reconnections (loggers
`httpx2`, `mcp.client.streamable_http` at INFO): what a test shows when a count is off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from fastmcp import Client


async def main(url: str, tool: str, arguments: dict, count: int) -> None:
    async with Client(url, timeout=60) as client:
        await client.list_tools()
        for number in range(1, count + 1):
            logging.getLogger("fastmcp_client").warning("call %d: %s", number, tool)
            try:
                result = await client.call_tool(tool, arguments)
            except Exception as exc:  # what the user sees instead of a result
                line = {"ok": False, "type": type(exc).__name__, "message": str(exc)[:4000]}
            else:
                texts = [getattr(block, "text", None) for block in result.content]
                line = {"ok": True, "texts": texts}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    for name in ("httpx2", "mcp.client.streamable_http"):
        logging.getLogger(name).setLevel(logging.INFO)
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), count))
