"""A lean MCP echo upstream for the relay benchmark: it waits, and burns almost no CPU.

    python bench/lean_upstream.py --transport stdio [--wait-ms 5]
    python bench/lean_upstream.py --transport http --port P [--wait-ms 5]

The SDK's `MCPServer` (bench/upstream.py) spends 1-2 ms of CPU per call, so on a two-core machine
it, not the proxy, sets the pace of every leg it is in. This server answers the few methods the
benchmark and the proxy's probe use, by hand, over plain dicts:

- 2025 handshake: `initialize`, `notifications/initialized`, `ping`;
- 2026-07-28: `server/discover`, and the per-request envelope is accepted as is; a request whose
  `_meta` names a protocol version (a 2026 request) gets `resultType: "complete"` in its result,
  as that era requires of every result, and `ttlMs`/`cacheScope` on a cacheable one;
- `tools/list` (one read-only tool, `echo(text)`), `tools/call` of `echo` (waits `--wait-ms` with
  `asyncio.sleep`, then returns the text), anything else a JSON-RPC "method not found".

Over stdio it reads newline-delimited JSON and answers every request in its own task, so
concurrent calls overlap their waits as the SDK server's do. Over HTTP it is a bare ASGI app on
uvicorn (127.0.0.1 only): POST a JSON-RPC message, get `application/json` back (202 for a
notification); no sessions, no SSE, so a 2025 client gets a fixed session id it may ignore. It is
a benchmark yardstick, not an MCP server to build on.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

TOOL = {
    "name": "echo",
    "description": "Echo the text back.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "annotations": {"readOnlyHint": True},
}
INFO = {"name": "bench-lean-echo", "version": "1.0"}
CAPS = {"tools": {"listChanged": False}}
CACHEABLE = frozenset({"server/discover", "tools/list"})  # of the methods answered here
MODERN_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"  # in every 2026-07-28 request's `_meta`


class Echo:
    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """The response to one message, or None for a notification."""
        if not isinstance(message, dict) or "method" not in message or "id" not in message:
            return None
        method, id_ = message["method"], message["id"]
        params = message.get("params") or {}
        if not isinstance(params, dict):
            return _error(id_, -32602, "params must be an object")
        response = await self._answer(method, id_, params)
        meta = params.get("_meta")
        if isinstance(meta, dict) and MODERN_VERSION_KEY in meta and "result" in response:
            response["result"]["resultType"] = "complete"
            if method in CACHEABLE:  # the era's freshness hints: never fresh, this caller's only
                response["result"].update(ttlMs=0, cacheScope="private")
        return response

    async def _answer(self, method: Any, id_: Any, params: dict[str, Any]) -> dict[str, Any]:
        if method == "tools/call":
            if params.get("name") != "echo":
                return _error(id_, -32602, "Unknown tool")
            if self.wait_s > 0:
                await asyncio.sleep(self.wait_s)
            text = str((params.get("arguments") or {}).get("text", ""))
            return _result(id_, {"content": [{"type": "text", "text": text}], "isError": False})
        if method == "tools/list":
            return _result(id_, {"tools": [TOOL]})
        if method == "initialize":
            version = params.get("protocolVersion") or "2025-11-25"
            return _result(id_, {"protocolVersion": version, "capabilities": CAPS, "serverInfo": INFO})
        if method == "server/discover":
            return _result(
                id_,
                {"supportedVersions": ["2026-07-28", "2025-11-25"], "capabilities": CAPS, "serverInfo": INFO},
            )
        if method == "ping":
            return _result(id_, {})
        return _error(id_, -32601, f"Method not found: {method}")


def _result(id_: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def _error(id_: Any, code: int, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": text}}


async def serve_stdio(echo: Echo) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, sys.stdout)
    tasks: set[asyncio.Task[None]] = set()

    async def answer(message: Any) -> None:
        response = await echo.handle(message)
        if response is not None:
            transport.write(orjson.dumps(response) + b"\n")

    while line := await reader.readline():
        try:
            message = orjson.loads(line)
        except ValueError:
            continue
        task = asyncio.create_task(answer(message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def http_app(echo: Echo):  # type: ignore[no-untyped-def]
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        try:
            message = orjson.loads(body)
        except ValueError:
            message = None
        response = await echo.handle(message) if scope["method"] == "POST" else None
        if response is None:
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        data = orjson.dumps(response)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if isinstance(message, dict) and message.get("method") == "initialize":
            headers.append((b"mcp-session-id", b"lean-session"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--wait-ms", type=float, default=0.0, help="asyncio.sleep this long in every call")
    args = parser.parse_args(argv)
    echo = Echo(args.wait_ms / 1000.0)
    if args.transport == "stdio":
        # The same event loop as the HTTP mode (uvicorn picks uvloop when it is installed).
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve_stdio(echo))
        return
    import uvicorn

    uvicorn.run(http_app(echo), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
