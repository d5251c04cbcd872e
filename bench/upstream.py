"""A minimal, fast MCP echo upstream for the relay benchmark.

    python bench/upstream.py --transport stdio [--wait-ms 5]
    python bench/upstream.py --transport http --port P [--wait-ms 5] [--json-response]

It is the SDK's own `MCPServer` (the yardstick: the benchmark's direct leg hits this same server)
with one tool, `echo(text)`. `--wait-ms` makes every call wait with `asyncio.sleep` (an upstream
that waits on I/O rather than burning the CPU the proxy shares with it on a small machine).
Streamable HTTP binds 127.0.0.1 only. Over HTTP it serves both eras; the benchmark uses the
2026-07-28 era, where every tools/call is an independent POST that needs no session.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import warnings

WAIT_S = 0.0


def build(wait_ms: float):
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    global WAIT_S
    WAIT_S = wait_ms / 1000.0
    server = MCPServer("bench-echo")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def echo(text: str) -> str:
        """Echo the text back."""
        if WAIT_S > 0:
            await asyncio.sleep(WAIT_S)
        return text

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--wait-ms", type=float, default=0.0, help="asyncio.sleep this long in every call")
    parser.add_argument("--json-response", action="store_true", help="answer POSTs with JSON instead of SSE")
    args = parser.parse_args(argv)

    try:
        from mcp.shared.exceptions import MCPDeprecationWarning

        warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    except ImportError:  # pragma: no cover - older SDKs
        pass
    # Per-request INFO logs would cost the yardstick CPU the proxy does not spend.
    logging.basicConfig(level=logging.WARNING)
    for name in ("mcp", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.WARNING)

    server = build(args.wait_ms)
    if args.transport == "stdio":
        server.run("stdio")
        return

    import uvicorn

    app = server.streamable_http_app(json_response=args.json_response, host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, lifespan="on")


if __name__ == "__main__":
    main()
