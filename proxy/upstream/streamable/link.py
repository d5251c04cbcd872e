"""What both Streamable HTTP eras share: a link's requests, each POSTed and its answer read, at
the JSON-RPC message level.

`HttpLink` (subclassed by `HttpModernLink` and `HttpLegacyLink`) implements `UpstreamLink`:
- `send_request` POSTs the message and returns its `Exchange` once the request started going out
  (a failure before that is raised: dispatch no); from then on the exchange's future gets the
  response, or the `UpstreamFailure` with dispatch unknown. Cancelled after the request started
  going out, it calls the caller's `on_write` and cancels the request itself (the caller has no
  exchange to cancel). Two ways through, the same outcome:
  * When a pooled connection is idle, the request is written at once (`h1.HttpClient.send_now`)
    and a 2xx answer, `application/json` or an event stream, is read and delivered from the
    connection's own callbacks (`Flight`, an `h1.Sink`): no task per request. Any other answer
    (an error status, a forgotten session) is handed to an exchange task, which continues
    exactly where it would be after its own POST; a stream that breaks before its response is
    resumed in a task.
  * Otherwise an exchange task (`_run_exchange`) POSTs, reads the answer (JSON or an event
    stream, `messages.py`), and delivers what it carries: the response resolves the exchange,
    the server's requests and notifications on the request's stream go to its `on_message`, and
    what belongs to no request to the unsolicited handler. Once the response came, the rest of
    an event stream is read to its end (bounded, `STREAM_TAIL_*`, unread), so that the
    connection goes back to the pool instead of being closed.
- `cancel` marks the exchange cancelled, tells the upstream if the era does that, and ends the
  POST (its stream closed, its task cancelled); `aclose` fails every pending exchange.

Failures: anything the client raises is translated by the upstream (`HttpClientOwner.translate`);
an exchange's `written` turns true when its request starts going out, so a failure from then on
has dispatch unknown. A 404 (or a 400 naming the session) to a request that carried a session id
is raised as `Expired` (the 2025 link re-establishes its session) or as the era's refusal.

The eras fill in hooks: the headers of a request, what a request or an accepted answer changes
(the 2025 session), cancelling on the wire, resuming a broken stream, and closing the session.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import Message, dumps, is_response
from proxy.upstream.base import Era, Exchange, Health, LinkBase, OnMessage, PendingTable, ours
from proxy.upstream.h1 import Response
from proxy.upstream.sse.parse import SseError
from proxy.upstream.streamable.failures import (
    CLIENT_ERRORS,
    bounded_detail,
    forgot_session,
    read_bounded,
    status_failure_of,
)
from proxy.upstream.streamable.flight import (
    STREAM_TAIL_BYTES,
    STREAM_TAIL_S,
    Flight,
    heard,
    no_answer,
    unanswered,
)
from proxy.upstream.streamable.headers import post_headers
from proxy.upstream.streamable.messages import StreamState, answer_messages
from proxy.upstream.streamable.owner import HttpClientOwner
from proxy.upstream.streamable.posts import SmallAnswer, post_small

log = logging.getLogger(__name__)


class Expired(Exception):
    """The upstream forgot the session a request carried (a 404, or a 400 naming the session;
    handled inside the legacy link)."""


class HttpLink(LinkBase):
    """What both eras share: the exchange task that POSTs and reads the response stream."""

    era: Era

    def __init__(self, upstream: HttpClientOwner, prefix: str) -> None:
        self.owner = upstream
        self._health = upstream.health
        self._client = upstream.client
        self._pending = PendingTable(prefix=prefix)
        self._unsolicited: OnMessage = _drop
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Set while the legacy standalone GET stream is being opened (see `_opened`).
        self._opening: asyncio.Future[None] | None = None

    @property
    def closed(self) -> bool:
        """Whether `aclose` ran: the link takes no more requests."""
        return self._closed

    # -- UpstreamLink ---------------------------------------------------------------------

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        if self._closed:
            raise UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, "the upstream link is closed")
        if self._opening is not None:
            await self._opened()
        self._before_request(message)
        ex = self._pending.add(message, on_message)
        if self._client.idle:
            # A pooled connection is free: write the request now; the answer comes back through
            # the connection's callbacks (`Flight`), with a task only if it is not plain JSON.
            h = self._post_headers(message, headers)
            flight = Flight(self, ex, message, h, headers)
            try:
                flight.conn = self._client.send_now(
                    "POST", headers=h, body=dumps(message), sink=flight, max_body=self.owner.max_event_bytes
                )
            except ValueError:
                self._pending.discard(ex)
                raise _invalid_header() from None
            if flight.conn is not None:
                ex.written = True
                if on_write is not None:
                    on_write()
                ex.transport_state = flight
                return ex
        # the exchange's loop (its table's), asked once for the request
        sent: asyncio.Future[None] = ex.response.get_loop().create_future()
        task = self._spawn_exchange(ex, message, dict(headers or {}), sent)
        try:
            await asyncio.shield(sent)
        except UpstreamFailure:
            self._pending.discard(ex)
            raise
        except asyncio.CancelledError:
            if ex.written:
                # Cancelled between the request going out and this returning: the caller gets no
                # exchange to cancel, so it is cancelled here as one that was sent (2025: the
                # notification; 2026: the POST closed), or the server would run it to its end;
                # and the caller hears it went out (the exchange task wrote it: `on_write` is
                # called here, in the caller's task, before its cancellation goes on).
                if on_write is not None:
                    on_write()
                cancelling = ex.response.get_loop().create_task(self.cancel(ex, "request cancelled by the proxy"))
                self._tasks.add(cancelling)
                cancelling.add_done_callback(self._tasks.discard)
            else:
                self._pending.discard(ex)
                task.cancel()
            raise
        if on_write is not None:
            on_write()
        return ex

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        raise NotImplementedError  # each era posts a notification its own way

    async def send_response(self, message: Message) -> None:
        await self.send_notification(message)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        exchange.cancelled = True
        self._pending.discard(exchange)
        await self._cancel_on_wire(exchange, reason)
        task = exchange.transport_state
        if isinstance(task, Flight):
            task.abort()
            task = exchange.transport_state  # a task, if the answer was handed over to one
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=2.0)
        self._pending.fail(
            exchange,
            UpstreamFailure(
                FailureKind.CLOSED,
                Dispatch.UNKNOWN if exchange.written else Dispatch.NO,
                "the proxy cancelled the request",
            ),
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ex in self._pending.exchanges():
            if isinstance(ex.transport_state, Flight):
                ex.transport_state.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        self._pending.fail_all(FailureKind.CLOSED, "the proxy closed the upstream link")
        await self._close_session()
        self.owner.forget(self)

    def _spawn_exchange(
        self,
        ex: Exchange,
        message: Message,
        extra: dict[str, str],
        sent: asyncio.Future[None],
        first: FirstAnswer | None = None,
    ) -> asyncio.Task[None]:
        """The exchange task of `ex`, kept (and cancelled by `cancel`/`aclose`) by the link."""
        task = ex.response.get_loop().create_task(self._run_exchange(ex, message, extra, sent, first))
        ex.transport_state = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._exchange_ended, ex))
        return task

    def _exchange_ended(self, ex: Exchange, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # A task that ended cancelled keeps its CancelledError, whose traceback holds the task's
        # frames, which hold the exchange: without this the three form a cycle.
        if ex.transport_state is task:
            ex.transport_state = None

    # -- for an answer read in the connection's callbacks (`Flight`) ---------------------------
    def continue_in_task(
        self, ex: Exchange, message: Message, extra: Mapping[str, str] | None, first: FirstAnswer
    ) -> None:
        """An answer that is not read in the callbacks (an error status, an expired session):
        an exchange task takes it, where `_post_exchange` is after its POST (already sent)."""
        sent: asyncio.Future[None] = ex.response.get_loop().create_future()
        sent.set_result(None)
        self._spawn_exchange(ex, message, dict(extra or {}), sent, first)

    def fail(self, ex: Exchange, failure: UpstreamFailure) -> None:
        """`ex` ends with `failure` (its answer will not come)."""
        self._pending.fail(ex, failure)

    def resume_in_task(self, ex: Exchange, state: StreamState, failure: UpstreamFailure) -> None:
        """A POST stream read in the callbacks (`Flight`) broke or ended before its response,
        with an event id to resume from: resumed in a task of the link's (`_resume_or_fail`)."""
        task = ex.response.get_loop().create_task(self._resume_or_fail(ex, state, failure))
        ex.transport_state = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._exchange_ended, ex))

    async def _resume_or_fail(self, ex: Exchange, state: StreamState, failure: UpstreamFailure) -> None:
        """What `_post_exchange` does once its stream broke or ended unanswered: resume it, and
        fail the exchange with `failure` if that brings no response."""
        try:
            if await self._resume(ex, state):
                return
        except asyncio.CancelledError as cancelled:
            untraced(cancelled)
            raise
        except Exception as exc:  # a bug here must not leave the caller waiting forever
            log.exception("resuming an upstream stream failed")
            failure = _internal_error(exc, Dispatch.UNKNOWN)
        if unanswered(ex):
            self._pending.fail(ex, untraced(failure))

    async def _opened(self) -> None:
        """Requests wait (bounded) until the standalone GET stream is open: a server sends what is
        not tied to a request there, and drops it if the stream is not open yet."""
        opening = self._opening
        if opening is not None and not opening.done():
            await asyncio.wait({opening}, timeout=self.owner.connect_timeout_s)
        if self._opening is opening:
            self._opening = None

    # -- hooks for the eras ---------------------------------------------------------------
    def _before_request(self, message: Message) -> None:
        return None

    def _request_headers(self, message: Message) -> dict[str, str]:
        raise NotImplementedError

    async def _cancel_on_wire(self, exchange: Exchange, reason: str | None) -> None:
        return None

    async def _close_session(self) -> None:
        return None

    def _on_response(self, ex: Exchange, response: Response, message: Message) -> None:
        return None

    def accepted(self, headers: Mapping[str, str]) -> None:
        """The upstream answered 2xx to a request sent with `headers`."""
        return None

    def _forgotten(self, headers: Mapping[str, str]) -> BaseException:
        """What a 404 (or a 400 naming the session) to a request that carried a session id means."""
        return Expired()

    async def _resume(self, ex: Exchange, state: StreamState) -> bool:
        """Try to recover the rest of a broken response stream; True when the response arrived."""
        return False

    async def _run_exchange(
        self,
        ex: Exchange,
        message: Message,
        extra: dict[str, str],
        sent: asyncio.Future[None],
        first: FirstAnswer | None = None,
    ) -> None:
        try:
            await self._attempt_loop(ex, message, extra, sent, first)
        except UpstreamFailure as failure:
            untraced(failure)
            if not ex.written and not sent.done():
                sent.set_exception(failure)
                sent.exception()
            else:
                self._pending.fail(ex, failure)
        except asyncio.CancelledError as cancelled:
            if not sent.done():
                sent.set_exception(
                    UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, "the proxy closed the upstream link")
                )
                sent.exception()
            # The error is also kept by the future it came out of (h1's, in a frame of the
            # request) and by this task: its frames below would be a cycle with them.
            untraced(cancelled)
            raise
        except Exception as exc:  # a bug here must not leave the caller waiting forever
            log.exception("upstream exchange task failed")
            internal = _internal_error(exc, Dispatch.UNKNOWN if ex.written else Dispatch.NO)
            if not sent.done():
                sent.set_exception(untraced(internal))
                sent.exception()
            self._pending.fail(ex, internal)
        finally:
            if not sent.done():
                sent.set_result(None)

    async def _attempt_loop(
        self,
        ex: Exchange,
        message: Message,
        extra: dict[str, str],
        sent: asyncio.Future[None],
        first: FirstAnswer | None,
    ) -> None:
        await self._post_exchange(ex, message, extra, sent, first)

    async def _post_exchange(
        self,
        ex: Exchange,
        message: Message,
        extra: dict[str, str],
        sent: asyncio.Future[None],
        first: FirstAnswer | None,
    ) -> None:
        """One POST of `message` and the reading of its answer, for exchange `ex`; with `first`,
        the POST was already sent (by `send_request`) and this is its answer and headers."""
        headers = self._post_headers(message, extra) if first is None else first[1]

        def on_write() -> None:
            ex.written = True
            if not sent.done():
                sent.set_result(None)

        state = StreamState()
        try:
            if first is None:
                try:
                    response = await self._client.request(
                        "POST",
                        headers=headers,
                        body=dumps(message),
                        on_write=on_write,
                        max_body=self.owner.max_event_bytes,
                    )
                except ValueError:
                    if ex.written:
                        raise  # not the client refusing a header: an internal error, below
                    raise _invalid_header() from None
            else:
                response = first[0]
            async with response:
                ex.written = True  # an answer came: the request reached the peer
                heard(ex)
                if not sent.done():
                    sent.set_result(None)
                status = response.status
                # A 404 (or a 400 naming the session) to a request that carried a session id is a
                # refusal before processing: this request was not executed. Nor is it heard: a
                # request sent again (on a re-established session) is taken only when the head of
                # its own answer comes, which its cancellation waits for.
                if status == 404 and self._sent_session(headers):
                    response.release()
                    ex.written = ex.heard = False
                    raise self._forgotten(headers)
                if not 200 <= status < 300:
                    raw = await read_bounded(response)
                    if status == 400 and self._sent_session(headers) and forgot_session(raw):
                        ex.written = ex.heard = False
                        raise self._forgotten(headers)
                    raise status_failure_of(response, raw, ex.upstream_id)
                self.accepted(headers)
                if status == 202:
                    raise UpstreamFailure(
                        FailureKind.PROTOCOL,
                        Dispatch.UNKNOWN,
                        "upstream answered a request with 202 Accepted and no response",
                    )
                async for msg in answer_messages(response, state, self.owner.max_event_bytes):
                    if self.route_stream_message(ex, response, msg):
                        # The server ends a POST's stream after its response: read that end
                        # (bounded), so that the connection carries the next request.
                        response.release_at_end(STREAM_TAIL_BYTES, STREAM_TAIL_S)
                        return
        except (Expired, UpstreamFailure):
            raise
        except (*CLIENT_ERRORS, SseError) as exc:
            untraced(exc)  # stored by the response it came from, whose frames it holds
            if ex.cancelled:
                return
            if state.last_event_id is not None and await self._resume(ex, state):
                return
            raise self.owner.translate(exc, ex.written) from None
        if not unanswered(ex):
            return
        if state.last_event_id is not None and await self._resume(ex, state):
            return
        raise no_answer()

    def _post_headers(self, message: Message, extra: Mapping[str, str] | None) -> dict[str, str]:
        """The headers of `message`'s POST, on either path: the caller's `extra`, then the era's."""
        return post_headers({**(extra or {}), **self._request_headers(message)})

    def _sent_session(self, headers: Mapping[str, str]) -> bool:
        return False

    def route_stream_message(self, ex: Exchange, response: Response, msg: Message) -> bool:
        """Deliver one message read from `ex`'s own response stream. True once `ex` is answered."""
        if is_response(msg) or ("id" in msg and "method" not in msg):
            msg_id = msg.get("id")
            if msg_id is None or (msg_id == ex.upstream_id and ours(msg_id)):
                if msg_id is None:  # an error for our request sent before its id was parsed
                    msg = {**msg, "id": ex.upstream_id}
                self._on_response(ex, response, msg)
                self._pending.resolve(msg)
                if self._health.state is not Health.UP:  # the one check an answer pays for the gauge
                    self._health.answered()
                return True
            self._pending.resolve(msg)  # another exchange's (a resumed stream); unknown ids are dropped
            return False
        if ex.cancelled:
            return False
        if ex.on_message is not None:
            ex.on_message(msg)
        else:
            self._deliver_unsolicited(msg)
        return False

    def _deliver_unsolicited(self, msg: Message) -> None:
        if is_response(msg):
            self._pending.resolve(msg)
            return
        if msg.get("method") == "notifications/progress" and self._pending.route_progress(msg):
            return
        try:
            self._unsolicited(msg)
        except Exception:
            log.exception("unsolicited message handler failed")

    async def _post_small(self, message: Message, headers: Mapping[str, str], what: str) -> SmallAnswer:
        """POST a notification or response; the answer's body is read (it should be empty)."""
        return await post_small(self.owner, self._client, message, headers, what)


# An answer `send_request` already has in hand when it hands the exchange to a task: the response
# and the headers its request was sent with.
FirstAnswer = tuple[Response, dict[str, str]]


def _internal_error(exc: Exception, dispatched: Dispatch) -> UpstreamFailure:
    """The failure of an exchange whose relaying code failed (a bug): its caller must not wait."""
    return UpstreamFailure(
        FailureKind.PROTOCOL, dispatched, bounded_detail(f"internal error while relaying: {type(exc).__name__}")
    )


def _invalid_header() -> UpstreamFailure:
    """A request the HTTP client refused to write (a header it cannot send): nothing was sent."""
    return UpstreamFailure(FailureKind.PROTOCOL, Dispatch.NO, "a request header is not valid")


def _drop(message: Message) -> None:
    log.debug("no unsolicited handler set; dropped %s", message.get("method"))
