"""HttpUpstream against real servers on 127.0.0.1: an SDK MCPServer over Streamable HTTP (both
eras), misbehaving Starlette apps, a refused port and a server process killed mid-request."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.upstream.base import Era, Exchange
from proxy.upstream.streamable.failures import forgot_session
from proxy.upstream.streamable.headers import encode_header_value
from proxy.upstream.streamable.legacy import HttpLegacyLink
from proxy.upstream.streamable.modern import HttpModernLink
from proxy.upstream.streamable.upstream import HttpUpstream
from tests.core.memory_link import RecordingOutbox

from ..attempts import CHARGE, AttemptTimers, state_changing_relay
from ..servers import (
    Journal,
    RawHttp,
    free_socket,
    initialize_request,
    serve,
    start_subprocess_server,
    streamable_app,
)

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*deprecated as of 2026-07-28")]
WAIT = 10.0

MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
}


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
async def mcp_url(journal: Journal) -> AsyncIterator[str]:
    async with serve(streamable_app(journal)) as port:
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
async def upstream(mcp_url: str) -> AsyncIterator[HttpUpstream]:
    up = HttpUpstream(mcp_url, headers={"x-proxy-credential": "secret-value"})
    yield up
    await up.aclose()


async def answer(ex: Exchange) -> Message:
    return await asyncio.wait_for(ex.response, WAIT)


async def failure_of(ex: Exchange) -> UpstreamFailure:
    with pytest.raises(UpstreamFailure) as info:
        await asyncio.wait_for(ex.response, WAIT)
    return info.value


async def legacy_session(up: HttpUpstream, sampling: bool = False) -> HttpLegacyLink:
    link = await up.open(Era.LEGACY)
    assert isinstance(link, HttpLegacyLink)
    caps: dict[str, Any] = {"sampling": {}} if sampling else {}
    init = {
        "jsonrpc": "2.0",
        "id": link.new_id(),
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": caps, "clientInfo": {"name": "t", "version": "1"}},
    }
    resp = await answer(await link.send_request(init))
    assert resp["result"]["protocolVersion"] == "2025-11-25"
    assert link.session_id and link.protocol_version == "2025-11-25"
    await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return link


def call(link: Any, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> Message:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": link.new_id(), "method": "tools/call", "params": params}


def text_of(resp: Message) -> str:
    return resp["result"]["content"][0]["text"]


# --- probe -----------------------------------------------------------------------------------
async def test_probe_detects_both_eras(upstream: HttpUpstream) -> None:
    caps = await upstream.probe()
    assert caps.legacy and caps.modern
    assert "2026-07-28" in caps.detail


async def test_probe_connection_refused() -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()  # nobody listens there now
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=2)
    try:
        with pytest.raises(UpstreamFailure) as info:
            await up.probe()
        assert info.value.kind is FailureKind.CONNECT_FAILED and info.value.dispatched is Dispatch.NO
        link = await up.open(Era.MODERN)
        with pytest.raises(UpstreamFailure) as info:
            await link.send_request(call(link, "echo", {"text": "x"}, MODERN_META))
        assert info.value.kind is FailureKind.CONNECT_FAILED and info.value.dispatched is Dispatch.NO
        assert link.in_flight == 0  # type: ignore[attr-defined]
    finally:
        await up.aclose()


# --- legacy ----------------------------------------------------------------------------------
async def test_legacy_handshake_list_and_call(upstream: HttpUpstream) -> None:
    link = await legacy_session(upstream)
    listed = await answer(await link.send_request({"jsonrpc": "2.0", "id": link.new_id(), "method": "tools/list"}))
    names = {t["name"] for t in listed["result"]["tools"]}
    assert {"echo", "progress_and_log", "ask_llm", "slow"} <= names
    ex = await link.send_request(call(link, "echo", {"text": "héllo"}))
    assert ex.written
    assert text_of(await answer(ex)) == "héllo"
    other = await upstream.open(Era.LEGACY)
    assert other is not link
    await other.aclose()


async def test_legacy_progress_and_log_go_to_on_message(upstream: HttpUpstream) -> None:
    link = await legacy_session(upstream)
    unsolicited: list[Message] = []
    link.set_unsolicited_handler(unsolicited.append)
    got: list[Message] = []
    req = call(link, "progress_and_log", {"steps": 3})
    req["params"]["_meta"] = {"progressToken": req["id"]}
    resp = await answer(await link.send_request(req, on_message=got.append))
    assert text_of(resp) == "done"
    progress = [m for m in got if m["method"] == "notifications/progress"]
    assert [p["params"]["progress"] for p in progress] == [1, 2, 3]
    assert all(p["params"]["progressToken"] == req["id"] for p in progress)
    assert any(m["method"] == "notifications/message" for m in got)
    assert unsolicited == []


async def test_legacy_sampling_round_trip(upstream: HttpUpstream) -> None:
    link = await legacy_session(upstream, sampling=True)
    tasks: list[asyncio.Task[None]] = []
    seen: list[Message] = []

    def on_message(m: Message) -> None:
        seen.append(m)
        if m.get("method") == "sampling/createMessage":
            reply = {
                "jsonrpc": "2.0",
                "id": m["id"],
                "result": {"role": "assistant", "content": {"type": "text", "text": "42"}, "model": "test-model"},
            }
            tasks.append(asyncio.create_task(link.send_response(reply)))

    resp = await answer(await link.send_request(call(link, "ask_llm", {"prompt": "meaning?"}), on_message=on_message))
    assert text_of(resp) == "llm said: 42"
    assert any(m.get("method") == "sampling/createMessage" for m in seen)
    await asyncio.gather(*tasks)


async def test_legacy_cancel_stops_server_handler(upstream: HttpUpstream, journal: Journal) -> None:
    link = await legacy_session(upstream)
    ex = await link.send_request(call(link, "slow", {"seconds": 30}))
    await asyncio.wait_for(journal.slow_started.wait(), WAIT)
    await link.cancel(ex, "test timeout")
    await asyncio.wait_for(journal.slow_cancelled.wait(), WAIT)
    assert ex.cancelled
    failure = await failure_of(ex)
    assert failure.kind is FailureKind.CLOSED and failure.dispatched is Dispatch.UNKNOWN
    # the link is still usable afterwards
    assert text_of(await answer(await link.send_request(call(link, "echo", {"text": "after"})))) == "after"


async def test_legacy_session_expiry_is_reestablished_once(upstream: HttpUpstream, mcp_url: str) -> None:
    link = await legacy_session(upstream)
    old = link.session_id
    assert old is not None
    async with httpx.AsyncClient() as c:  # the server forgets the session
        r = await c.delete(mcp_url, headers={"mcp-session-id": old, "mcp-protocol-version": "2025-11-25"})
        assert r.status_code == 200
    resp = await answer(await link.send_request(call(link, "echo", {"text": "again"})))
    assert text_of(resp) == "again"
    assert link.session_id not in (None, old)
    assert link.reestablished == 1


async def test_legacy_second_404_is_session_expired() -> None:
    """A server that answers 404 to anything after initialize: one re-establish, then SESSION_EXPIRED."""
    inits = 0

    async def endpoint(request: Request) -> Response:
        nonlocal inits
        body = orjson.loads(await request.body())
        if request.method == "DELETE":
            return Response(status_code=405)
        if body.get("method") == "initialize":
            inits += 1
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "x", "version": "1"}}
            return JSONResponse(
                {"jsonrpc": "2.0", "id": body["id"], "result": result}, headers={"mcp-session-id": f"s{inits}"}
            )
        if "id" not in body:
            return Response(status_code=202)
        return Response(status_code=404)

    app = Starlette(routes=[Route("/mcp", endpoint, methods=["POST", "DELETE", "GET"])])
    async with serve(app) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
        try:
            link = await up.open(Era.LEGACY)
            init = initialize_request(link)
            await answer(await link.send_request(init))
            ex = await link.send_request(call(link, "echo", {"text": "x"}))
            failure = await failure_of(ex)
            assert failure.kind is FailureKind.SESSION_EXPIRED and failure.dispatched is Dispatch.NO
            assert inits == 2
        finally:
            await up.aclose()


async def test_legacy_get_stream_delivers_unsolicited(upstream: HttpUpstream) -> None:
    """A server request not tied to a client request travels on the standalone GET stream."""
    link = await legacy_session(upstream, sampling=True)
    tasks: list[asyncio.Task[None]] = []
    unsolicited: list[Message] = []
    on_stream: list[Message] = []

    def on_unsolicited(m: Message) -> None:
        unsolicited.append(m)
        if m.get("method") == "sampling/createMessage":
            reply = {
                "jsonrpc": "2.0",
                "id": m["id"],
                "result": {"role": "assistant", "content": {"type": "text", "text": "via GET"}, "model": "m"},
            }
            tasks.append(asyncio.create_task(link.send_response(reply)))

    link.set_unsolicited_handler(on_unsolicited)
    req = call(link, "ask_llm", {"prompt": "q", "via_get_stream": True})
    resp = await answer(await link.send_request(req, on_message=on_stream.append))
    assert text_of(resp) == "llm said: via GET"
    assert [m["method"] for m in unsolicited] == ["sampling/createMessage"]
    assert on_stream == []
    await asyncio.gather(*tasks)


# --- modern ----------------------------------------------------------------------------------
async def test_modern_call_with_envelope(upstream: HttpUpstream) -> None:
    link = await upstream.open(Era.MODERN)
    assert isinstance(link, HttpModernLink)
    assert await upstream.open(Era.MODERN) is link  # shared
    resp = await answer(await link.send_request(call(link, "echo", {"text": "modern"}, MODERN_META)))
    assert text_of(resp) == "modern"
    assert resp["result"]["resultType"] == "complete"
    listed = await answer(
        await link.send_request(
            {"jsonrpc": "2.0", "id": link.new_id(), "method": "tools/list", "params": {"_meta": MODERN_META}}
        )
    )
    assert any(t["name"] == "slow" for t in listed["result"]["tools"])


async def test_modern_progress_routing(upstream: HttpUpstream) -> None:
    link = await upstream.open(Era.MODERN)
    got: list[Message] = []
    req = call(link, "progress_and_log", {"steps": 2})
    req["params"]["_meta"] = {**MODERN_META, "progressToken": req["id"], "io.modelcontextprotocol/logLevel": "info"}
    resp = await answer(await link.send_request(req, on_message=got.append))
    assert text_of(resp) == "done"
    assert [m["params"]["progress"] for m in got if m["method"] == "notifications/progress"] == [1, 2]
    assert any(m["method"] == "notifications/message" for m in got)


async def test_modern_cancel_closes_stream_and_stops_handler(upstream: HttpUpstream, journal: Journal) -> None:
    link = await upstream.open(Era.MODERN)
    ex = await link.send_request(call(link, "slow", {"seconds": 30}, MODERN_META))
    await asyncio.wait_for(journal.slow_started.wait(), WAIT)
    await link.cancel(ex)
    await asyncio.wait_for(journal.slow_cancelled.wait(), WAIT)
    assert not journal.slow_finished.is_set()
    failure = await failure_of(ex)
    assert failure.kind is FailureKind.CLOSED
    assert text_of(await answer(await link.send_request(call(link, "echo", {"text": "ok"}, MODERN_META)))) == "ok"


async def test_modern_headers_name_encoding_and_param_forwarding() -> None:
    seen: list[dict[str, str]] = []

    async def endpoint(request: Request) -> Response:
        seen.append(dict(request.headers))
        body = orjson.loads(await request.body())
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"ok": True}})

    app = Starlette(routes=[Route("/mcp", endpoint, methods=["POST"])])
    async with serve(app) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", headers={"authorization": "Bearer proxy-own"})
        try:
            link = await up.open(Era.MODERN)
            await answer(
                await link.send_request(
                    call(link, "wëather", {"city": "Zürich"}, MODERN_META),
                    headers={"Mcp-Param-City": "=?base64?WsO8cmljaA==?="},
                )
            )
            read = {
                "jsonrpc": "2.0",
                "id": link.new_id(),
                "method": "resources/read",
                "params": {"uri": "file:///a b", "_meta": MODERN_META},
            }
            await answer(await link.send_request(read))
        finally:
            await up.aclose()
    h = seen[0]
    assert h["mcp-protocol-version"] == "2026-07-28"
    assert h["mcp-method"] == "tools/call"
    assert h["mcp-name"] == "=?base64?" + base64.b64encode("wëather".encode()).decode() + "?="
    assert h["mcp-param-city"] == "=?base64?WsO8cmljaA==?="
    assert h["authorization"] == "Bearer proxy-own"
    assert "mcp-session-id" not in h
    assert seen[1]["mcp-name"] == "file:///a b" and seen[1]["mcp-method"] == "resources/read"


def test_header_value_rule() -> None:
    assert encode_header_value("get_weather") == "get_weather"
    assert encode_header_value(" padded") == "=?base64?IHBhZGRlZA==?="
    assert encode_header_value("=?base64?abc?=").startswith("=?base64?PT9")
    assert encode_header_value("a\r\nb") == "=?base64?YQ0KYg==?="
    assert encode_header_value("=?base64?=") == "=?base64?=", "too short to be the encoded form"
    assert encode_header_value("=?base64??=").startswith("=?base64?PT9")
    assert encode_header_value("tab\there").startswith("=?base64?") and encode_header_value("\x7f") == "=?base64?fw==?="
    assert encode_header_value("météo") == "=?base64?bcOpdMOpbw==?=" and encode_header_value("") == ""


# --- failures --------------------------------------------------------------------------------
def status_app(status: int, headers: dict[str, str] | None = None, jsonrpc_error: bool = False) -> Starlette:
    async def endpoint(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if jsonrpc_error:
            err = {"jsonrpc": "2.0", "id": body.get("id"), "error": {"code": -32603, "message": "boom"}}
            return JSONResponse(err, status_code=status, headers=headers)
        return Response("nope", status_code=status, headers=headers)

    return Starlette(routes=[Route("/mcp", endpoint, methods=["POST"])])


@pytest.mark.parametrize(
    ("status", "headers", "dispatched", "retry_after"),
    [
        (503, {"retry-after": "3"}, Dispatch.NO, 3.0),
        (429, {"retry-after": "1"}, Dispatch.NO, 1.0),
        (401, {"www-authenticate": "Bearer secret-realm"}, Dispatch.NO, None),
        (500, {}, Dispatch.UNKNOWN, None),
        (502, {}, Dispatch.UNKNOWN, None),
    ],
)
async def test_http_status_failures(
    status: int, headers: dict[str, str], dispatched: Dispatch, retry_after: float | None
) -> None:
    async with serve(status_app(status, headers)) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", headers={"authorization": "Bearer top-secret"})
        try:
            link = await up.open(Era.MODERN)
            ex = await link.send_request(call(link, "echo", {"text": "x"}, MODERN_META))
            f = await failure_of(ex)
        finally:
            await up.aclose()
    assert f.kind is FailureKind.HTTP_STATUS and f.http_status == status
    assert f.dispatched is dispatched and f.retry_after_s == retry_after
    assert len(f.detail) <= 300 and "secret" not in f.detail


async def test_http_500_with_jsonrpc_body() -> None:
    async with serve(status_app(500, jsonrpc_error=True)) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
        try:
            link = await up.open(Era.MODERN)
            req = call(link, "echo", {"text": "x"}, MODERN_META)
            f = await failure_of(await link.send_request(req))
        finally:
            await up.aclose()
    assert f.dispatched is Dispatch.UNKNOWN
    assert f.body is not None and f.body["id"] == req["id"] and f.body["error"]["code"] == -32603


async def test_peer_closes_without_answer_is_closed_unknown() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # take the request, then vanish
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
    try:
        link = await up.open(Era.MODERN)
        ex = await link.send_request(call(link, "echo", {"text": "x"}, MODERN_META))
        assert ex.written
        f = await failure_of(ex)
        assert f.kind is FailureKind.CLOSED and f.dispatched is Dispatch.UNKNOWN
    finally:
        await up.aclose()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("era", [Era.LEGACY, Era.MODERN])
async def test_server_dies_mid_request(era: Era) -> None:
    proc, port = await start_subprocess_server()
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
    try:
        if era is Era.LEGACY:
            link: Any = await legacy_session(up)
            got: asyncio.Queue[Message] = asyncio.Queue()
            req = call(link, "progress_and_log", {"steps": 1})
            await answer(await link.send_request(req))
            req = call(link, "slow", {"seconds": 60})
        else:
            link = await up.open(Era.MODERN)
            got = asyncio.Queue()
            req = call(link, "slow", {"seconds": 60}, MODERN_META)
        ex = await link.send_request(req, on_message=got.put_nowait)
        # the request reached the server (its stream is open); now kill the server
        assert ex.written
        proc.kill()
        await proc.wait()
        f = await failure_of(ex)
        assert f.kind is FailureKind.CLOSED and f.dispatched is Dispatch.UNKNOWN
        # nothing listens any more: the next request is refused before it is sent
        with pytest.raises(UpstreamFailure) as info:
            await link.send_request(call(link, "echo", {"text": "x"}, MODERN_META if era is Era.MODERN else None))
        assert info.value.kind is FailureKind.CONNECT_FAILED and info.value.dispatched is Dispatch.NO
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await up.aclose()


async def test_send_request_returns_once_sent_not_once_answered() -> None:
    """`send_request` returns when the request went out (the engine's attempt timer starts then),
    not when the answer's headers arrive; and bytes on the wire mean dispatch unknown."""
    got_request = asyncio.Event()
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        got_request.set()
        await release.wait()  # never answers until the test is done
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
    try:
        link = await up.open(Era.MODERN)
        ex = await asyncio.wait_for(link.send_request(call(link, "echo", {"text": "x"}, MODERN_META)), WAIT)
        assert ex.written and not ex.response.done()
        await asyncio.wait_for(got_request.wait(), WAIT)
        await link.cancel(ex)
        f = await failure_of(ex)
        assert f.kind is FailureKind.CLOSED and f.dispatched is Dispatch.UNKNOWN
    finally:
        release.set()
        await up.aclose()
        server.close()
        await server.wait_closed()


async def test_refused_notification_is_an_http_status_failure() -> None:
    async with serve(status_app(503, {"retry-after": "2"})) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
        try:
            link = await up.open(Era.MODERN)
            with pytest.raises(UpstreamFailure) as info:
                await link.send_notification(
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "m1"}}
                )
        finally:
            await up.aclose()
    f = info.value
    assert f.kind is FailureKind.HTTP_STATUS and f.http_status == 503
    assert f.dispatched is Dispatch.NO and f.retry_after_s == 2.0


