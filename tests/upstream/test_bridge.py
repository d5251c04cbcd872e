"""The era bridge's translations (proxy/upstream/bridge.py), the parts that are pure functions of a
message: what a 2026 request loses before it reaches a 2025 session, and what a 2025 answer gains
or loses before it reaches a 2026 caller. The bridge end to end: tests/e2e/test_era_bridge.py,
tests/interop/test_era_bridge.py."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.upstream.bridge import (
    ModernOverLegacy,
    asked_capabilities,
    legacy_form,
    level_of,
    without_modern_meta,
)

MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
    "io.modelcontextprotocol/clientInfo": {"name": "c", "version": "1"},
    "io.modelcontextprotocol/logLevel": "warning",
}


class _NoLink:
    """The bridge's translations never touch its session: only `set_unsolicited_handler` is called."""

    def set_unsolicited_handler(self, handler: Any) -> None:
        pass


def bridge(init: dict[str, Any] | None = None) -> ModernOverLegacy:
    result = init or {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "s", "version": "2"}}
    return ModernOverLegacy(_NoLink(), result)  # type: ignore[arg-type]


def test_a_request_loses_the_2026_meta_keys_and_keeps_every_other_one() -> None:
    meta = {**MODERN_META, "progressToken": 7, "traceparent": "00-abc", "com.example/x": 1}
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "_meta": meta}}
    out = without_modern_meta(request)
    assert out["params"] == {"name": "t", "_meta": {"progressToken": 7, "traceparent": "00-abc", "com.example/x": 1}}
    assert request["params"]["_meta"] is meta and len(meta) == 7, "the caller's message is not changed"
    bare = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": dict(MODERN_META)}}
    assert without_modern_meta(bare)["params"] == {}, "an emptied _meta goes too"


def test_the_requested_log_level_is_read_and_an_unknown_one_means_none() -> None:
    assert level_of({"params": {"_meta": MODERN_META}}) == 3  # warning
    assert level_of({"params": {"_meta": {"io.modelcontextprotocol/logLevel": "loud"}}}) is None
    assert level_of({"params": {}}) is None


def test_an_answer_gains_the_2026_fields_and_loses_the_2025_task_field() -> None:
    tool = {"name": "t", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}}
    listed = bridge().translated("tools/list", {"jsonrpc": "2.0", "id": 1, "result": {"tools": [tool]}})
    result = listed["result"]
    assert result["tools"] == [{"name": "t", "inputSchema": {"type": "object"}}]
    assert result["resultType"] == "complete" and result["ttlMs"] == 0 and result["cacheScope"] == "private"
    assert result["_meta"] == {"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "2"}}
    answer = {"jsonrpc": "2.0", "id": 2, "result": {"content": [], "_meta": {"k": 1}}}
    called = bridge().translated("tools/call", answer)
    assert called["result"]["_meta"]["k"] == 1 and "ttlMs" not in called["result"]


def test_a_2025_resource_not_found_becomes_the_2026_code_and_other_errors_go_as_they_came() -> None:
    missing = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32002, "message": "Resource not found"}}
    assert bridge().translated("resources/read", missing)["error"] == {"code": -32602, "message": "Resource not found"}
    other = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "boom"}}
    assert bridge().translated("tools/call", other) == other


def test_discover_is_answered_from_initialize_without_2025_tasks() -> None:
    init = {
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {"listChanged": True}, "tasks": {"list": {}}},
        "serverInfo": {"name": "s", "version": "2"},
        "instructions": "use it well",
    }
    found = bridge(init).discover()
    assert found["supportedVersions"] == ["2026-07-28"] and found["capabilities"] == {"tools": {"listChanged": True}}
    assert found["instructions"] == "use it well" and found["resultType"] == "complete"
    assert found["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "s"


def test_a_request_runs_on_a_session_declaring_what_a_2025_server_can_ask_its_client() -> None:
    def request(method: str, caps: Any) -> dict[str, Any]:
        meta = {**MODERN_META, "io.modelcontextprotocol/clientCapabilities": caps}
        return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"name": "t", "_meta": meta}}

    declared = {"sampling": {"tools": {}}, "elicitation": {"form": {}}, "roots": {"listChanged": True}, "x": {}}
    # what the session's initialize declares: the askable three, roots without listChanged (a 2026
    # client sends no roots notification)
    assert asked_capabilities(request("tools/call", declared)) == {
        "sampling": {"tools": {}},
        "elicitation": {"form": {}},
        "roots": {},
    }
    assert asked_capabilities(request("prompts/get", {"elicitation": {}})) == {"elicitation": {}}
    assert asked_capabilities(request("resources/read", {"roots": {}})) == {"roots": {}}
    # nothing to ask: the shared session serves it
    assert asked_capabilities(request("tools/call", {})) is None
    assert asked_capabilities(request("tools/call", {"experimental": {}})) is None
    # any request: the server sees the client as a 2025 client declaring them (a server may list
    # some tools only to a client that can sample)
    assert asked_capabilities(request("tools/list", {"sampling": {}})) == {"sampling": {}}
    assert asked_capabilities({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}) is None


def test_a_task_augmented_call_runs_in_place_and_task_methods_are_not_found() -> None:
    """No tasks are bridged (2026-07-28 has no core tasks, and discover offers none): the `task` of
    a call is dropped, as a 2026 server without the tasks extension ignores it."""
    call = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "t", "arguments": {}, "task": {"ttl": 60000}, "_meta": MODERN_META},
    }
    assert legacy_form(call)["params"] == {"name": "t", "arguments": {}}

    async def answers() -> list[Any]:
        link = bridge()  # its session is never touched: the bridge answers these itself
        out = []
        for method in ("tasks/get", "tasks/result", "tasks/cancel", "tasks/list"):
            request = {"jsonrpc": "2.0", "id": 9, "method": method, "params": {"taskId": "x", "_meta": MODERN_META}}
            out.append((await (await link.send_request(request)).response)["error"]["code"])
        return out

    assert asyncio.run(answers()) == [-32601] * 4
