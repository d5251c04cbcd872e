"""SseUpstream against a real SDK MCPServer served over the legacy HTTP+SSE transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.upstream.base import Era, Exchange
from proxy.upstream.sse.link import SseLegacyLink, SseUpstream
from tests.core.memory_link import RecordingOutbox

from ..attempts import CHARGE, AttemptTimers, state_changing_relay
from ..servers import Journal, RawHttp, free_socket, initialize_request, serve, sse_app

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


def _principal(authorization: str | None) -> str | None:
    """The user a test token names: `Bearer alice-2` is alice's second token (a refresh)."""
    return authorization.rsplit("-", 1)[0] if authorization else None


async def test_passthrough_only_the_accepted_credential_reopens_the_stream_and_goes_on_the_links_own() -> None:
    """--auth passthrough in front of an SSE server that binds each stream to the principal of the
    credential that opened it (another principal's POST: 404, as the MCP SDK answers), refuses a
    request without a credential (401) and a revoked token (401). A caller's POST carries only its
    own credential; the link's own messages (its cancellation, an answer to the server) and a
    broken stream's reopening carry the credential the upstream accepted on the session, never one
    it refused. Before, bob's refused POST became the link's credential: the stream was reopened
    as bob (the session moved to him), and a request without a credential went out as alice."""
    streams: dict[str, tuple[str | None, asyncio.Queue[bytes | None]]] = {}
    revoked: set[str] = set()
    gets: list[str | None] = []
    posts: list[tuple[str | None, str | None]] = []  # credential, JSON-RPC method ("response" for an answer)

    def valid(auth: str | None) -> bool:
        return auth is not None and auth not in revoked

    async def sse(request: Request) -> Response:
        auth = request.headers.get("authorization")
        gets.append(auth)
        if not valid(auth):
            return Response(status_code=401)
        sid = f"s{len(streams) + 1}"
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        streams[sid] = (_principal(auth), queue)

        async def body() -> AsyncIterator[bytes]:
            yield f"event: endpoint\ndata: /messages/?session_id={sid}\n\n".encode()
            while (item := await queue.get()) is not None:
                yield b"event: message\ndata: " + item + b"\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    async def messages(request: Request) -> Response:
        auth = request.headers.get("authorization")
        body = orjson.loads(await request.body())
        posts.append((auth, body.get("method", "response")))
        if not valid(auth):
            return Response(status_code=401)
        owner, queue = streams.get(request.query_params["session_id"], (None, None))
        if queue is None or owner != _principal(auth):
            return Response(status_code=404)
        if body.get("method") == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "x", "version": "1"}}
            queue.put_nowait(orjson.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}))
        elif body.get("method") == "tools/call":
            text = f"{owner}:{body['params']['arguments']['text']}"
            answer_ = {"jsonrpc": "2.0", "id": body["id"], "result": {"content": [{"type": "text", "text": text}]}}
            queue.put_nowait(orjson.dumps(answer_))
        return Response(status_code=202)

    def as_(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    async def echo(link: SseLegacyLink, text: str, headers: dict[str, str] | None) -> Message:
        return await answer(await link.send_request(call(link, "echo", {"text": text}), headers=headers))

    async def failed(link: SseLegacyLink, text: str, headers: dict[str, str] | None) -> UpstreamFailure:
        """The failure of an echo: raised by `send_request` (before it was written) or its answer."""
        with pytest.raises(UpstreamFailure) as info:
            await echo(link, text, headers)
        return info.value

    async def break_streams(link: SseLegacyLink) -> None:
        """End the server's streams, and wait until the link has seen its own end."""
        reader = link._conn.reader if link._conn is not None else None
        for _, queue in streams.values():
            queue.put_nowait(None)
        if reader is not None:
            await asyncio.wait_for(asyncio.shield(reader), WAIT)

    app = Starlette(routes=[Route("/sse", sse), Route("/messages/", messages, methods=["POST"])])
    async with serve(app) as port:
        up = SseUpstream(f"http://127.0.0.1:{port}/sse")
        try:
            link = await up.open(Era.LEGACY)
            init = initialize_request(link)
            await answer(await link.send_request(init, headers=as_("alice-1")))
            await link.send_notification(
                {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=as_("alice-1")
            )
            assert (await echo(link, "a", as_("alice-1")))["result"]["content"][0]["text"] == "Bearer alice:a"

            refused = await failed(link, "b", as_("bob-1"))
            assert refused.kind is FailureKind.SESSION_REFUSED and refused.http_status == 404
            assert (await failed(link, "c", None)).http_status == 401  # not lent alice's credential
            await link.send_response({"jsonrpc": "2.0", "id": "server-1", "result": {}})  # the link's own
            assert posts[-3:] == [("Bearer bob-1", "tools/call"), (None, "tools/call"), ("Bearer alice-1", "response")]

            # The stream breaks: it is reopened with alice's accepted credential, whoever's message
            # needs it, and bob's message is refused on it.
            await break_streams(link)
            assert (await failed(link, "d", as_("bob-1"))).kind is FailureKind.SESSION_REFUSED
            assert gets == ["Bearer alice-1", "Bearer alice-1"]
            assert (await echo(link, "e", as_("alice-1")))["result"]["content"][0]["text"] == "Bearer alice:e"

            # A refreshed token, once accepted, reopens it; a token refreshed since whose message
            # meets a stream that its accepted predecessor cannot reopen (revoked) gets 404.
            assert (await echo(link, "f", as_("alice-2")))["result"]["content"][0]["text"] == "Bearer alice:f"
            assert link.caller_authorization == "Bearer alice-2"
            await break_streams(link)
            revoked.add("Bearer alice-2")
            stale = await failed(link, "g", as_("alice-3"))
            assert stale.kind is FailureKind.SESSION_REFUSED and stale.http_status == 404
            assert gets[-1] == "Bearer alice-2" and None not in gets and "Bearer bob-1" not in gets
        finally:
            await up.aclose()


async def test_a_request_refused_by_a_server_that_forgot_the_session_is_answered_by_its_second_post() -> None:
    """A server that forgot the SSE session while its stream still looks open to the link (a
    restart the link has not seen yet) answers the request's POST 404: the link opens a new stream,
    replays the handshake and posts the request again, and the request's exchange gets that
    answer. Failing the exchange (dispatch no) while its request was posted again would leave the
    caller retrying a request that runs, and cancelling nothing when it gives up."""
    streams: dict[str, asyncio.Queue[bytes | None]] = {}
    forgotten: set[str] = set()
    calls: list[str] = []  # the sessions that took a tools/call

    async def sse(request: Request) -> Response:
        sid = f"s{len(streams) + 1}"
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        streams[sid] = queue

        async def body() -> AsyncIterator[bytes]:
            yield f"event: endpoint\ndata: /messages/?session_id={sid}\n\n".encode()
            while (item := await queue.get()) is not None:
                yield b"event: message\ndata: " + item + b"\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    async def messages(request: Request) -> Response:
        sid = request.query_params["session_id"]
        body = orjson.loads(await request.body())
        if sid in forgotten or sid not in streams:
            return Response(status_code=404)
        queue = streams[sid]
        if body.get("method") == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "x", "version": "1"}}
            queue.put_nowait(orjson.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}))
        elif body.get("method") == "tools/call":
            calls.append(sid)
            text = f"{sid}:{body['params']['arguments']['text']}"
            answer_ = {"jsonrpc": "2.0", "id": body["id"], "result": {"content": [{"type": "text", "text": text}]}}
            queue.put_nowait(orjson.dumps(answer_))
        return Response(status_code=202)

    app = Starlette(routes=[Route("/sse", sse), Route("/messages/", messages, methods=["POST"])])
    async with serve(app) as port:
        up = SseUpstream(f"http://127.0.0.1:{port}/sse")
        try:
            link = await up.open(Era.LEGACY)
            await answer(await link.send_request(initialize_request(link)))
            await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
            forgotten.add("s1")
            resp = await answer(await link.send_request(call(link, "echo", {"text": "again"})))
            assert resp["result"]["content"][0]["text"] == "s2:again"
            assert calls == ["s2"] and link.reconnects == 1
        finally:
            await up.aclose()


