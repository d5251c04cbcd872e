"""A bare TCP byte relay on uvloop: the floor of a hop written in Python.

    python bench/byte_relay.py LISTEN_PORT UPSTREAM_PORT

Every accepted connection on 127.0.0.1:LISTEN_PORT gets its own connection to
127.0.0.1:UPSTREAM_PORT, and bytes are copied both ways as they arrive: no HTTP is parsed, no
header or body is looked at. `bench/relay.py --rows pyhop` puts it where nginx sits in front of
the direct upstream, so the CPU per call of a Python process that only moves the bytes (two
reads, two writes and the event loop's turns) is read beside nginx's and the proxy's in one run.
It is a yardstick, not a proxy: it serves HTTP/1.1 keep-alive only because a client connection
maps onto one upstream connection.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import uvloop

HIGH_WATER = 256 * 1024  # a peer that stops reading pauses the other side beyond this


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection: what arrives is written to `peer`; when `peer`'s write
    buffer is full, this side stops reading until it drains."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.early: list[bytes] = []  # bytes that came before the peer existed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it
        self.transport.set_write_buffer_limits(high=HIGH_WATER)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)
        else:
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Downstream(_Pipe):
    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        upstream = _Pipe()
        upstream.peer = self
        try:
            await asyncio.get_running_loop().create_connection(lambda: upstream, "127.0.0.1", self.upstream_port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        self.peer = upstream
        assert upstream.transport is not None
        if self.transport is None or self.transport.is_closing():  # the client left meanwhile
            upstream.transport.close()
            return
        for chunk in self.early:
            upstream.transport.write(chunk)
        self.early.clear()


async def serve(listen_port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Downstream(upstream_port), "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: byte_relay.py LISTEN_PORT UPSTREAM_PORT")
    uvloop.run(serve(int(argv[0]), int(argv[1])))


if __name__ == "__main__":
    main(sys.argv[1:])
