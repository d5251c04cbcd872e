"""What one HTTP response carries to its client: the bounded outbox a relay writes into, the SSE
framing, and the watch on the client's connection.

Contract:
- `Stream` is an outbox feeding one HTTP response (a POST's answer or a 2025 listen stream): bounded
  in bytes, with backpressure signalled to the relay, one writer woken per message.
- `next_message` yields what the writer writes next, with a keep-alive comment every
  `PING_INTERVAL_S` while nothing comes; None once the handler ended.
- `watch_disconnect` ends a stream when its client disconnects and, where the protocol makes the
  disconnect a cancellation (2026, or a 2025 request whose answer cannot be resumed), cancels the
  request's task. `LateWatches` starts those watchers only for requests that run a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from proxy import jsonrpc
from proxy.core.resend import Flight
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.telemetry.shed import SHED

log = logging.getLogger("proxy.frontend.http")

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PING_INTERVAL_S = 15.0

# What one response or listen stream may hold for a client that does not read (its writer waits
# on the socket meanwhile). A single message is always taken when nothing is queued, so any
# message within the message limit passes; beyond the bound a request stream drops what is not
# its answer, and a listen stream is closed (the client may open another). The default of
# `--stream-buffer-bytes`; the app passes the configured value to every stream.
STREAM_BUFFER_BYTES: int = Settings.model_fields["stream_buffer_bytes"].default


class ClientGone(Exception):
    pass


class Stream:
    """An Outbox feeding one HTTP response: messages queue up, serialized once, and wake the
    single writer. The queue is bounded in bytes (`max_bytes`): past the bound a request stream
    drops what is not its answer (the answer is always taken) and a listen stream is closed, both
    counted in `mcp_recovery_dropped_messages_total`. `on_pressure(True)` is called when the
    queue passes half the bound and `on_pressure(False)` when it has drained to a quarter (or the
    stream closes): the relay of a session with its own stdio child pauses reading the child
    meanwhile (backpressure instead of buffering).

    Cheaper than an asyncio.Queue plus asyncio.wait per message: one future at a time, resolved
    by `send`, by `finish` (the handler is over) or by `close`, awaited with a ping timeout.

    `on_stream`, when set, is called once, on the first message that is not the answer to
    `down_id` itself: the POST's handler runs in the request's own task, so the response only
    needs a writer task of its own when it turns into an event stream.
    """

    __slots__ = (
        "_bytes",
        "_closed",
        "_items",
        "_keep",
        "_loop",
        "_waiter",
        "down_id",
        "finished",
        "flight",
        "listen",
        "max_bytes",
        "on_pressure",
        "on_stream",
        "owns_flight",
        "pressured",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        keep_after_close: bool = False,
        listen: bool = False,
        max_bytes: int = STREAM_BUFFER_BYTES,
    ) -> None:
        self._loop = loop  # passed in: on Python 3.11 each get_running_loop() is a getpid() syscall
        self._items: deque[tuple[Message, bytes]] = deque()
        self._bytes = 0
        self.max_bytes = max_bytes
        self.listen = listen
        self.on_pressure: Callable[[bool], None] | None = None
        self.pressured = False
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._keep = keep_after_close  # 2025: a disconnected client may resume the stream
        self.finished = False  # the handler is over: no message follows what is queued
        self.down_id: Any = None
        self.on_stream: Callable[[], None] | None = None
        self.flight: Flight | None = None  # see `hold`
        self.owns_flight = False

    def hold(self, flight: Flight, owner: bool) -> None:
        """The request's answer must not be lost (proxy/core/resend.py): `flight` hears of the
        answer, of its delivery (`wrote_answer`) or of this stream closing before it; and the
        client's disconnect does not cancel the request (`watch_disconnect`)."""
        self.flight = flight
        self.owns_flight = owner

    def send(self, message: Message) -> None:
        flight = self.flight
        if flight is not None and message.get("id") == self.down_id and jsonrpc.is_response(message):
            flight.answered(message)
        if self._closed and not self._keep:
            return
        data = jsonrpc.dumps_out(message)  # once, secrets removed: the writer writes these bytes
        answer = message.get("id") == self.down_id and jsonrpc.is_response(message)
        queued = self._bytes + len(data)
        if queued > self.max_bytes and self._items and not answer:
            if self.listen:  # a listen stream nobody reads: closed rather than fed
                SHED.count("dropped_messages", "listen_closed", len(self._items) + 1)
                self._items.clear()
                self._bytes = 0
                self.close()
            else:
                SHED.count("dropped_messages", "stream_full")
            return
        self._items.append((message, data))
        self._bytes = queued
        if not self.pressured and queued > self.max_bytes // 2 and not self._closed and self.on_pressure is not None:
            self.pressured = True
            self.on_pressure(True)
        start = self.on_stream
        if start is not None and not answer:
            self.on_stream = None
            start()
        self.wake()

    def wake(self, *_: object) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pop(self) -> tuple[Message, bytes] | None:
        """The next message and its serialized form."""
        if not self._items:
            return None
        item = self._items.popleft()
        self._bytes -= len(item[1])
        if self.pressured and self._bytes <= self.max_bytes // 4:
            self._release()
        return item

    def _release(self) -> None:
        self.pressured = False
        if self.on_pressure is not None:
            self.on_pressure(False)

    async def wait(self, timeout_s: float | None) -> None:
        """Until a message arrives or `wake` is called, at most `timeout_s` (None: no limit).

        A plain timer that wakes the waiter (cheaper than an `asyncio.timeout` scope per response).
        """
        loop = self._loop
        self._waiter = waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, self.wake)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def has_items(self) -> bool:
        """Messages are queued for the writer."""
        return bool(self._items)

    @property
    def resumable(self) -> bool:
        """A 2025 response that became an event stream: a client that lost it may resume it, so
        its request goes on when the connection drops."""
        return self._keep and self.on_stream is None

    def finish(self) -> None:
        self.finished = True
        self.on_stream = None
        self.wake()

    def wrote_answer(self) -> None:
        """The request's answer was handed to the client's connection: delivered, unless the
        stream had closed (the client was gone) before."""
        flight = self.flight
        if flight is not None and not self._closed:
            flight.delivered()

    def close(self) -> None:
        self._closed = True
        if self.pressured:
            self._release()
        flight = self.flight
        if flight is not None and not flight.ended:
            if flight.answer is None and self.finished and self.owns_flight:
                flight.abandoned()  # the request ended without an answer: it was cancelled
            else:
                flight.stranded()  # the client went before its answer: a re-send may take it
        self.wake()


