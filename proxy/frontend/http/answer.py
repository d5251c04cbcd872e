"""Writing a request's answer to the client: the one place the HTTP frontend does it, both eras.

Contract (`Answers.answer`, once per POSTed request):
- The request runs through its relay in the caller's own task (`Relay.handle_request`), its
  messages going into the response's outbox (`Stream`, proxy/frontend/http/outbox.py).
- The answer is one `application/json` response (the HTTP status the 2026 table maps its error
  to: `status_for`) when nothing else came first; otherwise the response becomes a
  `text/event-stream`, written by a task of its own (`_write_stream`): the request's notifications
  and server-to-client requests, then its answer, with keep-alive comments meanwhile; a 2025
  session's stream is resumable (`Replays`, proxy/frontend/http/resume.py).
- A cancelled request gets an empty event stream; a relay that failed, a 500; an upstream refusal
  of the caller's credentials (`--auth passthrough`) the refusal's HTTP status, or a JSON-RPC
  error once the answer already streams; a new session refused at its upstream's limit (a
  `Refusal`: a stdio child that did not start) the answer of a refused session (503, Retry-After,
  `respond_session_refused`). An `initialize` answered with an error carries no session id: no
  session came of it.
- Returns whether a successful result was written (a new 2025 session is kept only then).
- A client that went away is watched (`LateWatches`): its 2026 request, or a 2025 request other
  than `tools/call`, is cancelled (see `answer`), unless its answer is held for a re-send.
- Delivery: once the answer is handed to a connection still open, the stream says so
  (`Stream.wrote_answer`); a request whose answer is held (`Stream.hold`, proxy/core/resend.py)
  thus knows whether its client got it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from proxy import jsonrpc
from proxy.auth.base import AuthRefused, Principal
from proxy.core.relay import Relay
from proxy.errors import Refusal
from proxy.frontend.http.identity import Identity
from proxy.frontend.http.outbox import LateWatches, Receive, Send, Stream, next_message, sse
from proxy.frontend.http.respond import (
    JSON,
    SSE_HEADERS,
    refusal_body,
    refusal_error,
    respond,
    respond_error,
    respond_session_refused,
    status_for,
)
from proxy.frontend.http.resume import Replays
from proxy.jsonrpc import Message

log = logging.getLogger("proxy.frontend.http")


class Answers:
    """The HTTP frontend's writer of answers: one per app."""

    def __init__(self, identity: Identity, replays: Replays, stream_buffer_bytes: int) -> None:
        self.identity = identity  # answers an upstream's refusal of the caller's credentials
        self.replays = replays  # a 2025 session's event streams, kept for resumption
        self.stream_buffer_bytes = stream_buffer_bytes
        self._watches: LateWatches | None = None  # created in the loop, on the first POST

    async def answer(
        self,
        relay: Relay,
        request: Message,
        receive: Receive,
        send: Send,
        forward_headers: dict[str, str] | None,
        *,
        modern: bool,
        session_id: str | None = None,
        caller: str | None = None,
        prime: bool = False,
        principal: Principal | None = None,
    ) -> bool:
        """Run one request through the relay and write its answer (JSON, or SSE once it streams).

        The relay runs in this request's own task: a request is written upstream, and its answer
        written back, without waiting for a second task to be scheduled behind every other request
        of the same burst. Only a response that becomes an event stream gets a writer task (the
        handler goes on producing while the writer waits on the socket). Cancelling the request
        (2026: the client closed its POST; 2025: `notifications/cancelled` or the session ended)
        cancels this task while the handler runs; that cancellation ends here.

        A 2025 client that disconnects has not cancelled a `tools/call` (the spec says so; the
        engine finishes the attempt in flight and starts no other). Any other request of a
        disconnected 2025 client is cancelled upstream if its response had not become an event
        stream yet: no event id was given, so nothing can resume it and its answer could reach
        no one; one that had is kept (a client may resume it), bounded by the request timeout.

        Returns whether a successful result was written (initialize keeps its session only then).
        """
        loop = asyncio.get_running_loop()  # once per request (a getpid() syscall on Python 3.11)
        task = asyncio.current_task(loop)
        assert task is not None
        stream = Stream(loop, keep_after_close=not modern, max_bytes=self.stream_buffer_bytes)
        down_id = stream.down_id = request["id"]
        extra = [(b"mcp-session-id", session_id.encode())] if session_id else []
        writer: asyncio.Task[bool] | None = None

        def start_writer() -> None:
            nonlocal writer
            writer = loop.create_task(self._write_stream(stream, down_id, send, extra, modern, session_id, prime))

        stream.on_stream = start_writer
        watches = self._watches
        if watches is None:
            watches = self._watches = LateWatches(loop)
        watches.add(stream, receive, task if modern or request.get("method") != "tools/call" else None)
        failed = False
        refused: AuthRefused | None = None
        session_refused: Refusal | None = None
        try:
            try:
                await relay.handle_request(
                    request, stream, forward_headers, by_id=not modern, caller=caller, principal=principal
                )
            except asyncio.CancelledError:
                if task.uncancel() > 0:
                    raise  # not (only) the request's cancellation: the server stops this task
            except AuthRefused as refusal:  # passthrough: the upstream refused the caller's credential
                refused = refusal
                if writer is not None:  # the answer is an event stream already: no status to set
                    stream.send(refusal_error(down_id, refusal))
            except Refusal as refusal:  # a new session refused at its upstream's limit (a stdio child's start)
                session_refused = refusal
                if writer is not None:
                    stream.send(refusal_body(down_id, refusal))
            except Exception:
                log.exception("relaying %s failed", request.get("method"))
                failed = True
            # Nothing may cancel this task once the handler is over (a stray cancellation while
            # the answer is written would reach uvicorn as an application error).
            watches.end(stream)
            stream.finish()
            if writer is not None:
                return await writer
            if refused is not None:
                await self.identity.refuse(send, refused, "POST", down_id)
                return False
            if session_refused is not None:
                await respond_session_refused(send, down_id, session_refused)
                return False
            item = stream.pop()
            if item is None:
                if failed:
                    await respond_error(send, 500, down_id, jsonrpc.INTERNAL_ERROR, "internal proxy error")
                    return False
                # Cancelled: a cancelled request gets no response; its stream just ends.
                await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return False
            first, data = item
            ok = "result" in first
            if not ok and request.get("method") == "initialize":
                extra = []  # no session came of it (the caller closes it): a client must not use its id
            await respond(send, status_for(first, modern), data, [JSON, *extra])
            stream.wrote_answer()
            return ok
        finally:
            watches.end(stream)
            stream.close()
            if writer is not None and not writer.done():
                writer.cancel()

    async def _write_stream(
        self,
        stream: Stream,
        down_id: Any,
        send: Send,
        extra: list[tuple[bytes, bytes]],
        modern: bool,
        session_id: str | None,
        prime: bool,
    ) -> bool:
        """The response as an event stream: what the handler sends, then its answer; keep-alive
        comments meanwhile. Returns whether a successful result was written."""
        try:
            first = stream.pop()
            assert first is not None
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra})
            if not modern and session_id is not None:
                return await self.replays.stream(stream, first, down_id, send, session_id, prime)
            ok = False
            item: tuple[Message, bytes] | None = first
            while item is not None:
                message, data = item
                await send({"type": "http.response.body", "body": sse(data), "more_body": True})
                if jsonrpc.is_response(message) and message.get("id") == down_id:
                    stream.wrote_answer()
                    ok = "result" in message
                    break
                item = await next_message(stream, ping=send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return ok
        except BaseException:
            stream.close()  # nobody reads what the handler still sends
            raise
