"""An incremental Server-Sent Events parser working on raw bytes.

Implements the WHATWG "event stream interpretation" rules that matter for MCP: the fields
`event`, `data` (multi-line, joined with LF), `id` (ignored when it contains NUL; it persists as
the stream's last event id), `retry` (ASCII digits only), comment lines starting with `:`, and all
three line terminators (CRLF, LF, CR — including a CR/LF pair split across two chunks). A leading
UTF-8 BOM is dropped.

Why our own parser and not `httpx-sse`: mcp 2.3.0 depends on `httpx2` (its own SSE support lives
there), not on `httpx` + `httpx-sse`, so `httpx-sse` would be one more dependency for ~100 lines.
Owning it also lets us keep `data` as bytes (orjson parses bytes directly, no str round trip),
bound the size of one event (a misbehaving upstream cannot make us buffer without limit), and feed
it from the HTTP client's chunks whatever their boundaries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_LINE_END: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"
DEFAULT_MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
# A `retry` longer than this many digits is read as this value: Python refuses int() of more than
# 4300 digits (ValueError), and a delay of 10**18 ms already means "never" to every consumer
# (each caps it to its own maximum).
_RETRY_DIGITS: Final = 18
_RETRY_CAP_MS: Final = 10**_RETRY_DIGITS


class SseError(ValueError):
    """The stream broke the limits we accept (an event larger than the configured bound)."""


@dataclass(slots=True)
class SseEvent:
    event: str = "message"
    data: bytes = b""
    id: str | None = None  # the stream's last event id when this event was dispatched
    retry: int | None = None  # a `retry` field seen since the previous event, in milliseconds


class SseParser:
    """Feed it byte chunks; it returns the events completed by each chunk."""

    __slots__ = (
        "_bom_checked",
        "_data",
        "_data_len",
        "_event",
        "_pending",
        "_pending_len",
        "_pending_retry",
        "_skip_lf",
        "last_event_id",
        "max_event_bytes",
        "retry",
    )

    def __init__(self, max_event_bytes: int | None = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self.last_event_id: str | None = None
        self.retry: int | None = None  # the latest reconnection time the server asked for (ms)
        self._pending: list[bytes] = []  # the pieces of the line not yet terminated
        self._pending_len = 0
        self._skip_lf = False
        self._bom_checked = False
        self._event = ""
        self._data: list[bytes] = []
        self._data_len = 0
        self._pending_retry: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events `chunk` completes. Linear in the input: only the new chunk is scanned for line
        ends, and an unterminated line is kept as a list of pieces joined once when it ends (a
        buffer concatenated and rescanned per chunk made a long line quadratic: 41 s of CPU for
        15 MiB). Raises SseError once a line or an event exceeds `max_event_bytes`."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return []
        if not self._bom_checked:
            head = b"".join(self._pending) + chunk  # fewer than 3 bytes were kept back
            self._pending, self._pending_len = [], 0
            if len(head) < 3 and _BOM.startswith(head):
                self._pending, self._pending_len = [head], len(head)
                return []
            self._bom_checked = True
            chunk = head[3:] if head.startswith(_BOM) else head
        events: list[SseEvent] = []
        start = 0
        size = len(chunk)
        for m in _LINE_END.finditer(chunk):
            end = m.start()
            if m.end() == size and end == size - 1 and chunk[end] == 0x0D:
                self._skip_lf = True  # a LF may follow in the next chunk: same terminator
            if self._pending:
                self._pending.append(chunk[start:end])
                line = b"".join(self._pending)
                self._pending, self._pending_len = [], 0
            else:
                line = chunk[start:end]
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
            start = m.end()
        if start < size:
            self._pending_len += size - start
            if self.max_event_bytes is not None and self._pending_len > self.max_event_bytes:
                self._pending, self._pending_len = [], 0
                raise SseError(f"an SSE line exceeds {self.max_event_bytes} bytes")
            self._pending.append(chunk[start:] if start else chunk)
        return events

    def _line(self, line: bytes) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == 0x3A:  # ':' comment / keep-alive
            return None
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._data_len += len(value) + 1
            if self.max_event_bytes is not None and self._data_len > self.max_event_bytes:
                raise SseError(f"an SSE event exceeds {self.max_event_bytes} bytes")
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\x00" not in value:
                self.last_event_id = value.decode("utf-8", "replace")
        elif name == b"retry":
            if value and value.isdigit():
                self.retry = self._pending_retry = int(value) if len(value) <= _RETRY_DIGITS else _RETRY_CAP_MS
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event, retry = self._data, self._event, self._pending_retry
        self._data, self._data_len, self._event, self._pending_retry = [], 0, "", None
        if not data:
            return None  # no data field: nothing to dispatch (id/retry were still recorded)
        return SseEvent(
            event=event or "message",
            data=data[0] if len(data) == 1 else b"\n".join(data),
            id=self.last_event_id,
            retry=retry,
        )
