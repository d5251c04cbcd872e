"""The protocol's vocabulary in one place: JSON-RPC message shapes, error codes, MCP versions, codec.

Messages travel through the proxy as plain dicts parsed once with orjson; nothing in the hot path
builds model objects. Helpers here never raise on a peer's malformed input except `loads`, whose
`ValueError` the transports translate into a JSON-RPC parse error.
"""

from __future__ import annotations

from typing import Any, Final, TypeGuard

import orjson

from proxy.secret_values import SECRETS

Message = dict[str, Any]
RequestId = int | str

JSONRPC: Final = "2.0"

# JSON-RPC 2.0 and MCP error codes.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
# Server-error range (-32000..-32099): the proxy is stopping and takes no new requests; a client
# or gateway in front may send the request to another replica.
SHUTTING_DOWN: Final = -32000
REQUEST_TIMEOUT: Final = -32001  # what the SDKs raise for a request that got no answer in time
HEADER_MISMATCH: Final = -32020
MISSING_CLIENT_CAPABILITY: Final = -32021
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022

# Protocol revisions.
MODERN_VERSIONS: Final = ("2026-07-28",)
LEGACY_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LATEST_LEGACY: Final = LEGACY_VERSIONS[0]
LATEST_MODERN: Final = MODERN_VERSIONS[0]

# Reserved _meta keys of the 2026-07-28 envelope.
META_PROTOCOL_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"
META_LOG_LEVEL: Final = "io.modelcontextprotocol/logLevel"

# Our own _meta keys.
META_PREFIX: Final = "io.mcp-recovery-proxy/"
META_DEADLINE_MS: Final = META_PREFIX + "deadlineMs"
META_APPROVE_BUDGET: Final = META_PREFIX + "approveBudget"
META_IDEMPOTENCY_KEY: Final = META_PREFIX + "idempotencyKey"
META_ATTEMPTS: Final = META_PREFIX + "attempts"
# on a success after attempts that could not reach the upstream: how long it was unreachable (ms)
META_UNREACHABLE_MS: Final = META_PREFIX + "unreachableMs"
META_APPROVED_BUDGET: Final = META_PREFIX + "approvedBudgetId"  # on a success that used an approval
META_UNRESOLVED: Final = META_PREFIX + "unresolved"  # the unresolved report, on every result the proxy gives up on
# Revisions whose CallToolResult has `structuredContent` (2025-06-18 introduced it).
STRUCTURED_CONTENT_VERSIONS: Final = frozenset({"2025-06-18", "2025-11-25", *MODERN_VERSIONS})


# orjson parses 1024 levels but serialises only about 254: a message between the two would be
# accepted, then fail in `dumps` on its way out (a 500 and a traceback per request). Nothing in MCP nests
# anywhere near this deep; the margin leaves room for the levels the proxy wraps around a message.
MAX_DEPTH: Final = 200
_ORJSON_DEPTH: Final = 254  # the most nested containers orjson.dumps serialises (measured, orjson 3.x)


class TooDeep(ValueError):
    """A JSON value nested deeper than `MAX_DEPTH` levels."""


def _brackets(data: bytes | str) -> int:
    if isinstance(data, bytes):
        return data.count(b"[") + data.count(b"{")
    return data.count("[") + data.count("{")


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ValueError (orjson.JSONDecodeError, or `TooDeep`) on malformed input.

    Every parsed message can be serialised again: one nested deeper than `MAX_DEPTH` is refused."""
    value = orjson.loads(data)
    # Counting brackets is a C-speed scan; only a text with that many brackets needs the walk.
    if value.__class__ in (dict, list) and _brackets(data) > MAX_DEPTH:
        if _deeper_than(value, MAX_DEPTH):
            raise TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` containers, asked of orjson's own serialiser: it
    refuses more than `_ORJSON_DEPTH` levels, so `value` wrapped in the difference fails exactly
    when it is too deep. C speed: a Python walk of a 4 MiB body of small lists would take seconds."""
    wrapped = value
    for _ in range(_ORJSON_DEPTH - limit):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except TypeError:  # a parsed value has nothing else orjson cannot serialise
        return True
    return False


def dumps(message: Any) -> bytes:
    return orjson.dumps(message)


def dumps_out(message: Any) -> bytes:
    """`dumps` for a message written to a caller: the proxy's own credentials removed
    (proxy/secret_values.py), whatever the upstream put in a result, error or notification."""
    return SECRETS.scrub_bytes(orjson.dumps(message))


def is_request(m: Message) -> bool:
    return "method" in m and "id" in m


def is_notification(m: Message) -> bool:
    return "method" in m and "id" not in m


def is_response(m: Message) -> bool:
    return "method" not in m and "id" in m and ("result" in m or "error" in m)


def valid_id(value: Any) -> TypeGuard[RequestId]:
    return (isinstance(value, str) or isinstance(value, int)) and not isinstance(value, bool)


def error(id_: RequestId | None, code: int, message: str, data: Any = None) -> Message:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": JSONRPC, "id": id_, "error": err}


def result(id_: RequestId, value: Any) -> Message:
    return {"jsonrpc": JSONRPC, "id": id_, "result": value}


def meta_of(message: Message) -> dict[str, Any] | None:
    """The `params._meta` object of a message, or None."""
    params = message.get("params")
    if isinstance(params, dict):
        meta = params.get("_meta")
        if isinstance(meta, dict):
            return meta
    return None


def is_modern_request(message: Message) -> bool:
    """A request carrying the 2026-07-28 envelope (the version key alone decides, as the SDK does)."""
    meta = meta_of(message)
    return meta is not None and META_PROTOCOL_VERSION in meta and message.get("method") != "initialize"


def validate(message: Any) -> str | None:
    """Return why `message` is not a JSON-RPC 2.0 message, or None when it is one."""
    if not isinstance(message, dict):
        return "a JSON-RPC message must be an object"
    if message.get("jsonrpc") != JSONRPC:
        return 'the "jsonrpc" member must be exactly "2.0"'
    if "method" in message:
        if not isinstance(message["method"], str):
            return 'the "method" member must be a string'
        if "id" in message and not valid_id(message["id"]):
            return 'a request "id" must be a string or an integer'
        params = message.get("params")
        # MCP allows only by-name params (JSON-RPC's by-position array is not MCP): relayed, an
        # array is dropped unanswered by the SDK's servers, and its caller would wait forever.
        if params is not None and not isinstance(params, dict):
            return '"params" must be an object'
        return None
    if "id" in message and ("result" in message or "error" in message):
        if "error" in message and not isinstance(message["error"], dict):
            return 'the "error" member must be an object'
        if not valid_id(message["id"]) and not (message["id"] is None and "error" in message):
            return 'a response "id" must be a string or an integer'
        return None
    return "not a request, notification or response"


def bounded(text: str, limit: int = 512) -> str:
    """At most `limit` characters, ending with an ellipsis when cut: every string the proxy echoes
    back to a peer, writes to a log or puts into a report is bounded by this one function."""
    if limit <= 0:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"
