"""FastMCP's own `Client` (PyPI `fastmcp`, scripts/setup-fastmcp.sh) calling one tool, as a user of
it would: run with the python of that venv, never imported by pytest.

Usage: fastmcp_client.py URL TOOL ARGS_JSON [COUNT]
Prints one JSON line per call: {"ok": true, "texts": [...]} or, when the client raised (FastMCP
raises `ToolError` for an isError result, with the text of the FIRST content block only),
{"ok": false, "type": "ToolError", "message": str(exc)}.
"""

from __future__ import annotations

import asyncio
import json
import sys

from fastmcp import Client


async def main(url: str, tool: str, arguments: dict, count: int) -> None:
    async with Client(url, timeout=60) as client:
        for _ in range(count):
            try:
                result = await client.call_tool(tool, arguments)
            except Exception as exc:  # what the user sees instead of a result
                line = {"ok": False, "type": type(exc).__name__, "message": str(exc)[:4000]}
            else:
                texts = [getattr(block, "text", None) for block in result.content]
                line = {"ok": True, "texts": texts}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), count))
