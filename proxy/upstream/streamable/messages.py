"""An upstream's answer body as JSON-RPC messages: `application/json` (one message, or a
2025-03-26 batch) or `text/event-stream` (each `message` event's data).

- `content_type(response)`: the media type alone, lower-cased ("" when absent).
- `json_messages(raw)`: the message objects of a JSON body; a body that is not JSON is a
  `PROTOCOL` failure (dispatch unknown: the request reached the upstream); anything but objects
  in a batch is skipped.
- `answer_messages(response, state, max_event_bytes)`: the messages of a 2xx answer, read as
  its content type says: a JSON body whole (bounded by the request's `max_body`), an event stream
  as it comes (below); any other content type is a `PROTOCOL` failure (dispatch unknown).
- `SseMessages(state, max_event_bytes).feed(chunk)`: the messages an event stream's chunk
  completes, whoever reads the stream (a task, or the connection's callbacks). The stream's whole
  body has no bound (it lasts as long as its session may), each event has (`SseError` past it).
  An event whose data is not JSON is dropped with a rate-limited warning; events of another type
  are skipped. `state` (`StreamState`) keeps the last event id and the server's `retry`, what
  resuming the stream needs.
- `iter_sse_messages(response, state, max_event_bytes)`: the same, as they come, for a task.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message, loads
from proxy.upstream.base import UPSTREAM_NOTICES
from proxy.upstream.h1 import Response
from proxy.upstream.sse.parse import SseParser
from proxy.upstream.streamable.failures import bounded_detail

log = logging.getLogger(__name__)


def content_type(response: Response) -> str:
    return (response.headers.get("content-type") or "").partition(";")[0].strip().lower()


@dataclass(slots=True)
class StreamState:
    """What a response stream told us about resuming it."""

    last_event_id: str | None = None
    retry_ms: int | None = None


class SseMessages:
    """An event stream's JSON-RPC messages, chunk by chunk: the one reader of a response stream's
    events, whether a task iterates the response (`iter_sse_messages`) or the connection's own
    callbacks feed it (`Flight`, link.py). `feed` returns the messages a chunk completes (a
    2025-03-26 batch flattened), keeping in `state` the last event id and the server's `retry`;
    it raises `SseError` past the event bound. An event whose data is not JSON is dropped with a
    rate-limited warning; events of another type are skipped."""

    __slots__ = ("_parser", "state")

    def __init__(self, state: StreamState, max_event_bytes: int | None) -> None:
        self.state = state
        self._parser = SseParser(max_event_bytes)

    def feed(self, chunk: bytes) -> Iterator[Message]:
        """The messages `chunk` completes, each parsed as it is taken (a chunk of many small
        events is never held parsed all at once). Raises `SseError` at the first take when the
        chunk breaks the event bound."""
        parser = self._parser
        events = parser.feed(chunk)
        state = self.state
        state.last_event_id = parser.last_event_id
        if parser.retry is not None:
            state.retry_ms = parser.retry
        for ev in events:
            if ev.event != "message" or not ev.data.strip():
                continue
            try:
                message = loads(ev.data)
            except ValueError:
                UPSTREAM_NOTICES.log(log, logging.WARNING, "upstream sent an SSE event that is not JSON; dropped")
                continue
            if message.__class__ is dict:
                yield message
            elif isinstance(message, list):  # a 2025-03-26 batch
                for item in message:
                    if isinstance(item, dict):
                        yield item


async def iter_sse_messages(
    response: Response, state: StreamState, max_event_bytes: int | None
) -> AsyncIterator[Message]:
    """Parse `message` events of an SSE response into JSON-RPC messages (`SseMessages`).

    A stream's whole body has no bound (it lasts as long as the session may); each event has."""
    response.max_body = None
    reader = SseMessages(state, max_event_bytes)
    async for chunk in response.iter_chunks():
        for message in reader.feed(chunk):
            yield message


def json_messages(raw: bytes) -> list[Message]:
    """The JSON-RPC messages of an `application/json` answer (one, or a 2025-03-26 batch)."""
    try:
        parsed = loads(raw)
    except ValueError:
        raise UpstreamFailure(
            FailureKind.PROTOCOL, Dispatch.UNKNOWN, "upstream answered a body that is not JSON"
        ) from None
    if parsed.__class__ is dict:
        return [parsed]
    return [item for item in parsed if isinstance(item, dict)] if isinstance(parsed, list) else []


async def answer_messages(
    response: Response, state: StreamState, max_event_bytes: int | None
) -> AsyncIterator[Message]:
    """The messages of a 2xx answer: a JSON body's, or an event stream's as they come (`state`
    keeps what resuming it needs). Raises `UpstreamFailure` for any other content type."""
    ctype = content_type(response)
    if ctype == "application/json":
        for item in json_messages(await response.read()):
            yield item
    elif ctype == "text/event-stream":
        async for item in iter_sse_messages(response, state, max_event_bytes):
            yield item
    else:
        raise UpstreamFailure(
            FailureKind.PROTOCOL,
            Dispatch.UNKNOWN,
            bounded_detail(f"upstream answered an unexpected content type {ctype!r}"),
        )
