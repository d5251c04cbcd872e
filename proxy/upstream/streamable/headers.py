"""The headers a Streamable HTTP request carries, for either era.

- The MCP header names (`Mcp-Session-Id`, `MCP-Protocol-Version`, the 2026 `Mcp-Method` and
  `Mcp-Name`, `Last-Event-ID`), lower-cased as the HTTP client compares them.
- `post_headers(extra)`: the headers of every POST of a JSON-RPC message (it accepts a JSON or an
  event-stream answer); `extra` (a caller's own, a session's) are added, and win over the defaults.
- `modern_headers(message)`: the 2026-07-28 routing headers a request or notification must carry,
  each value encoded by `encode_header_value` (visible ASCII verbatim; anything else as
  `=?base64?...?=`, so that no value can break the header block).

Pure functions of their arguments; no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Final

from proxy.jsonrpc import LATEST_MODERN, META_PROTOCOL_VERSION, Message, meta_of

SESSION_HEADER: Final = "mcp-session-id"
VERSION_HEADER: Final = "mcp-protocol-version"
METHOD_HEADER: Final = "mcp-method"
NAME_HEADER: Final = "mcp-name"
LAST_EVENT_ID_HEADER: Final = "last-event-id"
ACCEPT_BOTH: Final = "application/json, text/event-stream"

_SENTINEL_START: Final = "=?base64?"
_SENTINEL_END: Final = "?="


def post_headers(extra: Mapping[str, str]) -> dict[str, str]:
    """The headers of a POST carrying one JSON-RPC message: its content type, the two answer
    types Streamable HTTP allows, and `extra` over them."""
    return {"accept": ACCEPT_BOTH, "content-type": "application/json", **extra}


def encode_header_value(value: str) -> str:
    """The 2026 header value rule: visible ASCII without edge whitespace passes verbatim; anything
    else (non-ASCII, controls, edge whitespace, or a value that looks like the sentinel itself) is
    sent as `=?base64?<standard base64 of the UTF-8 bytes>?=`."""
    # visible ASCII: 0x20-0x7e (string methods, not a regular expression: this runs on every 2026 request)
    if value.isascii() and value.isprintable() and value == value.strip() and not _is_sentinel(value):
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


def _is_sentinel(value: str) -> bool:
    """`=?base64?...?=`, the encoded form: a value that reads like one is itself encoded."""
    return (
        len(value) >= len(_SENTINEL_START) + len(_SENTINEL_END)
        and value.startswith(_SENTINEL_START)
        and value.endswith(_SENTINEL_END)
    )


_NAME_PARAM: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def modern_headers(message: Message) -> dict[str, str]:
    """The 2026-07-28 routing headers a request (or notification) must carry."""
    method = message.get("method")
    headers: dict[str, str] = {}
    meta = meta_of(message) or {}
    version = meta.get(META_PROTOCOL_VERSION)
    headers[VERSION_HEADER] = version if isinstance(version, str) and version else LATEST_MODERN
    if isinstance(method, str):
        headers[METHOD_HEADER] = encode_header_value(method)
        params = message.get("params")
        if isinstance(params, dict):
            key = _NAME_PARAM.get(method)
            value = params.get(key) if key else None
            if isinstance(value, str):
                headers[NAME_HEADER] = encode_header_value(value)
    return headers
