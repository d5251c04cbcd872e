"""One response of the HTTP/1.1 client as its caller sees it, and `Sink`, who may take it instead.

Contract: a `Response` has its status line and headers; its body arrives from the connection
(`feed`, `finish`, `fail`), is decoded if it came gzip or deflate, bounded by `max_body`, and
buffered until read — once, whole (`read`, `take`) or chunk by chunk (`iter_chunks`). Its
connection goes back to the pool only when the body was read to its end (`release`); anything
else closes it, since a connection with an unread body cannot carry the next request. Above
`HIGH_WATER` buffered bytes nobody reads, the socket stops being read until the reader brings it
under `LOW_WATER`.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Final, Protocol

from proxy.upstream.h1.errors import BodyTooLarge, ClientError, ProtocolError, printable
from proxy.upstream.h1.headers import Headers

__all__ = ["HIGH_WATER", "LOW_WATER", "MAX_INFLATE_PER_READ", "Carrier", "Response", "Sink"]

# Above this many buffered, unconsumed body bytes the socket stops being read; below LOW it resumes.
HIGH_WATER: Final = 256 * 1024
LOW_WATER: Final = 64 * 1024
# What one read of a compressed body without a bound of its own (an event stream) may expand to:
# the message limit (one event is never larger). The proxy does not ask for compressed answers.
MAX_INFLATE_PER_READ: Final = 16 * 1024 * 1024

_DECODED_ENCODINGS: Final = frozenset({"gzip", "x-gzip", "deflate"})


class Sink(Protocol):
    """Who takes the answer of a request sent with `HttpClient.send_now`, from the connection's own
    callbacks (no task, no future). Called exactly once with `head`, then, if `head` returned
    True, exactly once with `done` or `failed`; or just once with `failed` if no head came."""

    def head(self, response: Response) -> bool:
        """The status line and headers arrived. True: call `done` once the whole body is in (read
        it with `Response.take`), or, if it set `response.on_chunk`, hand that each piece of the
        body as it arrives instead of buffering it (a stream read in the callbacks); False: the
        response is read the usual way by whoever took it."""
        ...

    def done(self, response: Response) -> None:
        """The whole body arrived (after `head` returned True)."""
        ...

    def failed(self, error: ClientError) -> None:
        """The connection broke (or the answer was invalid) before the response was complete."""
        ...


class _Decoder(Protocol):
    """A `zlib.decompressobj` (whose type has no public name)."""

    def decompress(self, data: bytes, max_length: int = ..., /) -> bytes: ...

    def flush(self) -> bytes: ...


class Carrier(Protocol):
    """What a response needs of the connection its body arrives on."""

    loop: asyncio.AbstractEventLoop
    paused: bool

    def pause(self) -> None:
        """Stop reading the socket (the body buffer is full)."""
        ...

    def resume(self) -> None:
        """Read the socket again."""
        ...

    def close(self) -> None:
        """Close the connection, whatever it was doing."""
        ...

    def response_done(self, reusable: bool) -> None:
        """The response let go of the connection: back to the pool if `reusable` (its body was
        read to the end) and the connection allows it, else closed."""
        ...


class Response:
    """One response: head parsed, body arriving on the connection.

    The body is kept as the list of chunks the parser delivered (one chunk, returned as is, in the
    common case) and read once. `max_body` bounds the decoded body (the request's `max_body`; a
    reader may change it once it has the head): past it the response fails with BodyTooLarge and
    the connection is closed. A compressed answer is never decoded beyond it. None: no bound (an
    event stream is bounded per event by its reader instead). `sink`: who hears `done` or
    `failed` for this body (`HttpClient.send_now`), if anybody; `on_chunk`: who takes each piece
    of the body (decoded and bounded) as it arrives instead of the buffer, if anybody. It is called
    from the connection's callbacks and must not raise."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_decoder",
        "_error",
        "_linger",
        "_read_all",
        "_received",
        "_waiter",
        "_want",
        "complete",
        "headers",
        "max_body",
        "on_chunk",
        "reason",
        "sink",
        "status",
    )

    def __init__(self, conn: Carrier, status: int, reason: str, headers: Headers) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.complete = False
        self._conn: Carrier | None = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._error: ClientError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._want = 0
        self._read_all = False
        self._linger: asyncio.TimerHandle | None = None  # set by `release_at_end`
        self._decoder: _Decoder | None = None
        encoding = headers.first.get("content-encoding")
        if encoding is not None and encoding.strip().lower() in _DECODED_ENCODINGS:
            self._decoder = zlib.decompressobj(wbits=47)  # zlib or gzip framing, auto-detected
        self.sink: Sink | None = None
        self.on_chunk: Callable[[bytes], None] | None = None
        self._received = 0  # body bytes so far, decoded
        self.max_body: int | None = None

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason!r} complete={self.complete}>"

    @property
    def error(self) -> ClientError | None:
        """Why the body cannot complete, once it cannot."""
        return self._error

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    # -- for the caller ------------------------------------------------------------------------

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

    async def next_chunk(self) -> bytes | None:
        """The next chunk of the body as it arrives, None at its end (what `iter_chunks` yields)."""
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
        the end and both sides allow keep-alive; otherwise it is closed. Idempotent; after
        `release_at_end`, the body's end (or its bound) decides instead."""
        conn = self._conn
        if conn is None or self._linger is not None:
            return
        self._conn = None
        conn.response_done(self.complete)

    def release_at_end(self, max_bytes: int, within_s: float) -> None:
        """Done with the response before its body ended (an event stream that gave what its reader
        wanted, and whose server closes it right after, as a Streamable HTTP server does after a
        POST's response): the connection goes back to the pool when the body ends, if what is left
        of it is at most `max_bytes` and ends within `within_s`; otherwise it is closed then, as
        `release` would have closed it at once. Whatever arrives meanwhile is dropped unread.
        Opening a new connection per answer costs the server a TCP accept and a new HTTP
        connection state every call; a client that reads to the end (wrk, nginx) keeps one."""
        conn = self._conn
        if conn is None or self._linger is not None:
            return
        if self.complete or self._error is not None:
            self.release()
            return
        self._chunks.clear()
        self._buffered = 0
        self.max_body = self._received + max_bytes
        self._read_all = True
        self._linger = conn.loop.call_later(within_s, self._close)
        if conn.paused:
            conn.resume()

    async def aclose(self) -> None:
        self.release()

    def _close(self) -> None:
        self._unlinger()
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.response_done(False)

    def _unlinger(self) -> None:
        linger = self._linger
        if linger is not None:
            self._linger = None
            linger.cancel()

    # -- for the connection --------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """A piece of the body arrived (transfer coding removed): decode, bound and buffer it."""
        decoder = self._decoder
        limit = self.max_body
        if decoder is not None:
            # Bounded, so that a small compressed chunk cannot expand to gigabytes at once: at
            # most one byte past the limit is produced (then the response fails below). A body
            # without a limit (an event stream, bounded per event by its reader) may expand to at
            # most MAX_INFLATE_PER_READ per read, past which it is a bomb, not an answer.
            try:
                if limit is None:
                    data = decoder.decompress(data, MAX_INFLATE_PER_READ + 1)
                    if len(data) > MAX_INFLATE_PER_READ:
                        self._too_large(MAX_INFLATE_PER_READ)
                        return
                else:
                    data = decoder.decompress(data, limit - self._received + 1)
            except zlib.error as exc:
                self._undecodable(exc)
                return
            if not data:
                return
        received = self._received = self._received + len(data)
        if limit is not None and received > limit:
            self._too_large(limit)
            return
        if self._linger is not None:
            return  # released at its end: nobody reads it
        on_chunk = self.on_chunk
        if on_chunk is not None:
            on_chunk(data)
            return
        self._chunks.append(data)
        buffered = self._buffered = self._buffered + len(data)
        if self._waiter is not None and buffered >= self._want:
            self._wake()
        if buffered > HIGH_WATER and not self._read_all:
            conn = self._conn
            if conn is not None and not conn.paused:
                conn.pause()

    def finish(self) -> None:
        """The body ended: the response is complete (or fails, if its decoded tail is too large)."""
        decoder = self._decoder
        if decoder is not None:
            try:
                tail = decoder.flush()
            except zlib.error as exc:
                self._undecodable(exc)
                return
            limit = self.max_body
            if tail and limit is not None and self._received + len(tail) > limit:
                self._too_large(limit)
                return
            if tail and self._linger is None:
                if self.on_chunk is not None:
                    self.on_chunk(tail)
                else:
                    self._chunks.append(tail)
                    self._buffered += len(tail)
        self.complete = True
        if self._linger is not None:
            self._chunks.clear()
            self._buffered = 0
            self._unlinger()
            self.release()
            return
        self._wake()
        sink = self.sink
        if sink is not None:
            self.sink = None
            sink.done(self)

    def fail(self, error: ClientError) -> None:
        """The body cannot complete: readers get `error` raised, the sink `failed`."""
        self._error = error
        if self._linger is not None:
            self._close()
            return
        self._wake()
        sink = self.sink
        if sink is not None:
            self.sink = None
            sink.failed(error)

    def _too_large(self, limit: int) -> None:
        """The body outgrew its bound: fail the response, drop what arrived, close the connection
        (the rest of the body would be read as the next answer)."""
        self._chunks.clear()
        self._buffered = 0
        self.fail(BodyTooLarge(limit))
        conn = self._conn
        if conn is not None:
            conn.close()

    def _undecodable(self, exc: zlib.error) -> None:
        """The body does not decode as its `Content-Encoding` says: fail the response and close
        the connection, as for a body past its bound (the peer's bytes never raise out of `feed`)."""
        self._chunks.clear()
        self._buffered = 0
        encoding = printable(self.headers.first.get("content-encoding", "").strip().lower(), 16)
        self.fail(ProtocolError(f"the upstream's answer body does not decode as {encoding} ({printable(str(exc))})"))
        conn = self._conn
        if conn is not None:
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
        data = await self._response.next_chunk()
        if data is None:
            raise StopAsyncIteration
        return data
