"""A sans-I/O reader of HTTP/1.1 responses, on `httptools` (llhttp, in C).

Contract: `ResponseReader` turns the bytes of one connection into events, with no socket, task or
loop of its own: `expect()` announces a request; `feed(data)` parses what arrived and calls its
`ReaderEvents` synchronously — `on_head(status, reason, headers)` once per final answer,
`on_body(data)` per piece of body (de-chunked, still content-encoded), `on_end(keep_alive)` when
the answer is complete; `feed_eof()` says the peer closed, which ends a body delimited by the
close. Interim answers (1xx) are skipped. An answer to a HEAD request ends with its head, and
leaves the connection unusable (`on_end(False)`): the parser cannot be told that no body follows.

`feed` never raises for the peer's bytes: it returns a `ProtocolError` (never raised, so that its
traceback holds no frame and through it no connection) for an invalid response, for a head past
`MAX_HEAD_BYTES`, and an `UnsolicitedResponse` for bytes that came while no request awaited an
answer. An exception raised by an event callback is returned the same way, as a `ProtocolError`.
After an error the reader must not be fed again.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Protocol

import httptools

from proxy.upstream.h1.errors import ProtocolError
from proxy.upstream.h1.headers import Headers

__all__ = ["MAX_HEAD_BYTES", "Phase", "ReaderEvents", "ResponseReader", "UnsolicitedResponse"]

# A response's status line and headers larger than this fail the request (a peer sending an
# endless head must not grow the proxy's memory); checked after each read, so the bound is this
# plus one read.
MAX_HEAD_BYTES: Final = 64 * 1024
_NO_BODY_STATUSES: Final = frozenset({204, 304})


class Phase(Enum):
    """Where a `ResponseReader` is in the answer to the current request.

    IDLE (no request yet) -> AWAITING (`expect`) -> HEAD (a byte of the status line or a header
    came) -> BODY (the head is complete) -> DONE (`on_end`). An interim 1xx answer keeps HEAD; the
    answer to a HEAD request goes from HEAD to DONE. `expect` starts over at AWAITING."""

    IDLE = "idle"
    AWAITING = "awaiting"
    HEAD = "head"
    BODY = "body"
    DONE = "done"


# The members, bound once for the callbacks below, which read them about fifteen times per answer:
# on Python 3.11 every `Phase.X` goes through the Enum metaclass's `__getattr__` hook, about five
# times the cost of a plain attribute (2% of the proxy's instructions per relayed call).
_IDLE, _AWAITING, _HEAD, _BODY, _DONE = Phase.IDLE, Phase.AWAITING, Phase.HEAD, Phase.BODY, Phase.DONE


class ReaderEvents(Protocol):
    """Who hears what a `ResponseReader` read (called from inside `ResponseReader.feed`)."""

    def on_head(self, status: int, reason: str, headers: Headers) -> None:
        """The status line and headers of the answer (not of an interim 1xx) arrived."""
        ...

    def on_body(self, data: bytes) -> None:
        """A piece of the answer's body, transfer coding removed."""
        ...

    def on_end(self, keep_alive: bool) -> None:
        """The answer is complete; `keep_alive`: the connection may carry another request."""
        ...


class UnsolicitedResponse(ProtocolError):
    """Bytes of a response arrived while no request awaited one."""


class _HeadTooLarge(Exception):
    """The answer's head grew past `MAX_HEAD_BYTES` (reported as a ProtocolError)."""


class _Unexpected(Exception):
    """Raised inside a parser callback: the peer sent a response nobody asked for."""


