"""The relay's own bounds on relayed requests (so one session cannot hold the upstream for
everyone), on an in-memory link.

The in-memory link stands in for an upstream transport (it records what was sent and cancelled;
nothing here needs a socket or a process): a timeout for every relayed request other than
`tools/call`, its upstream cancellation, and the per-caller share of requests in flight.
The end-to-end versions through the real proxy and real upstreams are in tests/e2e/test_limits.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.core.relay import Relay, ToolCatalog
from proxy.telemetry.shed import SHED
from tests.core.memory_link import MemoryLink, RecordingOutbox

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def read(id_: int, uri: str = "slow://x") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "resources/read", "params": {"uri": uri}}


async def until(condition: Any) -> None:
    """Let the loop run until `condition()` holds (bounded by the test's timeout)."""
    while not condition():  # noqa: ASYNC110 (a loop step, not a wait for time: the link has no event)
        await asyncio.sleep(0)


async def test_a_request_the_upstream_never_answers_is_answered_with_a_timeout_error_and_cancelled() -> None:
    link = MemoryLink()
    relay = Relay(link, catalog=ToolCatalog(), request_timeout_s=0.05)  # type: ignore[arg-type]
    out = RecordingOutbox()
    before = SHED.get("relayed_timeouts")
    await asyncio.wait_for(relay.handle_request(read(7), out), 10)
    assert SHED.get("relayed_timeouts") - before == 1
    [answer] = out.messages
    assert answer["id"] == 7
    assert answer["error"]["code"] == -32001
    assert "did not answer resources/read within 0.05 s" in answer["error"]["message"]
    assert answer["error"]["data"]["io.mcp-recovery-proxy/upstreamFailure"]["kind"] == "timeout"
    await until(lambda: link.cancelled)
    assert link.cancelled == [link.sent[0]["id"]], "cancelled upstream under the id it was sent with"


async def test_long_lived_requests_have_no_request_timeout() -> None:
    link = MemoryLink()
    relay = Relay(link, catalog=ToolCatalog(), request_timeout_s=0.01)  # type: ignore[arg-type]
    out = RecordingOutbox()
    listen = {"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {}}
    task = asyncio.create_task(relay.handle_request(listen, out))
    await until(lambda: link.sent)
    assert relay._deadlines is None, "no timer was armed for it"
    assert not task.done() and out.messages == []
    ex = link.pending.get(link.sent[0]["id"])
    assert ex is not None
    link.answer(ex, {})
    await asyncio.wait_for(task, 10)
    assert out.messages[0]["result"] == {}


async def test_a_session_has_at_most_its_share_upstream_and_the_rest_wait_in_order() -> None:
    link = MemoryLink()
    relay = Relay(link, catalog=ToolCatalog(), max_in_flight=2)  # type: ignore[arg-type]
    outs = [RecordingOutbox() for _ in range(4)]
    tasks = [asyncio.create_task(relay.handle_request(read(i), outs[i])) for i in range(4)]
    await until(lambda: len(link.sent) == 2)
    for _ in range(10):  # the others wait, however long the loop runs
        await asyncio.sleep(0)
    assert len(link.sent) == 2
    # One answer frees one slot: the next request in arrival order goes.
    first = link.pending.get(link.sent[0]["id"])
    assert first is not None
    link.answer(first, {"n": 0})
    await until(lambda: len(link.sent) == 3)
    assert link.sent[2]["params"]["uri"] == "slow://x"
    # A waiting request that is cancelled gives up its place, not a slot it never had.
    tasks[3].cancel()
    for i in (1, 2):
        ex = link.pending.get(link.sent[i]["id"])
        assert ex is not None
        link.answer(ex, {"n": i})
    await asyncio.wait_for(asyncio.gather(*tasks[:3]), 10)
    assert len(link.sent) == 3, "the cancelled one never went upstream"
    assert [o.messages[0]["result"]["n"] for o in outs[:3]] == [0, 1, 2]
    # Every slot came back: the next request goes at once.
    out = RecordingOutbox()
    task = asyncio.create_task(relay.handle_request(read(9), out))
    await until(lambda: len(link.sent) == 4)
    task.cancel()


async def test_callers_of_the_shared_relay_each_get_their_own_share() -> None:
    link = MemoryLink()
    relay = Relay(link, catalog=ToolCatalog(), max_in_flight=1)  # type: ignore[arg-type]
    hog = [asyncio.create_task(relay.handle_request(read(i), RecordingOutbox(), caller="10.0.0.1")) for i in range(3)]
    await until(lambda: len(link.sent) == 1)
    other = RecordingOutbox()
    task = asyncio.create_task(relay.handle_request(read(99, "slow://other"), other, caller="10.0.0.2"))
    await until(lambda: len(link.sent) == 2)
    assert link.sent[1]["params"]["uri"] == "slow://other"
    ex = link.pending.get(link.sent[1]["id"])
    assert ex is not None
    link.answer(ex, {"ok": True})
    await asyncio.wait_for(task, 10)
    assert other.messages[0]["result"] == {"ok": True}
    for t in hog:
        t.cancel()
    await asyncio.gather(*hog, return_exceptions=True)
