"""Resumable 2025 response streams: the events a client may ask for again after losing the stream.

Contract:
- A 2025 POST whose answer becomes an event stream is written through a `Replay`: every event gets
  an id `<key>:<seq>` (the key is 128 random bits, so nobody derives another stream's ids), is
  recorded and written in one step under the replay's lock.
- A client that lost the stream sends GET with `Last-Event-ID`; `Replays.resume` writes what it
  missed and makes it the target for the rest. An answer evicted to keep the buffers bounded is
  reported as a JSON-RPC error for the request, never as a silently ended stream.
- Bounded: per stream by events (`Replay.KEEP`) and bytes (`--replay-stream-bytes`), all streams
  together by bytes (`--replay-total-bytes`) and count (`Replays.LIMIT`), each kept
  `Replay.GRACE_S` after its response; evictions are counted in
  `mcp_recovery_resumption_evictions_total{bound}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections import deque
from collections.abc import MutableMapping
from typing import Any

from proxy import jsonrpc
from proxy.core.resend import Flight
from proxy.frontend.http.outbox import Receive, Send, Stream, next_message, sse, wait_disconnect
from proxy.frontend.http.respond import SSE_HEADERS
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.telemetry.shed import SHED

# The reconnection delay a 2025-11-25 client is told in the priming event.
RETRY_MS = 1000


class Replay:
    """A 2025 POST response stream kept for resumption (SEP-1699): its events by sequence number.

    The POST writes through `target` while its connection lasts; a client that lost the stream
    reconnects with GET and `Last-Event-ID: <key>:<seq>`, gets what it missed, and becomes the
    target for the rest. Bounded: the last `KEEP` events and `Replays.stream_bytes`, oldest
    evicted first, kept `GRACE_S` after the response; all replays together by
    `Replays.total_bytes` (see there).
    """

    KEEP = 256
    GRACE_S = 30.0

    def __init__(self, key: str, session_id: str, down_id: Any, store: Replays) -> None:
        self.key = key
        self.session_id = session_id
        self.down_id = down_id
        self.store = store
        self.events: deque[tuple[int, bytes]] = deque()
        self.bytes = 0
        self.evicted_upto = 0  # the highest sequence number evicted
        self.answer_seq: int | None = None  # the event carrying the request's answer
        self.seq = 0
        self.target: Send | None = None
        self.flight: Flight | None = None  # the request's answer may be kept for a re-send too
        self.lock = asyncio.Lock()
        self.finished = asyncio.Event()

    async def emit(self, message: bytes, *, answer: bool = False) -> None:
        """Record the serialized message under its id and write it: one step, so a resumption
        that replays under the same lock neither misses it nor gets it twice."""
        async with self.lock:
            self.seq += 1
            if answer:
                self.answer_seq = self.seq
            data = f"id: {self.key}:{self.seq}\n".encode() + sse(message)
            self.events.append((self.seq, data))
            self.bytes += len(data)
            self.store.added(self, len(data))
            await self._write_locked(data)

    def evict(self) -> int:
        seq, data = self.events.popleft()
        self.evicted_upto = seq
        self.bytes -= len(data)
        return len(data)

    async def write_ping(self, message: MutableMapping[str, Any]) -> None:
        await self.write(message["body"])

    async def write(self, data: bytes) -> None:
        async with self.lock:
            await self._write_locked(data)

    async def _write_locked(self, data: bytes) -> None:
        if self.target is None:
            return
        try:
            await self.target({"type": "http.response.body", "body": data, "more_body": True})
        except Exception:  # the reader went away: keep recording for the next resumption
            self.target = None


# Resumption buffers: one response may keep its answer (up to the 16 MiB message limit) and some
# notifications; all of them together hold at most `REPLAY_TOTAL_BYTES` (with only the event count
# bounded, 200 calls with 8 MiB answers would hold 1.8 GB for 30 s). Defaults of
# `--replay-stream-bytes` and `--replay-total-bytes`.
REPLAY_STREAM_BYTES: int = Settings.model_fields["replay_stream_bytes"].default
REPLAY_TOTAL_BYTES: int = Settings.model_fields["replay_total_bytes"].default


def replay_key(n: int) -> str:
    """The key of a resumable stream's event ids (`<key>:<seq>`): 128 random bits, so nobody
    derives another stream's ids from their own (as they could from a plain counter), and the counter in
    hex after them, so two keys never collide. At most 22 + 16 characters, never a `:`."""
    return f"{secrets.token_urlsafe(16)}{n:x}"


class Replays:
    """The 2025 response streams kept for resumption: at most `LIMIT` of them (the oldest
    forgotten), each within `KEEP` events and `stream_bytes`, all within `total_bytes`. Eviction
    takes the oldest event first: of the stream itself for its own bounds, of the oldest stream
    holding any for the total. Evictions are counted in
    `mcp_recovery_resumption_evictions_total{bound}`. A client resuming past an evicted answer is
    told so with a JSON-RPC error for its request, not left waiting."""

    LIMIT = 1024

    def __init__(self, stream_bytes: int = REPLAY_STREAM_BYTES, total_bytes: int = REPLAY_TOTAL_BYTES) -> None:
        self.stream_bytes = stream_bytes
        self.total_bytes = total_bytes
        self.replays: dict[str, Replay] = {}
        self.held = 0
        self._ids = itertools.count(1)

    def get(self, key: str) -> Replay | None:
        return self.replays.get(key)

    def new(self, key: str, session_id: str, down_id: Any) -> Replay:
        if len(self.replays) >= self.LIMIT:
            self.forget(next(iter(self.replays)))
        replay = self.replays[key] = Replay(key, session_id, down_id, self)
        return replay

    def forget(self, key: str) -> None:
        replay = self.replays.pop(key, None)
        if replay is not None:
            self.held -= replay.bytes
            replay.events.clear()
            replay.bytes = 0

    def added(self, replay: Replay, size: int) -> None:
        self.held += size
        while len(replay.events) > 1 and (replay.bytes > self.stream_bytes or len(replay.events) > Replay.KEEP):
            self.held -= replay.evict()
            SHED.count("resumption_evictions", "stream")
        if self.held > self.total_bytes:
            for oldest in list(self.replays.values()):
                while oldest.events and self.held > self.total_bytes:
                    self.held -= oldest.evict()
                    SHED.count("resumption_evictions", "total")
                if self.held <= self.total_bytes:
                    break

    async def stream(
        self,
        stream: Stream,
        first: tuple[Message, bytes],
        down_id: Any,
        send: Send,
        session_id: str,
        prime: bool,
    ) -> bool:
        """Write a 2025 SSE response whose events carry ids, so a client that lost it can resume it
        (resumability and event ids are in every 2025 revision); `prime`: it opens with the
        2025-11-25 priming event. Returns whether a successful result was written."""
        replay = self.new(replay_key(next(self._ids)), session_id, down_id)
        replay.target = send
        ok = False
        try:
            if prime:
                # SEP-1699 (2025-11-25): a priming event (an id, no data) and the reconnection
                # delay. An older client reads an empty `data:` as a malformed message (the Python
                # SDK 1.9 logs an error and a traceback for each), so it goes to 2025-11-25+ only.
                await replay.write(f"id: {replay.key}:0\nretry: {RETRY_MS}\ndata: \n\n".encode())
            item: tuple[Message, bytes] | None = first
            while item is not None:
                message, data = item
                answer = jsonrpc.is_response(message) and message.get("id") == down_id
                if answer:
                    # the flight the answer reports to, as it is when the answer goes (a re-send
                    # answered `still_running` no longer reports to the execution it waited for)
                    replay.flight = stream.flight
                await replay.emit(data, answer=answer)
                if answer:
                    if replay.target is send:  # written to the client's connection, not only recorded
                        stream.wrote_answer()
                    elif replay.target is not None and replay.flight is not None:
                        replay.flight.delivered()  # written to the GET that resumed the stream
                    ok = "result" in message
                    break
                item = await next_message(stream, ping=replay.write_ping)
        finally:
            replay.finished.set()
            asyncio.get_running_loop().call_later(Replay.GRACE_S, self.forget, replay.key)
        async with replay.lock:
            target, replay.target = replay.target, None
        if target is send:
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        return ok

    async def resume(self, send: Send, receive: Receive, replay: Replay, after: int) -> None:
        """GET with Last-Event-ID: what the client missed, then the rest of the stream as it comes."""
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        async with replay.lock:
            for seq, data in list(replay.events):
                if seq > after:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    if seq == replay.answer_seq and replay.flight is not None:
                        replay.flight.delivered()  # resumed: a later identical call is a new call
            lost = replay.answer_seq
            if lost is not None and after < lost <= replay.evicted_upto:
                # The answer was evicted to keep the buffers bounded: say so rather than end the
                # stream as if the request had been cancelled.
                note = jsonrpc.error(
                    replay.down_id,
                    jsonrpc.INTERNAL_ERROR,
                    "the answer is no longer held for resumption (the proxy's resumption buffers are full)",
                )
                await send({"type": "http.response.body", "body": sse(jsonrpc.dumps_out(note)), "more_body": True})
            if not replay.finished.is_set():
                replay.target = send
        if not replay.finished.is_set():
            gone = asyncio.ensure_future(wait_disconnect(receive))
            done = asyncio.ensure_future(replay.finished.wait())
            try:
                await asyncio.wait({gone, done}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                done.cancel()
            async with replay.lock:
                if replay.target is send:
                    replay.target = None
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
