"""A small HTTP/1.1 client for one upstream origin, on `httptools` and an `asyncio.Protocol`.

Why it exists: relaying a call to an HTTP upstream spent most of its CPU in the general-purpose
client (aiohttp's session, connector, request/response objects, timers and tasks). The proxy talks
to one origin per upstream, sends small JSON bodies, owns every retry and every attempt timeout,
and needs to know exactly when a request may have reached the peer. A client built for that shape
can skip most of the work: no task per request, no timer unless one is armed, one write per
request, and a response whose body usually arrived in the same `data_received` as its head.

What it deliberately does not do: redirects (a 3xx is returned as is), reading proxy settings
from the environment (`proxy/net/egress.py` does, and hands it a `ProxyRoute`), retries of
any kind (a failed request is reported, never repeated), read timeouts (the caller bounds each
attempt), pipelining, HTTP/2, `Expect: 100-continue`.

Egress proxy: with a `ProxyRoute`, every connection is a CONNECT tunnel through the proxy (for
`http://` origins too), with `Proxy-Authorization` on the CONNECT request only and TLS to the
origin inside the tunnel (`loop.create_connection(sock=...)` on the tunnelled socket). Tunnels are
pooled exactly like direct connections. A proxy that refuses the tunnel (407, 403, 502...) is a
`ProxyRefused`, a `ConnectError`: nothing reached the origin. Requests themselves are unchanged
(origin-form targets, the origin's Host), so the direct path pays nothing for this.

TLS: a handshake the client rejects (unknown CA, host name mismatch) or the server rejects with an
alert is a `TlsError`, a `ConnectError` whose message says what failed. In TLS 1.3 a server checks
the client's certificate after the client has finished its handshake, so a missing or refused
client certificate shows only when the first request's answer should come: an alert then (OpenSSL,
Go, Envoy servers) is a `TlsError` too, nothing having been processed; a bare close (asyncio
servers such as uvicorn send no alert) of a new TLS connection before any byte of its first answer
is a `TlsClosed`, also a `ConnectError` but with `dispatch_known=False`: the upstream most likely
refused the handshake, but a server that died at that moment looks the same.

Loop binding: a client may be built anywhere, and binds to the running loop on its first request;
every later request must run on that same loop (the loop is cached because asking for it costs a
`getpid()` on Python 3.11).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import re
import socket
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Final, Protocol
from urllib.parse import quote, urlsplit

import httptools

__all__ = [
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectTimeout",
    "Connection",
    "ConnectionClosed",
    "Headers",
    "HttpClient",
    "InvalidURL",
    "ProtocolError",
    "ProxyRefused",
    "ProxyRoute",
    "Response",
    "Sink",
    "TlsClosed",
    "TlsError",
]

# Above this many buffered, unconsumed body bytes the socket stops being read; below LOW it resumes.
HIGH_WATER: Final = 256 * 1024
# A response's status line and headers larger than this fail the request (a peer sending an
# endless head must not grow the proxy's memory); checked after each read, so the bound is this
# plus one read.
MAX_HEAD_BYTES: Final = 64 * 1024
LOW_WATER: Final = 64 * 1024
# What one read of a compressed body without a bound of its own (an event stream) may expand to:
# the message limit (one event is never larger). The proxy does not ask for compressed answers.
MAX_INFLATE_PER_READ: Final = 16 * 1024 * 1024

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_FORBIDDEN = re.compile(r"[\r\n\x00]")
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_KNOWN_METHODS: Final = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Header names the client writes itself: a request header with one of these names takes the slow path.
_MANAGED: Final = frozenset({"host", "content-length", "cookie"})
_DECODED_ENCODINGS: Final = frozenset({"gzip", "x-gzip", "deflate"})
_NO_BODY_STATUSES: Final = frozenset({204, 304})
# Printable ASCII minus space: what `quote` may leave alone in a target with non-ASCII characters.
_TARGET_SAFE: Final = "".join(chr(c) for c in range(0x21, 0x7F))


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
class ClientError(Exception):
    """Base of every failure this client reports (never a bare OSError or parser error)."""


class InvalidURL(ValueError):
    """The URL given to `HttpClient` is not one origin this client can reach."""


class ClientClosed(ClientError):
    """The client was closed (`aclose`) before or while the request waited for a connection."""


class ConnectError(ClientError):
    """Establishing the connection failed: nothing of the request can have been sent (see
    `TlsClosed` for the one exception). The message names what failed and never carries
    credentials."""

    dispatch_known = True


class ConnectTimeout(ConnectError):
    """No connection within `connect_timeout_s` (waiting for a pool slot, TCP connect, TLS)."""


class TlsError(ConnectError):
    """The TLS handshake with the origin failed, or the origin refused it with an alert."""


class TlsClosed(TlsError):
    """A new TLS connection was closed before any byte of its first answer: in TLS 1.3, how an
    upstream that refuses the client's certificate without sending an alert looks. Unlike other
    `ConnectError`s the request was written, so whether it was processed is not known for sure."""

    dispatch_known = False


class ProxyRefused(ConnectError):
    """The egress proxy answered the CONNECT request with something other than 2xx (`status`)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class PoolTimeout(ConnectTimeout):
    """Every pooled connection stayed busy for `connect_timeout_s`: the upstream is slow or the
    pool too small, which is not the same as an upstream nobody can reach."""


