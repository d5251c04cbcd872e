"""The least a Python hop that terminates HTTP and reads each MCP message can spend: a yardstick.

    python bench/term_relay.py LISTEN_PORT UPSTREAM_PORT

`bench/relay.py --rows pyterm` puts it where nginx sits in front of the direct upstream. Unlike
`bench/byte_relay.py` (bytes copied, nothing parsed), it does per call what any recovery proxy
must do at the least, and nothing more: it parses the client's HTTP/1.1 request (httptools) and
its JSON-RPC body (orjson), writes a new request upstream on a keep-alive connection of its own
(the client's connection's), parses the upstream's response head and body (an `application/json`
body, or the `data:` line of a `text/event-stream` one, the SDK server's answer to a 2025
session), reads the answer's `result` (what a retry decision looks at), and writes the answer to
the client as `application/json` with its length. Everything runs in the protocols' callbacks on
uvloop: no task, no coroutine, no ASGI, no telemetry, no policy, no bound on anything.

What its CPU per call says: the floor of a terminating Python hop on this machine, read beside
nginx's and the proxy's in one run. The distance from it to the proxy is what the proxy's own
layers cost (its frontend, engine, upstream client); its distance to nginx is what terminating
HTTP and reading JSON in Python cost at all. It is not a proxy: one request at a time per client
connection, no error handling beyond closing, an event stream's notifications dropped.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, cast

import httptools
import orjson
import uvloop

# The request headers passed on (the rest are the hop's own: host, length, connection).
_FORWARDED = (b"content-type", b"accept", b"mcp-protocol-version", b"mcp-session-id", b"mcp-method", b"mcp-name")


class _Upstream(asyncio.Protocol):
    """The hop's connection to the upstream for one client connection."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.client.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()

    def on_message_begin(self) -> None:
        self.headers = {}
        self.body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        if self.headers.get(b"content-type", b"").startswith(b"text/event-stream"):
            # the stream's last message is the answer (a 2025 POST's stream ends with it)
            data = [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]
            body = data[-1] if data else b""
        answer = orjson.loads(body) if body else None
        if isinstance(answer, dict):
            result = answer.get("result")
            _ = isinstance(result, dict) and result.get("isError") is True  # what a retry decision reads
        self.client.answer(self.status, self.headers.get(b"mcp-session-id"), body)


class _Client(asyncio.Protocol):
    """One client connection, answered one request at a time."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.waiting: bytes | None = None  # a request written before the upstream connection opened
        self.connecting: asyncio.Task[Any] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        upstream = self.upstream = _Upstream(self)
        loop = asyncio.get_running_loop()
        self.connecting = loop.create_task(loop.create_connection(lambda: upstream, "127.0.0.1", self.upstream_port))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        message: Any = orjson.loads(body)  # what the hop must read: the method, the id, the tool
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            self.close()
            return
        _ = (message.get("id"), (message.get("params") or {}).get("name"))
        head = [b"POST ", self.url, b" HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % self.upstream_port]
        for name in _FORWARDED:
            value = self.headers.get(name)
            if value is not None:
                head += (name, b": ", value, b"\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        self.waiting = b"".join(head) + body
        self._send()

    def _send(self) -> None:
        """The waiting request upstream, once the upstream connection is open."""
        upstream = self.upstream
        if upstream is None or upstream.transport is None:
            connecting = self.connecting
            if connecting is not None and connecting.done():  # the connection failed: no wait for ever
                if not connecting.cancelled():
                    connecting.exception()  # retrieved: it is the reason, and the client is closed
                self.close()
                return
            asyncio.get_running_loop().call_later(0.01, self._send)
            return
        request, self.waiting = self.waiting, None
        if request is not None:
            upstream.transport.write(request)

    def answer(self, status: int, session_id: bytes | None, body: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        head = b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\n" % status
        if session_id is not None:
            head += b"mcp-session-id: " + session_id + b"\r\n"
        self.transport.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)


async def serve(listen_port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream_port), "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: term_relay.py LISTEN_PORT UPSTREAM_PORT")
    uvloop.run(serve(int(argv[0]), int(argv[1])))


if __name__ == "__main__":
    main(sys.argv[1:])
