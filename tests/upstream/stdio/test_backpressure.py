"""Backpressure from a client that does not read to a 2025 session's own stdio child: the proxy
stops reading the child's stdout instead of buffering what it writes (memory stays bounded for a
caller that stops reading), and resumes when the client reads. A real child over real pipes, the
real relay and the HTTP frontend's real response-stream queue; only the HTTP writer is left out (the
test is the reader).
"""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from proxy.core.relay import Relay, ToolCatalog
from proxy.frontend.http.outbox import STREAM_BUFFER_BYTES, Stream
from proxy.telemetry.shed import SHED
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

NOTES = 400
NOTE_BYTES = 64 * 1024  # 25 MiB in all: six times the stream's bound

CHILD = textwrap.dedent(
    f"""
    import json, sys
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue
        for i in range({NOTES}):
            note = {{"jsonrpc": "2.0", "method": "notifications/message",
                     "params": {{"level": "info", "data": {{"i": i, "pad": "x" * {NOTE_BYTES}}}}}}}
            sys.stdout.write(json.dumps(note) + "\\n")
        sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": msg["id"], "result": {{"done": True}}}}) + "\\n")
        sys.stdout.flush()
    """
)


@pytest.fixture(params=[pytest.param(False, id="asyncio"), pytest.param(True, id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return "asyncio", {"use_uvloop": request.param}


async def test_a_session_whose_client_does_not_read_pauses_its_child_and_loses_nothing() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=0)
    link = await upstream.open(Era.LEGACY)
    relay = Relay(link, catalog=ToolCatalog(), session_id="s1")
    paused = asyncio.Event()
    states: list[bool] = []
    pause = relay._pause
    assert pause is not None, "a session's own stdio link can pause"

    def recording(on: bool) -> None:
        states.append(on)
        if on:
            paused.set()
        pause(on)

    relay._pause = recording
    pauses_before = SHED.get("upstream_read_pauses")
    dropped_before = SHED.get("dropped_messages", "stream_full")
    stream = Stream(asyncio.get_running_loop())
    stream.down_id = 7
    request = {"jsonrpc": "2.0", "id": 7, "method": "spam", "params": {}}
    task = asyncio.create_task(relay.handle_request(request, stream))
    try:
        async with asyncio.timeout(30):
            await paused.wait()
            # Nobody reads: the queue stays within its bound and the child is not read meanwhile.
            assert stream._bytes <= STREAM_BUFFER_BYTES
            assert SHED.get("upstream_read_pauses") > pauses_before
            # Now the client reads everything: the child is resumed, and nothing was lost.
            notes = 0
            answer = None
            while answer is None:
                item = stream.pop()
                if item is None:
                    await stream.wait(5.0)
                    continue
                message = item[0]
                if message.get("id") == 7:
                    answer = message
                else:
                    assert message["params"]["data"]["i"] == notes, "in order, none missing"
                    notes += 1
                assert stream._bytes <= STREAM_BUFFER_BYTES
            await task
        assert answer["result"] == {"done": True}
        assert notes == NOTES
        assert SHED.get("dropped_messages", "stream_full") == dropped_before
        assert states[0] is True and states[-1] is False, "paused, then resumed"
    finally:
        task.cancel()
        await relay.aclose()
        await upstream.aclose()