class ResponseReader:
    """The responses of one connection, one request at a time (no pipelining).

    `phase` (a `Phase`; read it, never set it) is where the current answer is. `until_eof`: the
    current answer's body has neither a length nor chunked framing, so it ends when the connection
    does."""

    __slots__ = (
        "_events",
        "_head_bytes",
        "_head_only",
        "_items",
        "_parser",
        "_reason",
        "phase",
        "until_eof",
    )

    def __init__(self, events: ReaderEvents) -> None:
        self._events = events
        # Holds bound methods of this reader (a reference cycle): `close` drops it.
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._head_bytes = 0  # read while the head of the current answer is incomplete
        self._head_only = False
        self._items: list[tuple[str, str]] = []
        self._reason = ""
        self.phase = _IDLE
        self.until_eof = False

    @property
    def awaiting(self) -> bool:
        """A request was announced and its answer's head is not complete yet."""
        phase = self.phase
        return phase is _AWAITING or phase is _HEAD

    @property
    def started(self) -> bool:
        """Some of the current answer's head arrived (its status line, a header)."""
        phase = self.phase
        return phase is _HEAD or phase is _BODY or phase is _DONE

    def expect(self, head_only: bool = False) -> None:
        """A request went out: the next response is its answer (`head_only`: a HEAD request's)."""
        self.phase = _AWAITING
        self._head_only = head_only

    def feed(self, data: bytes) -> ProtocolError | None:
        """Parse `data`, calling the events for what it completes; the peer's error, if any."""
        parser = self._parser
        if parser is None:
            return None
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            kind = UnsolicitedResponse if isinstance(exc.__context__, _Unexpected) else ProtocolError
            return _invalid(kind, exc)
        phase = self.phase
        if phase is _AWAITING or phase is _HEAD:  # head incomplete
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                return _invalid(ProtocolError, _HeadTooLarge(f"the response head exceeds {MAX_HEAD_BYTES} bytes"))
        return None

    def feed_eof(self) -> bool:
        """The peer closed the connection. True if that ended a body delimited by the close (then
        `on_end(False)` was called); False if no body was coming or it was cut short."""
        if self.phase is _BODY and self.until_eof:
            self.phase = _DONE
            self._events.on_end(False)
            return True
        return False

    def close(self) -> None:
        """Done with the connection: drop the parser (and the reference cycle it makes)."""
        self._parser = None

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        phase = self.phase
        if phase is not _AWAITING and phase is not _HEAD:
            raise _Unexpected
        self._items = []
        self._reason = ""

    def on_status(self, reason: bytes) -> None:
        # Called once per read the reason phrase spans (httptools does not join the pieces).
        self.phase = _HEAD
        self._reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.phase is _AWAITING:  # not for a trailer, which comes in BODY
            self.phase = _HEAD
        self._items.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._head_bytes = 0
        parser = self._parser
        assert parser is not None  # callbacks run only inside feed_data
        status = parser.get_status_code()
        if status < 200:  # an interim answer (103 Early Hints...): the real one follows
            self.phase = _HEAD
            return
        headers = Headers(self._items)
        first = headers.first
        # HTTP/1.0 style when neither a length nor chunks frame the body: it ends with the connection.
        self.until_eof = (
            "content-length" not in first
            and "chunked" not in first.get("transfer-encoding", "").lower()
            and status not in _NO_BODY_STATUSES
        )
        head_only = self._head_only
        self.phase = _DONE if head_only else _BODY
        events = self._events
        events.on_head(status, self._reason, headers)
        if head_only:
            # The parser cannot be told the answer has no body: what it would read as one is
            # ignored, and the connection never reused (its next answer would be read as this body).
            events.on_end(False)

    def on_body(self, data: bytes) -> None:
        if self.phase is _BODY:  # not a HEAD answer's body
            self._events.on_body(data)

    def on_message_complete(self) -> None:
        # HEAD: an interim answer's end (the real one follows); DONE: a HEAD answer's, ended with its head
        if self.phase is not _BODY:
            return
        self.phase = _DONE
        self._events.on_end(self._parser.should_keep_alive())  # type: ignore[union-attr]


def _invalid(kind: type[ProtocolError], exc: Exception) -> ProtocolError:
    error = kind(f"the upstream sent an invalid HTTP response ({type(exc).__name__}: {exc})")
    error.__cause__ = exc
    return error
