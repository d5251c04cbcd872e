"""What went wrong talking to an HTTP upstream, as an `UpstreamFailure`: the one place where the
HTTP client's exceptions and the upstream's HTTP answers become failure kinds.

Shared by Streamable HTTP (both eras) and the legacy HTTP+SSE transport.

- `translate_exception(exc, written, what)`: a client (or socket) exception. Establishing the
  connection (refused, DNS, TLS, the egress proxy's refusal, the connect timeout, which also bounds
  the wait for a free pooled connection) is `CONNECT_FAILED`, dispatch no; a bad URL or an answer
  over its size bound is `PROTOCOL`; anything else lost the connection (`CLOSED`). `written` is
  whether the request had started going out (`WriteFlag`, `Exchange.written`): the client writes
  the request line, headers and body in one write and says so right before it, so anything failing
  from then on has dispatch unknown; before it, dispatch no.
- `status_failure(response, request_id)` / `status_failure_of(response, raw, request_id)`: a non-2xx
  answer as `HTTP_STATUS`, with the JSON-RPC error of its (bounded) body if it has one for that
  request, its `Retry-After` (`proxy.recovery.backoff.parse_retry_after`), its `WWW-Authenticate`
  challenge for a 401/403, and where a redirect pointed. Statuses a server sends before processing
  the request are dispatch no, every other one dispatch unknown.
- `session_refused(detail)`: `--auth passthrough`'s refusal of a credential on a session another
  credential holds (`SESSION_REFUSED`, a 404); `forgot_session(raw)`: whether a 400's body says the
  server does not know the session it was sent.

Details are bounded (`bounded_detail`, with the proxy's own credentials cut out); header values
are never put in a detail, and a redirect names only the scheme, host and path it points to.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final
from urllib.parse import urlsplit

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import RequestId, bounded, loads
from proxy.recovery.backoff import parse_retry_after
from proxy.secret_values import SECRETS
from proxy.upstream.h1 import BodyTooLarge, ClientError, ConnectError, InvalidURL, Response
from proxy.upstream.sse.parse import SseError

# Refused before processing (a redirect the proxy does not follow, the request's form or
# credentials refused, a rate limit, an overload): retrying cannot duplicate an effect.
NOT_DISPATCHED_STATUSES: Final = frozenset({301, 302, 303, 307, 308, 400, 401, 403, 405, 413, 415, 422, 429, 503})
REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
MAX_ERROR_BODY: Final = 64 * 1024
MAX_DETAIL: Final = 300
MAX_CHALLENGE: Final = 2048


def bounded_detail(text: str) -> str:
    # The proxy's credentials go before the cut, which could otherwise keep a prefix of one.
    return bounded(SECRETS.head(text, MAX_DETAIL + 1), MAX_DETAIL)


# What the HTTP client raises for a failed exchange (its own errors; socket errors, to be safe).
CLIENT_ERRORS: Final = (ClientError, OSError)


def translate_exception(exc: BaseException, written: bool, what: str = "request") -> UpstreamFailure:
    """A client (or socket) exception as an `UpstreamFailure`. Never includes header values.

    Establishing the connection (connect refused, DNS, TLS, the connect timeout, which also bounds
    the wait for a free pooled connection) is dispatch no whatever `written` says."""
    name = type(exc).__name__
    if isinstance(exc, ConnectError):
        # Its message says what failed (refused, DNS, TLS and why, the egress proxy's refusal)
        # and holds no credentials. A new TLS connection closed before its first answer may have
        # carried the request (`h1.TlsClosed`): dispatch unknown then.
        dispatched = Dispatch.NO if exc.dispatch_known or not written else Dispatch.UNKNOWN
        return UpstreamFailure(FailureKind.CONNECT_FAILED, dispatched, bounded_detail(str(exc) or name))
    if isinstance(exc, InvalidURL):
        return UpstreamFailure(FailureKind.PROTOCOL, Dispatch.NO, bounded_detail(f"bad upstream URL ({name})"))
    if isinstance(exc, BodyTooLarge):
        return UpstreamFailure(
            FailureKind.PROTOCOL,
            Dispatch.UNKNOWN if written else Dispatch.NO,
            f"upstream answer rejected: its body exceeds {exc.limit} bytes",
        )
    if isinstance(exc, SseError):
        return UpstreamFailure(
            FailureKind.PROTOCOL,
            Dispatch.UNKNOWN if written else Dispatch.NO,
            bounded_detail(f"upstream event stream rejected: {exc}"),
        )
    dispatched = Dispatch.UNKNOWN if written else Dispatch.NO
    return UpstreamFailure(
        FailureKind.CLOSED, dispatched, bounded_detail(f"upstream connection failed during the {what} ({name})")
    )


def status_dispatch(status: int) -> Dispatch:
    return Dispatch.NO if status in NOT_DISPATCHED_STATUSES else Dispatch.UNKNOWN


async def read_bounded(response: Response, limit: int = MAX_ERROR_BODY) -> bytes:
    """At most `limit` bytes of the body; what a broken connection delivered up to then."""
    try:
        return await response.read(limit)
    except CLIENT_ERRORS:
        return b""


async def status_failure(response: Response, request_id: RequestId | None) -> UpstreamFailure:
    """A non-2xx answer as `UpstreamFailure(HTTP_STATUS, ...)`, with the JSON-RPC error body if any."""
    return status_failure_of(response, await read_bounded(response), request_id)


def redirect_note(location: str | None) -> str:
    """What a redirect means for the call, naming where it points (scheme, host and path only: a
    query or user part may hold a secret)."""
    target = ""
    if location:
        try:
            parts = urlsplit(location)  # raises for an unclosed "[" (an IPv6 literal)
        except ValueError:
            parts = None
        if parts is None:
            target = " to an address that is not a URL"
        else:
            try:
                port = f":{parts.port}" if parts.port is not None else ""
            except ValueError:
                port = ""
            host = f"{parts.scheme + '://' if parts.scheme else ''}{parts.hostname or ''}{port}"
            target = f" to {host}{parts.path}"[:200]
    return (
        f": the upstream redirected the request{target}; it was not run there, and the proxy follows no"
        " redirects (point --upstream at the new URL)"
    )


def status_failure_of(response: Response, raw: bytes, request_id: RequestId | None) -> UpstreamFailure:
    """`status_failure` for an answer whose (bounded) body was already read."""
    status = response.status
    body: dict[str, Any] | None = None
    if raw:
        try:
            parsed = loads(raw)
        except ValueError:
            parsed = None
        if (
            isinstance(parsed, dict)
            and isinstance(parsed.get("error"), dict)
            and parsed.get("id") in (request_id, None)
        ):
            body = dict(parsed)
            if request_id is not None:
                body["id"] = request_id
    detail = f"upstream answered HTTP {status}"
    if response.reason:
        detail += f" {response.reason}"
    if body is not None:
        msg = body["error"].get("message")
        detail += f" (JSON-RPC {body['error'].get('code')}: {msg if isinstance(msg, str) else ''})"
    if status in REDIRECTS:
        detail += redirect_note(response.headers.get("location"))
    return UpstreamFailure(
        FailureKind.HTTP_STATUS,
        status_dispatch(status),
        bounded_detail(detail),
        http_status=status,
        retry_after_s=parse_retry_after(response.headers.get("retry-after"), time.time()),
        body=body,
        challenge=auth_challenge(response) if status in (401, 403) else None,
    )


def session_refused(detail: str) -> UpstreamFailure:
    """--auth passthrough: the upstream's 404 to a session id sent with a credential other than the
    one it accepted on that session. It refuses that caller, not a session it forgot: a permission
    refusal, not dispatched, relayed to the caller as the server's 404 (never retried, and the
    session is not re-established with that credential). Streamable HTTP and legacy SSE alike."""
    return UpstreamFailure(FailureKind.SESSION_REFUSED, Dispatch.NO, detail, http_status=404)


def auth_challenge(response: Response) -> str | None:
    """The answer's WWW-Authenticate, bounded and on one line (it is relayed as a header)."""
    value = response.headers.get("www-authenticate")
    if not value:
        return None
    value = " ".join(value.split())
    return value if len(value) <= MAX_CHALLENGE else None  # a cut challenge would mislead: none


# What a 400 says when the server no longer knows the session it was sent: the TypeScript SDK's
# servers answer an unknown id "Bad Request: No valid session ID provided" (its examples) or
# "Bad Request: Server not initialized" (its transport). Anything else a 400 says is the caller's
# input and stays a validation failure.
_FORGOTTEN_SESSION = re.compile(r"(?i)\bsession\b|\bnot initiali[sz]ed\b")


def forgot_session(raw: bytes) -> bool:
    """Whether a 400's (bounded) body says the session is unknown: its JSON-RPC error message,
    or the plain text of a body that is not JSON-RPC, names the session or an uninitialized server."""
    text: Any = raw.decode("utf-8", "replace")
    try:
        parsed = loads(raw)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        text = error.get("message") if isinstance(error, dict) else None
    return isinstance(text, str) and _FORGOTTEN_SESSION.search(text) is not None


class WriteFlag:
    """Whether a request started going out (`mark` is the client's `on_write`): the `written` of
    `translate_exception` for the POSTs that are not exchanges (notifications, probes, replays)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = False

    def mark(self) -> None:
        self.written = True
