"""The stdio frontend's output is bounded for a client that does not read its stdout: notifications
beyond the bound are dropped and counted, responses are always written. A real pipe whose reading
end nobody reads."""

from __future__ import annotations

import asyncio
import os

import pytest

from proxy.frontend.stdio import STDOUT_BUFFER_BYTES, _StdoutOutbox
from proxy.telemetry.shed import SHED

pytestmark = pytest.mark.anyio


async def test_notifications_stop_at_the_bound_of_an_unread_stdout_and_answers_still_go() -> None:
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    pipe = os.fdopen(write_fd, "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    out = _StdoutOutbox(writer)
    before = SHED.get("dropped_messages", "stream_full")
    try:
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x" * 65536}}
        for _ in range(200):  # 12.5 MiB offered to a pipe nobody reads
            out.send(note)
        held = transport.get_write_buffer_size()
        assert held <= STDOUT_BUFFER_BYTES + 70_000
        dropped = SHED.get("dropped_messages", "stream_full") - before
        assert dropped > 0
        out.send({"jsonrpc": "2.0", "id": 1, "result": {}})
        assert transport.get_write_buffer_size() > held, "the answer is written anyway"
    finally:
        transport.abort()
        os.close(read_fd)
