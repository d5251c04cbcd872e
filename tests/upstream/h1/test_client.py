"""proxy.upstream.h1 against real sockets on 127.0.0.1: a uvicorn+Starlette app for the well-behaved
answers, raw `asyncio.start_server` servers for everything a library server would not do
(close mid-body, garbage status lines, answers that never come, gated answers for the pool)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from proxy.upstream.h1 import (
    BodyTooLarge,
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionClosed,
    ConnectTimeout,
    HttpClient,
    InvalidURL,
    PoolTimeout,
    ProtocolError,
    Response,
)
from proxy.upstream.h1.reader import MAX_HEAD_BYTES
from proxy.upstream.h1.response import HIGH_WATER

from ..servers import serve

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(60)]
WAIT = 5.0
SECRET = "s3cr3t-token-value"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Fail a test whose loop reported anything ("Future exception was never retrieved", ...)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(previous)
    assert not errors, [c.get("message") for c in errors]


@dataclass
class Req:
    line: str
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    body: bytes


async def read_request(reader: asyncio.StreamReader) -> Req | None:
    """One request off the connection; None on a clean EOF between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    line, *rest = head[:-4].decode("latin-1").split("\r\n")
    raw = [tuple(h.split(": ", 1)) for h in rest]
    headers = {k.lower(): v for k, v in raw}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Req(line, headers, raw, body)  # type: ignore[arg-type]


def answer(
    status: int = 200, body: bytes = b"", headers: tuple[tuple[str, str], ...] = (), reason: str = "OK"
) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers), f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


