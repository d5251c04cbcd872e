"""Writers waiting for a stdio child's stdin to drain: one of them being cancelled (its attempt
timed out) must not cancel the others.

Found by bench/load_faults.py: under load, a respawned shared 2026 child filled its stdin pipe,
many requests waited in `drain()` on one future, the first attempt timer to fire cancelled that
future, and every other waiting request got a CancelledError it took for its caller's
cancellation: those calls ended with no answer at all (2026 HTTP: an empty event stream, the SDK
client's "SSE stream ended without a response"). A real child over a real pipe here.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from proxy.upstream.stdio.process import ChildProtocol as _ChildProtocol

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

NOT_READING = "import time; time.sleep(120)"  # never reads its stdin: the pipe fills


async def test_a_cancelled_drain_leaves_the_other_writers_of_the_child_waiting() -> None:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ChildProtocol(1 << 20),
        sys.executable,
        "-c",
        NOT_READING,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdin = transport.get_pipe_transport(0)
        assert stdin is not None
        stdin.write(b"x" * (4 << 20))  # far past the pipe's size and the transport's high-water mark
        assert protocol._paused is not None and not protocol._paused.done(), "writing should be paused"
        first = asyncio.create_task(protocol.drain())
        second = asyncio.create_task(protocol.drain())
        await asyncio.sleep(0)  # one loop turn: both are now waiting in drain()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert not second.done(), "the other writer was woken by someone else's cancellation"
        transport.kill()  # its stdin closes: nothing more will drain, the waiting writer goes on
        await asyncio.wait_for(second, 30)
    finally:
        if transport.get_returncode() is None:
            transport.kill()
        transport.close()
