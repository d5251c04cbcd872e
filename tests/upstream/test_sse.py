"""SseUpstream against a real SDK MCPServer served over the legacy HTTP+SSE transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.upstream.base import Era, Exchange
from proxy.upstream.sse import SseLegacyLink, SseUpstream

from .servers import Journal, free_socket, serve, sse_app

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*deprecated as of 2026-07-28")]
WAIT = 10.0


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
async def sse_url(journal: Journal) -> AsyncIterator[str]:
    async with serve(sse_app(journal)) as port:
        yield f"http://127.0.0.1:{port}/sse"


@pytest.fixture
async def upstream(sse_url: str) -> AsyncIterator[SseUpstream]:
    up = SseUpstream(sse_url)
    yield up
    await up.aclose()


async def answer(ex: Exchange) -> Message:
    return await asyncio.wait_for(ex.response, WAIT)


def call(link: SseLegacyLink, name: str, arguments: dict[str, Any]) -> Message:
    return {
        "jsonrpc": "2.0",
        "id": link.new_id(),
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


async def session(up: SseUpstream, sampling: bool = False) -> SseLegacyLink:
    link = await up.open(Era.LEGACY)
    init = {
        "jsonrpc": "2.0",
        "id": link.new_id(),
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}} if sampling else {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    resp = await answer(await link.send_request(init))
    assert resp["result"]["protocolVersion"] == "2025-11-25"
    await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return link


async def test_probe_is_legacy_only(upstream: SseUpstream) -> None:
    caps = await upstream.probe()
    assert caps.legacy and not caps.modern
    with pytest.raises(UpstreamFailure) as info:
        await upstream.open(Era.MODERN)
    assert info.value.kind is FailureKind.PROTOCOL and info.value.dispatched is Dispatch.NO


async def test_handshake_list_call_and_progress(upstream: SseUpstream) -> None:
    link = await session(upstream)
    listed = await answer(await link.send_request({"jsonrpc": "2.0", "id": link.new_id(), "method": "tools/list"}))
    assert any(t["name"] == "echo" for t in listed["result"]["tools"])
    ex = await link.send_request(call(link, "echo", {"text": "sse"}))
    assert ex.written
    assert (await answer(ex))["result"]["content"][0]["text"] == "sse"

    unsolicited: list[Message] = []
    link.set_unsolicited_handler(unsolicited.append)
    got: list[Message] = []
    req = call(link, "progress_and_log", {"steps": 2})
    req["params"]["_meta"] = {"progressToken": req["id"]}
    resp = await answer(await link.send_request(req, on_message=got.append))
    assert resp["result"]["content"][0]["text"] == "done"
    assert [m["params"]["progress"] for m in got] == [1, 2]  # progress by token → on_message
    assert [m["method"] for m in unsolicited] == ["notifications/message"]  # the rest → unsolicited


async def test_sampling_round_trip_via_unsolicited(upstream: SseUpstream) -> None:
    link = await session(upstream, sampling=True)
    tasks: list[asyncio.Task[None]] = []

    def on_unsolicited(m: Message) -> None:
        if m.get("method") == "sampling/createMessage":
            reply = {
                "jsonrpc": "2.0",
                "id": m["id"],
                "result": {"role": "assistant", "content": {"type": "text", "text": "7"}, "model": "m"},
            }
            tasks.append(asyncio.create_task(link.send_response(reply)))

    link.set_unsolicited_handler(on_unsolicited)
    resp = await answer(await link.send_request(call(link, "ask_llm", {"prompt": "?"})))
    assert resp["result"]["content"][0]["text"] == "llm said: 7"
    await asyncio.gather(*tasks)


async def test_cancel_stops_server_handler(upstream: SseUpstream, journal: Journal) -> None:
    link = await session(upstream)
    ex = await link.send_request(call(link, "slow", {"seconds": 30}))
    await asyncio.wait_for(journal.slow_started.wait(), WAIT)
    await link.cancel(ex, "timeout")
    await asyncio.wait_for(journal.slow_cancelled.wait(), WAIT)
    with pytest.raises(UpstreamFailure):
        await answer(ex)
    assert (await answer(await link.send_request(call(link, "echo", {"text": "ok"}))))["result"]


async def test_stream_end_fails_pending_then_reconnects_and_replays() -> None:
    """The server goes away mid-request (pending fails CLOSED/UNKNOWN); after it is back on the same
    port the next request reconnects the SSE stream and replays the handshake transparently."""
    sock = free_socket()
    port = sock.getsockname()[1]
    j1 = Journal()
    up = SseUpstream(f"http://127.0.0.1:{port}/sse")
    try:
        async with serve(sse_app(j1), sock) as _:
            link = await session(up)
            ex = await link.send_request(call(link, "slow", {"seconds": 30}))
            await asyncio.wait_for(j1.slow_started.wait(), WAIT)
        # server stopped: the SSE stream ended
        with pytest.raises(UpstreamFailure) as info:
            await answer(ex)
        assert info.value.kind is FailureKind.CLOSED and info.value.dispatched is Dispatch.UNKNOWN
        sock2 = free_socket_on(port)
        async with serve(sse_app(Journal()), sock2):
            resp = await answer(await link.send_request(call(link, "echo", {"text": "back"})))
            assert resp["result"]["content"][0]["text"] == "back"
            assert link.reconnects == 1
    finally:
        await up.aclose()


def free_socket_on(port: int) -> Any:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def test_cross_origin_endpoint_is_refused() -> None:
    async def sse(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"event: endpoint\ndata: http://evil.example:9/messages/?session_id=1\n\n"
            await asyncio.Event().wait()

        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/sse", sse)])
    async with serve(app) as port:
        up = SseUpstream(f"http://127.0.0.1:{port}/sse")
        try:
            link = await up.open(Era.LEGACY)
            with pytest.raises(UpstreamFailure) as info:
                await link.send_request({"jsonrpc": "2.0", "id": link.new_id(), "method": "initialize", "params": {}})
            assert info.value.kind is FailureKind.PROTOCOL and info.value.dispatched is Dispatch.NO
            assert "origin" in info.value.detail
        finally:
            await up.aclose()


async def test_connection_refused() -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    up = SseUpstream(f"http://127.0.0.1:{port}/sse")
    try:
        with pytest.raises(UpstreamFailure) as info:
            await up.probe()
        assert info.value.kind is FailureKind.CONNECT_FAILED and info.value.dispatched is Dispatch.NO
    finally:
        await up.aclose()
