"""Server messages tied to no request (isolation, and memory bounded for a caller that does not
read): a 2025 session keeps them in a backlog bounded in bytes as well as count; the shared 2026
relay gives them to nobody. The relay is built on a real stdio link (its child is never needed:
messages are handed to the relay the way the link's reader hands them)."""

from __future__ import annotations

import asyncio

import pytest

from proxy import jsonrpc
from proxy.core.relay import Relay, ToolCatalog
from proxy.core.routing import BACKLOG_BYTES
from proxy.core.server_messages import REFUSALS_IN_FLIGHT
from proxy.jsonrpc import Message
from proxy.telemetry.shed import SHED
from proxy.upstream.base import Era, PendingTable
from proxy.upstream.stdio import StdioUpstream

pytestmark = pytest.mark.anyio


class Collected:
    closed = False

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, message: Message) -> None:
        self.messages.append(message)


def _log(i: int) -> Message:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": "info", "data": "x" * 131072, "i": i},
    }


async def test_a_sessions_backlog_is_bounded_in_bytes_and_keeps_the_newest() -> None:
    upstream = StdioUpstream(["true"])
    relay = Relay(await upstream.open(Era.LEGACY), catalog=ToolCatalog(), session_id="s")
    before = SHED.get("dropped_messages", "backlog_full")
    for i in range(100):  # 12.5 MiB while no stream is open
        relay.server_messages.unsolicited(_log(i))
    listen = Collected()
    assert relay.attach_listen(listen)
    delivered = sum(len(jsonrpc.dumps(m)) for m in listen.messages)
    assert delivered <= BACKLOG_BYTES
    assert [m["params"]["i"] for m in listen.messages] == list(range(100 - len(listen.messages), 100))
    assert SHED.get("dropped_messages", "backlog_full") - before == 100 - len(listen.messages)
    await upstream.aclose()


async def test_the_shared_relay_gives_an_untied_message_to_nobody() -> None:
    upstream = StdioUpstream(["true"])
    relay = Relay(await upstream.open(Era.MODERN), catalog=ToolCatalog())
    assert relay.shared
    stream = Collected()
    relay.delivery.streams.append(stream)  # a caller's request stream is open
    before = SHED.get("dropped_messages", "untied")
    relay.server_messages.unsolicited(_log(0))
    assert stream.messages == []
    assert SHED.get("dropped_messages", "untied") - before == 1
    await upstream.aclose()


async def test_a_log_line_naming_no_request_goes_only_to_a_sole_request_on_the_link_that_asked_for_logs() -> None:
    """The link decides, seeing every request in flight on it (a native 2026 caller's and a bridged
    2025 session's alike): a log line goes to the one request in flight that asked for logs
    (`logLevel` in its `_meta`); with a second request in flight, or when the sole one did not ask,
    it cannot be told whose it is: the shared relay then gives it to nobody (counted as untied)."""
    upstream = StdioUpstream(["true"])
    relay = Relay(await upstream.open(Era.MODERN), catalog=ToolCatalog())
    pending = PendingTable()  # the link's table of requests in flight, as every stdio link keeps one
    asked, other = Collected(), Collected()
    relay.delivery.streams.extend([asked, other])  # two request streams open on the relay
    meta = {jsonrpc.META_LOG_LEVEL: "info"}
    asking = pending.add({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"_meta": meta}}, asked.send)
    assert pending.route_related(_log(0))
    assert [m["params"]["i"] for m in asked.messages] == [0]
    pending.add({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {}}, other.send)  # in flight at once
    before = SHED.get("dropped_messages", "untied")
    assert not pending.route_related(_log(1))
    relay.server_messages.unsolicited(_log(1))  # where the link's reader hands what it did not route
    pending.discard(asking)  # the sole request left did not ask for logs
    assert not pending.route_related(_log(2))
    relay.server_messages.unsolicited(_log(2))
    assert [m["params"]["i"] for m in asked.messages] == [0] and other.messages == []
    assert SHED.get("dropped_messages", "untied") - before == 2
    await upstream.aclose()


async def test_refusing_a_flood_of_untied_server_requests_holds_a_bounded_number_of_writes() -> None:
    """A server on the shared link that floods it with requests while not reading its own input:
    each refusal waits on the full pipe. Before, every one was a task of its own, without limit."""
    upstream = StdioUpstream(["true"])
    link = await upstream.open(Era.MODERN)
    relay = Relay(link, catalog=ToolCatalog())
    assert relay.shared
    stuck = asyncio.Event()
    written: list[Message] = []

    async def never_drains(message: Message) -> None:
        written.append(message)
        await stuck.wait()

    link.send_response = never_drains  # type: ignore[method-assign]
    request = {"jsonrpc": "2.0", "method": "sampling/createMessage", "params": {}}
    for i in range(5000):
        relay.server_messages.unsolicited({**request, "id": i})
    assert len(relay._background) <= REFUSALS_IN_FLIGHT
    stuck.set()
    await asyncio.wait_for(asyncio.gather(*relay._background), 10)
    assert len(written) == len(set(m["id"] for m in written)) <= REFUSALS_IN_FLIGHT
    relay.server_messages.unsolicited({**request, "id": "after"})  # the pipe drained: refusals go out again
    await asyncio.wait_for(asyncio.gather(*relay._background), 10)
    assert written[-1]["id"] == "after" and written[-1]["error"]["code"] == -32603
    await upstream.aclose()