Handler = Callable[["Raw", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Raw:
    """A raw TCP server: records each connection's client port and every request it read."""

    handler: Handler
    port: int = 0
    ports: list[int] = field(default_factory=list)
    requests: list[Req] = field(default_factory=list)
    eofs: int = 0
    eof_event: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.ports.append(writer.get_extra_info("peername")[1])
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The teardown's cancel: end normally, asyncio.streams (3.11) reports a cancelled
            # handler task as an "Exception in callback", which `loop_errors` would count.
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def next_request(self, reader: asyncio.StreamReader) -> Req | None:
        req = await read_request(reader)
        if req is not None:
            self.requests.append(req)
            self.arrived.set()
        return req

    async def wait_requests(self, n: int) -> None:
        while len(self.requests) < n:
            self.arrived.clear()
            await self.arrived.wait()

    async def wait_eof(self, reader: asyncio.StreamReader) -> None:
        """Until the client closes its side (EOF or reset)."""
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.eofs += 1
        self.eof_event.set()


@contextlib.asynccontextmanager
async def raw_server(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[Raw]:
    raw = Raw(handler)
    server = await asyncio.start_server(raw._serve, "127.0.0.1", 0, ssl=tls)
    raw.port = server.sockets[0].getsockname()[1]
    try:
        yield raw
    finally:
        server.close()
        for task in list(raw.tasks):
            task.cancel()
        await asyncio.gather(*raw.tasks, return_exceptions=True)
        await server.wait_closed()


def keep_alive(respond: Callable[[Req], bytes]) -> Handler:
    """A well-behaved keep-alive server: answers every request on the connection in turn."""

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (req := await raw.next_request(reader)) is not None:
            writer.write(respond(req))
            await writer.drain()

    return handler


def url(raw: Raw | int, path: str = "/mcp") -> str:
    port = raw if isinstance(raw, int) else raw.port
    return f"http://127.0.0.1:{port}{path}"


@contextlib.asynccontextmanager
async def client_for(target: Raw | int, **kw: Any) -> AsyncIterator[HttpClient]:
    client = HttpClient(url(target), **kw)
    try:
        yield client
    finally:
        await client.aclose()


def refused_port() -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # bound, never listened: connecting is refused
    return port


def messages_of(exc: BaseException) -> str:
    """Every message in the exception chain, and their reprs."""
    out: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 20:
        out += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# well-behaved answers (uvicorn + Starlette)
# ---------------------------------------------------------------------------------------------
async def _echo(request: Request) -> JSONResponse:
    body = await request.body()
    assert request.client is not None
    return JSONResponse(
        {
            "got": json.loads(body) if body else None,
            "headers": [[k, v] for k, v in request.headers.items()],
            "client_port": request.client.port,
        },
        headers={"X-Reply": "one"},
    )


async def _stream(request: Request) -> StreamingResponse:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"data: {i}\n\n".encode()

    return StreamingResponse(gen(), media_type="text/event-stream")


@pytest.fixture
async def app_port() -> AsyncIterator[int]:
    app = Starlette(routes=[Route("/mcp", _echo, methods=["POST", "GET"]), Route("/stream", _stream)])
    async with serve(app) as port:
        yield port


async def test_post_json_content_length_against_uvicorn(app_port: int) -> None:
    client = HttpClient(url(app_port), headers={"Authorization": "Bearer a", "X-Default": "d"})
    try:
        async with asyncio.timeout(WAIT):
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
            async with await client.request(
                "POST",
                headers={"content-type": "application/json", "authorization": "Bearer b"},
                body=body,
            ) as resp:
                assert resp.status == 200
                assert resp.reason == "OK"
                assert resp.headers.get("content-type") == "application/json"
                assert resp.headers.get("x-reply") == "one"
                data = json.loads(await resp.read())
                assert resp.complete
            headers = dict((k, v) for k, v in data["headers"])
            assert data["got"] == {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            assert headers["host"] == f"127.0.0.1:{app_port}"
            assert headers["content-length"] == str(len(body))
            assert headers["authorization"] == "Bearer b"  # the request's header replaced the default
            assert [k for k, _ in data["headers"]].count("authorization") == 1
            assert headers["x-default"] == "d"
            assert "accept-encoding" not in headers
            assert "cookie" not in headers
            # the same connection serves the next request (keep-alive), uvicorn sees the same port
            resp2 = await client.request("POST", body=b"{}")
            again = json.loads(await resp2.read())
            assert again["client_port"] == data["client_port"]
    finally:
        await client.aclose()


async def test_chunked_stream_from_uvicorn(app_port: int) -> None:
    async with client_for(app_port) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET", target="/stream")
        assert resp.headers.get("transfer-encoding") == "chunked"
        assert await resp.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


# ---------------------------------------------------------------------------------------------
# body framings
# ---------------------------------------------------------------------------------------------
async def test_chunked_answer() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
        for part in (b'{"a":', b"1", b"}"):
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await raw.next_request(reader)  # keep-alive: the client may reuse the connection

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("POST", body=b"{}")
        assert await resp.read() == b'{"a":1}'
        assert resp.complete


async def test_close_delimited_answer_and_no_reuse() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"world")
        await writer.drain()
        writer.close()

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET")
        assert not resp.complete
        assert await resp.read() == b"hello world"
        assert resp.complete
        resp2 = await client.request("GET")
        assert await resp2.read() == b"hello world"
        assert len(raw.ports) == 2 and raw.ports[0] != raw.ports[1]


async def test_sse_like_stream_chunks_arrive_over_time() -> None:
    go_on = asyncio.Event()

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        first = b"event: message\ndata: 1\n\n"
        writer.write(f"{len(first):x}\r\n".encode() + first + b"\r\n")
        await writer.drain()
        await go_on.wait()  # the second event is only sent once the client saw the first
        second = b"data: 2\n\n"
        writer.write(f"{len(second):x}\r\n".encode() + second + b"\r\n0\r\n\r\n")
        await writer.drain()
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET", headers={"Accept": "text/event-stream"})
        got: list[bytes] = []
        async for chunk in resp.iter_chunks():
            got.append(chunk)
            if len(got) == 1:
                assert chunk == b"event: message\ndata: 1\n\n"
                go_on.set()
        assert got[-1] == b"data: 2\n\n"
        assert b"".join(got) == b"event: message\ndata: 1\n\ndata: 2\n\n"
        assert resp.complete


async def test_gzip_and_deflate_answers_are_decoded() -> None:
    payload = json.dumps({"result": ["x" * 50] * 200}).encode()

    def respond(req: Req) -> bytes:
        assert "accept-encoding" not in req.headers  # never asked for compression
        if req.line.startswith("GET /gz"):
            return answer(body=gzip.compress(payload), headers=(("Content-Encoding", "gzip"),))
        return answer(body=zlib.compress(payload), headers=(("Content-Encoding", "deflate"),))

    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET", target="/gz")
        assert resp.headers.get("content-encoding") == "gzip"
        assert await resp.read() == payload
        resp = await client.request("GET", target="/deflate")
        chunks = [c async for c in resp.iter_chunks()]
        assert b"".join(chunks) == payload
        assert len(raw.ports) == 1  # a decoded answer still leaves the connection reusable
        assert raw.requests[0].line == "GET /gz HTTP/1.1"


async def test_head_answer_has_no_body() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("HEAD")
        assert resp.complete
        assert await resp.read() == b""
        await raw.eof_event.wait()  # not reusable: closed


async def test_interim_answer_is_skipped() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + answer(body=b"ok"))
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET")
        assert resp.status == 200
        assert "link" not in resp.headers
        assert await resp.read() == b"ok"


# ---------------------------------------------------------------------------------------------
# keep-alive and the pool
# ---------------------------------------------------------------------------------------------
async def test_keep_alive_reuse_and_connection_close_honoured() -> None:
    def respond(req: Req) -> bytes:
        if req.line.startswith("GET /close"):
            return answer(body=b"bye", headers=(("Connection", "close"),))
        return answer(body=b"ok")

    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        for _ in range(3):
            assert await (await client.request("POST", body=b"{}")).read() == b"ok"
        assert len(raw.ports) == 1
        assert [r.headers["content-length"] for r in raw.requests] == ["2", "2", "2"]
        assert await (await client.request("GET", target="/close")).read() == b"bye"
        assert len(raw.ports) == 1
        assert await (await client.request("POST")).read() == b"ok"
        assert len(raw.ports) == 2 and raw.ports[1] != raw.ports[0]
        assert raw.requests[-1].headers["content-length"] == "0"  # a POST without body says so


async def test_request_connection_close_header_is_honoured() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b"ok"))) as raw, client_for(raw) as client:
        async with asyncio.timeout(WAIT):
            await (await client.request("GET", headers={"Connection": "close"})).read()
            await (await client.request("GET")).read()
        assert len(raw.ports) == 2


def _gated(gate: asyncio.Event) -> Handler:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.next_request(reader) is not None:
            await gate.wait()
            writer.write(answer(body=b"ok"))
            await writer.drain()

    return handler


async def test_pool_limit_third_request_waits_for_a_connection() -> None:
    gate = asyncio.Event()
    async with raw_server(_gated(gate)) as raw, client_for(raw, max_connections=2, connect_timeout_s=3) as client:
        async with asyncio.timeout(WAIT):

            async def one() -> bytes:
                return await (await client.request("GET")).read()

            tasks = [asyncio.create_task(one()) for _ in range(3)]
            await raw.wait_requests(2)
            await asyncio.sleep(0.1)
            assert len(raw.requests) == 2 and len(raw.ports) == 2  # the third waits, no third connection
            gate.set()
            assert await asyncio.gather(*tasks) == [b"ok"] * 3
            assert len(raw.ports) == 2  # it got one of the two


