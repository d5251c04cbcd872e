"""Real upstream servers for the adapter tests: an SDK `MCPServer` over Streamable HTTP and over
legacy SSE (uvicorn on 127.0.0.1, free port), plus tiny Starlette apps that misbehave on purpose.

Run as a script (`python tests/upstream/servers.py`) it serves the MCP app in a subprocess and
prints `PORT <n>` once it listens, so a test can kill it mid-request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import SamplingMessage, TextContent
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send


@dataclass
class Journal:
    """What the server-side tool handlers did (same event loop as the test when in-process)."""

    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    slow_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    slow_finished: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[str] = field(default_factory=list)


class RawHttp(asyncio.Protocol):
    """A bare HTTP/1.1 server protocol in the test's own loop: each request whose body arrived is
    handed, with its method, path and parsed JSON body (None without one), to `on_request`, in the
    very callback that received its last bytes (before any task the write woke has resumed), and
    `on_request` writes the answer itself. Build one per connection: `lambda: RawHttp(handler)`."""

    def __init__(self, on_request: Callable[[RawHttp, str, str, Any], None]) -> None:
        self.on_request = on_request
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            raw = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self.on_request(self, method, path, orjson.loads(raw) if raw else None)


def build_server(journal: Journal | None = None) -> MCPServer:
    j = journal or Journal()
    server = MCPServer("upstream-under-test")

    @server.tool()
    def echo(text: str) -> str:
        j.calls.append("echo")
        return text

    @server.tool()
    async def progress_and_log(ctx: Context, steps: int = 3) -> str:
        j.calls.append("progress_and_log")
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i}")
        await ctx.info("halfway there")
        return "done"

    @server.tool()
    async def ask_llm(prompt: str, ctx: Context, via_get_stream: bool = False) -> str:
        """Sampling on the request's own stream, or (unrelated to the request) on the GET stream."""
        j.calls.append("ask_llm")
        result = await ctx.request_context.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=10,
            related_request_id=None if via_get_stream else ctx.request_id,
        )
        content = result.content
        return f"llm said: {getattr(content, 'text', content)}"

    @server.tool()
    async def slow(seconds: float, ctx: Context) -> str:
        j.calls.append("slow")
        j.slow_started.set()
        try:
            await asyncio.sleep(seconds)
        except BaseException:
            j.slow_cancelled.set()
            raise
        j.slow_finished.set()
        return "slept"

    return server


def _watch_startup(app: ASGIApp, started: asyncio.Event) -> ASGIApp:
    """Wrap an ASGI app so that `started` is set once its lifespan startup completed."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":

            async def watching_send(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "lifespan.startup.complete":
                    started.set()
                await send(message)

            await app(scope, receive, watching_send)
        else:
            await app(scope, receive, send)

    return wrapped


async def _start(app: ASGIApp, sock: socket.socket, **options: Any) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    started = asyncio.Event()
    config = uvicorn.Config(
        _watch_startup(app, started), log_level="warning", lifespan="on", timeout_graceful_shutdown=1, **options
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        task.result()
        raise RuntimeError("the test server stopped during startup")
    if not started.is_set():
        raise RuntimeError("the test server did not start in time")
    return server, task


def initialize_request(link: Any) -> dict[str, Any]:
    """A minimal 2025 `initialize` for `link`, with one of its own ids."""
    return {"jsonrpc": "2.0", "id": link.new_id(), "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serve(app: ASGIApp, sock: socket.socket | None = None, **options: Any) -> AsyncIterator[int]:
    """Run `app` under uvicorn in this event loop; yields the port. Bounded start and stop.
    `options` go to `uvicorn.Config` (the `ssl_*` ones serve HTTPS)."""
    sock = sock or free_socket()
    port = sock.getsockname()[1]
    server, task = await _start(app, sock, **options)
    try:
        yield port
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 10)
        except TimeoutError:
            server.force_exit = True
            task.cancel()
        sock.close()


def streamable_app(journal: Journal, **kw: Any) -> Starlette:
    return build_server(journal).streamable_http_app(**kw)


def sse_app(journal: Journal, **kw: Any) -> Starlette:
    return build_server(journal).sse_app(**kw)


async def start_subprocess_server() -> tuple[asyncio.subprocess.Process, int]:
    """The streamable HTTP app in a child process; returns (process, port)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    if not line.startswith(b"PORT "):
        proc.kill()
        raise RuntimeError("the subprocess server did not start")
    return proc, int(line.split()[1])


AsyncFn = Callable[[], Awaitable[None]]


async def _main() -> None:
    sock = free_socket()
    _, task = await _start(streamable_app(Journal()), sock)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(_main())
