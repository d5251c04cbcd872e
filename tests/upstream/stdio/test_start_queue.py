"""The queue of stdio child starts (proxy/upstream/stdio/startwait.py `StartQueue`): waiters get
their slot in the order they came; a wait is bounded by the queue's progress, not by its length.

Fast: no process; each slot's holder gives it back after a short while, standing for a start that
completes (the start itself is bounded elsewhere, by the start wait).
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.errors import Refusal
from proxy.upstream.stdio.startwait import StartQueue

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

START_S = 0.15  # each start, from its slot to its slot given back


async def test_a_queue_that_keeps_progressing_serves_every_waiter_in_order_however_long_it_takes() -> None:
    # Six starts one at a time take 6 x START_S; each waiter's bound is 2 x START_S of no progress.
    # The last waits 5 x START_S, far past its bound, and is served, since starts kept completing.
    queue = StartQueue(1, stall_s=2 * START_S)
    loop = asyncio.get_running_loop()
    order: list[int] = []

    async def start(i: int) -> None:
        give_back = await queue.take()
        order.append(i)
        loop.call_later(START_S, give_back)

    async with asyncio.timeout(20):
        await asyncio.gather(*(start(i) for i in range(6)))
    assert order == list(range(6))


async def test_a_queue_that_makes_no_progress_refuses_its_waiter_naming_the_flag() -> None:
    queue = StartQueue(1, stall_s=START_S)
    held = await queue.take()  # a start that never completes
    async with asyncio.timeout(20):
        with pytest.raises(Refusal) as refused:
            await queue.take()
    assert refused.value.limit == "session_starts"
    assert refused.value.flag == "--stdio-start-timeout-s"
    assert refused.value.http_status == 503 and refused.value.retry_after_s
    assert "--stdio-start-timeout-s" in refused.value.detail and "--stdio-sessions shared" in refused.value.detail
    held()
    assert queue.waiting == 0
    give_back = await queue.take()  # the slot it gave back serves the next start at once
    give_back()
    give_back()  # once only: a second call does not add a slot
    taken = [await queue.take()]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(START_S):
            await queue.take()
    taken[0]()