async def test_pool_wait_ends_at_the_requests_own_wait_s_not_at_the_connect_timeout() -> None:
    gate = asyncio.Event()
    async with raw_server(_gated(gate)) as raw, client_for(raw, max_connections=2, connect_timeout_s=WAIT) as client:
        async with asyncio.timeout(WAIT):
            busy = [asyncio.create_task(client.request("GET")) for _ in range(2)]
            await raw.wait_requests(2)
            loop = asyncio.get_running_loop()
            started = loop.time()
            wrote: list[int] = []
            with pytest.raises(PoolTimeout, match=r"within 0\.3 s \(2 in use\)"):
                await client.request("GET", on_write=lambda: wrote.append(1), wait_s=0.3)
            assert 0.25 <= loop.time() - started < 2
            assert wrote == []
            gate.set()
            for resp in await asyncio.gather(*busy):
                assert await resp.read() == b"ok"
            # the timed-out waiter swallowed no slot: two more requests in parallel still work
            gate.set()
            resps = await asyncio.gather(client.request("GET"), client.request("GET"))
            assert [await r.read() for r in resps] == [b"ok", b"ok"]
            assert len(raw.ports) == 2


async def test_requests_beyond_the_pool_wait_their_turn_longer_than_the_connect_timeout() -> None:
    # An upstream that takes SLOW_S per request (a tool that takes a while), twice as many
    # requests as the pool holds, three times: each round takes longer than the connect timeout,
    # and the last requests wait two rounds. Every one is served, on the pool's two connections.
    slow_s = 0.4
    at_once: list[int] = []
    running = 0

    async def slow(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal running
        while await raw.next_request(reader) is not None:
            running += 1
            at_once.append(running)
            await asyncio.sleep(slow_s)  # the upstream's work on this request
            running -= 1
            writer.write(answer(body=b"ok"))
            await writer.drain()

    async with raw_server(slow) as raw, client_for(raw, max_connections=2, connect_timeout_s=slow_s / 2) as client:
        async with asyncio.timeout(WAIT):

            async def one() -> bytes:
                return await (await client.request("GET")).read()

            assert await asyncio.gather(*(one() for _ in range(6))) == [b"ok"] * 6
        assert len(raw.requests) == 6 and len(raw.ports) == 2
        assert max(at_once) == 2


async def test_cancelled_pool_waiter_does_not_swallow_the_slot() -> None:
    gate = asyncio.Event()
    async with raw_server(_gated(gate)) as raw, client_for(raw, max_connections=1, connect_timeout_s=3) as client:
        async with asyncio.timeout(WAIT):
            first = asyncio.create_task(client.request("GET"))
            await raw.wait_requests(1)
            waiter = asyncio.create_task(client.request("GET"))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            gate.set()
            assert await (await first).read() == b"ok"
            assert await (await client.request("GET")).read() == b"ok"
            assert len(raw.ports) == 1


async def test_waiter_cancelled_right_after_being_handed_a_connection() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b"ok"))) as raw:
        async with client_for(raw, max_connections=1, connect_timeout_s=3) as client, asyncio.timeout(WAIT):
            first = await client.request("GET")
            waiter = asyncio.create_task(client.request("GET"))
            await asyncio.sleep(0.05)
            first.release()  # hands the connection to the waiter's future...
            waiter.cancel()  # ...whose task is cancelled before it runs
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert await (await client.request("GET")).read() == b"ok"
            assert len(raw.ports) == 1


async def test_stale_idle_connection_is_not_reused() -> None:
    closed = asyncio.Event()

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(answer(body=b"ok"))
        await writer.drain()
        if len(raw.ports) == 1:
            writer.close()  # an idle timeout on the server side
            await writer.wait_closed()
            closed.set()
            return
        while await raw.next_request(reader) is not None:
            writer.write(answer(body=b"ok"))

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        assert await (await client.request("GET")).read() == b"ok"
        await closed.wait()
        await asyncio.sleep(0.05)  # the client's loop sees the FIN
        assert await (await client.request("GET")).read() == b"ok"
        assert len(raw.ports) == 2


async def test_read_limit_stops_and_does_not_reuse() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b"x" * 10000))) as raw, client_for(raw) as client:
        async with asyncio.timeout(WAIT):
            resp = await client.request("GET")
            assert await resp.read(limit=10) == b"x" * 10
            assert await (await client.request("GET")).read() == b"x" * 10000
            assert len(raw.ports) == 2
            # a body within the limit is read whole and the connection kept
            resp = await client.request("GET")
            assert await resp.read(limit=20000) == b"x" * 10000
            await (await client.request("GET")).read()
            assert len(raw.ports) == 2


async def test_unread_body_closes_the_connection_on_release() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        async with await client.request("GET") as resp:
            assert resp.status == 200
        await raw.eof_event.wait()
        with pytest.raises(ClientError):
            await resp.read()


async def test_flow_control_pauses_and_resumes_reading() -> None:
    size = 4 * 1024 * 1024
    payload = bytes(range(256)) * (size // 256)

    async with raw_server(keep_alive(lambda req: answer(body=payload))) as raw, client_for(raw) as client:
        async with asyncio.timeout(WAIT):
            resp = await client.request("GET")
            while resp._buffered <= HIGH_WATER:  # noqa: ASYNC110 (the client's own state, no event to wait on)
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert resp._conn is not None and resp._conn.paused
            assert resp._buffered < size  # not everything was taken in while nobody read
            got = b"".join([c async for c in resp.iter_chunks()])
            assert got == payload
            assert await (await client.request("GET")).read() == payload
            assert len(raw.ports) == 1


# ---------------------------------------------------------------------------------------------
# failures
# ---------------------------------------------------------------------------------------------
async def test_connect_refused_is_connect_error_and_nothing_written() -> None:
    wrote: list[int] = []
    async with client_for(refused_port(), headers={"Authorization": SECRET}) as client, asyncio.timeout(WAIT):
        with pytest.raises(ConnectError) as info:
            await client.request("POST", body=b"{}", on_write=lambda: wrote.append(1))
    assert not isinstance(info.value, ConnectTimeout)
    assert isinstance(info.value.__cause__, OSError)
    assert wrote == []
    assert SECRET not in messages_of(info.value)


async def test_server_closes_before_answering() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)

    wrote: list[int] = []
    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        with pytest.raises(ConnectionClosed) as info:
            await client.request("POST", body=b"{}", headers={"X-Api-Key": SECRET}, on_write=lambda: wrote.append(1))
    assert info.value.response_started is False
    assert info.value.reused is False
    assert wrote == [1]
    assert SECRET not in messages_of(info.value)