class ProtocolError(ClientError):
    """The peer answered something that is not a valid HTTP/1.1 response."""


class BodyTooLarge(ProtocolError):
    """The answer's body (decoded, if it came compressed) grew past its `Response.max_body`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the upstream's answer body exceeds {limit} bytes")
        self.limit = limit


class ConnectionClosed(ClientError):
    """The peer closed or reset the connection before the response was complete.

    `response_started` tells whether the status line had been received; `reused` whether the
    connection had already served an earlier request (a keep-alive connection the peer was closing
    while this request went out fails this way)."""

    def __init__(self, message: str, *, response_started: bool, reused: bool) -> None:
        super().__init__(message)
        self.response_started = response_started
        self.reused = reused


class Sink(Protocol):
    """Who takes the answer of a request sent with `HttpClient.send_now`, from the connection's own
    callbacks (no task, no future). Called exactly once with `head`, then, if `head` returned
    True, exactly once with `done` or `failed`; or just once with `failed` if no head came."""

    def head(self, response: Response) -> bool:
        """The status line and headers arrived. True: call `done` once the whole body is in (read
        it with `Response.take`); False: the response is read the usual way by whoever took it."""
        ...

    def done(self, response: Response) -> None:
        """The whole body arrived (after `head` returned True)."""
        ...

    def failed(self, error: ClientError) -> None:
        """The connection broke (or the answer was invalid) before the response was complete."""
        ...


# ---------------------------------------------------------------------------------------------
# headers and cookies
# ---------------------------------------------------------------------------------------------
class Headers:
    """Response headers, in arrival order, looked up case-insensitively.

    Not a `collections.abc.Mapping`: iteration yields `(name, value)` pairs, so that repeated
    headers (`Set-Cookie`) survive. The lookup index keeps the first value per name and is built
    once, in C, by a dict comprehension; `getall` scans the pairs (it is rarely needed). `repr`
    shows names only: values can carry credentials."""

    __slots__ = ("_first", "_items")

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        self._first = {name.lower(): value for name, value in reversed(items)}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._first.get(name.lower(), default)

    def getall(self, name: str) -> list[str]:
        key = name.lower()
        return [value for n, value in self._items if n.lower() == key]

    def __getitem__(self, name: str) -> str:
        return self._first[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def __repr__(self) -> str:
        return f"Headers({[name for name, _ in self._items]!r})"


class _CookieJar:
    """The cookies of one origin, name → value.

    The upstream is a single origin, so `Path` and `Domain` are ignored (every cookie is sent on
    every request), as are `Secure`/`HttpOnly`/`SameSite`. `Max-Age` wins over `Expires` (RFC 6265
    §5.3); a Max-Age ≤ 0 or an Expires in the past deletes the cookie. A Set-Cookie the standard
    library cannot parse is ignored: a server's bad cookie must not fail the call."""

    __slots__ = ("_cookies",)

    def __init__(self) -> None:
        self._cookies: dict[str, tuple[str, float | None]] = {}

    def __bool__(self) -> bool:
        return bool(self._cookies)

    def update(self, set_cookies: list[str]) -> None:
        now = time.time()
        for raw in set_cookies:
            parsed = SimpleCookie()
            try:
                parsed.load(raw)
            except CookieError:
                continue
            for name, morsel in parsed.items():
                expires_at = _expiry(morsel["max-age"], morsel["expires"], now)
                if expires_at is not None and expires_at <= now:
                    self._cookies.pop(name, None)
                else:
                    self._cookies[name] = (morsel.coded_value, expires_at)

    def header(self) -> str:
        """The `Cookie` header value; drops the cookies that expired meanwhile."""
        now = time.time()
        expired = [name for name, (_, at) in self._cookies.items() if at is not None and at <= now]
        for name in expired:
            del self._cookies[name]
        return "; ".join(f"{name}={value}" for name, (value, _) in self._cookies.items())


def _expiry(max_age: str, expires: str, now: float) -> float | None:
    """The absolute expiry (time.time() scale) of a cookie, None for a session cookie."""
    if max_age:
        try:
            return now + int(max_age)
        except ValueError:
            pass  # RFC 6265: an unparseable Max-Age is ignored
    if expires:
        try:
            when = email.utils.parsedate_to_datetime(expires)
        except (TypeError, ValueError, IndexError):
            return None
        if when is not None:
            return when.timestamp()
    return None


