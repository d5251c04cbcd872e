"""Hypothesis strategies shared by the fuzz tests: JSON values, JSON-RPC-shaped messages, and
2026 requests with their routing headers (mostly mirroring the body, each then perturbed)."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import strategies as st

from proxy import jsonrpc

# orjson, the proxy's codec, writes 64-bit integers only (bigger ones are covered as raw bytes).
INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
JSON = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
IDS = st.one_of(INT64, st.text(max_size=10), st.none(), st.booleans(), st.floats(allow_nan=False), JSON)
# Methods a client may send. Tools that hang, crash or charge on the scripted upstream are never
# named: a call of those is a fault test of its own, not input handling.
CLIENT_METHODS = st.sampled_from(
    [
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "logging/setLevel",
        "completion/complete",
        "server/discover",
        "notifications/cancelled",
        "notifications/initialized",
        "notifications/progress",
        "no/such/method",
    ]
)
SAFE_TOOLS = st.sampled_from(["echo", "log_then_answer", "rpc_error", "no_such_tool", ""])


@st.composite
def jsonrpc_shaped(draw: st.DrawFn, methods: st.SearchStrategy[Any] = CLIENT_METHODS) -> dict[str, Any]:
    """Objects close to JSON-RPC messages: every member present or not, of any JSON type."""
    message: dict[str, Any] = {}
    for key, values in (
        ("jsonrpc", st.sampled_from(["2.0", "1.0", 2.0, None]) | JSON),
        ("id", IDS),
        ("method", methods | JSON),
        ("params", JSON),
        ("result", JSON),
        ("error", JSON),
    ):
        if draw(st.integers(0, 2)) if key in ("jsonrpc", "method") else draw(st.booleans()):
            message[key] = draw(values)
    return message


@st.composite
def client_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed JSON-RPC requests and notifications with arbitrary params (tools/call names
    only safe tools, with arbitrary arguments)."""
    method = draw(CLIENT_METHODS)
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if not method.startswith("notifications/"):
        message["id"] = draw(st.integers(min_value=-(2**53), max_value=2**53) | st.text(max_size=12))
    if method == "tools/call":
        params: Any = {"name": draw(SAFE_TOOLS), "arguments": draw(st.dictionaries(st.text(max_size=8), JSON))}
        if draw(st.booleans()):
            params["arguments"] = draw(JSON)
    else:
        params = draw(JSON)
    if draw(st.integers(0, 4)):
        message["params"] = params
    return message


METHODS_2026 = st.sampled_from(["tools/call", "resources/read", "prompts/get", "tools/list", "custom/thing", "ping"])
NAMES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["echo", "=?base64?", "=?base64?bm9wZQ==?=", "a b", " echo", "échö"]),
    st.text(max_size=8).map(lambda s: "=?base64?" + base64.b64encode(s.encode()).decode() + "?="),
)
VERSIONS = st.sampled_from(["2026-07-28", "2025-11-25", "2025-06-18", "2099-01-01", "", "2026-07-28 "])


@st.composite
def modern_request(
    draw: st.DrawFn, methods: st.SearchStrategy[str] = METHODS_2026, names: st.SearchStrategy[Any] = NAMES
) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026 request and its routing headers."""
    method = draw(methods)
    key = "uri" if method == "resources/read" else "name"
    params: dict[str, Any] = {}
    if draw(st.booleans()):
        params[key] = draw(names | JSON)
    meta: dict[str, Any] = {}
    if draw(st.integers(0, 5)):
        meta[jsonrpc.META_PROTOCOL_VERSION] = draw(VERSIONS | JSON)
    if draw(st.integers(0, 5)):
        meta[jsonrpc.META_CLIENT_CAPABILITIES] = draw(st.just({}) | JSON)
    if draw(st.integers(0, 5)):
        params["_meta"] = meta if draw(st.integers(0, 5)) else draw(JSON)
    if method == "tools/call" and draw(st.booleans()):
        params["arguments"] = draw(st.dictionaries(st.text(max_size=8), JSON, max_size=3))
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": draw(st.integers(-(2**53), 2**53) | st.text(max_size=5)),
        "method": method,
    }
    if draw(st.integers(0, 8)):
        message["params"] = params
    headers: dict[str, str] = {}
    version = meta.get(jsonrpc.META_PROTOCOL_VERSION)
    mirrors = {
        "mcp-protocol-version": version if isinstance(version, str) else "2026-07-28",
        "mcp-method": method,
    }
    name = params.get(key)
    if isinstance(name, str):
        mirrors["mcp-name"] = name
    for header, mirror in mirrors.items():
        choice = draw(st.integers(0, 5))
        if choice <= 3:
            headers[header] = mirror
        elif choice == 4:
            headers[header] = draw(VERSIONS | NAMES | METHODS_2026)
    if draw(st.integers(0, 6)) == 0:
        headers["mcp-name"] = draw(NAMES)
    return message, headers
