"""Pure checks of an MCP request's headers and body: no I/O, no state.

Contract:
- `SINGLE_HEADERS` are the headers a request may carry once only.
- `forwarded_headers` is what of the caller's headers the upstream may see.
- `check_modern_headers` runs the SDK's own 2026 validation ladder (`mcp.shared.inbound`), so the
  proxy rejects exactly what the reference server rejects; `plainly_routable` is its common case
  at a fraction of the cost, true only where every rung passes.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from proxy import jsonrpc
from proxy.jsonrpc import Message
from proxy.sdk import inbound

# The ladder's names are read from `inbound` where they are used, not bound here: the SDK module
# loads at its first attribute read (proxy/sdk.py), and only a 2026 request should pay for that.

# Headers a request may carry once only: a second one is answered 400 (`McpHttpApp._http`).
SINGLE_HEADERS = (b"host", b"origin", b"mcp-session-id", b"authorization", b"last-event-id", b"content-type")

_TRACE_HEADERS = ("traceparent", "tracestate")


def forwarded_headers(headers: dict[str, str], credentials: bool = False) -> dict[str, str] | None:
    """What of the caller's headers the upstream may see: `Mcp-Param-*` (intermediaries must
    forward them) and the W3C trace context (the engine replaces it with the attempt's own when
    tracing is on). Credentials to the upstream are the proxy's own, except with `credentials`
    (`--auth passthrough`): the caller's `Authorization` then goes on unchanged."""
    out = {k: v for k, v in headers.items() if k.startswith("mcp-param-") or k in _TRACE_HEADERS}
    if credentials and "authorization" in headers:
        out["authorization"] = headers["authorization"]
    return out or None


def plainly_routable(message: Message, headers: dict[str, str]) -> bool:
    """The common case of the SDK's 2026 ladder (`classify_inbound_request`) at a fraction of its
    cost: the envelope pair is there, the version is one the SDK serves, and the routing headers
    repeat the body verbatim. True only where every rung of the ladder passes; anything else
    (including a name that could be a base64-encoded header value) goes through the ladder itself,
    which alone words the rejections."""
    params = message.get("params")
    meta = params.get("_meta") if params.__class__ is dict else None
    if meta.__class__ is not dict or jsonrpc.META_CLIENT_CAPABILITIES not in meta:
        return False
    version = meta.get(jsonrpc.META_PROTOCOL_VERSION)
    if version.__class__ is not str or version not in inbound.MODERN_PROTOCOL_VERSIONS:
        return False
    method = message.get("method")
    if headers.get(inbound.MCP_PROTOCOL_VERSION_HEADER) != version or headers.get(inbound.MCP_METHOD_HEADER) != method:
        return False
    key = inbound.NAME_BEARING_METHODS.get(method)  # type: ignore[arg-type]
    if key is None:
        return True
    value = params.get(key)  # type: ignore[union-attr]
    return value is None or (headers.get(inbound.MCP_NAME_HEADER) == value and not value.startswith("=?"))


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def check_modern_headers(scope: MutableMapping[str, Any], headers: dict[str, str], message: Message) -> Any:
    """The SDK's 2026 header ladder for one request: None when it passes, else the
    `InboundLadderRejection` to answer (a routing header given twice is one)."""
    if len(headers) != len(scope["headers"]):  # some header name came twice: is it a routing one?
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        duplicated = inbound.find_duplicated_routing_header(raw)
        if duplicated is not None:
            return inbound.InboundLadderRejection(
                code=jsonrpc.HEADER_MISMATCH, message=f"{duplicated} header appears more than once"
            )
    if plainly_routable(message, headers):
        return None
    verdict = inbound.classify_inbound_request(message, headers=headers)
    return verdict if isinstance(verdict, inbound.InboundLadderRejection) else None
