"""Plain HTTP answers of the MCP endpoint: a body with its status, a JSON-RPC error, a refused session.

Contract:
- `respond*` write a whole response (head and body) at once; `respond_error` is a JSON-RPC error
  with the HTTP status the caller chose.
- `respond_session_refused` words a refused 2025 session: at a limit, 429/503 with `Retry-After`
  and the limit's flag in the message and `data` (`refusal_body`); shutting down, 503; an upstream
  that could not open one, 502 with the failure's text (bounded).
- `status_for` is the 2026 table mapping a JSON-RPC error code to its HTTP status.
"""

from __future__ import annotations

import math
from typing import Any

from proxy import jsonrpc
from proxy.auth.base import AuthRefused
from proxy.core import capacity
from proxy.errors import FailureKind, Refusal, UpstreamFailure
from proxy.frontend.http.outbox import Send
from proxy.jsonrpc import Message
from proxy.sdk import inbound

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
JSON = (b"content-type", b"application/json")


async def respond(send: Send, status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> None:
    hdrs = list(headers or [])
    if body:
        hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def respond_json(
    send: Send, status: int, message: Message, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await respond(send, status, jsonrpc.dumps_out(message), [JSON, *(headers or [])])


async def respond_error(send: Send, status: int, id_: Any, code: int, text: str) -> None:
    await respond_json(send, status, jsonrpc.error(id_, code, text))


async def respond_session_refused(send: Send, id_: Any, failure: UpstreamFailure) -> None:
    """A new session refused: at a limit (proxy/core/capacity.py: 429/503, Retry-After, the limit and
    its flag in the message and `data`) or because the proxy shuts down (503), both -32000; an
    upstream that cannot open one, 502 with the failure's text."""
    if failure.kind is not FailureKind.OVERLOADED:
        await respond_error(send, 502, id_, jsonrpc.INTERNAL_ERROR, jsonrpc.bounded(failure.detail))
        return
    body = refusal_body(id_, failure)
    retry = b"%d" % math.ceil(failure.retry_after_s or capacity.RETRY_AFTER_S)
    await respond_json(send, failure.http_status or 503, body, [(b"retry-after", retry)])


def refusal_body(id_: Any, failure: UpstreamFailure) -> Message:
    """The JSON-RPC error of a refused session: -32000, the message naming the limit and its flag,
    and for a `Refusal` its `data` (the limit, the flag, the seconds to wait)."""
    data = failure.data() if isinstance(failure, Refusal) else None
    return jsonrpc.error(id_, jsonrpc.SHUTTING_DOWN, jsonrpc.bounded(failure.detail), data)


def status_for(message: Message, modern: bool) -> int:
    if modern and "error" in message and isinstance(message["error"], dict):
        return inbound.ERROR_CODE_HTTP_STATUS.get(message["error"].get("code"), 200)  # type: ignore[arg-type]
    return 200


def refusal_error(id_: Any, refused: AuthRefused) -> Message:
    """A refusal that can no longer be an HTTP status (the answer already streams): a JSON-RPC
    error saying which status the upstream answered."""
    return jsonrpc.error(
        id_,
        jsonrpc.INTERNAL_ERROR,
        f"the upstream refused the request's credentials (HTTP {refused.status})",
        {"io.mcp-recovery-proxy/upstreamFailure": {"kind": "http_status", "httpStatus": refused.status}},
    )
