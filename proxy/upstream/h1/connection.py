"""One connection of the HTTP/1.1 client: an `asyncio.Protocol` that writes a request and hands
the bytes it reads to a `ResponseReader`.

Contract: one request at a time. The reader's events run synchronously inside `data_received`,
so the head future is resolved and, for a small answer, the whole body buffered before the
requesting task resumes. Futures are resolved with results, never exceptions (an error is
returned as the result and raised by the awaiting side), so a task cancelled at the wrong moment
cannot leave a "Future exception was never retrieved" behind. Every request gets exactly one
outcome: a `Response` (or its `Sink` hears `head`), or a `ClientError`. A connection that is
closing leaves its pool at once (`Owner.drop`), even before asyncio reports it lost.

TLS refusals: in TLS 1.3 a server checks the client's certificate after the client has finished
its handshake, so a refused client certificate shows only when the first answer should come. An
alert then is a `TlsError`; a bare close of a new TLS connection before any byte of its first
answer is a `TlsClosed` (the upstream most likely refused the handshake, but a server that died at
that moment looks the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections.abc import Callable
from typing import Final, Protocol

from proxy.upstream.h1.errors import ClientError, ConnectionClosed, ProtocolError, TlsClosed, TlsError, tls_failure_text
from proxy.upstream.h1.headers import CookieJar, Headers
from proxy.upstream.h1.reader import ResponseReader, UnsolicitedResponse
from proxy.upstream.h1.response import Response, Sink

# An idle connection older than this is checked for a close the loop has not read yet (`reusable`).
STALE_CHECK_S: Final = 0.1

__all__ = ["Connection", "Owner"]


class Owner(Protocol):
    """What a connection needs of the pool that made it."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def tls(self) -> bool:
        """Whether connections are TLS (an https origin)."""
        ...

    @property
    def cookies(self) -> CookieJar:
        """Where the answers' `Set-Cookie` headers go."""
        ...

    def put_back(self, conn: Connection) -> None:
        """`conn` finished its request and may carry another."""
        ...

    def drop(self, conn: Connection) -> None:
        """`conn` is closing: out of the pool, its slot freed (idempotent)."""
        ...


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and its response reader; one request at a time.

    What `HttpClient.send_now` hands back: its caller may only `close()` it."""

    __slots__ = (
        "_head_fut",
        "_max_body",
        "_reader",
        "_sink",
        "client",
        "closed",
        "counted",
        "idle_since",
        "keep_alive",
        "loop",
        "paused",
        "response",
        "served",
        "transport",
    )

    def __init__(self, client: Owner, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        # Made at connection_made and dropped at connection_lost: the reader holds this
        # connection, a reference cycle that only the cyclic GC could free otherwise (a refused
        # connect never makes one).
        self._reader: ResponseReader | None = None
        self.closed = False
        self.counted = True  # holds one of the client's connection slots until dropped
        self.paused = False
        self.keep_alive = True
        self.idle_since = 0.0  # when it was last put back in the pool (time.monotonic)
        self.served = 0
        self.response: Response | None = None
        self._head_fut: asyncio.Future[Response | ClientError] | None = None
        self._sink: Sink | None = None  # instead of `_head_fut`, for a request sent with `send_now`
        self._max_body: int | None = None  # the bound the current request gives its answer's body

    # -- used by the client and the response ---------------------------------------------

    def send(
        self,
        data: bytes,
        fut: asyncio.Future[Response | ClientError],
        head_only: bool,
        keep_alive: bool,
        on_write: Callable[[], None] | None,
        max_body: int | None,
    ) -> None:
        self.served += 1
        self._head_fut = fut
        self._sink = None
        self._max_body = max_body
        self.keep_alive = keep_alive
        if self.closed or self.transport is None or self.transport.is_closing():
            fut.set_result(self._closed_error(False))
            return
        self._reader.expect(head_only)  # type: ignore[union-attr]
        if on_write is not None:
            on_write()
        self.transport.write(data)

    def send_to(self, data: bytes, sink: Sink, keep_alive: bool, max_body: int | None) -> None:
        """`send` for `HttpClient.send_now`: the answer goes to `sink` (the connection is usable)."""
        self.served += 1
        self._head_fut = None
        self._sink = sink
        self._max_body = max_body
        self.keep_alive = keep_alive
        self._reader.expect()  # type: ignore[union-attr]
        self.transport.write(data)  # type: ignore[union-attr]

    def close(self) -> None:
        """Close now and give the slot back at once (connection_lost comes later)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self.client.drop(self)

    def pause(self) -> None:
        self.paused = True
        self.transport.pause_reading()  # type: ignore[union-attr]

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def is_usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def reusable(self, now: float) -> bool:
        """Whether this idle connection may carry a request: usable, and, once it has been idle
        for `STALE_CHECK_S`, its socket has nothing to read. An idle connection is read, so the
        loop notices a peer's close (`eof_received`) at its next turn; but a close that arrived
        while the loop was busy elsewhere is only in the socket yet, and a request written on it
        would fail as closed in flight, though the server never saw it. Servers close idle
        connections after their keep-alive timeout (uvicorn's: 5 s), so only a connection idle
        for a while is asked (one poll(2), none for one reused at once under load)."""
        if not self.is_usable():
            return False
        if now - self.idle_since < STALE_CHECK_S:
            return True
        sock = self.transport.get_extra_info("socket")  # type: ignore[union-attr]
        if sock is None:
            return True
        poller = select.poll()
        try:
            poller.register(sock.fileno(), select.POLLIN)
            return not poller.poll(0)  # readable when idle: the peer closed it (or spoke unasked)
        except (OSError, ValueError):
            return False

    def response_done(self, reusable: bool) -> None:
        """The current response let go of this connection: back to the pool if `reusable` and
        both sides allow keep-alive, else closed."""
        self.response = None
        if reusable and self.keep_alive and not self.closed and not self.transport.is_closing():  # type: ignore[union-attr]
            if self.paused:
                self.resume()  # an idle connection must be read to notice the peer closing it
            self.client.put_back(self)
        else:
            self.close()

    def _lost_error(self, exc: Exception | None, started: bool) -> ClientError:
        """Why the request in flight failed when the connection went: a TLS refusal if this was
        the first request of a new TLS connection and nothing of an answer came (see the module
        docstring), else a plain close."""
        client = self.client
        if self.served == 1 and not started and client.tls:
            if isinstance(exc, ssl.SSLError):
                return TlsError(tls_failure_text(exc, client.host, client.port))
            return TlsClosed(
                f"TLS with the upstream {client.host}:{client.port} failed: it closed a new connection "
                "before answering; it most likely refused the handshake: it requires a client certificate "
                "(--upstream-client-cert and --upstream-client-key) or does not accept the one given"
            )
        return self._closed_error(started)

    def _closed_error(self, started: bool) -> ConnectionClosed:
        what = "during the response" if started else "before the response"
        return ConnectionClosed(
            f"the upstream closed the connection {what}", response_started=started, reused=self.served > 1
        )

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._reader = ResponseReader(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:
            return
        error = reader.feed(data)
        if error is not None:
            self._fail_protocol(error)

    def eof_received(self) -> bool | None:
        if self.response is None and self._head_fut is None and self._sink is None:
            self.closed = True  # idle: never hand it out again, even before connection_lost runs
            self.client.drop(self)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client.drop(self)
        reader = self._reader
        started = reader is not None and reader.started
        fut = self._head_fut
        if fut is not None:
            self._head_fut = None
            if not fut.done():
                error = self._lost_error(exc, started)
                error.__cause__ = exc
                fut.set_result(error)
        sink = self._sink
        if sink is not None:
            self._sink = None
            error = self._lost_error(exc, started)
            error.__cause__ = exc
            sink.failed(error)
        response = self.response
        if response is not None and not response.complete and response.error is None:
            # A body delimited by the close ends here; any other is cut short.
            if reader is None or not reader.feed_eof():
                error = ConnectionClosed(
                    "the upstream closed the connection during the response body",
                    response_started=True,
                    reused=self.served > 1,
                )
                error.__cause__ = exc
                response.fail(error)
        if reader is not None:
            reader.close()
        self._reader = None
        self.response = None  # a dead connection holds no response: the two would be a cycle

    def pause_writing(self) -> None:
        """Requests are written whole and small: there is nothing to stop producing."""

    def resume_writing(self) -> None:
        """See `pause_writing`."""

    # -- the reader's events --------------------------------------------------------------------

    def on_head(self, status: int, reason: str, headers: Headers) -> None:
        response = Response(self, status, reason, headers)
        response.max_body = self._max_body
        if "set-cookie" in headers.first:
            self.client.cookies.update(headers.getall("set-cookie"))
        self.response = response
        fut = self._head_fut
        self._head_fut = None
        if fut is not None and not fut.done():
            fut.set_result(response)
        sink = self._sink
        if sink is not None:
            self._sink = None
            if sink.head(response):
                response.sink = sink

    def on_body(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete or response.error is not None:
            return  # a response abandoned or failed meanwhile
        response.feed(data)

    def on_end(self, keep_alive: bool) -> None:
        response = self.response
        if response is None or response.complete or response.error is not None:  # failed: stays failed
            return
        self.keep_alive = self.keep_alive and keep_alive
        response.finish()

    # -- helpers ------------------------------------------------------------------------------

    def _fail_protocol(self, error: ProtocolError) -> None:
        self.keep_alive = False
        fut = self._head_fut
        response = self.response
        if isinstance(error, UnsolicitedResponse) and fut is None and self._sink is None and response is None:
            self.close()  # unsolicited bytes on an idle connection: just drop it
            return
        sink = self._sink
        if fut is not None:
            self._head_fut = None
            if not fut.done():
                fut.set_result(error)
        elif sink is not None:
            self._sink = None
            sink.failed(error)
        elif response is not None and not response.complete:
            response.fail(error)
        self.close()
