"""An answer read in the connection's own callbacks: `Flight`, the `h1.Sink` of a POST that
`HttpLink.send_request` wrote at once on an idle pooled connection.

Contract: a 2xx `application/json` or `text/event-stream` answer is read and its messages routed
(`HttpLink.route_stream_message`) from the callbacks, with no task per request; anything else
(an error status, a 404 of an expired session) is handed to an exchange task
(`HttpLink._spawn_exchange`) that continues exactly where the task that POSTs would be. An event
stream's tail, once the response came, is dropped up to its end (`STREAM_TAIL_*`), so that the
connection carries the next request; a stream that breaks or ends before its response is resumed
from its last event id in a task (`HttpLink.resume_in_task`), or fails as the task's would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.upstream.base import Exchange, mark_heard
from proxy.upstream.h1 import ClientError, Connection, Response
from proxy.upstream.sse.parse import SseError
from proxy.upstream.streamable.messages import SseMessages, StreamState, content_type, json_messages

if TYPE_CHECKING:
    from proxy.upstream.streamable.link import HttpLink

# What is left of a POST's event stream once its response came, read so that its connection is
# reused: its end comes at once from a server that closes the stream after the response; a
# server that keeps it open loses the connection after this long, as if it were closed at once.
STREAM_TAIL_BYTES = 16 * 1024
STREAM_TAIL_S = 1.0


class Flight:
    """An exchange whose POST `send_request` wrote at once on an idle pooled connection (the
    `h1.Sink` of that request): a 2xx answer, `application/json` or `text/event-stream`, is read
    and delivered from the connection's own callbacks, with no task; any other answer (an error
    status, a 404 of an expired session) goes to an exchange task that continues exactly where
    `_post_exchange` would be after its POST. `abort()` (cancel, close) closes the connection
    while the answer is still coming.

    An event stream is read as the exchange task reads one: its messages (`SseMessages`) routed
    as each chunk arrives, the rest of the stream once the response came dropped up to its end
    (bounded: `release_at_end`) so that the connection carries the next request; a stream that
    breaks or ends before the response is resumed from its last event id in a task
    (`HttpLink._resume_or_fail`), or fails as the task's would."""

    __slots__ = ("conn", "ex", "extra", "headers", "link", "message", "reader", "response")

    def __init__(
        self,
        link: HttpLink,
        ex: Exchange,
        message: Message,
        headers: dict[str, str],
        extra: Mapping[str, str] | None,
    ) -> None:
        self.link = link
        self.ex = ex
        self.message = message
        self.headers = headers  # as sent
        self.extra = extra  # the caller's own, for a POST sent again (an expired 2025 session)
        self.conn: Connection | None = None  # while the answer is coming on it
        self.reader: SseMessages | None = None  # an event stream's, while it is read here
        self.response: Response | None = None  # the event stream's, while it is read here

    def head(self, response: Response) -> bool:
        heard(self.ex)
        status = response.status
        if 200 <= status < 300 and status != 202:
            ctype = content_type(response)
            if ctype == "application/json":
                self.link.accepted(self.headers)
                return True
            if ctype == "text/event-stream":
                self.link.accepted(self.headers)
                response.max_body = None  # a stream is bounded per event, by its reader
                self.reader = SseMessages(StreamState(), self.link.owner.max_event_bytes)
                self.response = response
                response.on_chunk = self._chunk
                return True
        self.conn = None  # the task owns the response now: cancelling it closes the connection
        self.link.continue_in_task(self.ex, self.message, self.extra, (response, self.headers))
        return False

    def _chunk(self, data: bytes) -> None:
        """A piece of the event stream (`Response.on_chunk`): the messages it completes, routed."""
        response, reader = self.response, self.reader
        if response is None or reader is None:
            return
        ex, link = self.ex, self.link
        try:
            for msg in reader.feed(data):
                if link.route_stream_message(ex, response, msg):
                    # The server ends a POST's stream after its response: read that end
                    # (bounded), so that the connection carries the next request.
                    self._settle()
                    response.release_at_end(STREAM_TAIL_BYTES, STREAM_TAIL_S)
                    return
        except SseError as exc:
            self._settle()
            response.release()  # cut short: closes the connection, whose rest is unusable
            if not ex.cancelled:
                self._broken(link.owner.translate(exc, True), reader.state)

    def done(self, response: Response) -> None:
        reader = self.reader
        ex = self.ex
        self._settle()
        link = self.link
        if reader is not None:  # an event stream that ended before its response
            response.release()
            if unanswered(ex):
                self._broken(no_answer(), reader.state)
            return
        try:
            messages = json_messages(response.take())
        except UpstreamFailure as failure:
            if not ex.cancelled:
                link.fail(ex, failure)
            return
        for msg in messages:
            if link.route_stream_message(ex, response, msg):
                return
        if unanswered(ex):
            link.fail(ex, no_answer())

    def failed(self, error: ClientError) -> None:
        reader = self.reader
        self._settle()
        wake(self.ex)
        if not self.ex.cancelled:
            failure = self.link.owner.translate(error, True)
            if reader is None:
                self.link.fail(self.ex, failure)
            else:
                self._broken(failure, reader.state)

    def abort(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()  # the connection's loss reaches `failed`, which a cancelled exchange ignores

    def _settle(self) -> None:
        """The answer is in, or will not come here: nothing more is read in the callbacks. Undoes
        the references between flight, exchange and stream (cycles, once the answer is in)."""
        self.conn = None
        response = self.response
        if response is not None:
            self.response = self.reader = None
            response.on_chunk = None
            response.sink = None
        if self.ex.transport_state is self:
            self.ex.transport_state = None

    def _broken(self, failure: UpstreamFailure, state: StreamState) -> None:
        """The stream broke or ended before the response: resumed from its last event id if it
        gave one (as the exchange task would), else the exchange fails with `failure`."""
        if state.last_event_id is not None:
            self.link.resume_in_task(self.ex, state, failure)
        else:
            self.link.fail(self.ex, failure)


def no_answer() -> UpstreamFailure:
    """The failure of an exchange whose answer ended without its response (either path)."""
    return UpstreamFailure(
        FailureKind.CLOSED, Dispatch.UNKNOWN, "the upstream closed the response stream before the response arrived"
    )


def unanswered(ex: Exchange) -> bool:
    """Whether `ex` still waits for its response (not answered, failed or cancelled meanwhile)."""
    return not (ex.cancelled or ex.response.done())


def heard(ex: Exchange) -> None:
    mark_heard(ex)


def wake(ex: Exchange) -> None:
    waiter = ex.on_heard
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
