"""The frontend's uvicorn protocol: one write per JSON answer; a streamed head held one loop step at most.

The unit tests record what reaches a transport (a recording stand-in for the socket transport:
counting write calls is the point); the last test runs the protocol in a real uvicorn server on
127.0.0.1 and counts the `send` calls of a real socket transport."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from proxy.frontend.uvicorn_h1 import OneWriteHttpToolsProtocol, _HeadHolding

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


class Recording:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def abort(self) -> None:
        self.events.append("abort")

    def write_eof(self) -> None:
        self.events.append("eof")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def test_a_head_and_its_body_go_out_in_one_write() -> None:
    rec = Recording()
    t = _HeadHolding(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert rec.writes == []
    t.write(b"{}")
    assert rec.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    t.write(b"more")  # not a head: straight through
    assert rec.writes[-1] == b"more"
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert len(rec.writes) == 2


async def test_a_head_with_a_length_waits_for_its_body() -> None:
    rec = Recording()
    t = _HeadHolding(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n")
    for _ in range(3):
        await asyncio.sleep(0)
    assert rec.writes == []
    t.write(b"{}")
    assert rec.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"]


async def test_a_streamed_head_alone_goes_out_at_the_next_loop_step() -> None:
    rec = Recording()
    t = _HeadHolding(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
    assert rec.writes == []
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert rec.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"]


async def test_close_and_eof_flush_a_held_head_first_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    rec = Recording()
    t = _HeadHolding(rec, loop)  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    t.close()
    assert rec.writes == [b"HTTP/1.1 400 Bad Request\r\n\r\n"] and rec.events == ["close"]
    rec2 = Recording()
    t2 = _HeadHolding(rec2, loop)  # type: ignore[arg-type]
    t2.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t2.write_eof()
    assert rec2.writes == [b"HTTP/1.1 200 OK\r\n\r\n"] and rec2.events == ["eof"]
    rec3 = Recording()
    t3 = _HeadHolding(rec3, loop)  # type: ignore[arg-type]
    t3.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t3.abort()
    await asyncio.sleep(0)
    assert rec3.writes == [] and rec3.events == ["abort"]
    assert t3.get_extra_info("peername") == ("127.0.0.1", 1), "everything else is the real transport's"


async def test_a_real_uvicorn_server_answers_json_in_one_send() -> None:
    """Count the sends of the server's real socket transport while it answers one request."""
    sends: list[int] = []

    class Counting(OneWriteHttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            real_write = transport.write

            def write(data: Any) -> None:
                sends.append(len(data))
                real_write(data)

            transport.write = write  # type: ignore[method-assign]
            super().connection_made(transport)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"ok":true}'})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None, as the proxy runs it: uvicorn's own configuration would replace the uvicorn
    # loggers' handlers for every later test (tests/security checks that log lines are scrubbed).
    config = uvicorn.Config(app, http=Counting, lifespan="off", log_level="warning", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:  # noqa: ASYNC110 (uvicorn offers a flag, not an event)
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            data = b""
            while not data.endswith(b'{"ok":true}'):
                chunk = await reader.read(4096)
                assert chunk, data
                data += chunk
            writer.close()
    finally:
        server.should_exit = True
        await task
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert len(sends) == 1, sends