# ---------------------------------------------------------------------------------------------
# response
# ---------------------------------------------------------------------------------------------
class Response:
    """One response: head parsed, body arriving on the connection.

    The body is kept as the list of chunks the parser delivered (one chunk, returned as is, in the
    common case) and read once. The connection goes back to the pool when the body has been read
    to its end (or on `release()` after that); anything else closes it, since a connection with an
    unread body cannot carry the next request."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_decoder",
        "_error",
        "_read_all",
        "_received",
        "_sink",
        "_until_eof",
        "_waiter",
        "_want",
        "complete",
        "headers",
        "max_body",
        "reason",
        "status",
    )

    def __init__(self, conn: _Connection, status: int, reason: str, headers: Headers) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.complete = False
        self._conn: _Connection | None = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._error: ClientError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._want = 0
        self._read_all = False
        self._decoder: zlib._Decompress | None = None
        self._until_eof = False
        self._sink: Sink | None = None  # takes the complete body (`HttpClient.send_now`)
        self._received = 0  # body bytes so far, decoded
        # A bound on the decoded body (the request's `max_body`; a reader may change it once it has
        # the head): past it the response fails with BodyTooLarge and the connection is closed. A
        # compressed answer is never decoded beyond it. None: no bound (an event stream is bounded
        # per event by its reader instead).
        self.max_body: int | None = None

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason!r} complete={self.complete}>"

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    async def read(self, limit: int | None = None) -> bytes:
        """The rest of the body. With `limit`, at most `limit` bytes: if that cuts the body short
        the connection is closed (its unread remainder makes it unusable) instead of reused."""
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        self._read_all = True  # read() consumes whatever arrives: never pause the socket under it
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()
        want = 1 << 62 if limit is None else limit
        while not self.complete and self._buffered < want:
            if self._error is not None:
                raise self._error
            await self._wait(want)
        data = self._drain()
        if limit is not None and len(data) > limit:
            data = data[:limit]
            self._close()
        elif limit is not None and not self.complete:
            self._close()
        else:
            self.release()
        return data

    def take(self) -> bytes:
        """The whole body of a complete response, at once (what a `Sink.done` reads); the
        connection goes back to the pool."""
        if not self.complete:
            raise ClientError("the response body is not complete")
        data = self._drain()
        self.release()
        return data

    def _drain(self) -> bytes:
        """Everything buffered, as one bytes object (the one chunk as is, in the common case)."""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        return data

    def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive (decoded if the answer was compressed)."""
        return _ChunkIterator(self)

    async def _next_chunk(self) -> bytes | None:
        while not self._chunks:
            if self.complete:
                self.release()
                return None
            if self._error is not None:
                raise self._error
            await self._wait(1)
        data = self._chunks.pop(0)
        self._buffered -= len(data)
        conn = self._conn
        if conn is not None and conn.paused and self._buffered <= LOW_WATER:
            conn.resume()
        return data

    async def _wait(self, want: int) -> None:
        """Wait until `want` bytes are buffered, or the body ends or fails.

        Leaving abnormally (the awaiting task cancelled) closes the connection: a half-read
        response cannot be resumed by anybody else."""
        conn = self._conn
        if conn is None:
            raise ClientError("the response was released before its body was read")
        waiter = conn.loop.create_future()
        self._waiter = waiter
        self._want = want
        try:
            await waiter
        except BaseException:
            self._close()
            raise
        finally:
            self._waiter = None

    def release(self) -> None:
        """Done with the response: its connection goes back to the pool if the body was read to
        the end and both sides allow keep-alive; otherwise it is closed. Idempotent."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.response = None
        if self.complete and conn.keep_alive and not conn.closed and not conn.transport.is_closing():  # type: ignore[union-attr]
            if conn.paused:
                conn.resume()  # an idle connection must be read to notice the peer closing it
            conn.client._put_back(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        self.release()

    def _close(self) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.response = None
            conn.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _ChunkIterator:
    """`Response.iter_chunks`: a plain async iterator, not an async generator, so that a loop
    broken early leaves nothing to finalize."""

    __slots__ = ("_response",)

    def __init__(self, response: Response) -> None:
        self._response = response

    def __aiter__(self) -> _ChunkIterator:
        return self

    async def __anext__(self) -> bytes:
        data = await self._response._next_chunk()
        if data is None:
            raise StopAsyncIteration
        return data


# ---------------------------------------------------------------------------------------------
# connection
# ---------------------------------------------------------------------------------------------
class _HeadTooLarge(Exception):
    """The answer's head grew past `MAX_HEAD_BYTES` (reported as a ProtocolError)."""


