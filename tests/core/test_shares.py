"""`proxy.core.admission`: a client's share across its sessions, on the in-memory link (no socket needed
to show the counting; the end-to-end version is tests/e2e/test_limits.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.core.admission import ClientShares, SharesFull, Slots
from proxy.core.relay import Relay, ToolCatalog
from proxy.telemetry.shed import SHED
from tests.core.memory_link import MemoryLink, RecordingOutbox
from tests.core.test_request_limits import read, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_a_forced_holder_lowers_the_share_and_waiters_past_the_bound_are_refused() -> None:
    loop = asyncio.get_running_loop()
    slots = Slots(2, max_waiters=1)
    assert slots.try_take() and slots.try_take() and not slots.try_take()
    slots.force_take()  # a listen stream: never waits, even past the limit
    waiter = asyncio.ensure_future(slots.take(loop))
    await asyncio.sleep(0)
    with pytest.raises(SharesFull):
        await slots.take(loop)
    slots.give_back()  # 3 held of 2: the slot is not handed on yet
    await asyncio.sleep(0)
    assert not waiter.done() and slots.held == 2
    slots.give_back()
    await asyncio.wait_for(waiter, 5)
    assert slots.held == 2
    for _ in range(2):
        slots.give_back()
    assert slots.idle


async def test_sessions_of_one_client_share_one_bound_and_another_client_is_not_held_up() -> None:
    shares = ClientShares(3)
    link = MemoryLink()

    def session(client: str) -> Relay:
        return Relay(link, catalog=ToolCatalog(), max_in_flight=32, shares=shares, client=client)  # type: ignore[arg-type]

    hog = [session("10.0.0.1") for _ in range(3)]
    before = SHED.get("http_refused", "upstream_share")
    tasks: list[asyncio.Task[Any]] = []
    outs = []
    for relay in hog:  # 3 sessions x 3 requests: 3 upstream, 3 waiting, 3 refused
        for i in range(3):
            out = RecordingOutbox()
            outs.append(out)
            tasks.append(asyncio.create_task(relay.handle_request(read(i), out)))
    await until(lambda: len(link.sent) == 3 and sum(1 for o in outs if o.messages) == 3)
    assert SHED.get("http_refused", "upstream_share") - before == 3
    refused = [o.messages[0] for o in outs if o.messages]
    assert all("its share of the upstream" in m["error"]["message"] for m in refused)
    other = RecordingOutbox()
    task = asyncio.create_task(session("10.0.0.2").handle_request(read(99, "slow://other"), other))
    await until(lambda: len(link.sent) == 4)
    ex = link.pending.get(link.sent[3]["id"])
    assert ex is not None
    link.answer(ex, {"ok": True})
    await asyncio.wait_for(task, 10)
    assert other.messages[0]["result"] == {"ok": True}
    first = link.pending.get(link.sent[0]["id"])
    assert first is not None
    link.answer(first, {})
    await until(lambda: len(link.sent) == 5)  # a freed slot goes to the client's next waiter
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