def primes(version: str | None) -> bool:
    """Whether a 2025 request's revision has SSE priming events (SEP-1699, 2025-11-25). A request
    without `MCP-Protocol-Version` is 2025-03-26 (the spec's rule; 2025-06-18 clients send it on
    every request after initialize); `initialize` itself has none, so its stream is not primed."""
    return version is not None and version >= "2025-11-25" and version in jsonrpc.LEGACY_VERSIONS


def sse(data: bytes) -> bytes:
    """One SSE event carrying a message serialized by `jsonrpc.dumps_out`."""
    return b"event: message\ndata: " + data + b"\n\n"


async def next_message(stream: Stream, ping: Send) -> tuple[Message, bytes] | None:
    """The next message for this response; None once the handler ended without one more."""
    while True:
        item = stream.pop()
        if item is not None:
            return item
        if stream.finished:
            return None
        await stream.wait(PING_INTERVAL_S)
        if stream.has_items or stream.finished:
            continue
        await ping({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def watch_disconnect(receive: Receive, stream: Stream, cancel: asyncio.Task[None] | None) -> None:
    """Close `stream` when its client disconnects; then cancel `cancel` (the request's task) unless
    the answer can still be resumed or a re-send may take it (`Stream.hold`). 2026 HTTP: closing the
    response stream is the cancellation; 2025: see `Answers.answer` (proxy/frontend/http/answer.py)."""
    with contextlib.suppress(Exception):
        await wait_disconnect(receive)
        log.debug("client disconnected")
        resumable = stream.resumable
        stream.close()
        if cancel is not None and not resumable and stream.flight is None:
            cancel.cancel()


# A POST's disconnect watcher starts only once its request has run this long (up to half as long
# again): most calls are answered sooner, and a watcher is a task plus a wait on uvicorn's receive
# event per request. A client's disconnect is noticed that much later at most.
WATCH_AFTER_S = 0.05


class LateWatches:
    """Disconnect watchers of POST requests, started `WATCH_AFTER_S` after the request began.

    A request answered sooner never gets one (nothing to watch: its answer is written next); a
    client that disconnects before then is noticed at that point, which only delays the
    cancellation of a 2026 request by at most 1.5 x `WATCH_AFTER_S`. Pending requests are kept in
    arrival order (their due times increase), and one loop timer is armed for the oldest."""

    __slots__ = ("_handle", "_loop", "_pending", "_started")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: dict[Stream, tuple[float, Receive, asyncio.Task[None] | None]] = {}
        self._started: dict[Stream, asyncio.Task[None]] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, stream: Stream, receive: Receive, cancel: asyncio.Task[None] | None) -> None:
        due = self._loop.time() + WATCH_AFTER_S
        self._pending[stream] = (due, receive, cancel)
        if self._handle is None:
            self._handle = self._loop.call_at(due, self._sweep)

    def end(self, stream: Stream) -> None:
        """The request is over: forget it, or stop its watcher."""
        if self._pending.pop(stream, None) is None:
            watcher = self._started.pop(stream, None)
            if watcher is not None:
                watcher.cancel()

    def _sweep(self) -> None:
        self._handle = None
        pending = self._pending
        horizon = self._loop.time() + 0.001  # loop timers are millisecond-grained
        while pending:
            stream = next(iter(pending))
            due, receive, cancel = pending[stream]
            if due > horizon:
                # A sweep for a batch of requests, not one a request: a watcher may start up to
                # half of WATCH_AFTER_S late.
                self._handle = self._loop.call_at(max(due, horizon + WATCH_AFTER_S / 2), self._sweep)
                return
            del pending[stream]
            self._started[stream] = self._loop.create_task(watch_disconnect(receive, stream, cancel))
