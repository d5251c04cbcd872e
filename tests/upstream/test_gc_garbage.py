"""The per-call paths of the HTTP upstream leave no cyclic garbage: what a request
leaves behind, failed or not, is freed by reference counting, so the proxy's garbage collector
has little to do and its full collections (tens to hundreds of ms that stop every call in
flight) stay rare.

Each test runs a path N times over real loopback sockets with the collector disabled, then counts
what `gc.collect()` frees: the bound is a small constant, far below one object per request (the
paths fixed here left 9 to 44 objects per request). A failure is caught the way the engine
catches it (`untraced`, proxy/core/engine.py): an exception's traceback holds the frames it left, so
a caller that kept it would make the cycle itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import types
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.errors import UpstreamFailure, untraced
from proxy.upstream.base import Era
from proxy.upstream.h1 import ClientError, HttpClient
from proxy.upstream.streamable.flight import Flight
from proxy.upstream.streamable.upstream import HttpUpstream
from tests.fixtures.helpers import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
N = 40
BOUND = 10  # objects freed by the collector after N requests (a test's own odds and ends)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request read off `reader`: its head and its body (Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


@pytest.fixture(
    params=[pytest.param(("asyncio", {}), id="asyncio"), pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return request.param  # type: ignore[no-any-return]


def uvloop_only(anyio_backend: tuple[str, dict[str, bool]]) -> None:
    """For a test whose connections close: asyncio's own selector transport keeps a bound method of
    itself (`_read_ready_cb`), a cycle per closed connection on either side, not ours; the proxy
    runs on uvloop (proxy/cli.py), whose transports leave none."""
    if not anyio_backend[1].get("use_uvloop"):
        pytest.skip("the standard library's transport leaves a cycle per closed connection")


async def cyclic_garbage(once: Callable[[int], Awaitable[None]], n: int = N) -> collections.Counter[str]:
    """Run `once` a few times to warm up (lazy imports, pools), then `n` times with the collector off;
    the objects `gc.collect()` then frees, by type."""
    for i in range(3):
        await once(i)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for i in range(n):
            await once(i)
        gc.collect()
        found = collections.Counter(
            f"frame of {o.f_code.co_name}" if isinstance(o, types.FrameType) else type(o).__qualname__
            for o in gc.garbage
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return found


@contextlib.asynccontextmanager
async def answering(status: int, ctype: str, body: bytes, close: bool = False) -> AsyncIterator[int]:
    """A raw HTTP/1.1 server on 127.0.0.1 answering every request with `status`/`ctype`/`body`;
    `ID` in `body` becomes the JSON-RPC id of the request (a real answer)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _, request = await read_request(reader)
                answer = body
                if b"ID" in body:
                    answer = body.replace(b"ID", json.dumps(json.loads(request)["id"]).encode())
                extra = b"connection: close\r\n" if close else b""
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
                    % (status, ctype.encode(), len(answer), extra)
                    + answer
                )
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_refused_connect_leaves_no_cyclic_garbage(anyio_backend: object) -> None:
    client = HttpClient(f"http://127.0.0.1:{free_port()}/mcp", connect_timeout_s=5)

    async def once(_: int) -> None:
        try:
            await client.request("POST", body=b"{}")
        except ClientError as exc:
            untraced(exc)
        else:
            raise AssertionError("nothing listens on that port")

    found = await cyclic_garbage(once)
    await client.aclose()
    assert sum(found.values()) < BOUND, str(sorted(found.items()))


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
async def test_an_answered_request_leaves_no_cyclic_garbage(
    anyio_backend: tuple[str, dict[str, bool]], close: bool
) -> None:
    if close:
        uvloop_only(anyio_backend)
    async with answering(200, "application/json", b'{"ok":true}', close=close) as port:
        client = HttpClient(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=5)

        async def once(_: int) -> None:
            async with await client.request("POST", body=b"{}") as response:
                assert await response.read() == b'{"ok":true}'

        found = await cyclic_garbage(once)
        await client.aclose()
        assert sum(found.values()) < BOUND, str(sorted(found.items()))


def _call(i: int) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}


async def _exchange(link: object, i: int) -> None:
    try:
        ex = await link.send_request(_call(i))  # type: ignore[attr-defined]
        await ex.response
    except UpstreamFailure as failure:
        untraced(failure)  # what the engine does with a failed attempt


async def test_a_failed_exchange_to_a_refused_port_leaves_no_cyclic_garbage(anyio_backend: object) -> None:
    up = HttpUpstream(f"http://127.0.0.1:{free_port()}/mcp", connect_timeout_s=5)
    link = await up.open(Era.MODERN)
    found = await cyclic_garbage(lambda i: _exchange(link, i))
    await up.aclose()
    assert sum(found.values()) < BOUND, str(sorted(found.items()))


@pytest.mark.parametrize(
    ("status", "ctype", "body"),
    [
        (503, "text/plain", b"busy"),
        # answers for another id: the exchange fails with "closed before the response arrived"
        (200, "application/json", b'{"jsonrpc":"2.0","id":"other","result":{}}'),
        (200, "text/event-stream", b'event: message\ndata: {"jsonrpc":"2.0","id":"other","result":{}}\n\n'),
        # and the answers themselves
        (200, "application/json", b'{"jsonrpc":"2.0","id":ID,"result":{"content":[]}}'),
        (200, "text/event-stream", b'event: message\ndata: {"jsonrpc":"2.0","id":ID,"result":{"content":[]}}\n\n'),
    ],
    ids=["503", "json-without-the-answer", "sse-without-the-answer", "json-answer", "sse-answer"],
)
async def test_an_answered_exchange_leaves_no_cyclic_garbage(
    anyio_backend: object, status: int, ctype: str, body: bytes
) -> None:
    async with answering(status, ctype, body) as port:
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=5)
        link = await up.open(Era.MODERN)
        found = await cyclic_garbage(lambda i: _exchange(link, i))
        await up.aclose()
        assert sum(found.values()) < BOUND, str(sorted(found.items()))