async def test_legacy_broken_response_stream_is_resumed_with_last_event_id() -> None:
    """A 2025 upstream whose SSE response breaks after one event: the adapter reconnects with GET
    and `Last-Event-ID`, and the answer that was still missing arrives on the resumed stream."""
    gets: list[str | None] = []

    async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return lines[0].split(" ")[0], headers, body

    def json_response(payload: dict[str, Any], extra: str = "") -> bytes:
        data = orjson.dumps(payload)
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
        return head.encode() + data

    def sse_head() -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    def chunk(text: str) -> bytes:
        data = text.encode()
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, headers, body = await read_request(reader)
                if method == "GET":
                    gets.append(headers.get("last-event-id"))
                    if headers.get("last-event-id") != "ev1":
                        writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                        await writer.drain()
                        continue
                    answer_ = {"jsonrpc": "2.0", "id": pending[0], "result": {"content": [], "isError": False}}
                    writer.write(sse_head() + chunk(f"id: ev2\ndata: {orjson.dumps(answer_).decode()}\n\n"))
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    continue
                if method == "DELETE":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                msg = orjson.loads(body)
                if msg.get("method") == "initialize":
                    result = {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {},
                        "serverInfo": {"name": "x", "version": "1"},
                    }
                    writer.write(
                        json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result}, "mcp-session-id: s1\r\n")
                    )
                elif "id" not in msg:
                    writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
                else:  # tools/call: one event, then the connection breaks before the response
                    pending.append(msg["id"])
                    note = {
                        "jsonrpc": "2.0",
                        "method": "notifications/message",
                        "params": {"level": "info", "data": "working"},
                    }
                    writer.write(sse_head() + chunk(f"id: ev1\nretry: 10\ndata: {orjson.dumps(note).decode()}\n\n"))
                    await writer.drain()
                    writer.transport.abort()
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    pending: list[Any] = []
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
    try:
        link = await legacy_session(up)
        seen: list[Message] = []
        ex = await link.send_request(call(link, "echo", {"text": "x"}), on_message=seen.append)
        response = await asyncio.wait_for(ex.response, 10)
        assert response["result"] == {"content": [], "isError": False}
        assert [m.get("method") for m in seen] == ["notifications/message"], "the event before the break, once"
        assert "ev1" in gets, "the adapter resumed from the last event id it had"
    finally:
        await up.aclose()
        server.close()
        await server.wait_closed()


