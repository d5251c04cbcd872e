"""A 2025 session's listen stream (GET): what the server sends outside any request, as it comes.

Contract: `serve_listen` writes the stream's head, then every message queued on `stream` as an SSE
event, a keep-alive comment every `PING_INTERVAL_S` while nothing comes, until the client
disconnects, the stream is closed (shutdown, or a client that does not read: see `Stream`) or the
session ends. With `still_valid` (jwt, tokens) the caller's credential is checked again every
`CREDENTIAL_RECHECK_S`, and the stream ends once it no longer authenticates (a revoked token, an
expired JWT).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Container

from proxy.frontend.http.identity import CREDENTIAL_RECHECK_S
from proxy.frontend.http.outbox import PING_INTERVAL_S, Receive, Send, Stream, sse, watch_disconnect
from proxy.frontend.http.respond import SSE_HEADERS


async def serve_listen(
    send: Send,
    receive: Receive,
    stream: Stream,
    session_id: str,
    sessions: Container[str],
    still_valid: Callable[[], Awaitable[bool]] | None,
) -> None:
    gone = asyncio.create_task(watch_disconnect(receive, stream, None))
    wait_s = min(PING_INTERVAL_S, CREDENTIAL_RECHECK_S) if still_valid is not None else PING_INTERVAL_S
    pinged_at = checked_at = time.monotonic()
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*SSE_HEADERS, (b"mcp-session-id", session_id.encode())],
            }
        )
        while not stream.closed and session_id in sessions:
            item = stream.pop()
            if item is not None:
                await send({"type": "http.response.body", "body": sse(item[1]), "more_body": True})
                continue
            await stream.wait(wait_s)
            now = time.monotonic()
            if still_valid is not None and now - checked_at >= CREDENTIAL_RECHECK_S:
                checked_at = now
                if not await still_valid():
                    break
            if stream.closed or stream.has_items or now - pinged_at < PING_INTERVAL_S:
                continue
            pinged_at = now
            await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        gone.cancel()
        stream.close()