async def test_server_closes_mid_body() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.next_request(reader) is not None:
            if len(raw.requests) == 1:
                writer.write(answer(body=b"ok"))
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()
            return

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        await (await client.request("GET")).read()
        resp = await client.request("GET")
        with pytest.raises(ConnectionClosed) as info:
            await resp.read()
        assert info.value.response_started is True
        assert info.value.reused is True
        assert not resp.complete


async def test_server_closes_mid_chunked_stream_iter_chunks() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET")
        got: list[bytes] = []
        with pytest.raises(ConnectionClosed) as info:
            async for chunk in resp.iter_chunks():
                got.append(chunk)
        assert got == [b"hello"]
        assert info.value.response_started is True


async def test_malformed_status_line_is_protocol_error() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        with pytest.raises(ProtocolError) as info:
            await client.request("GET", headers={"Authorization": SECRET})
        await raw.eof_event.wait()  # the connection is closed, not pooled
    assert info.value.__cause__ is not None
    assert SECRET not in messages_of(info.value)


async def test_malformed_chunk_is_protocol_error_from_read() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"zz\r\nnope\r\n")
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET")
        with pytest.raises(ProtocolError):
            await resp.read()


async def test_cancel_while_waiting_for_the_head_closes_the_connection() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        req = await raw.next_request(reader)
        if req is not None and req.line.startswith("GET /hang"):
            await raw.wait_eof(reader)
            return
        while req is not None:
            writer.write(answer(body=b"ok"))
            req = await raw.next_request(reader)

    async with raw_server(handler) as raw:
        async with client_for(raw, max_connections=1, connect_timeout_s=0.5) as client, asyncio.timeout(WAIT):
            task = asyncio.create_task(client.request("GET", target="/hang"))
            await raw.wait_requests(1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await raw.eof_event.wait()  # the server saw the connection close
            # the only slot is free again: a new request connects at once instead of timing out
            assert await (await client.request("GET")).read() == b"ok"
            assert len(raw.ports) == 2


async def test_cancel_while_reading_the_body_closes_the_connection() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw, max_connections=1) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET")
        reading = asyncio.create_task(resp.read())
        await asyncio.sleep(0.05)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        await raw.eof_event.wait()
        assert client._open == 0


async def test_cancel_while_connecting_releases_the_slot() -> None:
    # The connect may fail or not before the cancel lands; either way the slot comes back.
    async with client_for(refused_port(), max_connections=1, connect_timeout_s=3) as client:
        task = asyncio.create_task(client.request("GET"))
        await asyncio.sleep(0)
        assert client._open == 1
        task.cancel()
        with pytest.raises((asyncio.CancelledError, ConnectError)):
            await task
        assert client._open == 0


# ---------------------------------------------------------------------------------------------
# request shaping, cookies, headers
# ---------------------------------------------------------------------------------------------
async def test_crlf_in_header_is_refused_before_anything_is_sent() -> None:
    async with raw_server(keep_alive(lambda req: answer())) as raw, client_for(raw) as client:
        wrote: list[int] = []
        for headers in (
            {"X-Bad": f"{SECRET}\r\nInjected: 1"},
            {"X-Bad\r\nInjected": "1"},
            {"X-Bad": f"{SECRET}\n"},
            {"X-Nul": f"a\x00{SECRET}"},
            {"Authorization": f"{SECRET}\r\n"},  # the slow path (a default header replaced)
        ):
            with pytest.raises(ValueError) as info:
                await client.request("POST", headers=headers, body=b"{}", on_write=lambda: wrote.append(1))
            assert SECRET not in messages_of(info.value)
        with pytest.raises(ValueError):
            await client.request("GET", target="/x y")
        await asyncio.sleep(0.05)
        assert wrote == []
        assert raw.ports == []  # not even a connection was opened
    with pytest.raises(ValueError):
        HttpClient("http://127.0.0.1:1/", headers={"X": "a\r\nb"})


async def test_on_write_called_once_before_the_bytes_go_out() -> None:
    seen_by_server_when_called: list[int] = []

    async with raw_server(keep_alive(lambda req: answer(body=b"ok"))) as raw, client_for(raw) as client:
        async with asyncio.timeout(WAIT):
            calls: list[int] = []

            def on_write() -> None:
                calls.append(1)
                seen_by_server_when_called.append(len(raw.requests))

            resp = await client.request("POST", body=b"{}", on_write=on_write)
            await resp.read()
            assert calls == [1]
            assert seen_by_server_when_called == [0]


async def test_redirect_is_not_followed() -> None:
    respond = lambda req: answer(302, headers=(("Location", "/elsewhere"),), reason="Found")  # noqa: E731
    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET")
        assert resp.status == 302 and resp.reason == "Found"
        assert resp.headers.get("location") == "/elsewhere"
        await resp.read()
        await asyncio.sleep(0.05)
        assert len(raw.requests) == 1


