"""The tool catalog over an in-memory link: listed once per upstream (or principal), refreshed on
`notifications/tools/list_changed`, and a tool it cannot name reported as one with an output schema
would be. The link stands in for a transport; what is tested is the catalog's and engine's logic."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from proxy.auth.base import Principal
from proxy.core.catalog import Catalogs
from proxy.core.engine import Engine
from proxy.core.relay import Relay
from proxy.policy.compiled import PolicySet
from proxy.upstream.base import Era, Exchange, OnMessage
from tests.core.memory_link import MemoryLink, RecordingOutbox

pytestmark = pytest.mark.anyio

TIMED_OUT = {"isError": True, "content": [{"type": "text", "text": "database timed out after 5s"}]}
CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "query", "arguments": {"sql": "x"}}}


class ListingLink(MemoryLink):
    """Answers tools/list with `listing` (a JSON-RPC result, or None: an empty, invalid result),
    anything else with `TIMED_OUT`; `unsolicited` is what the relay registered for server messages."""

    era = Era.MODERN

    def __init__(self, listing: dict[str, Any] | None) -> None:
        super().__init__()
        self.listing = listing
        self.lists = 0
        self.unsolicited: OnMessage | None = None

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        self.unsolicited = handler

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        ex = await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        if message["method"] == "tools/list":
            self.lists += 1
            answer = self.listing if self.listing is not None else {}
        else:
            answer = TIMED_OUT
        asyncio.get_running_loop().call_soon(self.answer, ex, answer)
        return ex


def listing(read_only: bool) -> dict[str, Any]:
    tool = {"name": "query", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": read_only}}
    return {"tools": [tool]}


def relay_for(link: ListingLink, catalogs: Catalogs | None = None) -> Relay:
    engine = Engine(policies=lambda: PolicySet(version="test"))
    return Relay(link, catalogs=catalogs, tool_calls=engine)  # type: ignore[arg-type]


async def test_a_tool_the_listing_could_not_name_gets_its_report_outside_structured_content() -> None:
    link = ListingLink(None)
    outbox = RecordingOutbox()
    async with asyncio.timeout(10):
        await relay_for(link).handle_request(CALL, outbox)
    (answer,) = outbox.messages
    result = answer["result"]
    assert result["isError"] is True
    assert "io.mcp-recovery-proxy/unresolved" in result["_meta"]
    assert "structuredContent" not in result, "an unknown tool may declare an output schema"


async def test_the_catalog_is_listed_once_and_again_after_list_changed() -> None:
    link = ListingLink(listing(read_only=True))
    relay = relay_for(link)
    async with asyncio.timeout(10):
        relay.list_tools_soon()  # the upstream was reached
        await relay.catalog.ready(relay.lister(relay.catalog, None, None), 5)
        assert relay.catalog.annotations("query") == {"readOnlyHint": True}
        outbox = RecordingOutbox()
        await relay.handle_request(CALL, outbox)
        await relay.handle_request({**CALL, "id": 8}, outbox)
        assert link.lists == 1, "calls use the catalog, they do not list"
        link.listing = listing(read_only=False)
        assert link.unsolicited is not None
        link.unsolicited({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        await relay.catalog.ready(relay.lister(relay.catalog, None, None), 5)
    assert link.lists == 2
    assert relay.catalog.annotations("query") == {"readOnlyHint": False}


async def test_with_passthrough_each_principal_has_its_own_listing() -> None:
    link = ListingLink(listing(read_only=True))
    relay = relay_for(link, Catalogs(per_principal=True))
    alice, bob = Principal("passthrough:a"), Principal("passthrough:b")
    async with asyncio.timeout(10):
        assert await relay.lookup_tool("query", None, 5, {"authorization": "Bearer a"}, alice) is not None
        link.listing = {"tools": []}
        assert await relay.lookup_tool("query", None, 5, {"authorization": "Bearer b"}, bob) is None
    assert link.lists == 2
    assert relay.catalog_of(alice).tools.keys() == {"query"}
    assert not relay.catalog_of(bob).tools
    assert "query" in relay.catalog.tools  # the upstream's union (labels, status page)
