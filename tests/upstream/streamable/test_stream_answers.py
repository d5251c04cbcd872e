"""A POST answered with an event stream, read on both of the link's paths: by an exchange task (no
idle pooled connection: the server closes each connection after its answer) and in the pooled
connection's own callbacks (`Flight`: the server keeps its connections alive). Each test asserts
which path it took, then that the path behaves as the other does: messages before the response
delivered as they come, an event over the bound, a stream that ends or breaks before its
response (resumed from its last event id), a cancelled call, and the next call on the link."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.upstream.base import Era, Exchange
from proxy.upstream.streamable.flight import Flight
from proxy.upstream.streamable.legacy import HttpLegacyLink
from proxy.upstream.streamable.upstream import HttpUpstream

pytestmark = [pytest.mark.anyio]
WAIT = 10.0
BOUND = 4096  # the upstream's message bound in these tests

PATHS = ["task", "callbacks"]


def _chunk(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(message: Message, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {orjson.dumps(message).decode()}\n\n"


def _note(text: str) -> Message:
    return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": text}}


def _result(id_: Any, text: str) -> Message:
    return {"jsonrpc": "2.0", "id": id_, "result": {"content": [{"type": "text", "text": text}], "isError": False}}


class Upstream:
    """A 2025 Streamable HTTP server on 127.0.0.1 that answers each `tools/call` with an event
    stream scripted by the tool's name; `keep_alive=False` closes every connection after its
    answer, so the client never has an idle pooled connection."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.gets: list[str | None] = []  # the Last-Event-ID of each GET
        self.connections = 0
        self.pending: list[Any] = []  # ids of calls whose answer is still owed (resumption)
        self.release = asyncio.Event()  # ends the "hang" tool's stream

    def _head(self, ctype: str, length: int | None = None) -> bytes:
        head = f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nmcp-session-id: s1\r\n"
        head += f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
        if not self.keep_alive:
            head += "Connection: close\r\n"
        return (head + "\r\n").encode()

    async def _stream(self, writer: asyncio.StreamWriter, msg: Message) -> bool:
        """Write the answer of a tools/call; False when the connection is to be dropped."""
        name, id_ = msg["params"]["name"], msg["id"]
        writer.write(self._head("text/event-stream"))
        if name == "echo":
            writer.write(_chunk(_event(_result(id_, "echoed"))))
        elif name == "note_then_answer":
            writer.write(_chunk(_event(_note("working"))))
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(_chunk(_event(_result(id_, "done"))))
        elif name == "big":
            writer.write(_chunk(_event(_note("x" * (2 * BOUND)))))
        elif name == "silent_end":
            writer.write(_chunk(_event(_note("no answer follows"))))
        elif name == "break":
            self.pending.append(id_)
            writer.write(_chunk("retry: 10\n" + _event(_note("before the break"), "ev1")))
            await writer.drain()
            writer.transport.abort()
            return False
        elif name == "hang":
            writer.write(_chunk(_event(_note("started"))))
            await writer.drain()
            await self.release.wait()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return self.keep_alive

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                method = lines[0].split(" ")[0]
                keep = self.keep_alive
                if method == "GET":
                    self.gets.append(headers.get("last-event-id"))
                    if headers.get("last-event-id") == "ev1" and self.pending:
                        writer.write(self._head("text/event-stream"))
                        writer.write(_chunk(_event(_result(self.pending.pop(0), "resumed"), "ev2")) + b"0\r\n\r\n")
                    else:
                        writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                elif method == "DELETE" or not body:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                else:
                    msg = orjson.loads(body)
                    if msg.get("method") == "initialize":
                        result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "x"}}
                        data = orjson.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result})
                        writer.write(self._head("application/json", len(data)) + data)
                    elif "id" not in msg or "method" not in msg:
                        writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
                    else:
                        keep = await self._stream(writer, msg)
                await writer.drain()
                if not keep:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return


@asynccontextmanager
async def session(path: str) -> AsyncIterator[tuple[HttpLegacyLink, Upstream]]:
    server_side = Upstream(keep_alive=path == "callbacks")
    server = await asyncio.start_server(server_side.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = HttpUpstream(f"http://127.0.0.1:{port}/mcp", max_event_bytes=BOUND)
    try:
        link = await up.open(Era.LEGACY)
        assert isinstance(link, HttpLegacyLink)
        init = {
            "jsonrpc": "2.0",
            "id": link.new_id(),
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}},
        }
        await asyncio.wait_for((await link.send_request(init)).response, WAIT)
        await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if path == "callbacks":
            await echo(link)  # a connection answered and kept: the pool has one idle
        yield link, server_side
    finally:
        server_side.release.set()
        await up.aclose()
        server.close()
        await server.wait_closed()