async def test_headers_case_insensitive_and_repeated() -> None:
    def respond(req: Req) -> bytes:
        return answer(
            body=b"{}",
            headers=(
                ("Content-Type", "application/json"),
                ("Set-Cookie", "a=1"),
                ("X-Multi", "1"),
                ("Set-Cookie", "b=2"),
            ),
        )

    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        async with await client.request("GET") as resp:
            h = resp.headers
            assert h.get("CONTENT-TYPE") == "application/json"
            assert h["content-type"] == "application/json"
            assert "x-MULTI" in h and "nope" not in h
            assert h.get("nope") is None and h.get("nope", "d") == "d"
            assert h.getall("set-cookie") == ["a=1", "b=2"]
            assert h.getall("nope") == []
            assert ("Set-Cookie", "b=2") in list(h)
            assert "a=1" not in repr(h)


async def test_cookies_set_sent_back_and_deleted() -> None:
    def respond(req: Req) -> bytes:
        n = len(raw.requests)
        if n == 1:
            cookies = ("sid=abc; Path=/other; HttpOnly", "pref=dark; Max-Age=3600", "a b=1", "x=1; Secure=yes; foo")
        elif n == 2:
            cookies = ("sid=; Max-Age=0", "old=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT")
        else:
            cookies = ()
        return answer(body=b"ok", headers=tuple(("Set-Cookie", c) for c in cookies))

    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        for _ in range(3):
            await (await client.request("GET")).read()
        assert "cookie" not in raw.requests[0].headers
        assert raw.requests[1].headers["cookie"] == "sid=abc; pref=dark"
        assert raw.requests[2].headers["cookie"] == "pref=dark"
        # the caller's own Cookie header is kept alongside the jar's
        await (await client.request("GET", headers={"Cookie": "mine=1"})).read()
        assert raw.requests[3].headers["cookie"] == "mine=1; pref=dark"
        assert [k.lower() for k, _ in raw.requests[3].raw_headers].count("cookie") == 1


async def test_host_and_default_header_order_and_override() -> None:
    async with raw_server(keep_alive(lambda req: answer())) as raw:
        client = HttpClient(f"http://127.0.0.1:{raw.port}/base?x=1", headers={"X-A": "1", "X-B": "2"})
        try:
            async with asyncio.timeout(WAIT):
                await (await client.request("GET")).read()
                await (await client.request("GET", target="/other", headers={"x-b": "3", "X-C": "4"})).read()
        finally:
            await client.aclose()
        first, second = raw.requests
        assert first.line == "GET /base?x=1 HTTP/1.1"
        assert first.raw_headers == [("Host", f"127.0.0.1:{raw.port}"), ("X-A", "1"), ("X-B", "2")]
        assert second.line == "GET /other HTTP/1.1"
        assert second.headers == {"host": f"127.0.0.1:{raw.port}", "x-a": "1", "x-b": "3", "x-c": "4"}


async def test_requests_after_aclose_raise_client_closed() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b"ok"))) as raw:
        client = HttpClient(url(raw))
        async with asyncio.timeout(WAIT):
            await (await client.request("GET")).read()
            await client.aclose()
            with pytest.raises(ClientClosed):
                await client.request("GET")
            assert isinstance(ClientClosed(), ClientError)


async def test_aclose_wakes_a_request_waiting_for_a_connection_with_client_closed() -> None:
    gate = asyncio.Event()
    async with raw_server(_gated(gate)) as raw:
        client = HttpClient(url(raw), max_connections=1, connect_timeout_s=WAIT)
        async with asyncio.timeout(WAIT):
            busy = asyncio.create_task(client.request("GET"))
            await raw.wait_requests(1)
            waiting = asyncio.create_task(client.request("GET"))
            await asyncio.sleep(0)  # one step: with no idle connection and no free slot, it queues
            await client.aclose()
            with pytest.raises(ClientClosed, match="while waiting for a connection"):
                await waiting
            with pytest.raises(ConnectionClosed):
                await busy
            gate.set()


async def test_aclose_fails_a_request_in_flight() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw:
        client = HttpClient(url(raw))
        async with asyncio.timeout(WAIT):
            task = asyncio.create_task(client.request("GET"))
            await raw.wait_requests(1)
            await client.aclose()
            with pytest.raises(ConnectionClosed):
                await task
            await raw.eof_event.wait()


async def test_invalid_urls() -> None:
    for bad in ("ftp://h/x", "http:///x", "http://h:notaport/", "http://user:pw@h/", "h/x", "http://h:99999/"):
        with pytest.raises(InvalidURL):
            HttpClient(bad)
    assert issubclass(InvalidURL, ValueError)
    v6 = HttpClient("http://[::1]:8080/mcp?a=b#frag")
    assert (v6.host, v6.port, v6.target) == ("::1", 8080, "/mcp?a=b")
    assert "Host: [::1]:8080\r\n" in v6.writer.fixed
    plain = HttpClient("https://Example.COM")
    assert (plain.host, plain.port, plain.target) == ("example.com", 443, "/")
    assert "Host: example.com\r\n" in plain.writer.fixed


async def test_constructed_outside_a_running_loop() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b"late"))) as raw:

        def in_a_thread() -> bytes:
            client = HttpClient(url(raw))  # no loop runs in this thread yet

            async def use() -> bytes:
                try:
                    return await (await client.request("GET")).read()
                finally:
                    await client.aclose()

            return asyncio.run(asyncio.wait_for(use(), WAIT))

        assert await asyncio.wait_for(asyncio.to_thread(in_a_thread), WAIT) == b"late"


