"""Pure translations of the era bridge's second direction: a 2025 client's messages into the
2026-07-28 requests of a server that speaks only that revision, and the answers back.

Nothing here does I/O or keeps state; `LegacyOverModern` (proxy/upstream/bridge_legacy.py) holds
the session and calls these. What each promises:

- `initialize_result`: the answer to a 2025 `initialize`, made from the server's `server/discover`
  result: the protocol version the client asked for when the proxy serves it (else the latest
  2025 revision), the server's capabilities as 2025 has them (2026-only keys left out), its
  `serverInfo` (from the discover result's `_meta`, else a placeholder naming the proxy's bridge)
  and `instructions`.
- `modern_request`: a 2025 request with the session state 2026 carries per request added to its
  `_meta` (protocol version, the client's capabilities and info from `initialize`, the log level
  the client set with `logging/setLevel`; none when it set none, so the server sends no log
  messages for it, as a 2026 server must).
- `legacy_result`: a 2026 result for a 2025 client: `resultType`, `ttlMs` and `cacheScope` and the
  server info in `_meta` left out; a `structuredContent` that is not a JSON object wrapped as
  `{"result": value}`, and in `tools/list` a tool's `outputSchema` that does not describe an
  object wrapped the same way (`{"type": "object", "properties": {"result": schema},
  "required": ["result"]}`), since 2025 allows only objects there.
- `input_requests`: the requests of an input-required result as (key, method, params), or a
  refusal naming what the client did not declare; `continued`: the request re-sent with the
  client's answers and the server's `requestState`, under a new id.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.jsonrpc import (
    LATEST_LEGACY,
    LATEST_MODERN,
    LEGACY_VERSIONS,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    Message,
    RequestId,
    bounded,
)

# The keys of 2026 results that a 2025 result does not have.
MODERN_RESULT_KEYS: Final = frozenset({"resultType", "ttlMs", "cacheScope"})
# The server capabilities of 2026 that 2025 does not have (passed to a 2025 client they would
# announce what it cannot use).
MODERN_ONLY_CAPABILITIES: Final = frozenset({"extensions"})
# What each input request of 2026 asks of the client, and the 2025 client capability it needs.
INPUT_CAPABILITY: Final = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
STRUCTURED_KEY: Final = "result"  # where a non-object structuredContent goes for a 2025 client
BRIDGE_SERVER_INFO: Final = {"name": "mcp-recovery-proxy (era bridge)", "version": "0.1.0"}


def negotiated_version(requested: object) -> str:
    """The 2025 revision the session speaks: the client's when the proxy serves it, else the
    latest (a 2025 server answers an unknown version with one it supports)."""
    return requested if isinstance(requested, str) and requested in LEGACY_VERSIONS else LATEST_LEGACY


def initialize_result(discover: dict[str, Any], requested: object) -> dict[str, Any]:
    caps = discover.get("capabilities")
    capabilities = (
        {k: v for k, v in caps.items() if k not in MODERN_ONLY_CAPABILITIES} if isinstance(caps, dict) else {}
    )
    meta = discover.get("_meta")
    info = meta.get(META_SERVER_INFO) if isinstance(meta, dict) else None
    server_info = info if isinstance(info, dict) and isinstance(info.get("name"), str) else BRIDGE_SERVER_INFO
    result: dict[str, Any] = {
        "protocolVersion": negotiated_version(requested),
        "capabilities": capabilities,
        "serverInfo": server_info,
    }
    instructions = discover.get("instructions")
    if isinstance(instructions, str):
        result["instructions"] = instructions
    return result


def modern_request(
    message: Message, capabilities: dict[str, Any], client_info: dict[str, Any] | None, log_level: str | None
) -> Message:
    params = message.get("params")
    params = dict(params) if isinstance(params, dict) else {}
    meta = params.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta[META_PROTOCOL_VERSION] = LATEST_MODERN
    meta[META_CLIENT_CAPABILITIES] = capabilities
    if client_info is not None:
        meta[META_CLIENT_INFO] = client_info
    if log_level is not None:
        meta[META_LOG_LEVEL] = log_level
    else:
        meta.pop(META_LOG_LEVEL, None)
    params["_meta"] = meta
    return {**message, "params": params}


def object_schema(schema: object) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "object"


def wrapped_schema(schema: object) -> dict[str, Any]:
    return {"type": "object", "properties": {STRUCTURED_KEY: schema}, "required": [STRUCTURED_KEY]}


def legacy_tool(tool: object) -> object:
    if not isinstance(tool, dict):
        return tool
    schema = tool.get("outputSchema")
    if schema is None or object_schema(schema):
        return tool
    return {**tool, "outputSchema": wrapped_schema(schema)}


def legacy_result(method: str, result: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in result.items() if k not in MODERN_RESULT_KEYS}
    meta = out.get("_meta")
    if isinstance(meta, dict) and META_SERVER_INFO in meta:
        kept = {k: v for k, v in meta.items() if k != META_SERVER_INFO}
        if kept:
            out["_meta"] = kept
        else:
            del out["_meta"]
    if "structuredContent" in out and not isinstance(out["structuredContent"], dict):
        if out["structuredContent"] is None:
            del out["structuredContent"]
        else:
            out["structuredContent"] = {STRUCTURED_KEY: out["structuredContent"]}
    tools = out.get("tools")
    if method == "tools/list" and isinstance(tools, list):
        out["tools"] = [legacy_tool(t) for t in tools]
    return out


def legacy_response(method: str, response: Message) -> Message:
    result = response.get("result")
    if not isinstance(result, dict):
        return response
    return {**response, "result": legacy_result(method, result)}


def is_input_required(response: Message) -> bool:
    result = response.get("result")
    return isinstance(result, dict) and result.get("resultType") == "input_required"


def input_requests(result: dict[str, Any], client_caps: dict[str, Any]) -> list[tuple[str, str, Any]] | str:
    """(key, method, params) of each input request, or why the 2025 client cannot be asked."""
    asked = result.get("inputRequests")
    if asked is None:
        return []
    if not isinstance(asked, dict):
        return "the server's input-required result has no valid inputRequests"
    out: list[tuple[str, str, Any]] = []
    for key, request in asked.items():
        method = request.get("method") if isinstance(request, dict) else None
        if not isinstance(method, str) or method not in INPUT_CAPABILITY:
            return f"the server asked the client for {bounded(str(method), 60)}, which the era bridge cannot relay"
        capability = INPUT_CAPABILITY[method]
        if not isinstance(client_caps.get(capability), dict):
            return (
                f"the server asked the client for {method} during this request, and the client declared no "
                f"{capability} capability in its initialize"
            )
        assert isinstance(request, dict)
        out.append((str(key), method, request.get("params")))
    return out


def continued(message: Message, new_id: RequestId, answers: dict[str, Any], state: object) -> Message:
    """`message` re-sent with the client's `answers` (`inputResponses`) and the server's
    `requestState` (echoed exactly), under `new_id` (a retry of an input-required request must
    have a new id), its progress token (if any) that id. Answers of an earlier round are not
    repeated."""
    params = message.get("params")
    params = (
        {k: v for k, v in params.items() if k not in ("inputResponses", "requestState")}
        if isinstance(params, dict)
        else {}
    )
    meta = params.get("_meta")
    if isinstance(meta, dict) and "progressToken" in meta:
        params["_meta"] = {**meta, "progressToken": new_id}  # each round's progress comes under its own id
    if answers:
        params["inputResponses"] = answers
    if state is not None:
        params["requestState"] = state
    return {**message, "id": new_id, "params": params}
