"""The frontend's request cycle (proxy/frontend/h1_cycle.py): the ASGI rules uvicorn's own cycle
keeps, and one write per JSON answer.

Every test runs the protocol the proxy runs (`LimitedHttpToolsProtocol`, default bounds) in a real
uvicorn server on 127.0.0.1 and speaks raw HTTP/1.1 over a real socket: what is under test is the
bytes on the wire. Every wait is bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from proxy.frontend.uvicorn_h1 import HttpLimits, LimitedHttpToolsProtocol
from tests.fixtures.uvicorn_serving import serving as serving_with

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

App = Callable[[Any, Any, Any], Awaitable[None]]
BOUND_S = 5.0


@asynccontextmanager
async def serving(app: App, sends: list[int] | None = None, **settings: Any) -> AsyncIterator[int]:
    """`app` behind the proxy's protocol on a free loopback port; `sends` gets the size of every
    write the server makes to its real socket transport; `settings` are uvicorn's."""
    base = LimitedHttpToolsProtocol.with_limits(HttpLimits())

    class Counting(base):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if sends is not None:
                real_write = transport.write

                def write(data: Any) -> None:
                    sends.append(len(data))
                    real_write(data)

                transport.write = write  # type: ignore[method-assign]
            super().connection_made(transport)

    async with serving_with(app, Counting, **settings) as port:
        yield port


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One response: its head and its body (by content-length, or chunked: the raw chunks)."""
    async with asyncio.timeout(BOUND_S):
        head = await reader.readuntil(b"\r\n\r\n")
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            body = b""
            while not body.endswith(b"0\r\n\r\n"):
                body += await reader.readuntil(b"\r\n")
            return head, body
        if b"content-length: " in lower:
            length = int(lower.split(b"content-length: ")[1].split(b"\r\n")[0])
            return head, await reader.readexactly(length)
        return head, b""


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    data = b""
    async with asyncio.timeout(BOUND_S):
        while chunk := await reader.read(65536):
            data += chunk
    return data


async def json_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    message = await receive()
    body = b'{"len":%d}' % len(message["body"])
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def test_a_json_answer_is_one_write_and_the_connection_carries_the_next() -> None:
    sends: list[int] = []
    async with serving(json_app, sends) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
            head, body = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\ndate: " in head
            assert body == b'{"len":3}'
        writer.close()
    assert len(sends) == 2, sends  # one write per answer: head and body together


async def test_the_scope_is_uvicorns() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(dict(scope))
        await json_app(scope, receive, send)

    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /a%20b/c?x=1&y=2 HTTP/1.1\r\nHost: x\r\nX-Thing:  v \r\ncontent-length: 0\r\n\r\n")
        await read_response(reader)
        writer.close()
    [scope] = seen
    assert scope["type"] == "http" and scope["method"] == "POST" and scope["http_version"] == "1.1"
    assert scope["path"] == "/a b/c" and scope["raw_path"] == b"/a%20b/c" and scope["query_string"] == b"x=1&y=2"
    assert scope["headers"] == [(b"host", b"x"), (b"x-thing", b"v"), (b"content-length", b"0")]
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.3"} and scope["scheme"] == "http"
    assert scope["client"][0] == "127.0.0.1" and scope["server"] == ("127.0.0.1", port) and scope["root_path"] == ""


async def test_a_streamed_head_goes_out_before_its_first_chunk_and_the_stream_is_chunked() -> None:
    go_on = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await go_on.wait()  # the head must reach the client meanwhile
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": True})  # nothing: no empty chunk
        await send({"type": "http.response.body", "body": b"data: 2\n\n"})

    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        async with asyncio.timeout(BOUND_S):
            head = await reader.readuntil(b"\r\n\r\n")
        assert b"\r\ntransfer-encoding: chunked\r\n" in head and b"content-length" not in head
        go_on.set()
        async with asyncio.timeout(BOUND_S):
            rest = await reader.readuntil(b"0\r\n\r\n")
        assert rest == b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # still keep-alive
        go_on.set()
        head, _ = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 200 OK")
        writer.close()


async def test_head_and_204_carry_no_body_and_http_1_0_closes() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if scope["path"] == "/empty":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"5")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"hello"})

    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\nGET /empty HTTP/1.1\r\nhost: x\r\n\r\n")
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        async with asyncio.timeout(BOUND_S):
            first = await reader.readuntil(b"\r\n\r\n")
            second = await reader.readuntil(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200 OK") and b"content-length: 5" in first
        assert second.startswith(b"HTTP/1.1 204 No Content") and b"transfer-encoding" not in second
        head, body = await read_response(reader)  # the bytes after a HEAD's head are the next answer's
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"hello"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.0\r\nhost: x\r\n\r\n")
        data = await read_to_end(reader)  # closed after the answer
        assert b"\r\nconnection: close\r\n" in data and data.endswith(b"\r\n\r\nhello")
        writer.close()


async def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    async with serving(json_app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n")
        async with asyncio.timeout(BOUND_S):
            interim = await reader.readuntil(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abcd")
        _, body = await read_response(reader)
        assert body == b'{"len":4}'
        writer.close()


async def test_a_large_body_in_pieces_is_read_whole() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        size = 0
        while True:
            message = await receive()
            size += len(message["body"])
            if not message["more_body"]:
                break
        body = b"%d" % size
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        size = 1_000_000  # past the 64 KiB at which reading pauses until the app reads
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 50_000):
            writer.write(b"x" * 50_000)
            await writer.drain()
        _, body = await read_response(reader)
        assert body == b"%d" % size
        writer.close()


async def test_after_the_body_receive_waits_for_the_disconnect() -> None:
    """A listen stream reads again to learn that its client went: that read waits, it does not spin."""
    reads: list[str] = []
    ended = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reads.append((await receive())["type"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
        reads.append((await receive())["type"])
        ended.set()

    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        async with asyncio.timeout(BOUND_S):
            await reader.readuntil(b": open\n\n\r\n")
        await asyncio.sleep(0.1)
        assert reads == ["http.request"]  # the second read still waits
        writer.close()
        async with asyncio.timeout(BOUND_S):
            await ended.wait()
    assert reads == ["http.request", "http.disconnect"]


@pytest.mark.parametrize(
    ("case", "logged"),
    [
        ("raise", "Exception in ASGI application"),
        ("bad-value", "Exception in ASGI application"),
        ("bad-name", "Exception in ASGI application"),
        ("bad-length", "Exception in ASGI application"),
        ("no-response", "ASGI callable returned without starting response."),
    ],
)
async def test_an_app_error_before_its_head_is_written_is_a_500(
    case: str, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if case == "raise":
            raise ValueError("boom")
        if case == "no-response":
            return
        headers = {
            "bad-value": [(b"x-echo", b"a\r\nset-cookie: injected")],
            "bad-name": [(b"x echo", b"a")],
            "bad-length": [(b"content-length", b"twelve")],
        }[case]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

    caplog.set_level(logging.ERROR, logger="uvicorn.error")
    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        data = await read_to_end(reader)
        writer.close()
    assert data.startswith(b"HTTP/1.1 500 Internal Server Error\r\n"), data
    assert data.endswith(b"\r\n\r\nInternal Server Error") and b"injected" not in data
    assert any(logged in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case", ["longer", "shorter", "after-complete"])
async def test_a_body_that_breaks_its_length_closes_the_connection(case: str, caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        if case == "longer":
            await send({"type": "http.response.body", "body": b"12345"})
        elif case == "shorter":
            await send({"type": "http.response.body", "body": b"123"})
        else:
            await send({"type": "http.response.body", "body": b"1234"})
            await send({"type": "http.response.body", "body": b"5"})

    caplog.set_level(logging.ERROR, logger="uvicorn.error")
    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        data = await read_to_end(reader)  # closed: a client cannot tell where the answer ends
        writer.close()
    assert b"12345" not in data
    assert any("Exception in ASGI application" in r.getMessage() for r in caplog.records)


# Keep-alive: an idle connection is closed `timeout_keep_alive` after its last answer, by one
# timer per connection (h1_cycle's module docstring). The waits are of the timeout itself; what is
# asserted is an order (closed, not closed before), never a speed.
KEEP_ALIVE_S = 1.0


async def slow_app(scope: Any, receive: Any, send: Any) -> None:
    """`json_app`, answering `?sleep=S` seconds late."""
    if scope["type"] == "http" and scope["query_string"].startswith(b"sleep="):
        await asyncio.sleep(float(scope["query_string"][6:]))
    await json_app(scope, receive, send)


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: str = "/mcp") -> float:
    """One request on the connection, answered 200: the time its answer was read."""
    writer.write(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}" % target.encode())
    head, _ = await read_response(reader)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
    return asyncio.get_running_loop().time()


async def closed_at(reader: asyncio.StreamReader) -> float:
    assert await read_to_end(reader) == b""  # closed silently
    return asyncio.get_running_loop().time()


async def test_an_idle_connection_is_closed_the_keep_alive_timeout_after_its_answer() -> None:
    async with serving(slow_app, timeout_keep_alive=KEEP_ALIVE_S) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answered = await ask(reader, writer)
        assert await closed_at(reader) - answered >= KEEP_ALIVE_S * 0.9
        writer.close()


async def test_a_connection_answered_again_is_closed_the_timeout_after_its_last_answer() -> None:
    """The timer armed at the first answer comes due while the connection has been answered
    again since: it is armed again for the last answer, not the connection closed."""
    async with serving(slow_app, timeout_keep_alive=KEEP_ALIVE_S) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await ask(reader, writer)
        await asyncio.sleep(KEEP_ALIVE_S / 2)
        last = await ask(reader, writer)
        assert await closed_at(reader) - last >= KEEP_ALIVE_S * 0.9
        writer.close()


async def test_a_request_running_past_the_timeout_is_answered_and_then_timed_from_its_answer() -> None:
    async with serving(slow_app, timeout_keep_alive=KEEP_ALIVE_S) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await ask(reader, writer)
        last = await ask(reader, writer, f"/mcp?sleep={KEEP_ALIVE_S * 1.5}")  # runs past the first timer
        assert await closed_at(reader) - last >= KEEP_ALIVE_S * 0.9
        writer.close()