class _Unexpected(Exception):
    """Raised inside a parser callback: the peer sent a response nobody asked for."""


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and its response parser; one request at a time.

    The parser's callbacks run synchronously inside `data_received`, so the head future is resolved
    and, for a small answer, the whole body buffered before the requesting task resumes. Futures are
    resolved with results, never exceptions (an error is returned as the result and raised by the
    awaiting side), so a task cancelled at the wrong moment cannot leave a "Future exception was
    never retrieved" behind."""

    __slots__ = (
        "_head_bytes",
        "_head_fut",
        "_head_only",
        "_interim",
        "_items",
        "_max_body",
        "_parser",
        "_reason",
        "_sink",
        "_started",
        "client",
        "closed",
        "counted",
        "keep_alive",
        "loop",
        "paused",
        "response",
        "served",
        "transport",
    )

    def __init__(self, client: HttpClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        # Made at connection_made and dropped at connection_lost: the parser holds bound methods of
        # this connection, a reference cycle that only the cyclic GC could free otherwise (a
        # refused connect never makes one).
        self._parser: httptools.HttpResponseParser | None = None
        self.closed = False
        self.counted = True  # holds one of the client's connection slots until dropped
        self.paused = False
        self.keep_alive = True
        self.served = 0
        self.response: Response | None = None
        self._head_fut: asyncio.Future[Response | ClientError] | None = None
        self._sink: Sink | None = None  # instead of `_head_fut`, for a request sent with `send_now`
        self._head_only = False
        self._max_body: int | None = None  # the bound the current request gives its answer's body
        self._head_bytes = 0  # read while the head of the current answer is incomplete
        self._interim = False
        self._items: list[tuple[str, str]] = []
        self._reason = ""
        self._started = False

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
        self._head_only = head_only
        self._max_body = max_body
        self.keep_alive = keep_alive
        self._started = False
        if self.closed or self.transport is None or self.transport.is_closing():
            fut.set_result(self._closed_error())
            return
        if on_write is not None:
            on_write()
        self.transport.write(data)

    def send_to(self, data: bytes, sink: Sink, keep_alive: bool, max_body: int | None) -> None:
        """`send` for `HttpClient.send_now`: the answer goes to `sink` (the connection is usable)."""
        self.served += 1
        self._head_fut = None
        self._sink = sink
        self._head_only = False
        self._max_body = max_body
        self.keep_alive = keep_alive
        self._started = False
        self.transport.write(data)  # type: ignore[union-attr]

    def close(self) -> None:
        """Close now and give the slot back at once (connection_lost comes later)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self.client._drop(self)

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def is_usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def _lost_error(self, exc: Exception | None) -> ClientError:
        """Why the request in flight failed when the connection went: a TLS refusal if this was
        the first request of a new TLS connection and nothing of an answer came (see the module
        docstring), else a plain close."""
        client = self.client
        if self.served == 1 and not self._started and client._ssl is not None:
            if isinstance(exc, ssl.SSLError):
                return TlsError(tls_failure_text(exc, client.host, client.port))
            return TlsClosed(
                f"TLS with the upstream {client.host}:{client.port} failed: it closed a new connection "
                "before answering; it most likely refused the handshake: it requires a client certificate "
                "(--upstream-client-cert and --upstream-client-key) or does not accept the one given"
            )
        return self._closed_error()

    def _closed_error(self) -> ConnectionClosed:
        started = self._started
        what = "during the response" if started else "before the response"
        return ConnectionClosed(
            f"the upstream closed the connection {what}", response_started=started, reused=self.served > 1
        )

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._parser = httptools.HttpResponseParser(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail_protocol(exc)
            return
        if self.response is None and (self._head_fut is not None or self._sink is not None):  # head incomplete
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail_protocol(_HeadTooLarge(f"the response head exceeds {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        if self.response is None and self._head_fut is None and self._sink is None:
            self.closed = True  # idle: never hand it out again, even before connection_lost runs
            self.client._drop(self)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client._drop(self)
        fut = self._head_fut
        if fut is not None:
            self._head_fut = None
            if not fut.done():
                error = self._lost_error(exc)
                error.__cause__ = exc
                fut.set_result(error)
        sink = self._sink
        if sink is not None:
            self._sink = None
            error = self._lost_error(exc)
            error.__cause__ = exc
            sink.failed(error)
        response = self.response
        if response is not None and not response.complete and response._error is None:
            if response._until_eof:
                self._finish(response)
            else:
                error = ConnectionClosed(
                    "the upstream closed the connection during the response body",
                    response_started=True,
                    reused=self.served > 1,
                )
                error.__cause__ = exc
                response._error = error
                response._wake()
                _fail_sink(response, error)
        self._parser = None

    def pause_writing(self) -> None:
        """Requests are written whole and small: there is nothing to stop producing."""

    def resume_writing(self) -> None:
        """See `pause_writing`."""

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._head_fut is None and self._sink is None:
            raise _Unexpected
        self._items = []
        self._reason = ""

    def on_status(self, reason: bytes) -> None:
        self._started = True
        self._reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._started = True
        self._items.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._started = True
        self._head_bytes = 0
        parser = self._parser
        assert parser is not None  # callbacks run only inside feed_data
        status = parser.get_status_code()
        if status < 200:  # an interim answer (103 Early Hints...): the real one follows
            self._interim = True
            return
        headers = Headers(self._items)
        response = Response(self, status, self._reason, headers)
        response.max_body = self._max_body
        first = headers._first
        encoding = first.get("content-encoding")
        if encoding is not None and encoding.strip().lower() in _DECODED_ENCODINGS:
            response._decoder = zlib.decompressobj(wbits=47)  # zlib or gzip framing, auto-detected
        if "set-cookie" in first:
            self.client._cookies.update(headers.getall("set-cookie"))
        if (
            "content-length" not in first
            and "chunked" not in first.get("transfer-encoding", "").lower()
            and status not in _NO_BODY_STATUSES
        ):
            response._until_eof = True  # HTTP/1.0 style: the body ends when the connection does
        self.response = response
        if self._head_only:
            # The parser cannot be told the answer has no body; finish it here and never reuse
            # the connection, whose parser would otherwise read the next answer as this body.
            self.keep_alive = False
            response.complete = True
        fut = self._head_fut
        self._head_fut = None
        if fut is not None and not fut.done():
            fut.set_result(response)
        sink = self._sink
        if sink is not None:
            self._sink = None
            if sink.head(response):
                if response.complete:
                    sink.done(response)  # a HEAD answer's: nothing more will come
                else:
                    response._sink = sink

    def on_body(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete or response._error is not None:
            return  # a HEAD answer's body, or a response abandoned or failed meanwhile
        decoder = response._decoder
        limit = response.max_body
        if decoder is not None:
            # Bounded, so that a small compressed chunk cannot expand to gigabytes at once: at
            # most one byte past the limit is produced (then the response fails below). A body
            # without a limit (an event stream, bounded per event by its reader) was decoded
            # whole, read by read: one 64 KiB read of a gzip bomb became 64 MiB at once, 256 MiB
            # from a 256 KiB read, before any bound could look at it. Now one read may expand to
            # at most MAX_INFLATE_PER_READ, past which it is a bomb, not an answer.
            if limit is None:
                data = decoder.decompress(data, MAX_INFLATE_PER_READ + 1)
                if len(data) > MAX_INFLATE_PER_READ:
                    self._too_large(response, MAX_INFLATE_PER_READ)
                    return
            else:
                data = decoder.decompress(data, limit - response._received + 1)
            if not data:
                return
        received = response._received = response._received + len(data)
        if limit is not None and received > limit:
            self._too_large(response, limit)
            return
        response._chunks.append(data)
        buffered = response._buffered = response._buffered + len(data)
        if response._waiter is not None and buffered >= response._want:
            response._wake()
        if buffered > HIGH_WATER and not response._read_all and not self.paused:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        response = self.response
        if response is None or response.complete:
            return
        self.keep_alive = self.keep_alive and self._parser.should_keep_alive()  # type: ignore[union-attr]
        self._finish(response)

    # -- helpers ------------------------------------------------------------------------------

    def _finish(self, response: Response) -> None:
        decoder = response._decoder
        if decoder is not None:
            tail = decoder.flush()
            limit = response.max_body
            if tail and limit is not None and response._received + len(tail) > limit:
                self._too_large(response, limit)
                return
            if tail:
                response._chunks.append(tail)
                response._buffered += len(tail)
        response.complete = True
        response._wake()
        sink = response._sink
        if sink is not None:
            response._sink = None
            sink.done(response)

    def _too_large(self, response: Response, limit: int) -> None:
        """The body outgrew its bound: fail the response, drop what arrived, close (the rest of
        the body would be read as the next answer)."""
        error = BodyTooLarge(limit)
        self.keep_alive = False
        response._error = error
        response._chunks.clear()
        response._buffered = 0
        response._wake()
        _fail_sink(response, error)
        self.close()

    def _fail_protocol(self, exc: Exception) -> None:
        self.keep_alive = False
        fut = self._head_fut
        response = self.response
        if isinstance(exc.__context__, _Unexpected) and fut is None and self._sink is None and response is None:
            self.close()  # unsolicited bytes on an idle connection: just drop it
            return
        error = ProtocolError(f"the upstream sent an invalid HTTP response ({type(exc).__name__}: {exc})")
        error.__cause__ = exc
        sink = self._sink
        if fut is not None:
            self._head_fut = None
            if not fut.done():
                fut.set_result(error)
        elif sink is not None:
            self._sink = None
            sink.failed(error)
        elif response is not None and not response.complete:
            response._error = error
            response._wake()
            _fail_sink(response, error)
        self.close()


# What `HttpClient.send_now` hands back: a connection its caller may only `close()`.
Connection = _Connection


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """An HTTP egress proxy that every connection tunnels through (CONNECT).

    `authorization` is the `Proxy-Authorization` value (a credential: sent on CONNECT requests
    only, never logged); `shown` names the proxy in messages, without its password;
    `secret_values` are what the secret registry must remove (proxy/secret_values.py)."""

    host: str
    port: int
    authorization: str | None = None
    shown: str = ""
    secret_values: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"ProxyRoute({self.shown or f'{self.host}:{self.port}'})"


# ---------------------------------------------------------------------------------------------
# client
# ---------------------------------------------------------------------------------------------
_TIMED_OUT: Final = object()
_CLIENT_CLOSED: Final = object()


class HttpClient:
    """An HTTP/1.1 keep-alive pool to the one origin of `url`.

    At most `max_connections` connections exist (idle, busy or connecting); idle ones are reused
    last-in first-out, so a burst's extra connections age out on the server side while the hot
    one stays warm. A request that finds no idle connection and no free slot waits, at most
    `connect_timeout_s`, for one; the TCP connect and TLS handshake are bounded by the same
    figure. Default headers are written on every request; a request header of the same name
    (case-insensitive) replaces the default."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 5.0,
        max_connections: int = 100,
        ssl_context: ssl.SSLContext | None = None,
        proxy: ProxyRoute | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidURL(f"invalid URL ({exc})") from exc
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise InvalidURL(f"unsupported URL scheme {scheme!r} (http or https only)")
        host = parts.hostname
        if not host:
            raise InvalidURL("the URL has no host")
        if parts.username is not None or parts.password is not None:
            raise InvalidURL("credentials in the URL are not supported; send an Authorization header")
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError as exc:
                raise InvalidURL("the URL's host is not a valid domain name") from exc
        if _BAD_TARGET.search(host):
            raise InvalidURL("the URL's host contains invalid characters")
        self.scheme = scheme
        self.host = host
        self.port = port if port is not None else _DEFAULT_PORTS[scheme]
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        self.target = _clean_target(target)
        literal = f"[{host}]" if ":" in host else host
        host_header = literal if port is None or port == _DEFAULT_PORTS[scheme] else f"{literal}:{port}"
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        if scheme == "https":
            self._ssl: ssl.SSLContext | None = ssl_context or ssl.create_default_context()
        else:
            self._ssl = None
        self._proxy = proxy
        self._connect_head = _connect_head(literal, self.port, proxy) if proxy is not None else b""
        defaults: dict[str, tuple[str, str]] = {"host": ("Host", host_header)}
        for name, value in (headers or {}).items():
            defaults[name.lower()] = (name, value)
        self._default_names = frozenset(defaults) | _MANAGED
        self._keep_alive = "close" not in defaults.get("connection", ("", ""))[1].lower()
        self._defaults = defaults
        # The constant part of every head: Host and the default headers, already joined.
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in defaults.values())
        _check_header_text(self._fixed, len(defaults))
        try:
            self._fixed.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError("a default header is not latin-1 encodable") from None
        self._cookies = _CookieJar()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[_Connection, None] = {}  # insertion-ordered: popitem() is LIFO
        self._all: set[_Connection] = set()
        self._open = 0  # slots taken: connecting, busy and idle connections
        self._waiters: collections.deque[asyncio.Future[object]] = collections.deque()
        self._closed = False

    def __repr__(self) -> str:
        return f"<HttpClient {self.scheme}://{self.host}:{self.port} open={self._open}>"

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- requests -----------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        *,
        target: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        on_write: Callable[[], None] | None = None,
        max_body: int | None = None,
        dedicated: bool = False,
    ) -> Response:
        """Send one request and return once the answer's status line and headers are parsed.

        `dedicated`: on a connection of its own, outside the pool's `max_connections` and closed
        when the response is released (a long-lived event stream, one per upstream session, that
        must not take a place the requests need).

        `on_write` runs synchronously right before the single write that carries the request: if
        it has not run, nothing of the request reached the peer. `max_body` bounds the answer's
        decoded body from its first byte on (`Response.max_body`; the reader may lift it once it
        sees the head, e.g. for an event stream it bounds per event). Raises `ValueError` (nothing
        sent) for a header name or value with CR, LF or NUL, `ConnectError` while establishing the
        connection, `ConnectionClosed`/`ProtocolError` after the request was written."""
        data, keep_alive = self._head(method, target, headers, body)
        if self._closed:
            raise ClientClosed("the HTTP client is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        conn: _Connection | None = None
        idle = self._idle if not dedicated else {}
        while idle:
            conn = idle.popitem()[0]
            if conn.is_usable():
                break
            conn.close()
            conn = None
        if conn is None:
            conn = await self._new_connection(loop, dedicated)
        fut: asyncio.Future[Response | ClientError] = loop.create_future()
        try:
            conn.send(data, fut, method == "HEAD", keep_alive, on_write, max_body)
            result = await fut
        except BaseException:
            conn.close()  # cancelled (or on_write failed): this connection's state is unknown
            raise
        if result.__class__ is Response:
            return result
        raise result  # type: ignore[misc]

    @property
    def idle(self) -> bool:
        """Whether a pooled connection is free (`send_now` may succeed)."""
        return bool(self._idle)

    def send_now(
        self,
        method: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        sink: Sink,
        max_body: int | None = None,
    ) -> Connection | None:
        """Write a request at once on an idle pooled connection; its answer goes to `sink`.

        None (nothing sent, nothing changed) when no idle connection is at hand or requests are
        queued for one: the caller uses `request` then. Otherwise the connection, once the request
        was handed to its transport (from then on it may have reached the peer); `close()` on it
        abandons the request, as long as the sink has not had its answer. The cheapest way
        through: no task, no future, no await. Raises `ValueError` (nothing sent) as `request` does;
        `max_body` as in `request`."""
        idle = self._idle
        if not idle or self._closed or self._waiters:
            return None
        data, keep_alive = self._head(method, None, headers, body)
        while idle:
            conn = idle.popitem()[0]
            if conn.is_usable():
                conn.send_to(data, sink, keep_alive, max_body)
                return conn
            conn.close()
        return None

    def _head(
        self, method: str, target: str | None, headers: Mapping[str, str] | None, body: bytes | None
    ) -> tuple[bytes, bool]:
        """The request line, headers and body as one bytes object, and whether to keep alive."""
        if method not in _KNOWN_METHODS and not _TOKEN.fullmatch(method):
            raise ValueError("invalid HTTP method")
        target = self.target if target is None else _clean_target(target)
        keep_alive = self._keep_alive
        parts = [method, " ", target, " HTTP/1.1\r\n", self._fixed]
        if headers:
            lowered = [name.lower() for name in headers]
            if len(set(lowered)) != len(lowered) or not self._default_names.isdisjoint(lowered):
                parts[4] = self._merged_fixed(headers)
            else:
                extra = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
                _check_header_text(extra, len(lowered))
                parts.append(extra)
            if "connection" in lowered:
                value = [v for k, v in headers.items() if k.lower() == "connection"][-1]
                keep_alive = "close" not in value.lower()
        if body is not None:
            parts.append(f"Content-Length: {len(body)}\r\n")
        elif method == "POST" or method == "PUT" or method == "PATCH":
            parts.append("Content-Length: 0\r\n")
        if self._cookies:
            parts.append(self._cookie_line(headers))
        parts.append("\r\n")
        try:
            head = "".join(parts).encode("latin-1")
        except UnicodeEncodeError:
            # from None: the encoding error would carry the whole header value along.
            raise ValueError("a request header is not latin-1 encodable") from None
        return (head + body if body else head), keep_alive

    def _merged_fixed(self, headers: Mapping[str, str]) -> str:
        """The slow path: request headers replacing defaults (or each other) by name."""
        merged = dict(self._defaults)
        for name, value in headers.items():
            merged[name.lower()] = (name, value)
        merged.pop("content-length", None)  # the client writes the body's own length
        if self._cookies:
            merged.pop("cookie", None)  # folded into the jar's line by `_cookie_line`
        text = "".join([f"{name}: {value}\r\n" for name, value in merged.values()])
        _check_header_text(text, len(merged))
        return text

    def _cookie_line(self, headers: Mapping[str, str] | None) -> str:
        value = self._cookies.header()
        if headers:
            own = [v for k, v in headers.items() if k.lower() == "cookie"]
            if own:
                value = "; ".join([*own, value]) if value else "; ".join(own)
        if not value:
            return ""
        _check_header_text(value, 0)
        return f"Cookie: {value}\r\n"

    # -- the pool -----------------------------------------------------------------------------

    async def _new_connection(self, loop: asyncio.AbstractEventLoop, dedicated: bool = False) -> _Connection:
        """A connection for a request that found no idle one: a free slot, or wait for one (a
        `dedicated` one takes no slot: it is not counted, and closed after its response)."""
        deadline = None
        if dedicated:
            pass
        elif self._open < self.max_connections:
            self._open += 1
        else:
            deadline = loop.time() + self.connect_timeout_s
            handed = await self._wait_for_slot(loop)
            if handed is not None:
                return handed
        conn = _Connection(self, loop)
        conn.counted = not dedicated
        self._all.add(conn)
        timeout = self.connect_timeout_s if deadline is None else max(0.0, deadline - loop.time())
        tls = self._ssl
        try:
            async with asyncio.timeout(timeout):
                if self._proxy is None:
                    await loop.create_connection(
                        lambda: conn, self.host, self.port, ssl=tls, server_hostname=self.host if tls else None
                    )
                else:
                    sock = await self._tunnel(loop)
                    try:
                        await loop.create_connection(
                            lambda: conn, sock=sock, ssl=tls, server_hostname=self.host if tls else None
                        )
                    except BaseException:
                        sock.close()
                        raise
        except TimeoutError as exc:
            conn.close()
            via = f" through the egress proxy {self._proxy.shown}" if self._proxy is not None else ""
            raise ConnectTimeout(f"connecting to {self.host}:{self.port}{via} timed out") from exc
        except ConnectError:
            conn.close()
            raise
        except ssl.SSLError as exc:
            conn.close()
            raise TlsError(tls_failure_text(exc, self.host, self.port)) from exc
        except OSError as exc:  # refused, unreachable, DNS (gaierror), a close during the handshake
            conn.close()
            # asyncio reports a peer that closes in the middle of the handshake as a reset.
            reset = isinstance(exc, ConnectionResetError | ConnectionAbortedError)
            what = "during the TLS handshake " if tls is not None and reset else ""
            raise ConnectError(
                f"cannot connect to {self.host}:{self.port} {what}({type(exc).__name__}: {exc})"
            ) from exc
        except BaseException:
            conn.close()
            raise
        if self._closed:
            conn.close()
            raise ClientClosed("the HTTP client was closed while connecting")
        return conn

    async def _tunnel(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        """A connected socket to the origin through the egress proxy: TCP to the proxy, CONNECT,
        its 2xx answer read whole. Raises `ConnectError` (the proxy unreachable) or `ProxyRefused`.
        The caller's timeout bounds it; the socket is closed on any failure or cancellation."""
        proxy = self._proxy
        assert proxy is not None
        try:
            infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(f"cannot resolve the egress proxy {proxy.shown} ({type(exc).__name__}: {exc})") from exc
        error: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
                await loop.sock_sendall(sock, self._connect_head)
                status, reason = await _read_connect_answer(loop, sock)
            except OSError as exc:  # this address of the proxy: try the next
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            if 200 <= status < 300:
                return sock
            sock.close()
            raise ProxyRefused(_refusal_text(proxy, self.host, self.port, status, reason), status=status)
        detail = f"{type(error).__name__}: {error}" if error is not None else "no address"
        raise ConnectError(f"cannot connect to the egress proxy {proxy.shown} ({detail})") from error

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop) -> _Connection | None:
        """Wait for an idle connection (returned) or a free slot (None: the slot is ours)."""
        waiter: asyncio.Future[object] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(self.connect_timeout_s, _expire, waiter)
        try:
            handed = await waiter
        except BaseException:
            # Cancelled: whatever was handed to us meanwhile goes to the next in line.
            if waiter.done() and not waiter.cancelled():
                self._give_back(waiter.result())
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise
        finally:
            timer.cancel()
        if handed is _TIMED_OUT:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            raise PoolTimeout(
                f"no connection to {self.host}:{self.port} freed up within {self.connect_timeout_s} s "
                f"({self.max_connections} in use)"
            )
        if handed is _CLIENT_CLOSED:
            raise ClientClosed("the HTTP client was closed while waiting for a connection")
        return handed  # type: ignore[return-value]

    def _give_back(self, handed: object) -> None:
        if isinstance(handed, _Connection):
            self._put_back(handed)
        elif handed is None:
            self._release_slot()

    def _put_back(self, conn: _Connection) -> None:
        """A connection whose answer was read whole: to the oldest waiter, else to the idle set."""
        if self._closed or not conn.counted:  # closing, or dedicated
            conn.close()
            return
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle[conn] = None

    def _release_slot(self) -> None:
        self._open -= 1
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                self._open += 1  # the slot passes straight to the waiter, which will connect
                waiter.set_result(None)
                return

    def _drop(self, conn: _Connection) -> None:
        """A connection that is closing: out of the pool, its slot freed. Idempotent."""
        self._all.discard(conn)
        if not conn.counted:
            return
        conn.counted = False
        self._idle.pop(conn, None)
        self._release_slot()

    def set_ssl_context(self, context: ssl.SSLContext) -> None:
        """Connections opened from now on use `context` (renewed certificates, a new CA); those
        already open keep the handshake they made. For an https origin only."""
        if self._ssl is not None:
            self._ssl = context

    async def aclose(self) -> None:
        """Close every connection (busy ones too: their requests fail with ConnectionClosed) and
        refuse further requests with `ClientClosed`."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(_CLIENT_CLOSED)
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        if self._all and self._loop is not None:
            await asyncio.sleep(0)  # let connection_lost run, so that callers see their failures


def _fail_sink(response: Response, error: ClientError) -> None:
    sink = response._sink
    if sink is not None:
        response._sink = None
        sink.failed(error)


def _expire(waiter: asyncio.Future[object]) -> None:
    if not waiter.done():
        waiter.set_result(_TIMED_OUT)


def _check_header_text(text: str, lines: int) -> None:
    """`text` is `lines` header lines each ending in CRLF: any other CR, LF or NUL is an injection.

    Counting is three C-level scans over the whole block instead of a check per name and value.
    The message never quotes the text: header values can carry credentials."""
    if text.count("\r") != lines or text.count("\n") != lines or "\x00" in text:
        raise ValueError("a header name or value contains CR, LF or NUL")


def _clean_target(target: str) -> str:
    if not target.isascii():
        target = quote(target, safe=_TARGET_SAFE)
    if not target or _BAD_TARGET.search(target):
        raise ValueError("the request target contains spaces or control characters")
    return target


# ---------------------------------------------------------------------------------------------
# egress proxy and TLS messages
# ---------------------------------------------------------------------------------------------
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: ([^\r\n]*))?\r\n")


def _connect_head(literal_host: str, port: int, proxy: ProxyRoute) -> bytes:
    authority = f"{literal_host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.authorization is not None:
        if _FORBIDDEN.search(proxy.authorization):
            raise ValueError("the egress proxy's credentials contain CR, LF or NUL")
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_connect_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[int, str]:
    """The status and reason of the proxy's answer to CONNECT, read to the end of its head.

    After a 2xx the next bytes are the origin's, which speaks only once spoken to (TLS, or the
    request): anything beyond the head then is a broken proxy. Bounded by MAX_HEAD_BYTES."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await loop.sock_recv(sock, 4096)
        if not chunk:
            raise ConnectionResetError("the egress proxy closed the connection before answering CONNECT")
        head += chunk
        if len(head) > MAX_HEAD_BYTES:
            raise ConnectionResetError(f"the egress proxy's answer to CONNECT exceeds {MAX_HEAD_BYTES} bytes")
    end = head.index(b"\r\n\r\n") + 4
    match = _STATUS_LINE.match(head)
    if match is None:
        raise ConnectionResetError("the egress proxy answered CONNECT with something other than HTTP/1.x")
    status = int(match.group(1))
    reason = (match.group(2) or b"").decode("latin-1")
    if 200 <= status < 300 and len(head) > end:
        raise ConnectionResetError("the egress proxy sent bytes after its 2xx answer to CONNECT")
    return status, reason