@contextlib.asynccontextmanager
async def upstream_of(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[HttpUpstream]:
    """An HTTP upstream on a raw server on 127.0.0.1 whose connections `handle` serves."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    up = HttpUpstream(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp", connect_timeout_s=5)
    try:
        yield up
    finally:
        await up.aclose()
        server.close()


@contextlib.asynccontextmanager
async def hanging() -> AsyncIterator[tuple[int, asyncio.Queue[None]]]:
    """A server that reads each request and never answers; each request read is put on the queue."""
    seen: asyncio.Queue[None] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                seen.put_nowait(None)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], seen
    finally:
        server.close()


async def test_a_cancelled_exchange_leaves_no_cyclic_garbage(anyio_backend: tuple[str, dict[str, bool]]) -> None:
    """What the relay does when an attempt's timer fires: the awaiting task is cancelled and the
    exchange cancelled upstream (for a 2026 link: its connection closed)."""
    uvloop_only(anyio_backend)
    async with hanging() as (port, seen):
        up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=5)
        link = await up.open(Era.MODERN)

        async def attempt(i: int) -> None:
            ex = await link.send_request(_call(i))
            try:
                await ex.response
            except asyncio.CancelledError:
                await link.cancel(ex)
                raise

        async def once(i: int) -> None:
            task = asyncio.ensure_future(attempt(i))
            await asyncio.wait_for(seen.get(), 10)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError as exc:
                untraced(exc)

        found = await cyclic_garbage(once)
        await up.aclose()
        assert sum(found.values()) < BOUND, str(sorted(found.items()))


async def test_a_listen_stream_that_breaks_leaves_no_cyclic_garbage(anyio_backend: tuple[str, dict[str, bool]]) -> None:
    """A 2025 session's standalone GET stream cut mid-way (its upstream restarted, a proxy in
    between timed it out) is opened again, with backoff; each break must leave nothing behind."""
    uvloop_only(anyio_backend)
    gets: asyncio.Queue[None] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, body = await read_request(reader)
                if head.startswith(b"GET"):
                    gets.put_nowait(None)
                    event = b'data: {"jsonrpc":"2.0","method":"notifications/message","params":{}}\n\n'
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                        + b"%x\r\n%s\r\n" % (len(event), event)
                        + b"40\r\npart of an event"  # then the connection is cut, mid-chunk
                    )
                    await writer.drain()
                    break
                message = json.loads(body) if body else {}  # no body: the session's DELETE at close
                if "id" not in message:
                    writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                    continue
                answer = json.dumps(
                    {"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": "2025-06-18"}}
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async with upstream_of(handle) as up:
        link = await up.open(Era.LEGACY)
        link.set_unsolicited_handler(lambda message: None)
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
        await (await link.send_request(init)).response
        await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})

        async def once(_: int) -> None:
            await asyncio.wait_for(gets.get(), 10)  # a GET came: the one before it broke and was handled

        found = await cyclic_garbage(once, n=4)
    assert sum(found.values()) < BOUND, str(sorted(found.items()))


async def test_a_stream_cancelled_while_read_in_the_callbacks_leaves_no_cyclic_garbage(
    anyio_backend: tuple[str, dict[str, bool]],
) -> None:
    """A POST answered with an event stream that stays open (one notification, then nothing), read
    in the pooled connection's callbacks (`Flight`, which holds the response that holds it back
    while the stream is read), then cancelled: the flight lets go of the stream, the connection
    closes, nothing is left for the collector."""
    uvloop_only(anyio_backend)
    note = b'data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}\n\n'
    streams: asyncio.Queue[None] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _, request = await read_request(reader)
                message = json.loads(request)
                if message["params"]["name"] == "warm":
                    answer = b'{"jsonrpc":"2.0","id":"%s","result":{}}' % message["id"].encode()
                    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                    writer.write(head % len(answer) + answer)
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                writer.write(b"%x\r\n%s\r\n" % (len(note), note))
                streams.put_nowait(None)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async with upstream_of(handle) as up:
        link = await up.open(Era.MODERN)

        async def once(i: int) -> None:
            warm = {"jsonrpc": "2.0", "id": f"w{i}", "method": "tools/call", "params": {"name": "warm"}}
            await asyncio.wait_for((await link.send_request(warm)).response, 10)  # a pooled connection idle
            heard = asyncio.Event()
            ex = await link.send_request(_call(i), on_message=lambda _m: heard.set())
            assert isinstance(ex.transport_state, Flight), "the answer is read in the callbacks"
            await asyncio.wait_for(heard.wait(), 10)  # the stream is being read
            await asyncio.wait_for(streams.get(), 10)
            await link.cancel(ex)
            try:
                await ex.response
            except UpstreamFailure as failure:
                untraced(failure)  # what the engine does with a failed attempt

        found = await cyclic_garbage(once)
    assert sum(found.values()) < BOUND, str(sorted(found.items()))
