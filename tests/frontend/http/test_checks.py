"""The frontend's shortcut through the SDK's 2026 validation ladder agrees with the ladder itself.

`plainly_routable` may only say "routable" where `mcp.shared.inbound.classify_inbound_request`
routes the request; every rejection must still come from the ladder. Checked over combinations of
the inputs the ladder reads (envelope keys and types, version, the three routing headers, the
name-bearing parameter, including values that look like base64-encoded header values).
"""

from __future__ import annotations

import base64
import itertools
from typing import Any

from mcp.shared.inbound import InboundLadderRejection, InboundModernRoute, classify_inbound_request
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY

from proxy import jsonrpc
from proxy.frontend.http.checks import plainly_routable

MISSING = object()


def test_our_envelope_keys_are_the_sdks() -> None:
    assert jsonrpc.META_PROTOCOL_VERSION == PROTOCOL_VERSION_META_KEY
    assert jsonrpc.META_CLIENT_CAPABILITIES == CLIENT_CAPABILITIES_META_KEY


def _message(method: Any, name: Any, version: Any, caps: Any, meta_kind: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    key = "uri" if method == "resources/read" else "name"
    if name is not MISSING:
        params[key] = name
    meta: dict[str, Any] = {}
    if version is not MISSING:
        meta[jsonrpc.META_PROTOCOL_VERSION] = version
    if caps is not MISSING:
        meta[jsonrpc.META_CLIENT_CAPABILITIES] = caps
    if meta_kind == "dict":
        params["_meta"] = meta
    elif meta_kind == "list":
        params["_meta"] = [meta]
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    if meta_kind == "no-params":
        del message["params"]
    return message


def test_the_shortcut_never_routes_what_the_ladder_rejects_and_routes_the_plain_case() -> None:
    encoded = "=?base64?" + base64.b64encode("échö".encode()).decode() + "?="
    methods = ["tools/call", "resources/read", "prompts/get", "tools/list", "custom/thing"]
    names = [MISSING, None, "echo", "échö", encoded, "=?base64?bm9wZQ==?=", 7]
    versions = [MISSING, "2026-07-28", "2025-11-25", "2099-01-01", 20260728, None]
    caps = [MISSING, {}, None]
    metas = ["dict", "list", "absent", "no-params"]
    header_sets = ["mirror", "no-version", "other-version", "other-method", "other-name", "no-name", "encoded-name"]
    routed = agreed = 0
    for method, name, version, cap, meta_kind, header_kind in itertools.product(
        methods, names, versions, caps, metas, header_sets
    ):
        message = _message(method, name, version, cap, meta_kind)
        headers = {"mcp-protocol-version": version if isinstance(version, str) else "2026-07-28", "mcp-method": method}
        if isinstance(name, str):
            headers["mcp-name"] = name
        if header_kind == "no-version":
            del headers["mcp-protocol-version"]
        elif header_kind == "other-version":
            headers["mcp-protocol-version"] = "2025-06-18"
        elif header_kind == "other-method":
            headers["mcp-method"] = "tools/list" if method != "tools/list" else "tools/call"
        elif header_kind == "other-name":
            headers["mcp-name"] = "something-else"
        elif header_kind == "no-name":
            headers.pop("mcp-name", None)
        elif header_kind == "encoded-name" and isinstance(name, str):
            headers["mcp-name"] = "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
        verdict = classify_inbound_request(message, headers=headers)
        assert isinstance(verdict, (InboundLadderRejection, InboundModernRoute))
        if plainly_routable(message, headers):
            routed += 1
            assert isinstance(verdict, InboundModernRoute), (message, headers, verdict)
        elif isinstance(verdict, InboundModernRoute):
            agreed += 1  # the shortcut declined; the ladder routes it (allowed: the ladder decides)
    assert routed > 0, "the plain case takes the shortcut"
    plain = _message("tools/call", "echo", "2026-07-28", {}, "dict")
    plain_headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "echo"}
    assert plainly_routable(plain, plain_headers)
    no_name = _message("tools/list", MISSING, "2026-07-28", {}, "dict")
    assert plainly_routable(no_name, {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"})
