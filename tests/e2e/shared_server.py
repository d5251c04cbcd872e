"""A real SDK stdio server for the shared-children tests (`--stdio-sessions shared`): an `MCPServer`
that keeps no state per session, with per-session features for the proxy to keep apart.

    python tests/e2e/shared_server.py

Tools: `progress(who, steps)` reports `steps` progress notifications naming `who`; `ask(prompt)`
asks the client for sampling (over stdio a server request names no request of the client);
`say(text)` logs one debug and one error line; `touch(uri)` notifies that `uri` was updated;
`pid()` answers the process id (`ppid()` its parent's); `hang(seconds)` reports progress once,
then sleeps (a call to kill the child under). It also serves `logging/setLevel` (answered, nothing
more) and `resources/subscribe`/`unsubscribe` (kept per process, for `touch` with
SHARED_SERVER_SUBSCRIBED_ONLY=1), so that its capabilities offer both: the MCPServer API has no
parameter for them, hence the low-level server's public `add_request_handler`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import SamplingMessage, TextContent


def build() -> MCPServer:
    server = MCPServer("shared-children")

    @server.tool()
    async def progress(who: str, ctx: Context, steps: int = 3) -> str:
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"progress of {who}")
        return f"done for {who}"

    @server.tool()
    async def ask(prompt: str, ctx: Context) -> str:
        result = await ctx.request_context.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=10,
            related_request_id=ctx.request_id,
        )
        return f"llm said: {getattr(result.content, 'text', result.content)}"

    @server.tool()
    async def say(text: str, ctx: Context) -> str:
        await ctx.log("debug", f"debug: {text}")
        await ctx.log("error", f"error: {text}")
        return "said"

    subscribed: set[str] = set()
    # With SHARED_SERVER_SUBSCRIBED_ONLY=1 `touch` notifies only a subscribed uri, as a server that
    # keeps its session's subscriptions does (a subscription lost upstream is then seen).
    subscribed_only = os.environ.get("SHARED_SERVER_SUBSCRIBED_ONLY") == "1"

    @server.tool()
    async def touch(uri: str, ctx: Context) -> str:
        if subscribed_only and uri not in subscribed:
            return "not subscribed"
        await ctx.request_context.session.send_resource_updated(uri)
        return "touched"

    @server.tool()
    async def pid() -> str:
        return str(os.getpid())

    @server.tool()
    async def ppid() -> str:
        return str(os.getppid())

    @server.tool()
    async def hang(seconds: float, ctx: Context) -> str:
        await ctx.report_progress(0, 1, "hanging")
        await asyncio.sleep(seconds)
        return "woke"

    @server.resource("file:///shared/{name}")
    def shared_resource(name: str) -> str:
        return name

    async def answer(ctx: Any, params: Any) -> types.EmptyResult:
        return types.EmptyResult()

    low = server._lowlevel_server  # (the MCPServer API has no setting for these)
    low.add_request_handler("logging/setLevel", types.SetLevelRequestParams, answer)

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        subscribed.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        subscribed.discard(str(params.uri))
        return types.EmptyResult()

    low.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    low.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    return server


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")  # the SDK's deprecation notes for 2025 features, on stderr per call
    build().run("stdio")