async def test_response_is_a_context_manager_and_release_is_idempotent() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b"ok"))) as raw, client_for(raw) as client:
        async with asyncio.timeout(WAIT):
            async with await client.request("GET") as resp:
                assert isinstance(resp, Response)
                assert await resp.read() == b"ok"
            resp.release()
            await resp.aclose()
            assert await (await client.request("GET")).read() == b"ok"
            assert len(raw.ports) == 1


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for IP 127.0.0.1 and its key, made by the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a self-signed certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


async def test_https_with_a_given_context_and_tls_failure_is_connect_error(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with raw_server(keep_alive(lambda req: answer(body=b"secure")), tls=server_ctx) as raw:
        trusting = ssl.create_default_context(cafile=str(cert))
        client = HttpClient(f"https://127.0.0.1:{raw.port}/mcp", ssl_context=trusting)
        try:
            async with asyncio.timeout(WAIT):
                for _ in range(2):
                    assert await (await client.request("POST", body=b"{}")).read() == b"secure"
                assert len(raw.ports) == 1
        finally:
            await client.aclose()
        wrote: list[int] = []
        untrusting = HttpClient(f"https://127.0.0.1:{raw.port}/mcp")  # the system CAs do not know it
        try:
            async with asyncio.timeout(WAIT):
                with pytest.raises(ConnectError) as info:
                    await untrusting.request("POST", body=b"{}", on_write=lambda: wrote.append(1))
        finally:
            await untrusting.aclose()
        assert isinstance(info.value.__cause__, ssl.SSLError)
        assert wrote == []


# ---------------------------------------------------------------------------------------------
# send_now: a request written at once on an idle connection, its answer through a Sink
# ---------------------------------------------------------------------------------------------
class RecordingSink:
    """Records what the connection told it; `keep` is what `head` answers."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.calls: list[str] = []
        self.heads: list[Response] = []
        self.bodies: list[bytes] = []
        self.errors: list[ClientError] = []
        self.finished = asyncio.Event()

    def head(self, response: Response) -> bool:
        self.calls.append("head")
        self.heads.append(response)
        if not self.keep:
            self.finished.set()
        return self.keep

    def done(self, response: Response) -> None:
        self.calls.append("done")
        self.bodies.append(response.take())
        self.finished.set()

    def failed(self, error: ClientError) -> None:
        self.calls.append("failed")
        self.errors.append(error)
        self.finished.set()


async def test_send_now_needs_an_idle_connection_and_delivers_the_whole_answer_to_the_sink() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b'{"n":' + req.body + b"}"))) as raw:
        async with client_for(raw) as client, asyncio.timeout(WAIT):
            sink = RecordingSink()
            assert not client.idle
            assert client.send_now("POST", body=b"1", sink=sink) is None, "no idle connection yet: nothing sent"
            assert raw.requests == [] and sink.calls == []
            await (await client.request("POST", body=b"0")).read()  # now one connection is pooled
            assert client.idle
            assert client.send_now("POST", body=b"1", sink=sink) is not None
            assert not client.idle, "the connection is busy with the request"
            await sink.finished.wait()
            assert sink.calls == ["head", "done"] and sink.bodies == [b'{"n":1}']
            assert sink.heads[0].status == 200 and sink.heads[0].complete
            assert client.idle, "taking the body gave the connection back"
            again = RecordingSink()
            assert client.send_now("POST", body=b"2", sink=again) is not None
            await again.finished.wait()
            assert again.bodies == [b'{"n":2}']
            assert len(set(raw.ports)) == 1, "one keep-alive connection served all three"
            assert raw.requests[1].line == "POST /mcp HTTP/1.1" and raw.requests[1].headers["content-length"] == "1"


async def test_send_now_sink_that_declines_reads_the_response_the_usual_way() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (req := await raw.next_request(reader)) is not None:
            if len(raw.requests) == 1:
                writer.write(answer(body=b"first"))
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (b"data: a\n\n", b"data: b\n\n"):
                await writer.drain()
                await asyncio.sleep(0.02)
                writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            writer.write(b"0\r\n\r\n")
            assert req is not None

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        await (await client.request("GET")).read()
        sink = RecordingSink(keep=False)
        assert client.send_now("POST", body=b"{}", sink=sink) is not None
        await sink.finished.wait()
        response = sink.heads[0]
        assert response.headers.get("content-type") == "text/event-stream"
        got = [chunk async for chunk in response.iter_chunks()]
        assert b"".join(got) == b"data: a\n\ndata: b\n\n"
        assert sink.calls == ["head"], "a sink that declined hears nothing more"
        assert client.idle, "read to its end: the connection is pooled again"


async def test_send_now_failures_reach_the_sink_before_and_during_the_body() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.next_request(reader) is not None:
            if len(raw.ports) == 1 and len(raw.requests) == 1:
                writer.write(answer(body=b"ok"))
                continue
            if len(raw.ports) == 1:
                return  # closes before answering
            if len(raw.requests) == 3:
                writer.write(answer(body=b"ok"))
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()
            return  # closes mid-body

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        await (await client.request("GET")).read()
        before = RecordingSink()
        assert client.send_now("POST", body=b"{}", sink=before) is not None
        await before.finished.wait()
        assert before.calls == ["failed"]
        assert isinstance(before.errors[0], ConnectionClosed) and before.errors[0].response_started is False
        assert before.errors[0].reused is True
        await (await client.request("GET")).read()  # a fresh connection, pooled
        during = RecordingSink()
        assert client.send_now("POST", body=b"{}", sink=during) is not None
        await during.finished.wait()
        assert during.calls == ["head", "failed"]
        assert isinstance(during.errors[0], ConnectionClosed) and during.errors[0].response_started is True


async def test_send_now_protocol_error_reaches_the_sink() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.next_request(reader) is not None:
            writer.write(answer(body=b"ok") if len(raw.requests) == 1 else b"NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        await (await client.request("GET")).read()
        sink = RecordingSink()
        assert client.send_now("POST", body=b"{}", sink=sink) is not None
        await sink.finished.wait()
        assert sink.calls == ["failed"] and isinstance(sink.errors[0], ProtocolError)


async def test_closing_a_send_now_connection_abandons_the_request() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(answer(body=b"ok"))
        await raw.next_request(reader)  # never answered
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw, max_connections=1) as client, asyncio.timeout(WAIT):
        await (await client.request("GET")).read()
        sink = RecordingSink()
        conn = client.send_now("POST", body=b"{}", sink=sink)
        assert conn is not None
        await raw.wait_requests(2)
        conn.close()
        await raw.eof_event.wait()
        await sink.finished.wait()
        assert sink.calls == ["failed"], "the sink hears of the loss (its owner ignores it once cancelled)"
        assert client.idle is False and client._open == 0, "the slot is free again"


async def test_send_now_refuses_header_injection_and_keeps_the_connection() -> None:
    async with raw_server(keep_alive(lambda req: answer(body=b"ok"))) as raw:
        async with client_for(raw) as client, asyncio.timeout(WAIT):
            await (await client.request("GET")).read()
            sink = RecordingSink()
            with pytest.raises(ValueError):
                client.send_now("POST", headers={"x-evil": "a\r\nInjected: 1"}, body=b"{}", sink=sink)
            assert client.idle, "nothing was sent and the idle connection stays pooled"
            assert len(raw.requests) == 1 and sink.calls == []


async def test_an_endless_response_head_fails_the_request_and_stays_bounded() -> None:
    written: list[int] = []
    ended = asyncio.Event()

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Long: ")
        try:
            for _ in range(64):  # 4 MiB of one header value, unless the client hangs up first
                writer.write(b"a" * 65536)
                await writer.drain()
                written.append(65536)
        finally:
            ended.set()

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        with pytest.raises(ProtocolError) as info:
            await client.request("GET")
        assert str(MAX_HEAD_BYTES) in str(info.value)
        await ended.wait()  # the client hung up: the server's writes failed
        assert sum(written) < 4 * 1024 * 1024


async def test_a_large_answer_in_one_read_is_not_mistaken_for_a_large_head() -> None:
    body = b"x" * (3 * 65536)

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.next_request(reader) is not None:
            writer.write(answer(body=body))
            await writer.drain()

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        assert await (await client.request("GET")).read() == body
        sink = RecordingSink()
        assert client.send_now("GET", sink=sink) is not None
        await sink.finished.wait()
        assert sink.calls == ["head", "done"] and sink.bodies == [body]


async def test_a_body_past_its_bound_that_ends_in_the_same_read_still_fails_the_response() -> None:
    """A small answer arrives in one read, its end included: the end must not mark a response
    that already failed (too large) as complete, or `read()` would give b"" instead of raising."""
    body = b"z" * 2000

    async with raw_server(keep_alive(lambda req: answer(body=body))) as raw, client_for(raw) as client:
        async with asyncio.timeout(WAIT):
            resp = await client.request("GET", max_body=1000)
            with pytest.raises(BodyTooLarge):
                await resp.read()


async def test_a_body_past_its_bound_fails_the_response_and_the_connection_is_not_reused() -> None:
    small, big = b"x" * 1000, b"y" * 300_000

    def respond(req: Req) -> bytes:
        return answer(body=big if req.headers.get("x-size") == "big" else small)

    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET", max_body=1000)
        assert resp.max_body == 1000
        assert await resp.read() == small, "exactly the bound is fine"
        resp = await client.request("GET", headers={"x-size": "big"}, max_body=100_000)
        with pytest.raises(BodyTooLarge) as caught:
            await resp.read()
        assert caught.value.limit == 100_000 and "100000 bytes" in str(caught.value)
        assert isinstance(caught.value, ProtocolError)
        assert resp._received <= 100_001 + 65536 and not resp._chunks, "what arrived was dropped"
        # A sink (send_now) hears `failed` instead of `done`.
        await (await client.request("GET")).read()
        sink = RecordingSink()
        assert client.send_now("GET", headers={"x-size": "big"}, sink=sink, max_body=100_000) is not None
        await sink.finished.wait()
        assert sink.calls == ["head", "failed"] and isinstance(sink.errors[0], BodyTooLarge)
        # The rest of that body was never read as the next answer: a fresh connection serves it.
        before = len(set(raw.ports))
        assert await (await client.request("GET")).read() == small
        assert len(set(raw.ports)) == before + 1
        # No bound given, none applies; a reader may also lift one once it has the head.
        assert len(await (await client.request("GET", headers={"x-size": "big"})).read()) == len(big)
        # (lifted in time: the bound holds from the first byte, and one read is at most 256 KiB)
        resp = await client.request("GET", headers={"x-size": "big"}, max_body=270_000)
        resp.max_body = None
        assert len(await resp.read()) == len(big)


async def test_a_compressed_answer_is_never_decoded_past_its_bound() -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB of zeros, ~64 KiB on the wire
    assert len(bomb) < 200_000

    def respond(req: Req) -> bytes:
        if "x-plain" in req.headers:
            return answer(body=b"plain")
        return answer(body=bomb, headers=(("Content-Encoding", "gzip"),))

    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET", max_body=1024 * 1024)
        with pytest.raises(BodyTooLarge):
            await resp.read()
        # At most one byte past the bound was ever produced by the decoder.
        assert resp._received == 1024 * 1024 + 1
        sink = RecordingSink()
        await (await client.request("GET", headers={"x-plain": "1"})).read()  # the first one was closed
        assert client.send_now("GET", sink=sink, max_body=1024 * 1024) is not None
        await sink.finished.wait()
        assert sink.calls == ["head", "failed"] and isinstance(sink.errors[0], BodyTooLarge)
        assert sink.heads[0]._received == 1024 * 1024 + 1


async def test_a_body_that_does_not_decode_fails_its_response_clearly_and_the_next_request_is_served() -> None:
    """Found by bench/fuzz.py's h1 target: a body that is not the gzip its Content-Encoding names
    raised zlib's error out of `Response.feed`, inside the parser's callback, where the reader
    turned it into "an invalid HTTP response (callback error)". It fails the response with what
    went wrong, on both ways of reading it, and closes the connection; the next request is served."""
    corrupt = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 40  # a gzip header, then no deflate stream

    def respond(req: Req) -> bytes:
        if "x-plain" in req.headers:
            return answer(body=b"plain")
        return answer(body=corrupt, headers=(("Content-Encoding", "gzip"),))

    async with raw_server(keep_alive(respond)) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        resp = await client.request("GET")
        with pytest.raises(ProtocolError, match="does not decode as gzip") as info:
            await resp.read()
        assert not isinstance(info.value, BodyTooLarge)
        assert await (await client.request("GET", headers={"x-plain": "1"})).read() == b"plain"
        sink = RecordingSink()
        assert client.send_now("GET", sink=sink) is not None
        await sink.finished.wait()
        assert sink.calls == ["head", "failed"] and "does not decode as gzip" in str(sink.errors[0])
        assert await (await client.request("GET", headers={"x-plain": "1"})).read() == b"plain"
        assert len(raw.ports) == 3, "each undecodable answer's connection was closed, the plain one's kept"


async def test_a_dedicated_request_takes_no_place_in_the_pool_and_its_connection_is_not_reused() -> None:
    """A session's listen stream lasts as long as the session: on a pooled connection, 100 idle
    sessions held all 100 places and no request could be sent. A dedicated request has a
    connection of its own: with the pool's one place, a request still goes while it is open, and
    its connection is closed after it, never handed to a request."""
    gate = asyncio.Event()

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await raw.next_request(reader)) is not None:
            if request.line.startswith("GET /stream"):
                await gate.wait()  # the long-lived stream: answered only when the test lets it
            writer.write(answer(body=b"ok"))
            await writer.drain()

    async with raw_server(handler) as raw, client_for(raw, max_connections=1, connect_timeout_s=0.5) as client:
        async with asyncio.timeout(WAIT):
            stream = asyncio.create_task(client.request("GET", target="/stream", dedicated=True))
            await raw.wait_requests(1)
            assert await (await client.request("GET")).read() == b"ok", "the pool's place was free"
            gate.set()
            streamed = await stream
            assert await streamed.read() == b"ok"
            streamed.release()
            assert await (await client.request("GET")).read() == b"ok"
            assert len(raw.ports) == 2, "the dedicated connection was not reused"


def _stream_head_and_event() -> bytes:
    event = b"event: message\ndata: 1\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + f"{len(event):x}\r\n".encode() + event + b"\r\n"


async def test_a_stream_released_before_its_end_is_closed_when_its_end_does_not_come_in_time() -> None:
    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(_stream_head_and_event())
        await writer.drain()
        await raw.wait_eof(reader)  # never ends the stream

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        async with await client.request("POST", body=b"{}") as resp:
            assert await resp.next_chunk() == b"event: message\ndata: 1\n\n"
            resp.release_at_end(1024, 0.05)
        assert not client.idle
        await raw.eof_event.wait()  # closed by the client once the 50 ms passed
        assert not client.idle


async def test_a_stream_released_before_its_end_is_closed_when_its_tail_is_too_long() -> None:
    go_on = asyncio.Event()

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.next_request(reader)
        writer.write(_stream_head_and_event())
        await writer.drain()
        await go_on.wait()
        tail = b"data: " + b"x" * 100 + b"\n\n"
        writer.write(f"{len(tail):x}\r\n".encode() + tail + b"\r\n0\r\n\r\n")
        await writer.drain()
        await raw.wait_eof(reader)

    async with raw_server(handler) as raw, client_for(raw) as client, asyncio.timeout(WAIT):
        async with await client.request("POST", body=b"{}") as resp:
            assert await resp.next_chunk() == b"event: message\ndata: 1\n\n"
            resp.release_at_end(16, WAIT)
        go_on.set()
        await raw.eof_event.wait()  # more than 16 bytes came: closed, not pooled
        assert not client.idle


async def test_an_idle_connection_whose_close_the_loop_has_not_read_yet_is_not_reused() -> None:
    """The server closed an idle connection (its keep-alive timeout) while the client's loop was
    busy elsewhere, as on a loaded proxy: the close is in the socket but `eof_received` has not
    run. The next request must go on a new connection, not fail as closed in flight on that one
    (the server never saw it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    answered_first, may_close = threading.Event(), threading.Event()
    accepted: list[int] = []

    def serve() -> None:  # a thread: the close must come while the client's loop is blocked
        with listener:
            listener.settimeout(WAIT)
            for n in range(2):
                conn, peer = listener.accept()
                accepted.append(peer[1])
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    conn.sendall(answer(body=b"ok"))
                    if n == 0:
                        answered_first.set()
                        may_close.wait(WAIT)
                    else:
                        conn.recv(1)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    async with client_for(port) as client, asyncio.timeout(WAIT):
        assert await (await client.request("GET")).read() == b"ok"
        may_close.set()
        # the loop is busy (blocked on purpose) while the server's FIN arrives, and stays idle
        # longer than the pool's stale check threshold
        time.sleep(0.3)  # noqa: ASYNC251
        assert await (await client.request("GET")).read() == b"ok"
    thread.join(WAIT)
    assert len(accepted) == 2 and accepted[0] != accepted[1]