async def test_a_request_written_as_its_caller_is_cancelled_is_still_cancelled_upstream() -> None:
    """A caller cancelled in the moment between its request's POST going out and `send_request`
    handing back the exchange gets no exchange to cancel: the link must send
    `notifications/cancelled` itself (once the POST was accepted), or the server runs the request
    to its end. The server cancels the caller the moment the POST's bytes arrive."""
    caller: asyncio.Task[Exchange] | None = None
    cancelled_ids: list[Any] = []
    got_cancel = asyncio.Event()

    def on_request(conn: RawHttp, method: str, path: str, body: Any) -> None:
        if method == "GET":
            conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            event = b"event: endpoint\ndata: /messages/?session_id=s1\n\n"
            conn.write(b"%x\r\n%s\r\n" % (len(event), event))
            return
        if body.get("method") == "tools/call":
            assert caller is not None
            caller.cancel()  # the server has the request; its caller has not resumed yet
        elif body.get("method") == "notifications/cancelled":
            cancelled_ids.append(body["params"]["requestId"])
            got_cancel.set()
        conn.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")

    server = await asyncio.get_running_loop().create_server(lambda: RawHttp(on_request), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = SseUpstream(f"http://127.0.0.1:{port}/sse")
    try:
        link = await up.open(Era.LEGACY)
        request = call(link, "slow", {"seconds": 30})
        caller = asyncio.ensure_future(link.send_request(request))
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.wait_for(got_cancel.wait(), WAIT)
        assert request["id"] in cancelled_ids
    finally:
        await up.aclose()
        server.close()
        await server.wait_closed()


async def test_an_attempt_timer_firing_as_its_post_is_written_records_dispatch_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same moment through the relay and the engine, with the attempt's own timer as what
    cancels: the attempt is recorded as dispatch unknown (a state-changing tool: outcome unknown,
    not sent again), never "not sent", and the request is cancelled upstream. The server fires
    the attempt's timer the moment the POST's bytes arrive; a second attempt would be answered at
    once on the stream."""
    timers = AttemptTimers(monkeypatch)
    streams: list[RawHttp] = []
    calls: list[Any] = []
    cancelled_ids: list[Any] = []
    got_cancel = asyncio.Event()

    def on_request(conn: RawHttp, method: str, path: str, body: Any) -> None:
        if method == "GET":
            streams.append(conn)
            conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            event = b"event: endpoint\ndata: /messages/?session_id=s1\n\n"
            conn.write(b"%x\r\n%s\r\n" % (len(event), event))
            return
        conn.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
        if body.get("method") == "tools/call":
            calls.append(body["id"])
            if len(calls) == 1:
                timers.fire_latest()  # the server has the request; its caller has not resumed
                return
            answer = orjson.dumps({"jsonrpc": "2.0", "id": body["id"], "result": {"content": []}})
            event = b"event: message\ndata: %s\n\n" % answer
            streams[-1].write(b"%x\r\n%s\r\n" % (len(event), event))
        elif body.get("method") == "notifications/cancelled":
            cancelled_ids.append(body["params"]["requestId"])
            got_cancel.set()

    server = await asyncio.get_running_loop().create_server(lambda: RawHttp(on_request), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = SseUpstream(f"http://127.0.0.1:{port}/sse")
    try:
        relay = state_changing_relay(await up.open(Era.LEGACY))
        outbox = RecordingOutbox()
        await asyncio.wait_for(relay.handle_request(CHARGE, outbox), WAIT)
        assert len(calls) == 1, "sent once"
        (answer,) = outbox.messages
        report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
        (step,) = report["attemptedSteps"]
        assert step["dispatched"] == "unknown", step
        assert report["stopReason"] == "outcome_unknown" and report["outcomeUnknown"] is True, report
        await asyncio.wait_for(got_cancel.wait(), WAIT)
        assert cancelled_ids == calls
    finally:
        await up.aclose()
        server.close()
        await server.wait_closed()
