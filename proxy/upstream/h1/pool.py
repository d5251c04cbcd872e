"""`HttpClient`: the HTTP/1.1 keep-alive pool to one upstream origin, and its two ways to send.

Contract: at most `max_connections` connections exist (idle, busy or connecting); a request that
finds no idle connection and no free slot waits its turn (arrival order) for one. That wait is
bounded by the request, not by the pool: by its caller (cancelling the request ends the wait, and
a connection or slot handed to it meanwhile passes on), or by the request's own `wait_s`
(`PoolTimeout`) when it gives one; a busy pool is not an unreachable upstream, and a request that
may run a minute may wait as long for its turn. The TCP connect, the CONNECT tunnel and the TLS
handshake are bounded by `connect_timeout_s` (`ConnectTimeout`), counted from when the request has
its slot. A connection returns to the pool only after its answer was read
whole; `aclose` fails every request in flight and refuses new ones (`ClientClosed`). No retry of
any kind: a failed request is reported, never repeated.

Loop binding: a client may be built anywhere, and binds to the running loop on its first request;
every later request must run on that same loop (the loop is cached because asking for it costs a
`getpid()` on Python 3.11).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Final, TypeAlias
from urllib.parse import urlsplit

from proxy.net.egress import ProxyRoute
from proxy.upstream.h1.connection import Connection
from proxy.upstream.h1.errors import (
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectTimeout,
    InvalidURL,
    PoolTimeout,
    TlsError,
    tls_failure_text,
)
from proxy.upstream.h1.headers import CookieJar, RequestWriter, clean_target, has_bad_host_characters
from proxy.upstream.h1.response import Response, Sink
from proxy.upstream.h1.tunnel import Tunnel

__all__ = ["HttpClient"]

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


class _NoConnection(Enum):
    """Why a request waiting for a connection was woken without one (besides None: a free slot)."""

    TIMED_OUT = "timed out"
    CLIENT_CLOSED = "client closed"


# What a waiter is handed: an idle connection, None (a free slot, now the waiter's), or why neither.
_Handed: TypeAlias = Connection | _NoConnection | None


class HttpClient:
    """An HTTP/1.1 keep-alive pool to the one origin of `url`.

    At most `max_connections` connections exist (idle, busy or connecting); idle ones are reused
    last-in first-out, so a burst's extra connections age out on the server side while the hot
    one stays warm. A request that finds no idle connection and no free slot waits for one, as
    long as its caller lets it (or its `wait_s`); the TCP connect and TLS handshake are bounded by
    `connect_timeout_s`. Default headers are written on every request; a request header of the same name
    (case-insensitive) replaces the default (`writer`, which writes every request head).
    `cookies` are the origin's, from its answers' `Set-Cookie`."""

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
        if has_bad_host_characters(host):
            raise InvalidURL("the URL's host contains invalid characters")
        self.scheme = scheme
        self.host = host
        self.port = port if port is not None else _DEFAULT_PORTS[scheme]
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        target = clean_target(target)
        literal = f"[{host}]" if ":" in host else host
        host_header = literal if port is None or port == _DEFAULT_PORTS[scheme] else f"{literal}:{port}"
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        if scheme == "https":
            self._ssl: ssl.SSLContext | None = ssl_context or ssl.create_default_context()
        else:
            self._ssl = None
        self._proxy = proxy
        self._tunnel = Tunnel(proxy, literal, host, self.port) if proxy is not None else None
        self.cookies = CookieJar()
        self.writer = RequestWriter(target, host_header, headers, self.cookies)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[Connection, None] = {}  # insertion-ordered: popitem() is LIFO
        self._all: set[Connection] = set()
        self._open = 0  # slots taken: connecting, busy and idle connections
        self._waiters: collections.deque[asyncio.Future[_Handed]] = collections.deque()
        self._closed = False

    def __repr__(self) -> str:
        return f"<HttpClient {self.scheme}://{self.host}:{self.port} open={self._open}>"

    @property
    def target(self) -> str:
        """The request target of the URL (path and query), what a request without one is sent to."""
        return self.writer.target

    @property
    def tls(self) -> bool:
        """Whether the origin is https (every connection is TLS)."""
        return self._ssl is not None

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
        wait_s: float | None = None,
    ) -> Response:
        """Send one request and return once the answer's status line and headers are parsed.

        `dedicated`: on a connection of its own, outside the pool's `max_connections` and closed
        when the response is released (a long-lived event stream, one per upstream session, that
        must not take a place the requests need).

        `wait_s`: the longest this request waits for a pooled connection when all are busy
        (`PoolTimeout`, nothing sent); None: as long as its caller lets it, which a caller without
        a deadline of its own must not choose.

        `on_write` runs synchronously right before the single write that carries the request: if
        it has not run, nothing of the request reached the peer. `max_body` bounds the answer's
        decoded body from its first byte on (`Response.max_body`; the reader may lift it once it
        sees the head, e.g. for an event stream it bounds per event). Raises `ValueError` (nothing
        sent) for a header name or value with CR, LF or NUL, `ConnectError` while establishing the
        connection, `ConnectionClosed`/`ProtocolError` after the request was written."""
        data, keep_alive = self.writer.encode(method, target, headers, body)
        if self._closed:
            raise ClientClosed("the HTTP client is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        conn: Connection | None = None
        idle = self._idle if not dedicated else {}
        now = time.monotonic() if idle else 0.0
        while idle:
            conn = idle.popitem()[0]
            if conn.reusable(now):
                break
            conn.close()
            conn = None
        if conn is None:
            conn = await self._new_connection(loop, dedicated, wait_s)
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
        data, keep_alive = self.writer.encode(method, None, headers, body)
        now = time.monotonic()
        while idle:
            conn = idle.popitem()[0]
            if conn.reusable(now):
                conn.send_to(data, sink, keep_alive, max_body)
                return conn
            conn.close()
        return None

    # -- the pool -----------------------------------------------------------------------------

    async def _new_connection(
        self, loop: asyncio.AbstractEventLoop, dedicated: bool = False, wait_s: float | None = None
    ) -> Connection:
        """A connection for a request that found no idle one: a free slot, or wait for one (a
        `dedicated` one takes no slot: it is not counted, and closed after its response)."""
        if dedicated:
            pass
        elif self._open < self.max_connections:
            self._open += 1
        else:
            handed = await self._wait_for_slot(loop, wait_s)
            if handed is not None:
                return handed
        conn = Connection(self, loop)
        conn.counted = not dedicated
        self._all.add(conn)
        tls = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self._tunnel is None:
                    await loop.create_connection(
                        lambda: conn, self.host, self.port, ssl=tls, server_hostname=self.host if tls else None
                    )
                else:
                    sock = await self._tunnel.open(loop)
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

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop, wait_s: float | None) -> Connection | None:
        """Wait for an idle connection (returned) or a free slot (None: the slot is ours): until
        the caller cancels, or at most `wait_s` when given."""
        waiter: asyncio.Future[_Handed] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(wait_s, _expire, waiter) if wait_s is not None else None
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
            if timer is not None:
                timer.cancel()
        if handed is _NoConnection.TIMED_OUT:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            raise PoolTimeout(
                f"no connection to {self.host}:{self.port} freed up within {wait_s} s ({self.max_connections} in use)"
            )
        if handed is _NoConnection.CLIENT_CLOSED:
            raise ClientClosed("the HTTP client was closed while waiting for a connection")
        return handed

    def _give_back(self, handed: _Handed) -> None:
        if isinstance(handed, Connection):
            self.put_back(handed)
        elif handed is None:
            self._release_slot()

    def put_back(self, conn: Connection) -> None:
        """A connection whose answer was read whole: to the oldest waiter, else to the idle set
        (what a connection calls, once its response let go of it)."""
        if self._closed or not conn.counted:  # closing, or dedicated
            conn.close()
            return
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_since = time.monotonic()
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

    def drop(self, conn: Connection) -> None:
        """A connection that is closing: out of the pool, its slot freed. Idempotent (what a
        connection calls when it closes or is lost)."""
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
                waiter.set_result(_NoConnection.CLIENT_CLOSED)
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        if self._all and self._loop is not None:
            await asyncio.sleep(0)  # let connection_lost run, so that callers see their failures


def _expire(waiter: asyncio.Future[_Handed]) -> None:
    if not waiter.done():
        waiter.set_result(_NoConnection.TIMED_OUT)
