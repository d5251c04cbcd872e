"""A 2026 tools/call before the upstream was reached (proxy/core/reaching.py), over in-memory links:
the failure to reach it is an attempt the engine classifies and reports, and an attempt that
reached it and was then given up is cancelled on the link that took it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.core.engine import Engine
from proxy.core.reaching import ReachingLink
from proxy.core.relay import Relay
from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.policy.compiled import PolicySet
from proxy.upstream.base import Era
from tests.core.memory_link import MemoryLink, RecordingOutbox

pytestmark = pytest.mark.anyio

CALL = {
    "jsonrpc": "2.0",
    "id": 3,
    "method": "tools/call",
    "params": {"name": "hang", "arguments": {}, "_meta": {"io.mcp-recovery-proxy/deadlineMs": 600}},
}


class SilentLink(MemoryLink):
    """The real 2026 link: takes every request, answers none."""

    era = Era.MODERN


class Reach:
    """The service's `modern_relay`: fails `failures` times, then gives the relay over `link`."""

    def __init__(self, link: SilentLink, failures: int) -> None:
        self.relay = Relay(link)  # type: ignore[arg-type]
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise UpstreamFailure(FailureKind.CONNECT_FAILED, Dispatch.NO, "upstream probe failed: refused")
        return self.relay


def reaching_relay(reach: Reach) -> Relay:
    engine = Engine(policies=lambda: PolicySet(version="test"))
    return Relay(ReachingLink(reach), tool_calls=engine)  # type: ignore[arg-type]


async def test_an_upstream_never_reached_is_a_transient_attempt_not_dispatched_in_the_report() -> None:
    reach = Reach(SilentLink(), failures=1000)
    outbox = RecordingOutbox()
    async with asyncio.timeout(10):
        await reaching_relay(reach).handle_request(CALL, outbox, by_id=False)
    (answer,) = outbox.messages
    report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    assert report["errorCategory"] == "transient"
    assert [step["dispatched"] for step in report["attemptedSteps"]] == ["no"] * report["attemptCount"]
    assert report["attemptCount"] >= 1 and reach.calls >= report["attemptCount"]  # (and the tools listing's)


async def test_an_attempt_that_reached_the_upstream_and_was_given_up_is_cancelled_on_its_link() -> None:
    link = SilentLink()
    reach = Reach(link, failures=0)
    outbox = RecordingOutbox()
    async with asyncio.timeout(10):
        await reaching_relay(reach).handle_request(CALL, outbox, by_id=False)
        calls = [m["id"] for m in link.sent if m["method"] == "tools/call"]
        while not set(calls) <= set(link.cancelled):  # cancellations are written in the background
            await asyncio.sleep(0.01)
            calls = [m["id"] for m in link.sent if m["method"] == "tools/call"]
    (answer,) = outbox.messages
    assert answer["result"]["isError"] is True
    assert calls, "the attempt reached the real link"


class WritesThenWaits(SilentLink):
    """Writes a tool call (its `on_write` runs), then its `send_request` never returns: a hand-over
    that an attempt's timer cuts after the request went out."""

    async def send_request(self, message: dict[str, Any], **kw: Any) -> Any:
        ex = await super().send_request(message, **kw)
        if message["method"] == "tools/call":
            await asyncio.get_running_loop().create_future()  # until cancelled
        return ex


async def test_an_attempt_cut_after_the_reached_link_wrote_it_is_dispatch_unknown() -> None:
    reach = Reach(WritesThenWaits(), failures=0)
    outbox = RecordingOutbox()
    async with asyncio.timeout(10):
        await reaching_relay(reach).handle_request(CALL, outbox, by_id=False)
    (answer,) = outbox.messages
    report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    assert [step["dispatched"] for step in report["attemptedSteps"]] == ["unknown"], report
    assert report["stopReason"] == "outcome_unknown", report
