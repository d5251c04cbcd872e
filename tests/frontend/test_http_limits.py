"""Request heads, slow peers and connections are bounded (a peer can neither exhaust memory with a
huge head nor hold a connection open forever with a half-sent one).

Each test runs the frontend's real protocol (`LimitedHttpToolsProtocol`) in a real uvicorn server
on 127.0.0.1 and talks raw HTTP/1.1 over a real socket, since what is under test is what a peer
that does not follow the protocol can do. Timeouts are set short (a fraction of a second) and
every wait is bounded; no test sleeps to wait for something: each reads until the server answers
or closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from proxy.frontend.uvicorn_h1 import HttpLimits, LimitedHttpToolsProtocol
from proxy.telemetry.shed import SHED
from tests.fixtures.echo_asgi import echo_app
from tests.fixtures.uvicorn_serving import serving

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

LIMITS = HttpLimits(max_head_bytes=4096, head_timeout_s=0.3, body_timeout_s=0.3, max_connections=4)


async def _serve(limits: HttpLimits) -> AsyncIterator[int]:
    async with serving(echo_app, LimitedHttpToolsProtocol.with_limits(limits)) as port:
        yield port


@pytest.fixture
async def server() -> AsyncIterator[int]:
    async for port in _serve(LIMITS):
        yield port


@pytest.fixture
async def patient_server() -> AsyncIterator[int]:
    """Long timeouts: connections held open stay open for the test's whole length."""
    async for port in _serve(HttpLimits(max_connections=4, head_timeout_s=60, body_timeout_s=60)):
        yield port


async def read_until_closed(reader: asyncio.StreamReader, bound_s: float = 5.0) -> bytes:
    """Everything the server writes until it closes the connection (bounded)."""
    data = b""
    async with asyncio.timeout(bound_s):
        while chunk := await reader.read(65536):
            data += chunk
    return data


async def test_a_request_in_one_read_and_one_in_pieces_are_served(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await asyncio.wait_for(reader.readexactly(1), 5) == b"5"
    # The same connection, a head and a body in several writes, each well within the timeouts.
    for part in (b"POST / HTTP/1.1\r\n", b"host: x\r\ncontent-length: 4\r\n\r\n", b"ab", b"cd"):
        writer.write(part)
        await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await asyncio.wait_for(reader.readexactly(1), 5) == b"4"
    writer.close()


async def test_a_head_past_the_limit_is_answered_431_and_closed(server: int) -> None:
    before = SHED.get("http_refused", "head_too_large")
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: ")
    # More header than the limit, in pieces (the parser would keep joining them), never ended.
    # Not more than that: the server reads all of it, so its close is not a reset.
    for _ in range(5):
        writer.write(b"a" * 1000)
        await writer.drain()
    data = await read_until_closed(reader)
    assert data.startswith(b"HTTP/1.1 431 "), data
    assert SHED.get("http_refused", "head_too_large") - before == 1, "counted under its reason"
    writer.close()


async def test_a_large_head_sent_at_once_gets_431(server: int) -> None:
    before = SHED.get("http_refused", "head_too_large")
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 8000 + b"\r\n\r\n")
    data = await read_until_closed(reader)
    assert data.startswith(b"HTTP/1.1 431 "), data
    assert SHED.get("http_refused", "head_too_large") - before == 1, "counted under its reason"
    writer.close()


async def test_a_body_larger_than_the_head_limit_in_the_heads_read_is_not_mistaken_for_a_head(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    body = b"b" * 20000
    writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 20000\r\n\r\n" + body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"20000"
    writer.close()


async def test_a_half_sent_head_is_answered_408_and_closed(server: int) -> None:
    before = SHED.get("http_refused", "head_timeout")
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n")  # never ends
    data = await read_until_closed(reader)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert SHED.get("http_refused", "head_timeout") - before == 1, "counted under its reason"
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    data = await read_until_closed(reader)
    assert data.startswith(b"HTTP/1.1 408 "), data
    writer.close()


async def test_a_stalled_body_is_answered_408_and_the_app_sees_a_disconnect(server: int) -> None:
    before = SHED.get("http_refused", "body_timeout")
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\npartial")
    data = await read_until_closed(reader)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert SHED.get("http_refused", "body_timeout") - before == 1, "counted under its reason"
    writer.close()


async def test_at_the_cap_a_connection_without_a_request_makes_room_for_a_new_one(
    patient_server: int,
) -> None:
    """Connections holding nothing but a place (no complete head) must not fill the port and have
    every new caller, probes included, answered 503: a half-sent head is closed first (503,
    counted `head_pending`), then the longest idle connection, without a response (it asked
    nothing: a client reusing a keep-alive connection would take a 503 written there for the
    answer to its next request), and the new connection is served; only when every connection
    runs a request is the new one refused (`connections`)."""
    reclaimed = SHED.get("http_refused", "head_pending")
    refused = SHED.get("http_refused", "connections")
    held = [await asyncio.open_connection("127.0.0.1", patient_server) for _ in range(4)]
    held[1][1].write(b"GET / HTTP/1.1\r\nhost: x\r\n")  # half a head
    await held[1][1].drain()
    reader, writer = await asyncio.open_connection("127.0.0.1", patient_server)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    partial = await read_until_closed(held[1][0])
    assert partial.startswith(b"HTTP/1.1 503 ") and b"connection closed to make room" in partial, partial
    assert SHED.get("http_refused", "head_pending") - reclaimed == 1
    # at the cap again: no half-sent head is left, so the longest idle one goes, with no answer
    second_reader, second = await asyncio.open_connection("127.0.0.1", patient_server)
    second.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await asyncio.wait_for(second_reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await read_until_closed(held[0][0]) == b""
    assert SHED.get("http_refused", "head_pending") - reclaimed == 2
    second.close()
    writer.close()
    for _, w in held:
        w.close()
    # Every connection runs a request (a body still coming): nothing to close, the new one is refused.
    async with asyncio.timeout(5):
        while True:
            running = [await asyncio.open_connection("127.0.0.1", patient_server) for _ in range(4)]
            for _, w in running:
                w.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nab")
                await w.drain()
            reader, writer = await asyncio.open_connection("127.0.0.1", patient_server)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            data = await read_until_closed(reader)
            writer.close()
            if b"too many connections" in data:
                break
            # the server had not seen the earlier closes yet: one of these made room; again
            for _, w in running:
                w.close()
    assert data.startswith(b"HTTP/1.1 503 "), data
    assert SHED.get("http_refused", "connections") - refused >= 1, "counted under its reason"
    for _, w in running:
        w.close()
