"""Relay.attempt's one timer: the send phase is bounded by the deadline, the response wait by the
attempt timeout, and neither ever passes the deadline. An in-memory link stands in for a
transport (what is timed here is the relay's own logic, not a peer)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from proxy.core.relay import Relay, ToolCatalog
from proxy.upstream.base import Exchange, OnMessage
from tests.core.memory_link import MemoryLink, RecordingOutbox

pytestmark = pytest.mark.anyio


class SlowLink(MemoryLink):
    """Takes `send_s` to hand a request over, then answers after `answer_s` (never if None)."""

    def __init__(self, send_s: float, answer_s: float | None) -> None:
        super().__init__()
        self.send_s, self.answer_s = send_s, answer_s

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        await asyncio.sleep(self.send_s)
        ex = await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        if self.answer_s is not None:
            asyncio.get_running_loop().call_later(self.answer_s, self.answer, ex, {})
        return ex


REQUEST = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}


async def run(link: SlowLink, response_timeout_s: float, send_deadline_s: float | None) -> tuple[str, float, bool]:
    relay = Relay(link, catalog=ToolCatalog())  # type: ignore[arg-type]
    sent = asyncio.Event()
    started = time.monotonic()
    try:
        await relay.attempt(
            REQUEST,
            RecordingOutbox(),
            response_timeout_s=response_timeout_s,
            send_deadline_s=send_deadline_s,
            sent=sent,
        )
        outcome = "answered"
    except TimeoutError:
        outcome = "timeout"
    await asyncio.sleep(0)  # let the cancellation task run
    return outcome, time.monotonic() - started, sent.is_set()


async def test_a_slow_start_is_not_counted_against_the_attempt_timeout() -> None:
    outcome, _, sent = await run(SlowLink(send_s=0.15, answer_s=0.05), response_timeout_s=0.1, send_deadline_s=1.0)
    assert outcome == "answered" and sent


async def test_the_send_phase_is_bounded_by_the_deadline() -> None:
    outcome, elapsed, sent = await run(SlowLink(send_s=5.0, answer_s=0.0), response_timeout_s=0.1, send_deadline_s=0.2)
    assert outcome == "timeout" and not sent and elapsed < 0.2 + 0.3


async def test_the_response_wait_never_passes_the_deadline() -> None:
    link = SlowLink(send_s=0.15, answer_s=None)
    outcome, elapsed, sent = await run(link, response_timeout_s=1.0, send_deadline_s=0.25)
    assert outcome == "timeout" and sent and elapsed < 0.25 + 0.3
    assert link.cancelled, "the attempt the proxy stopped waiting for was cancelled upstream"


async def test_the_response_timeout_counts_from_the_hand_over_without_a_send_deadline() -> None:
    outcome, _, sent = await run(SlowLink(send_s=0.15, answer_s=0.05), response_timeout_s=0.1, send_deadline_s=None)
    assert outcome == "answered" and sent
    silent = SlowLink(send_s=0.15, answer_s=None)
    outcome, elapsed, sent = await run(silent, response_timeout_s=0.1, send_deadline_s=None)
    assert outcome == "timeout" and sent and 0.15 + 0.1 <= elapsed + 0.01 < 0.15 + 0.1 + 0.3


async def test_an_unanswered_attempt_times_out_at_its_response_timeout_not_at_the_deadline() -> None:
    link = SlowLink(send_s=0.0, answer_s=None)
    outcome, elapsed, sent = await run(link, response_timeout_s=0.1, send_deadline_s=5.0)
    assert outcome == "timeout" and sent and 0.09 <= elapsed < 0.1 + 0.3
    assert link.cancelled


async def test_attempts_that_end_in_time_leave_a_bounded_heap_and_live_ones_still_fire() -> None:
    from proxy.core.deadlines import Deadlines

    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    for _ in range(5000):  # answered in time: each only marks its entry dead
        deadlines.end(deadlines.start(None, 30.0, math.inf, loop.time()))
    assert len(deadlines.heap) < 2 * Deadlines.COMPACT_AT, "dead entries are compacted away"
    victim = loop.create_task(asyncio.sleep(10))
    started = time.monotonic()
    early_dead = deadlines.start(None, 0.05, math.inf, loop.time())
    live = deadlines.start(victim, 0.2, math.inf, loop.time())
    early_dead.sent_at = live.sent_at = loop.time()  # handed over at once, as the relay records it
    deadlines.end(early_dead)
    with contextlib.suppress(asyncio.CancelledError):
        await victim
    assert live.fired and 0.19 <= time.monotonic() - started < 0.2 + 0.3