async def send(
    link: HttpLegacyLink, path: str, name: str, on_message: Callable[[Message], None] | None = None
) -> Exchange:
    """Send a call of `name` and check it took `path`."""
    message = call_of(link, name)
    for _ in range(50):  # the listen stream's GET may hold the idle connection for a moment
        ex = await link.send_request(message, on_message=on_message)
        took = "callbacks" if isinstance(ex.transport_state, Flight) else "task"
        if took == path or path == "task":
            break
        await asyncio.wait_for(ex.response, WAIT)  # an "echo" warming the pool: try again
        message = {**message, "id": link.new_id()}
        await asyncio.sleep(0.02)
    assert took == path, f"the call was read by {took}, not {path}"
    return ex


async def failure(response: Awaitable[Message]) -> UpstreamFailure:
    with pytest.raises(UpstreamFailure) as info:
        await asyncio.wait_for(response, WAIT)
    return info.value


def text(message: Message) -> str:
    return str(message["result"]["content"][0]["text"])


@pytest.mark.parametrize("path", PATHS)
async def test_messages_before_the_response_are_delivered_as_they_come(path: str) -> None:
    async with session(path) as (link, _):
        seen: list[tuple[str, bool]] = []
        holder: list[Exchange] = []

        def on_message(msg: Message) -> None:
            seen.append((msg["params"]["data"], holder[0].response.done()))

        ex = await send(link, path, "note_then_answer", on_message)
        holder.append(ex)
        assert text(await asyncio.wait_for(ex.response, WAIT)) == "done"
        assert seen == [("working", False)], "the notification, once, before the response"
        assert await echo(link) == "echoed", "the link goes on"


@pytest.mark.parametrize(
    ("tool", "kind", "detail"),
    [
        ("big", FailureKind.PROTOCOL, f"exceeds {BOUND} bytes"),
        ("silent_end", FailureKind.CLOSED, "closed the response stream before the response arrived"),
    ],
    ids=["an-event-over-the-bound", "a-stream-that-ends-unanswered"],
)
@pytest.mark.parametrize("path", PATHS)
async def test_a_stream_that_cannot_answer_fails_dispatch_unknown_and_the_link_goes_on(
    path: str, tool: str, kind: FailureKind, detail: str
) -> None:
    async with session(path) as (link, _):
        f = await failure((await send(link, path, tool)).response)
        assert f.kind is kind and f.dispatched is Dispatch.UNKNOWN, f
        assert detail in f.detail
        assert await echo(link) == "echoed", "the link goes on"


@pytest.mark.parametrize("path", PATHS)
async def test_a_stream_broken_before_its_response_is_resumed_from_its_last_event_id(path: str) -> None:
    async with session(path) as (link, server_side):
        seen: list[Message] = []
        ex = await send(link, path, "break", seen.append)
        assert text(await asyncio.wait_for(ex.response, WAIT)) == "resumed"
        assert [m["params"]["data"] for m in seen] == ["before the break"]
        assert "ev1" in server_side.gets, server_side.gets
        assert await echo(link) == "echoed", "the link goes on"


@pytest.mark.parametrize("path", PATHS)
async def test_a_call_cancelled_while_its_stream_is_open_ends_and_the_link_goes_on(path: str) -> None:
    async with session(path) as (link, _):
        started = asyncio.Event()
        ex = await send(link, path, "hang", lambda _msg: started.set())
        await asyncio.wait_for(started.wait(), WAIT)
        await asyncio.wait_for(link.cancel(ex, "the test gave up"), WAIT)
        f = await failure(ex.response)
        assert f.kind is FailureKind.CLOSED and "cancelled" in f.detail, f
        assert ex.transport_state is None or not isinstance(ex.transport_state, Flight)
        assert await echo(link) == "echoed", "the link goes on"


async def test_a_stream_read_in_the_callbacks_leaves_its_connection_to_the_next_call() -> None:
    async with session("callbacks") as (link, server_side):
        for _ in range(3):
            ex = await send(link, "callbacks", "echo")
            assert text(await asyncio.wait_for(ex.response, WAIT)) == "echoed"
            assert ex.transport_state is None, "nothing of the flight is left on the exchange"
        opened = server_side.connections
        for _ in range(5):
            ex = await send(link, "callbacks", "echo")
            assert text(await asyncio.wait_for(ex.response, WAIT)) == "echoed"
        assert server_side.connections == opened, "the calls went out on the connections already open"


def call_of(link: HttpLegacyLink, name: str) -> Message:
    return {"jsonrpc": "2.0", "id": link.new_id(), "method": "tools/call", "params": {"name": name, "arguments": {}}}


async def echo(link: HttpLegacyLink) -> str:
    return text(await asyncio.wait_for((await link.send_request(call_of(link, "echo"))).response, WAIT))