async def test_a_json_answer_over_the_message_bound_fails_the_call_on_both_paths() -> None:
    """The first call goes through an exchange task (no pooled connection yet), later ones are
    written at once and answered from the connection's callbacks: both bound the answer."""

    async def endpoint(request: Request) -> Response:
        body = orjson.loads(await request.body())
        size = body["params"]["arguments"]["size"]
        result = {"content": [{"type": "text", "text": "x" * size}], "isError": False}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": result})

    app = Starlette(routes=[Route("/mcp", endpoint, methods=["POST"])])
    async with serve(app) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", max_event_bytes=64 * 1024)
        try:
            link = await up.open(Era.MODERN)
            for _ in range(2):
                f = await failure_of(await link.send_request(call(link, "big", {"size": 200_000}, MODERN_META)))
                assert f.kind is FailureKind.PROTOCOL and f.dispatched is Dispatch.UNKNOWN
                assert "exceeds 65536 bytes" in f.detail
                ok = await answer(await link.send_request(call(link, "small", {"size": 1000}, MODERN_META)))
                assert len(text_of(ok)) == 1000
        finally:
            await up.aclose()


async def test_a_header_the_client_cannot_send_is_refused_alike_on_both_paths() -> None:
    """A caller's header the HTTP client refuses to write (a line break in its value) fails the
    request before anything is sent, as the same failure whether the request goes through an
    exchange task (no pooled connection yet) or is written at once on an idle connection."""

    async def endpoint(request: Request) -> Response:
        body = orjson.loads(await request.body())
        result = {"content": [{"type": "text", "text": "ok"}], "isError": False}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": result})

    app = Starlette(routes=[Route("/mcp", endpoint, methods=["POST"])])
    async with serve(app) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
        try:
            link = await up.open(Era.MODERN)
            for path in ("exchange task", "idle connection"):
                with pytest.raises(UpstreamFailure) as info:
                    await link.send_request(call(link, "t", {}, MODERN_META), headers={"x-bad": "a\r\nInjected: 1"})
                f = info.value
                assert (f.kind, f.dispatched, f.detail) == (
                    FailureKind.PROTOCOL,
                    Dispatch.NO,
                    "a request header is not valid",
                ), path
                assert link.in_flight == 0, path
                ok = await answer(await link.send_request(call(link, "t", {}, MODERN_META)))
                assert text_of(ok) == "ok"  # and now a pooled connection is idle
        finally:
            await up.aclose()


