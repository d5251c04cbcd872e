"""The HTTP frontend's per-stream queues and resumption buffers are bounded in bytes. Why bytes:
unbounded, a 2025 listen stream nobody read grew the proxy from 127 MB to 2.3 GB in 25 s, and 200
calls with 8 MiB answers held 1.8 GB for 30 s in resumption buffers bounded by count only."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from proxy import jsonrpc
from proxy.frontend.http.outbox import Stream
from proxy.frontend.http.resume import Replays
from proxy.telemetry.shed import SHED

pytestmark = pytest.mark.anyio
BOUND = 1024 * 1024


def _note(i: int, size: int = 64 * 1024) -> dict:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": "info", "data": "x" * size, "i": i},
    }


async def test_a_listen_stream_nobody_reads_is_closed_at_its_bound() -> None:
    before = SHED.get("dropped_messages", "listen_closed")
    stream = Stream(asyncio.get_running_loop(), listen=True, max_bytes=BOUND)
    offered = 0
    while not stream.closed:
        stream.send(_note(offered))
        offered += 1
        assert stream._bytes <= BOUND
        assert offered < 100, "a stream nobody reads is closed at its bound"
    assert not stream._items and stream._bytes == 0, "what it held is released"
    assert SHED.get("dropped_messages", "listen_closed") - before == offered, "each message it did not write is counted"


async def test_a_response_stream_nobody_reads_drops_notifications_but_takes_its_answer() -> None:
    before = SHED.get("dropped_messages", "stream_full")
    stream = Stream(asyncio.get_running_loop(), max_bytes=BOUND)
    stream.down_id = 5
    for i in range(100):
        stream.send(_note(i))
    assert stream._bytes <= BOUND and not stream.closed
    kept = len(stream._items)
    assert SHED.get("dropped_messages", "stream_full") - before == 100 - kept
    answer = {"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": "y" * 2 * BOUND}]}}
    stream.send(answer)
    assert stream._items[-1][0] is answer, "the answer is never dropped"
    assert stream._items[-1][1] == jsonrpc.dumps(answer), "serialized once, for the writer"


async def test_one_message_larger_than_the_bound_still_passes_an_empty_stream() -> None:
    stream = Stream(asyncio.get_running_loop(), listen=True, max_bytes=BOUND)
    stream.send(_note(0, size=2 * BOUND))
    assert len(stream._items) == 1 and not stream.closed


async def test_pressure_is_signalled_at_half_the_bound_and_released_at_a_quarter_or_on_close() -> None:
    stream = Stream(asyncio.get_running_loop(), max_bytes=BOUND)
    seen: list[bool] = []
    stream.on_pressure = seen.append
    while not seen:
        stream.send(_note(len(stream._items)))
    assert seen == [True] and stream._bytes > BOUND // 2
    while stream._bytes > BOUND // 4:
        assert stream.pop() is not None
    assert seen == [True, False]
    stream.send(_note(0, size=BOUND // 2))
    stream.send(_note(1, size=BOUND // 4))
    assert seen == [True, False, True]
    stream.close()
    assert seen == [True, False, True, False], "a closed stream holds no pressure"


async def test_resumption_buffers_are_bounded_per_stream_and_in_total_oldest_first() -> None:
    total_before = SHED.get("resumption_evictions", "total")
    stream_before = SHED.get("resumption_evictions", "stream")
    store = Replays(stream_bytes=3 * BOUND, total_bytes=8 * BOUND)
    big = b"z" * BOUND
    replays = [store.new(f"r{i}", "session", i) for i in range(20)]
    for replay in replays:  # 20 answers of 1 MiB each: only the newest 8 MiB stay
        await replay.emit(big, answer=True)
        assert store.held <= 8 * BOUND
    assert store.held == sum(r.bytes for r in replays)
    assert [bool(r.events) for r in replays] == [False] * 13 + [True] * 7, "the oldest are evicted first"
    assert SHED.get("resumption_evictions", "total") - total_before == 13
    one = replays[-1]
    for _ in range(5):  # one stream over its own bound evicts its own oldest events
        await one.emit(big)
    assert one.bytes <= 3 * BOUND and one.evicted_upto >= 1
    assert SHED.get("resumption_evictions", "stream") - stream_before >= 3
    store.forget(one.key)
    assert store.held == sum(r.bytes for r in replays if r.key in store.replays)


async def test_resuming_past_an_evicted_answer_gets_an_error_for_the_request() -> None:
    """A client that resumes after its answer was evicted is told so, not left with a stream that
    ends as if its request had been cancelled."""
    from proxy.core.service import Service
    from proxy.frontend.http.app import McpHttpApp
    from proxy.settings import Settings
    from proxy.upstream.stdio import StdioUpstream

    settings = Settings()
    app = McpHttpApp(Service(settings, StdioUpstream(["true"])), settings)
    app.replays = Replays(stream_bytes=3 * BOUND, total_bytes=2 * BOUND)
    lost = app.replays.new("r1", "session", "call-7")
    await lost.emit(b'{"jsonrpc":"2.0","method":"notifications/message","params":{}}')
    await lost.emit(jsonrpc.dumps({"jsonrpc": "2.0", "id": "call-7", "result": {}}), answer=True)
    lost.finished.set()
    for i in range(3):  # newer answers push the old one out of the total bound
        await app.replays.new(f"r{i + 2}", "session", i).emit(b"z" * BOUND, answer=True)
    assert not lost.events

    written: list[bytes] = []

    async def send(message: dict) -> None:
        written.append(message.get("body", b""))

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    await app.replays.resume(send, receive, lost, 0)
    body = b"".join(written)
    assert b'"id":"call-7"' in body and b'"error"' in body and b"no longer held" in body


async def test_the_app_bounds_its_streams_and_replays_by_the_settings() -> None:
    """`--stream-buffer-bytes` and the replay bounds reach the streams the app opens (they were
    constants). A listen stream nobody reads is closed at the configured 128 KiB, not at 4 MiB."""
    from proxy.core.service import Service
    from proxy.frontend.http.app import McpHttpApp
    from proxy.settings import Settings
    from proxy.upstream.stdio import StdioUpstream

    settings = Settings(stream_buffer_bytes=128 * 1024, replay_stream_bytes=1 << 20, replay_total_bytes=3 << 20)
    app = McpHttpApp(Service(settings, StdioUpstream(["true"])), settings)
    assert (app.replays.stream_bytes, app.replays.total_bytes) == (1 << 20, 3 << 20)

    class Session:  # the relay side of a listen stream: what the frontend attaches to
        stream: Stream | None = None
        owner: str | None = None  # opened without authentication: any caller may name it

        def attach_listen(self, stream: Stream) -> bool:
            self.stream = stream
            return True

        def detach_listen(self, stream: Stream) -> None:
            pass

    session = Session()
    app.service.sessions["s1"] = session  # type: ignore[assignment]
    started = asyncio.Event()
    never = asyncio.Event()  # the client reads nothing: the first body write blocks

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            started.set()
            return
        await never.wait()

    async def receive() -> dict:
        await never.wait()
        return {"type": "http.disconnect"}

    headers = {"accept": "text/event-stream", "mcp-session-id": "s1"}
    listening = asyncio.create_task(app._get(receive, send, headers, None))
    try:
        await asyncio.wait_for(started.wait(), 10)
        stream = session.stream
        assert stream is not None
        sent = 0
        while not stream.closed:
            stream.send(_note(sent, size=16 * 1024))
            sent += 1
            assert sent < 64, "closed at 128 KiB, long before the default 4 MiB"
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
