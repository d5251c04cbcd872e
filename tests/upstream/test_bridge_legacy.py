"""The era bridge's second direction (proxy/upstream/bridge_shapes.py), the parts that are pure
functions of a message: `initialize` answered from `server/discover`, the session state a 2025
request gains as 2026 per-request `_meta`, what a 2026 answer loses for a 2025 client, and the
input-required round trip's requests and re-send. The bridge end to end:
tests/e2e/test_era_bridge_legacy.py."""

from __future__ import annotations

from typing import Any

from proxy.core.eras import settled
from proxy.upstream.base import Capabilities
from proxy.upstream.bridge_shapes import (
    BRIDGE_SERVER_INFO,
    continued,
    initialize_result,
    input_requests,
    is_input_required,
    legacy_response,
    legacy_result,
    modern_request,
)

SERVER_INFO = {"name": "s", "version": "2"}
DISCOVER: dict[str, Any] = {
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {"listChanged": True}, "extensions": {"io.example/x": {}}},
    "instructions": "be kind",
    "ttlMs": 0,
    "cacheScope": "public",
    "resultType": "complete",
    "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
}


def test_initialize_is_answered_from_discover_in_the_revision_the_client_asked_for() -> None:
    result = initialize_result(DISCOVER, "2025-06-18")
    assert result == {
        "protocolVersion": "2025-06-18",
        "capabilities": {"tools": {"listChanged": True}},  # 2026-only extensions left out
        "serverInfo": SERVER_INFO,
        "instructions": "be kind",
    }
    assert initialize_result(DISCOVER, "2026-07-28")["protocolVersion"] == "2025-11-25", "not a 2025 revision"
    assert initialize_result(DISCOVER, None)["protocolVersion"] == "2025-11-25"
    bare = initialize_result({"supportedVersions": ["2026-07-28"], "capabilities": {}}, "2025-11-25")
    assert bare["serverInfo"] == BRIDGE_SERVER_INFO and "instructions" not in bare


def test_a_request_carries_the_session_state_as_2026_meta_and_keeps_its_own_keys() -> None:
    caps = {"sampling": {}, "elicitation": {"form": {}}}
    info = {"name": "c", "version": "1"}
    request = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "t", "_meta": {"progressToken": 3}},
    }
    out = modern_request(request, caps, info, "warning")
    assert out["params"]["_meta"] == {
        "progressToken": 3,
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": info,
        "io.modelcontextprotocol/logLevel": "warning",
    }
    assert request["params"]["_meta"] == {"progressToken": 3}, "the caller's message is not changed"
    quiet = modern_request({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, {}, None, None)
    assert quiet["params"]["_meta"] == {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }, "no level set: no log level asked, so the server sends no log messages"


def test_an_answer_loses_the_2026_fields_and_the_server_info_meta() -> None:
    result = {
        "content": [],
        "resultType": "complete",
        "ttlMs": 5,
        "cacheScope": "public",
        "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO, "k": 1},
    }
    assert legacy_result("tools/call", result) == {"content": [], "_meta": {"k": 1}}
    only_info = {"tools": [], "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO}}
    assert legacy_result("tools/list", only_info) == {"tools": []}
    error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "nope"}}
    assert legacy_response("resources/read", error) == error


def test_structured_content_that_is_not_an_object_is_wrapped_and_so_is_its_output_schema() -> None:
    assert legacy_result("tools/call", {"content": [], "structuredContent": [1, 2]})["structuredContent"] == {
        "result": [1, 2]
    }
    assert legacy_result("tools/call", {"content": [], "structuredContent": 7})["structuredContent"] == {"result": 7}
    assert legacy_result("tools/call", {"content": [], "structuredContent": {"a": 1}})["structuredContent"] == {"a": 1}
    assert "structuredContent" not in legacy_result("tools/call", {"content": [], "structuredContent": None})
    tools = [
        {
            "name": "list",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "array", "items": {"type": "integer"}},
        },
        {"name": "obj", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
        {"name": "none", "inputSchema": {"type": "object"}},
    ]
    listed = legacy_result("tools/list", {"tools": tools})["tools"]
    assert listed[0]["outputSchema"] == {
        "type": "object",
        "properties": {"result": {"type": "array", "items": {"type": "integer"}}},
        "required": ["result"],
    }
    assert listed[1] == tools[1] and listed[2] == tools[2]


def test_input_requests_are_listed_where_the_client_declared_the_capability_else_refused() -> None:
    elicit = {"method": "elicitation/create", "params": {"message": "name?"}}
    sample = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}
    result = {"resultType": "input_required", "inputRequests": {"who": elicit, "llm": sample}, "requestState": "s"}
    assert is_input_required({"result": result}) and not is_input_required({"result": {"content": []}})
    asked = input_requests(result, {"elicitation": {}, "sampling": {}})
    assert asked == [
        ("who", "elicitation/create", {"message": "name?"}),
        ("llm", "sampling/createMessage", sample["params"]),
    ]
    refused = input_requests(result, {"elicitation": {}})
    assert isinstance(refused, str) and "sampling" in refused and "initialize" in refused
    odd = input_requests({"inputRequests": {"x": {"method": "tasks/get"}}}, {"elicitation": {}})
    assert isinstance(odd, str) and "tasks/get" in odd
    assert input_requests({"resultType": "input_required", "requestState": "only"}, {}) == []


def test_the_re_sent_request_has_a_new_id_the_answers_and_the_state_echoed() -> None:
    first = {
        "jsonrpc": "2.0",
        "id": 10,
        "method": "tools/call",
        "params": {"name": "t", "inputResponses": {"old": {}}, "_meta": {"progressToken": 10, "k": 1}},
    }
    again = continued(first, 11, {"who": {"action": "accept", "content": {"name": "Ada"}}}, "opaque")
    assert again["id"] == 11
    assert again["params"] == {
        "name": "t",
        "_meta": {"progressToken": 11, "k": 1},
        "inputResponses": {"who": {"action": "accept", "content": {"name": "Ada"}}},
        "requestState": "opaque",
    }
    stateless = continued(first, 12, {}, None)
    assert "requestState" not in stateless["params"] and "inputResponses" not in stateless["params"]


def test_a_first_session_settles_an_assumed_2025_either_way() -> None:
    assumed = Capabilities(legacy=True, modern=True, detail="supportedVersions=['2026-07-28']", legacy_assumed=True)
    assert "legacy_assumed" not in repr(assumed), "the probe's log line reads as before"
    refused = settled(assumed, False)
    assert (refused.legacy, refused.modern, refused.legacy_assumed) == (False, True, False)
    assert refused.detail.endswith("initialize refused: 2026-07-28 only")
    answered = settled(assumed, True)
    assert (answered.legacy, answered.legacy_assumed, answered.detail) == (True, False, assumed.detail)