def _printable(text: str, limit: int = 80) -> str:
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in text[:limit])
    return cleaned + ("…" if len(text) > limit else "")


def _refusal_text(proxy: ProxyRoute, host: str, port: int, status: int, reason: str) -> str:
    what = f"the egress proxy {proxy.shown} refused the tunnel to {host}:{port}: {status} {_printable(reason)}".rstrip()
    if status == 407:
        given = "were refused" if proxy.authorization is not None else "are missing"
        return f"{what} (its credentials {given}: the proxy URL takes them as http://user:password@host:port)"
    if status == 403:
        return f"{what} (its policy does not allow this destination or port)"
    if status in (502, 503, 504):
        return f"{what} (the proxy could not reach the upstream)"
    return what


# OpenSSL verification codes that mean "the issuer is not trusted" (a private CA not given).
_UNTRUSTED_CODES: Final = frozenset({2, 18, 19, 20, 21})


def tls_failure_text(exc: ssl.SSLError, host: str, port: int) -> str:
    """What failed in a TLS handshake with the upstream, from OpenSSL's codes (never secrets)."""
    where = f"TLS with the upstream {host}:{port} failed"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        message = _printable(str(exc.verify_message or exc.reason or "verification failed"), 160)
        if code in _UNTRUSTED_CODES:
            hint = "its issuer is not trusted: give the CA that issued it with --upstream-ca"
        elif code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
            hint = f"the certificate does not name {host}: the upstream URL must use a name it lists"
        elif code == 10:
            hint = "the certificate has expired"
        else:
            hint = "the certificate was not accepted"
        return f"{where}: the upstream's certificate was rejected ({message}); {hint}"
    reason = (exc.reason or type(exc).__name__).upper()
    text = _printable(reason.lower().replace("_", " "), 120)
    if "ALERT" in reason and any(k in reason for k in ("CERTIFICATE", "UNKNOWN_CA", "HANDSHAKE_FAILURE", "ACCESS")):
        return (
            f"{where}: the upstream refused the handshake ({text}): it requires a client certificate "
            "(--upstream-client-cert and --upstream-client-key) or does not accept the one given"
        )
    return f"{where} ({text})"