@pytest.mark.parametrize(
    ("body", "forgotten"),
    [
        # the TypeScript SDK's examples (and most servers built from them), and its transport
        (b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"}}', True),
        (b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}', True),
        (b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Mcp-Session-Id header is required"}}', True),
        (b"Invalid or missing session ID", True),  # a plain-text body
        # a 400 about the request itself stays the caller's validation failure
        (b'{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params: field required"},"id":1}', False),
        (b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Unsupported protocol version"}}', False),
        (b'{"jsonrpc":"2.0","result":{"session":"x"},"id":1}', False),  # not an error body
        (b"", False),
    ],
)
def test_a_400_forgot_the_session_only_when_its_body_says_so(body: bytes, forgotten: bool) -> None:
    assert forgot_session(body) is forgotten


async def test_legacy_session_recovers_when_its_reestablishment_failed_once() -> None:
    """The upstream restarted (it forgot the session) and was still down when the proxy replayed
    `initialize`: that call fails, not dispatched, and the next one re-establishes the session.
    Before, the link had dropped its session id first, so every later request went without one and
    got the server's 400 "Missing session ID", taken as a validation failure, forever (found by
    bench/load_faults.py: all 50 legacy sessions over an HTTP upstream stuck after kills)."""
    state = {"forgot": False, "down": False, "inits": 0}

    async def endpoint(request: Request) -> Response:
        if request.method != "POST":  # the listen stream's GET, the session's DELETE
            return Response(status_code=405)
        body = orjson.loads(await request.body())
        sid = request.headers.get("mcp-session-id")
        if body.get("method") == "initialize":
            if state["down"]:
                return Response(status_code=503)
            state["inits"] += 1
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "x", "version": "1"}}
            return JSONResponse(
                {"jsonrpc": "2.0", "id": body["id"], "result": result},
                headers={"mcp-session-id": f"s{state['inits']}"},
            )
        if sid is None:  # what the SDK's server answers a request without a session
            return JSONResponse(
                {
                    "jsonrpc": "2.0",
                    "id": "server-error",
                    "error": {"code": -32600, "message": "Bad Request: Missing session ID"},
                },
                status_code=400,
            )
        if sid == "s1" and state["forgot"]:
            return Response(status_code=404)
        if "id" not in body:
            return Response(status_code=202)
        text = body["params"]["arguments"]["text"]
        return JSONResponse(
            {"jsonrpc": "2.0", "id": body["id"], "result": {"content": [{"type": "text", "text": text}]}}
        )

    app = Starlette(routes=[Route("/mcp", endpoint, methods=["POST", "DELETE", "GET"])])
    async with serve(app) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
        try:
            link = await up.open(Era.LEGACY)
            init = initialize_request(link)
            await answer(await link.send_request(init))
            assert text_of(await answer(await link.send_request(call(link, "echo", {"text": "before"})))) == "before"
            state["forgot"] = state["down"] = True  # it restarted, and is not up yet
            failure = await failure_of(await link.send_request(call(link, "echo", {"text": "during"})))
            assert failure.dispatched is Dispatch.NO
            state["down"] = False  # it is up again
            resp = await answer(await link.send_request(call(link, "echo", {"text": "after"})))
            assert text_of(resp) == "after"
            assert link.session_id == "s2"
        finally:
            await up.aclose()


def _principal(authorization: str | None) -> str | None:
    """The user a test token names: `Bearer alice-2` is alice's second token (a refresh)."""
    return authorization.rsplit("-", 1)[0] if authorization else None


async def test_passthrough_a_404_to_another_credential_refuses_it_and_never_moves_the_session() -> None:
    """--auth passthrough in front of a server that binds each session to the principal that
    opened it and answers its id used by another principal 404, as if it did not exist (the MCP
    SDK's rule), also its answer once it forgot the session (a restart). Only the credential the
    server last accepted on the session re-establishes it; any other is refused (SESSION_REFUSED,
    not dispatched), no `initialize` replayed with it; the link's own messages (an answer to the
    server, the closing DELETE) carry the accepted credential, never a refused one. Before, a 404
    to bob's credential on alice's session replayed `initialize` as bob: the session was his."""
    owners: dict[str, str | None] = {}
    seen: list[tuple[str, str | None, str | None]] = []  # HTTP method, JSON-RPC method, credential
    gets: list[str | None] = []  # the credential of each listen stream's GET

    async def endpoint(request: Request) -> Response:
        auth = request.headers.get("authorization")
        sid = request.headers.get("mcp-session-id")
        body = orjson.loads(await request.body()) if request.method == "POST" else {}
        if request.method == "GET":
            gets.append(auth)
            return Response(status_code=405)  # no listen stream
        seen.append((request.method, body.get("method", "response" if "result" in body else None), auth))
        if body.get("method") == "initialize":
            sid = f"s{len(owners) + 1}"
            owners[sid] = _principal(auth)
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "x", "version": "1"}}
            return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": result}, headers={"mcp-session-id": sid})
        if sid not in owners or owners[sid] != _principal(auth):
            return Response(status_code=404)  # unknown, forgotten, or another principal's
        if request.method == "DELETE" or "id" not in body or "method" not in body:
            return Response(status_code=202 if request.method == "POST" else 200)
        text = f"{_principal(auth)}:{body['params']['arguments']['text']}"
        return JSONResponse(
            {"jsonrpc": "2.0", "id": body["id"], "result": {"content": [{"type": "text", "text": text}]}}
        )

    def forget() -> None:  # the server restarted: every session is gone
        for sid in owners:
            owners[sid] = "forgotten"

    def as_(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    async def failed(link: HttpLegacyLink, text: str, headers: dict[str, str] | None) -> UpstreamFailure:
        """The failure of an echo: raised by `send_request` (before it was written) or its answer."""
        with pytest.raises(UpstreamFailure) as info:
            await answer(await link.send_request(call(link, "echo", {"text": text}), headers=headers))
        return info.value

    app = Starlette(routes=[Route("/mcp", endpoint, methods=["POST", "DELETE", "GET"])])
    async with serve(app) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
        try:
            link = await up.open(Era.LEGACY)
            assert isinstance(link, HttpLegacyLink)
            init = initialize_request(link)
            await answer(await link.send_request(init, headers=as_("alice-1")))
            await link.send_notification(
                {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=as_("alice-1")
            )
            ok = await answer(await link.send_request(call(link, "echo", {"text": "a"}), headers=as_("alice-1")))
            assert text_of(ok) == "Bearer alice:a"

            seen.clear()
            refused = await failed(link, "b", as_("bob-1"))
            assert refused.kind is FailureKind.SESSION_REFUSED and refused.dispatched is Dispatch.NO
            assert refused.http_status == 404
            with pytest.raises(UpstreamFailure) as note:
                await link.send_notification({"jsonrpc": "2.0", "method": "notifications/x"}, headers=as_("bob-1"))
            assert note.value.kind is FailureKind.SESSION_REFUSED
            anonymous = await failed(link, "c", None)
            assert anonymous.kind is FailureKind.SESSION_REFUSED  # no credential is not the owner's either
            await link.send_response({"jsonrpc": "2.0", "id": "server-1", "result": {}})  # the link's own
            assert seen == [
                ("POST", "tools/call", "Bearer bob-1"),
                ("POST", "notifications/x", "Bearer bob-1"),
                ("POST", "tools/call", None),
                ("POST", "response", "Bearer alice-1"),
            ]
            assert owners == {"s1": "Bearer alice"} and link.reestablished == 0

            # A restart: the accepted credential re-establishes the session, with that credential.
            forget()
            seen.clear()
            again = await answer(await link.send_request(call(link, "echo", {"text": "d"}), headers=as_("alice-1")))
            assert text_of(again) == "Bearer alice:d" and link.reestablished == 1
            assert [s for s in seen if s[1] == "initialize"] == [("POST", "initialize", "Bearer alice-1")]

            # A refreshed token, accepted: it is the one the link's own messages carry from now on.
            fresh = await answer(await link.send_request(call(link, "echo", {"text": "e"}), headers=as_("alice-2")))
            assert text_of(fresh) == "Bearer alice:e" and link.caller_authorization == "Bearer alice-2"

            # The price: a token refreshed again whose first request meets a restart is refused too
            # (the proxy cannot tell a refresh from another user); its client opens a new session.
            forget()
            seen.clear()
            first = await failed(link, "f", as_("alice-3"))
            assert first.kind is FailureKind.SESSION_REFUSED and link.reestablished == 1
            assert [s for s in seen if s[1] == "initialize"] == []
            again = await answer(await link.send_request(call(link, "echo", {"text": "g"}), headers=as_("alice-2")))
            assert text_of(again) == "Bearer alice:g" and link.reestablished == 2
            seen.clear()
            await link.aclose()
            assert [(s[0], s[2]) for s in seen] == [("DELETE", "Bearer alice-2")]
            assert gets and set(gets) <= {"Bearer alice-1", "Bearer alice-2"}, gets  # never bob's, nor none
        finally:
            await up.aclose()


async def test_legacy_request_written_as_its_caller_is_cancelled_is_still_cancelled_upstream() -> None:
    """A 2025 caller cancelled in the moment between its request going out and `send_request`
    handing back the exchange (the server already has it) gets no exchange to cancel: the link
    must cancel it itself (`notifications/cancelled`), or the server runs the request to its end.
    The server here cancels the caller the moment the request's bytes arrive, before the caller's
    task resumes, and then records the cancellations it gets."""
    caller: asyncio.Task[Exchange] | None = None
    cancelled_ids: list[Any] = []
    got_cancel = asyncio.Event()

    def on_request(conn: RawHttp, method: str, path: str, body: Any) -> None:
        if body.get("method") == "tools/call":
            assert caller is not None
            caller.cancel()  # the server has the request; its caller has not resumed yet
            conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            return
        if body.get("method") == "notifications/cancelled":
            cancelled_ids.append(body["params"]["requestId"])
            got_cancel.set()
        conn.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")

    server = await asyncio.get_running_loop().create_server(lambda: RawHttp(on_request), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
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


async def test_an_attempt_timer_firing_as_its_request_is_written_records_dispatch_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same moment, through the relay and the engine, with the attempt's own timer as what
    cancels: the request is on the server, `send_request` has not returned. The attempt must be
    recorded as dispatch unknown (a state-changing tool: not retried, outcome unknown), never as
    "not sent" (which would let the engine send it again), and the request is cancelled upstream.
    The server fires the attempt's timer the moment the request's bytes arrive (what the loop
    timer does when it comes due); a second attempt would be answered at once."""
    timers = AttemptTimers(monkeypatch)
    calls: list[Any] = []
    cancelled_ids: list[Any] = []
    got_cancel = asyncio.Event()

    def on_request(conn: RawHttp, method: str, path: str, body: Any) -> None:
        if body.get("method") == "tools/call":
            calls.append(body["id"])
            if len(calls) == 1:
                timers.fire_latest()  # the server has the request; its caller has not resumed
                conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                return
            answer = orjson.dumps({"jsonrpc": "2.0", "id": body["id"], "result": {"content": []}})
            conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer))
            conn.write(answer)
            return
        if body.get("method") == "notifications/cancelled":
            cancelled_ids.append(body["params"]["requestId"])
            got_cancel.set()
        conn.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")

    server = await asyncio.get_running_loop().create_server(lambda: RawHttp(on_request), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp")
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


async def test_a_call_answered_on_an_event_stream_leaves_its_connection_to_the_next_call() -> None:
    """A server that ends a POST's event stream after the response (the SDK's does, the end often
    coming apart from the last event): the link reads that end after delivering the answer, so
    the next call goes out on the same connection instead of a new one, a TCP accept and HTTP
    connection state the server would pay per call. Here the end comes only once the test saw
    the answer, and the pool has one connection: the next call waits for it, and gets it back
    once the end was read (had it been closed, the call would open a new one)."""
    ends: list[asyncio.Event] = []
    ports: list[int] = []

    async def post(request: Request) -> Response:
        message = orjson.loads(await request.body())
        assert request.client is not None
        ports.append(request.client.port)
        end = asyncio.Event()
        ends.append(end)
        result = {"content": [{"type": "text", "text": message["params"]["arguments"]["text"]}]}

        async def events() -> AsyncIterator[bytes]:
            yield b"event: message\ndata: " + orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
            yield b"\n\n"
            await end.wait()  # the stream's end, apart from its last event

        return StreamingResponse(events(), media_type="text/event-stream")

    async with serve(Starlette(routes=[Route("/mcp", post, methods=["POST"])])) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", max_connections=1)
        try:
            link = await up.open(Era.MODERN)
            for i in range(3):
                assert (
                    text_of(await answer(await link.send_request(call(link, "echo", {"text": f"c{i}"}, MODERN_META))))
                    == f"c{i}"
                )
                ends[-1].set()
            assert len(ports) == 3 and len(set(ports)) == 1, ports
        finally:
            await up.aclose()
