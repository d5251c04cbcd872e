"""Streamable HTTP upstream, both eras, at the JSON-RPC message level.

One `h1.HttpClient` per upstream (our own HTTP/1.1 keep-alive pool, no retries, no redirects, no
read timeout): the proxy owns every retry and every attempt timeout, so the client does neither.

- `HttpLegacyLink` (one per downstream 2025 session): forwards the client's own `initialize`,
  keeps `Mcp-Session-Id` and the negotiated `MCP-Protocol-Version`, opens the standalone GET SSE
  stream after `notifications/initialized`, re-establishes a session the upstream forgot once,
  transparently, and cancels with `notifications/cancelled`. A forgotten session is a 404 on a
  request that carried a session id (the spec's answer), or a 400 on one whose body names the
  session or an uninitialized server: the TypeScript SDK's servers answer a restarted process's
  unknown id with 400 "Bad Request: No valid session ID provided" (its examples, which most
  servers copy) or "Bad Request: Server not initialized" (its transport).
  `--auth passthrough` (the upstream authenticates callers, and a server such as the MCP SDK's
  binds each session to the principal that opened it, answering its id used with another
  principal's credential 404, "as if the session did not exist"): every message a caller sends
  goes with that caller's own `Authorization` (or none), never another's. The link keeps the
  credential the upstream last accepted on the session (`caller_authorization`: the one of the
  last request answered 2xx; a token refreshed mid-session takes over once accepted), and only
  its own requests carry it: the listen stream, cancellations, the replayed handshake, answers to
  the server's requests, DELETE. A 404 (or forgotten-session 400) to a request carrying that
  credential is a forgotten session, re-established with it; to any other credential it is that
  caller's refusal, `SESSION_REFUSED` (`session_refused`, shared with sse.py): relayed as the 404,
  never retried, the session not moved. The price: a refreshed token whose first request meets
  an upstream that restarted gets the 404 too, and its client opens a new session.
- `HttpModernLink` (shared by every 2026-07-28 request): one POST per request with the 2026
  routing headers; cancelling is closing that request's response stream.

Failure translation happens here and nowhere else: client exceptions and HTTP statuses become
`UpstreamFailure` with the right `Dispatch` (RECOVERY.md §1). `Exchange.written` turns true when
the request starts going out on the connection (the client writes the request line, headers and
body in one write and calls `on_write` right before it), so anything failing from then on has
dispatch unknown; before it, only establishing the connection can fail, and that is dispatch no.
Header values are never logged nor put in failure details.

Health (`UpstreamHealth`, the `mcp_recovery_upstream_up` gauge, shared with sse.py): a JSON-RPC
response marks the upstream up (one flag compare per answer); a connection that cannot be
established (refused, DNS, TLS, connect timeout; not a full pool) marks it down. HTTP error
statuses and connections lost mid-answer change nothing: the upstream was reached, or a pooled
keep-alive connection was closing.

Why a client of our own (measured with `bench/relay.py` and `bench/h1client.py`, see
docs/benchmarks.md): httpx first cost 2.5 to 4.7 ms of proxy CPU per relayed HTTP→HTTP call
against a target of 1.5 ms (its pool walks every pooled connection per request,
encode/httpcore#1035, and `current_async_library()` retried a failing import per call,
encode/httpcore#1103); aiohttp (C parser, O(1) pool) brought that to about 0.3-0.7 ms, but its
general-purpose machinery (session, connector, request and response objects, a timer context and
a task per request) was still the largest share of an HTTP→HTTP call and kept throughput more
than 10% under direct. `h1.HttpClient` does what this adapter needs and nothing else, at about a
fifth of aiohttp's CPU per request. Behaviour kept: the configured headers on every request, no
redirects, cookies kept per upstream; what changed is that the proxy no longer asks for
compressed answers (a compressed one is still decoded). The TLS context (`--upstream-ca`, the
client certificate) and the egress proxy (`HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`) are resolved once
at start (proxy/net/tls.py, egress.py) and handed to the client; a connection that cannot be
established for either reason is CONNECT_FAILED with the client's message, which says what
failed (an untrusted or mismatched certificate, a refused client certificate, the egress proxy's
407/403/502) and never carries a credential.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import functools
import logging
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import (
    LATEST_MODERN,
    LEGACY_VERSIONS,
    META_PROTOCOL_VERSION,
    MODERN_VERSIONS,
    Message,
    RequestId,
    dumps,
    is_response,
    loads,
    meta_of,
)
from proxy.secret_values import SECRETS
from proxy.upstream.base import (
    UPSTREAM_NOTICES,
    Capabilities,
    Era,
    Exchange,
    Handshake,
    LinkBase,
    OnMessage,
    PendingTable,
    UpstreamHealth,
    discover_request,
    initialize_request,
    ours,
)
from proxy.upstream.h1 import (
    BodyTooLarge,
    ClientError,
    ConnectError,
    Connection,
    Headers,
    HttpClient,
    InvalidURL,
    PoolTimeout,
    ProxyRoute,
    Response,
)
from proxy.upstream.sse_parse import SseError, SseParser

log = logging.getLogger(__name__)

SESSION_HEADER: Final = "mcp-session-id"
VERSION_HEADER: Final = "mcp-protocol-version"
METHOD_HEADER: Final = "mcp-method"
NAME_HEADER: Final = "mcp-name"
LAST_EVENT_ID_HEADER: Final = "last-event-id"
ACCEPT_BOTH: Final = "application/json, text/event-stream"

# Refused before processing (RECOVERY.md §1.2): retrying cannot duplicate an effect.
NOT_DISPATCHED_STATUSES: Final = frozenset({301, 302, 303, 307, 308, 400, 401, 403, 405, 413, 415, 422, 429, 503})
REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
MAX_ERROR_BODY: Final = 64 * 1024
MAX_DETAIL: Final = 300
# Standalone GET stream / POST stream resumption: bounded reconnects.
GET_BACKOFF_BASE_S: Final = 0.5
GET_BACKOFF_CAP_S: Final = 30.0
GET_MAX_FAILURES: Final = 8
RESUME_MAX_ATTEMPTS: Final = 3
DEFAULT_RETRY_MS: Final = 1000
MAX_RETRY_MS: Final = 30_000

_HEADER_SAFE = re.compile(r"[\x20-\x7e]*")
_B64_SENTINEL = re.compile(r"=\?base64\?.*\?=", re.DOTALL)


# ---------------------------------------------------------------------------------------------
# small helpers shared with sse.py
# ---------------------------------------------------------------------------------------------
def encode_header_value(value: str) -> str:
    """The 2026 header value rule: visible ASCII without edge whitespace passes verbatim; anything
    else (non-ASCII, controls, edge whitespace, or a value that looks like the sentinel itself) is
    sent as `=?base64?<standard base64 of the UTF-8 bytes>?=`."""
    if _HEADER_SAFE.fullmatch(value) and value == value.strip() and not _B64_SENTINEL.fullmatch(value):
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date); None when absent or unparseable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def bounded_detail(text: str) -> str:
    # The proxy's credentials go before the cut, which could otherwise keep a prefix of one.
    text = SECRETS.head(text, MAX_DETAIL + 1)
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


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
        parts = urlsplit(location)
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
        retry_after_s=parse_retry_after(response.headers.get("retry-after")),
        body=body,
        challenge=auth_challenge(response) if status in (401, 403) else None,
    )


def session_refused(detail: str) -> UpstreamFailure:
    """--auth passthrough: the upstream's 404 to a session id sent with a credential other than the
    one it accepted on that session. It refuses that caller, not a session it forgot: a permission
    refusal, not dispatched, relayed to the caller as the server's 404 (never retried, and the
    session is not re-established with that credential). Streamable HTTP and legacy SSE alike."""
    return UpstreamFailure(FailureKind.SESSION_REFUSED, Dispatch.NO, detail, http_status=404)


MAX_CHALLENGE = 2048


def auth_challenge(response: Response) -> str | None:
    """The answer's WWW-Authenticate, bounded and on one line (it is relayed as a header)."""
    value = response.headers.get("www-authenticate")
    if not value:
        return None
    value = " ".join(value.split())
    return value if len(value) <= MAX_CHALLENGE else None  # a cut challenge would mislead: none


# What a 400 says when the server no longer knows the session it was sent (see the module
# docstring); anything else a 400 says is the caller's input and stays a validation failure.
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


def content_type(response: Response) -> str:
    return (response.headers.get("content-type") or "").partition(";")[0].strip().lower()


@dataclass(slots=True)
class StreamState:
    """What a response stream told us about resuming it."""

    last_event_id: str | None = None
    retry_ms: int | None = None


async def iter_sse_messages(
    response: Response, state: StreamState, max_event_bytes: int | None
) -> AsyncIterator[Message]:
    """Parse `message` events of an SSE response into JSON-RPC messages (invalid JSON is skipped).

    A stream's whole body has no bound (it lasts as long as the session may); each event has."""
    response.max_body = None
    parser = SseParser(max_event_bytes)
    async for chunk in response.iter_chunks():
        for ev in parser.feed(chunk):
            state.last_event_id = parser.last_event_id
            if parser.retry is not None:
                state.retry_ms = parser.retry
            if ev.event != "message" or not ev.data.strip():
                continue
            try:
                message = loads(ev.data)
            except ValueError:
                UPSTREAM_NOTICES.log(log, logging.WARNING, "upstream sent an SSE event that is not JSON; dropped")
                continue
            if isinstance(message, dict):
                yield message
            elif isinstance(message, list):  # a 2025-03-26 batch
                for item in message:
                    if isinstance(item, dict):
                        yield item
        state.last_event_id = parser.last_event_id
        if parser.retry is not None:
            state.retry_ms = parser.retry


def json_messages(raw: bytes) -> list[Message]:
    """The JSON-RPC messages of an `application/json` answer (one, or a 2025-03-26 batch)."""
    try:
        parsed = loads(raw)
    except ValueError:
        raise UpstreamFailure(
            FailureKind.PROTOCOL, Dispatch.UNKNOWN, "upstream answered a body that is not JSON"
        ) from None
    if parsed.__class__ is dict:
        return [parsed]
    return [item for item in parsed if isinstance(item, dict)] if isinstance(parsed, list) else []


async def iter_json_messages(response: Response) -> AsyncIterator[Message]:
    """The answer's messages; its size is bounded by the request's `max_body`."""
    for item in json_messages(await response.read()):
        yield item


class _Written:
    """A `written` flag for the POSTs that are not exchanges (notifications, probes, replays)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = False

    def mark(self) -> None:
        self.written = True


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


# ---------------------------------------------------------------------------------------------
# links
# ---------------------------------------------------------------------------------------------
class _Expired(Exception):
    """The upstream forgot the session a request carried (a 404, or a 400 naming the session;
    handled inside the legacy link)."""


class _HttpLink(LinkBase):
    """What both eras share: the exchange task that POSTs and reads the response stream."""

    era: Era

    def __init__(self, upstream: HttpUpstream, prefix: str) -> None:
        self._upstream = upstream
        self._health = upstream.health
        self._client = upstream.client
        self._pending = PendingTable(prefix=prefix)
        self._unsolicited: OnMessage = _drop
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Set while the legacy standalone GET stream is being opened (see `_opened`).
        self._opening: asyncio.Future[None] | None = None

    # -- UpstreamLink ---------------------------------------------------------------------

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        if self._closed:
            raise UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, "the upstream link is closed")
        if self._opening is not None:
            await self._opened()
        self._before_request(message)
        ex = self._pending.add(message, on_message)
        if self._client.idle:
            # A pooled connection is free: write the request now; the answer comes back through
            # the connection's callbacks (`_Flight`), with a task only if it is not plain JSON.
            h = {"accept": ACCEPT_BOTH, "content-type": "application/json", **(headers or {})}
            h.update(self._request_headers(message))
            flight = _Flight(self, ex, message, h, headers)
            try:
                flight.conn = self._client.send_now(
                    "POST", headers=h, body=dumps(message), sink=flight, max_body=self._upstream.max_event_bytes
                )
            except ValueError:
                self._pending.discard(ex)
                raise UpstreamFailure(FailureKind.PROTOCOL, Dispatch.NO, "a request header is not valid") from None
            if flight.conn is not None:
                ex.written = True
                ex.transport_state = flight
                return ex
        # the table's loop, asked once (get_running_loop is a getpid() on 3.11)
        sent: asyncio.Future[None] = ex.response.get_loop().create_future()
        task = self._spawn_exchange(ex, message, dict(headers or {}), sent)
        try:
            await asyncio.shield(sent)
        except UpstreamFailure:
            self._pending.discard(ex)
            raise
        except asyncio.CancelledError:
            self._pending.discard(ex)
            task.cancel()
            raise
        return ex

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        raise NotImplementedError  # each era posts a notification its own way

    async def send_response(self, message: Message) -> None:
        await self.send_notification(message)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        exchange.cancelled = True
        self._pending.discard(exchange)
        await self._cancel_on_wire(exchange, reason)
        task = exchange.transport_state
        if isinstance(task, _Flight):
            task.abort()
            task = exchange.transport_state  # a task, if the answer was handed over to one
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=2.0)
        self._pending.fail(
            exchange,
            UpstreamFailure(
                FailureKind.CLOSED,
                Dispatch.UNKNOWN if exchange.written else Dispatch.NO,
                "the proxy cancelled the request",
            ),
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ex in self._pending.exchanges():
            if isinstance(ex.transport_state, _Flight):
                ex.transport_state.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        self._pending.fail_all(FailureKind.CLOSED, "the proxy closed the upstream link")
        await self._close_session()
        self._upstream._forget(self)

    def _spawn_exchange(
        self,
        ex: Exchange,
        message: Message,
        extra: dict[str, str],
        sent: asyncio.Future[None],
        first: _First | None = None,
    ) -> asyncio.Task[None]:
        """The exchange task of `ex`, kept (and cancelled by `cancel`/`aclose`) by the link."""
        task = ex.response.get_loop().create_task(self._run_exchange(ex, message, extra, sent, first))
        ex.transport_state = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._exchange_ended, ex))
        return task

    def _exchange_ended(self, ex: Exchange, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # A task that ended cancelled keeps its CancelledError, whose traceback holds the task's
        # frames, which hold the exchange: without this the three form a cycle.
        if ex.transport_state is task:
            ex.transport_state = None

    async def _opened(self) -> None:
        """Requests wait (bounded) until the standalone GET stream is open: a server sends what is
        not tied to a request there, and drops it if the stream is not open yet."""
        opening = self._opening
        if opening is not None and not opening.done():
            await asyncio.wait({opening}, timeout=self._upstream.connect_timeout_s)
        if self._opening is opening:
            self._opening = None

    # -- hooks for the eras ---------------------------------------------------------------
    def _before_request(self, message: Message) -> None:
        return None

    def _request_headers(self, message: Message) -> dict[str, str]:
        raise NotImplementedError

    async def _cancel_on_wire(self, exchange: Exchange, reason: str | None) -> None:
        return None

    async def _close_session(self) -> None:
        return None

    def _on_response(self, ex: Exchange, response: Response, message: Message) -> None:
        return None

    def _accepted(self, headers: Mapping[str, str]) -> None:
        """The upstream answered 2xx to a request sent with `headers`."""
        return None

    def _forgotten(self, headers: Mapping[str, str]) -> BaseException:
        """What a 404 (or a 400 naming the session) to a request that carried a session id means."""
        return _Expired()

    async def _resume(self, ex: Exchange, state: StreamState) -> bool:
        """Try to recover the rest of a broken response stream; True when the response arrived."""
        return False

    async def _run_exchange(
        self,
        ex: Exchange,
        message: Message,
        extra: dict[str, str],
        sent: asyncio.Future[None],
        first: _First | None = None,
    ) -> None:
        try:
            await self._attempt_loop(ex, message, extra, sent, first)
        except UpstreamFailure as failure:
            untraced(failure)
            if not ex.written and not sent.done():
                sent.set_exception(failure)
                sent.exception()
            else:
                self._pending.fail(ex, failure)
        except asyncio.CancelledError as cancelled:
            if not sent.done():
                sent.set_exception(
                    UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, "the proxy closed the upstream link")
                )
                sent.exception()
            # The error is also kept by the future it came out of (h1's, in a frame of the
            # request) and by this task: its frames below would be a cycle with them.
            untraced(cancelled)
            raise
        except Exception as exc:  # a bug here must not leave the caller waiting forever
            log.exception("upstream exchange task failed")
            internal = UpstreamFailure(
                FailureKind.PROTOCOL,
                Dispatch.UNKNOWN if ex.written else Dispatch.NO,
                bounded_detail(f"internal error while relaying: {type(exc).__name__}"),
            )
            if not sent.done():
                sent.set_exception(untraced(internal))
                sent.exception()
            self._pending.fail(ex, internal)
        finally:
            if not sent.done():
                sent.set_result(None)

    async def _attempt_loop(
        self, ex: Exchange, message: Message, extra: dict[str, str], sent: asyncio.Future[None], first: _First | None
    ) -> None:
        await self._post_exchange(ex, message, extra, sent, first)

    async def _post_exchange(
        self, ex: Exchange, message: Message, extra: dict[str, str], sent: asyncio.Future[None], first: _First | None
    ) -> None:
        """One POST of `message` and the reading of its answer, for exchange `ex`; with `first`,
        the POST was already sent (by `send_request`) and this is its answer and headers."""
        if first is None:
            headers = {"accept": ACCEPT_BOTH, "content-type": "application/json", **extra}
            headers.update(self._request_headers(message))
        else:
            headers = first[1]

        def on_write() -> None:
            ex.written = True
            if not sent.done():
                sent.set_result(None)

        state = StreamState()
        try:
            if first is None:
                response = await self._client.request(
                    "POST",
                    headers=headers,
                    body=dumps(message),
                    on_write=on_write,
                    max_body=self._upstream.max_event_bytes,
                )
            else:
                response = first[0]
            async with response:
                ex.written = True  # an answer came: the request reached the peer
                _heard(ex)
                if not sent.done():
                    sent.set_result(None)
                status = response.status
                # A 404 (or a 400 naming the session) to a request that carried a session id is a
                # refusal before processing: this request was not executed.
                if status == 404 and self._sent_session(headers):
                    response.release()
                    ex.written = False
                    raise self._forgotten(headers)
                if not 200 <= status < 300:
                    raw = await read_bounded(response)
                    if status == 400 and self._sent_session(headers) and forgot_session(raw):
                        ex.written = False
                        raise self._forgotten(headers)
                    raise status_failure_of(response, raw, ex.upstream_id)
                self._accepted(headers)
                if status == 202:
                    raise UpstreamFailure(
                        FailureKind.PROTOCOL,
                        Dispatch.UNKNOWN,
                        "upstream answered a request with 202 Accepted and no response",
                    )
                ctype = content_type(response)
                if ctype == "application/json":
                    async for msg in iter_json_messages(response):
                        if self._route_stream_message(ex, response, msg):
                            return
                elif ctype == "text/event-stream":
                    async for msg in iter_sse_messages(response, state, self._upstream.max_event_bytes):
                        if self._route_stream_message(ex, response, msg):
                            return
                else:
                    raise UpstreamFailure(
                        FailureKind.PROTOCOL,
                        Dispatch.UNKNOWN,
                        bounded_detail(f"upstream answered an unexpected content type {ctype!r}"),
                    )
        except (_Expired, UpstreamFailure):
            raise
        except (*CLIENT_ERRORS, SseError) as exc:
            untraced(exc)  # stored by the response it came from, whose frames it holds
            if ex.cancelled:
                return
            if state.last_event_id is not None and await self._resume(ex, state):
                return
            raise self._upstream.translate(exc, ex.written) from None
        if ex.cancelled or ex.response.done():
            return
        if state.last_event_id is not None and await self._resume(ex, state):
            return
        raise UpstreamFailure(
            FailureKind.CLOSED,
            Dispatch.UNKNOWN,
            "the upstream closed the response stream before the response arrived",
        )

    def _sent_session(self, headers: Mapping[str, str]) -> bool:
        return False

    def _route_stream_message(self, ex: Exchange, response: Response, msg: Message) -> bool:
        """Deliver one message read from `ex`'s own response stream. True once `ex` is answered."""
        if is_response(msg) or ("id" in msg and "method" not in msg):
            msg_id = msg.get("id")
            if msg_id is None or (msg_id == ex.upstream_id and ours(msg_id)):
                if msg_id is None:  # an error for our request sent before its id was parsed
                    msg = {**msg, "id": ex.upstream_id}
                self._on_response(ex, response, msg)
                self._pending.resolve(msg)
                if not self._health.up:  # the one check an answer pays for the gauge
                    self._health.answered()
                return True
            self._pending.resolve(msg)  # another exchange's (a resumed stream); unknown ids are dropped
            return False
        if ex.cancelled:
            return False
        if ex.on_message is not None:
            ex.on_message(msg)
        else:
            self._deliver_unsolicited(msg)
        return False

    def _deliver_unsolicited(self, msg: Message) -> None:
        if is_response(msg):
            self._pending.resolve(msg)
            return
        if msg.get("method") == "notifications/progress" and self._pending.route_progress(msg):
            return
        try:
            self._unsolicited(msg)
        except Exception:
            log.exception("unsolicited message handler failed")

    async def _post_small(self, message: Message, headers: Mapping[str, str], what: str) -> _SmallAnswer:
        """POST a notification or response; the answer's body is read (it should be empty)."""
        h = {"accept": ACCEPT_BOTH, "content-type": "application/json", **headers}
        flag = _Written()
        try:
            async with await self._client.request(
                "POST", headers=h, body=dumps(message), on_write=flag.mark, max_body=MAX_ERROR_BODY
            ) as response:
                return _SmallAnswer(response, await read_bounded(response))
        except CLIENT_ERRORS as exc:
            raise self._upstream.translate(exc, flag.written, what) from None


@dataclass(slots=True)
class _SmallAnswer:
    """The answer to a notification POST, body already read (`status_failure` can use it later)."""

    response: Response
    body: bytes

    @property
    def status_code(self) -> int:
        return self.response.status

    def failure(self) -> UpstreamFailure:
        return status_failure_of(self.response, self.body, None)


# An answer `send_request` already has in hand when it hands the exchange to a task: the response
# and the headers its request was sent with.
_First = tuple[Response, dict[str, str]]

_NO_ANSWER: Final = "the upstream closed the response stream before the response arrived"


class _Flight:
    """An exchange whose POST `send_request` wrote at once on an idle pooled connection (the
    `h1.Sink` of that request): a 2xx `application/json` answer is delivered from the
    connection's own callbacks, with no task; any other answer (an SSE stream, an error status, a
    404 of an expired session) goes to an exchange task that continues exactly where
    `_post_exchange` would be after its POST. `abort()` (cancel, close) closes the connection
    while the answer is still coming."""

    __slots__ = ("conn", "ex", "extra", "headers", "link", "message")

    def __init__(
        self,
        link: _HttpLink,
        ex: Exchange,
        message: Message,
        headers: dict[str, str],
        extra: Mapping[str, str] | None,
    ) -> None:
        self.link = link
        self.ex = ex
        self.message = message
        self.headers = headers  # as sent
        self.extra = extra  # the caller's own, for a POST sent again (an expired 2025 session)
        self.conn: Connection | None = None  # while the answer is coming on it

    def head(self, response: Response) -> bool:
        _heard(self.ex)
        status = response.status
        if 200 <= status < 300 and status != 202 and content_type(response) == "application/json":
            self.link._accepted(self.headers)
            return True
        self.conn = None  # the task owns the response now: cancelling it closes the connection
        sent: asyncio.Future[None] = self.ex.response.get_loop().create_future()
        sent.set_result(None)  # the request went out in `send_request`
        self.link._spawn_exchange(self.ex, self.message, dict(self.extra or {}), sent, (response, self.headers))
        return False

    def done(self, response: Response) -> None:
        self.conn = None
        ex = self.ex
        if ex.transport_state is self:
            ex.transport_state = None  # flight <-> exchange: a cycle, once the answer is in
        link = self.link
        try:
            messages = json_messages(response.take())
        except UpstreamFailure as failure:
            if not ex.cancelled:
                link._pending.fail(ex, failure)
            return
        for msg in messages:
            if link._route_stream_message(ex, response, msg):
                return
        if not (ex.cancelled or ex.response.done()):
            link._pending.fail(ex, UpstreamFailure(FailureKind.CLOSED, Dispatch.UNKNOWN, _NO_ANSWER))

    def failed(self, error: ClientError) -> None:
        self.conn = None
        if self.ex.transport_state is self:
            self.ex.transport_state = None
        _wake(self.ex)
        if not self.ex.cancelled:
            self.link._pending.fail(self.ex, translate_exception(error, True))

    def abort(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()  # the connection's loss reaches `failed`, which a cancelled exchange ignores


def _heard(ex: Exchange) -> None:
    ex.heard = True
    _wake(ex)


def _wake(ex: Exchange) -> None:
    waiter = ex.on_heard
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _drop(message: Message) -> None:
    log.debug("no unsolicited handler set; dropped %s", message.get("method"))


class HttpModernLink(_HttpLink):
    """The shared 2026-07-28 link: stateless POSTs, cancel = close the response stream."""

    era = Era.MODERN

    def __init__(self, upstream: HttpUpstream) -> None:
        super().__init__(upstream, prefix="m")

    def _request_headers(self, message: Message) -> dict[str, str]:
        return modern_headers(message)

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        """POST it (the 2026 HTTP transport defines no client notifications; servers answer 202)."""
        h = {**(headers or {}), **modern_headers(message)}
        response = await self._post_small(message, h, "notification")
        if not 200 <= response.status_code < 300:
            raise response.failure()


_REFUSED: Final = "the upstream refused this credential for the session (404): another credential holds it"


class HttpLegacyLink(_HttpLink):
    """One downstream 2025 session ↔ one upstream HTTP session."""

    era = Era.LEGACY

    def __init__(self, upstream: HttpUpstream) -> None:
        super().__init__(upstream, prefix="")
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._handshake = Handshake()
        self._reinit_lock = asyncio.Lock()
        self._get_task: asyncio.Task[None] | None = None
        self.reestablished = 0  # how many times an expired session was re-established
        # --auth passthrough: the credential the upstream last accepted on this session (a 2xx to
        # a request that carried it), which the link's own requests carry (see the module
        # docstring). A caller's own messages carry the caller's credential, never this one.
        self.caller_authorization: str | None = None

    # -- headers --------------------------------------------------------------------------
    def _session_headers(self, for_initialize: bool = False) -> dict[str, str]:
        """The session's headers, without a credential: a relayed message carries its caller's."""
        h: dict[str, str] = {}
        if not for_initialize:
            if self.session_id is not None:
                h[SESSION_HEADER] = self.session_id
            if self.protocol_version is not None:
                h[VERSION_HEADER] = self.protocol_version
        return h

    def _own_headers(self, for_initialize: bool = False) -> dict[str, str]:
        """The headers of the link's own requests (listen stream, cancellation, re-establishment,
        an answer to the server, DELETE): the session's, and the credential the upstream accepted."""
        h = self._session_headers(for_initialize)
        if self.caller_authorization is not None:
            h["authorization"] = self.caller_authorization
        return h

    def _request_headers(self, message: Message) -> dict[str, str]:
        return self._session_headers(message.get("method") == "initialize")

    def _sent_session(self, headers: Mapping[str, str]) -> bool:
        return SESSION_HEADER in headers

    def _accepted(self, headers: Mapping[str, str]) -> None:
        credential = headers.get("authorization")
        if credential is not None and credential != self.caller_authorization:
            self.caller_authorization = credential  # a token refreshed mid-session, now accepted

    def _foreign(self, headers: Mapping[str, str]) -> bool:
        """A server that binds its sessions to principals (the MCP SDK's) answers a session id used
        with another principal's credential 404, as if the session did not exist. Only a 404 to the
        credential the upstream last accepted here is a session it forgot (re-established with that
        credential); to any other (this is True) it is that caller's refusal: re-establishing with
        its credential would move the session, and what the server pushes on it, to whoever named
        the session id."""
        return headers.get("authorization") != self.caller_authorization

    def _forgotten(self, headers: Mapping[str, str]) -> BaseException:
        return session_refused(_REFUSED) if self._foreign(headers) else _Expired()

    def _before_request(self, message: Message) -> None:
        self._handshake.observe(message)

    def _on_response(self, ex: Exchange, response: Response, message: Message) -> None:
        if ex.method == "initialize":
            self._capture_session(response, message)

    def _capture_session(self, response: Response, message: Message) -> None:
        sid = response.headers.get(SESSION_HEADER)
        if sid:
            self.session_id = sid
        result = message.get("result")
        if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
            self.protocol_version = result["protocolVersion"]

    # -- requests with transparent session re-establishment ---------------------------------
    async def _attempt_loop(
        self, ex: Exchange, message: Message, extra: dict[str, str], sent: asyncio.Future[None], first: _First | None
    ) -> None:
        for attempt in range(2):
            stale = self.session_id if first is None else first[1].get(SESSION_HEADER)
            try:
                await self._post_exchange(ex, message, extra, sent, first)
                return
            except _Expired:
                first = None
                if attempt == 1:
                    raise UpstreamFailure(
                        FailureKind.SESSION_EXPIRED,
                        Dispatch.NO,
                        "the upstream session expired again right after it was re-established",
                        http_status=404,
                    ) from None
                await self._reestablish(stale)

    async def _reestablish(self, stale: str | None) -> None:
        async with self._reinit_lock:
            if self.session_id != stale:
                return  # a concurrent request already did it
            init = self._handshake.initialize
            if init is None:
                raise UpstreamFailure(
                    FailureKind.SESSION_EXPIRED,
                    Dispatch.NO,
                    "the upstream session expired and there is no handshake to replay",
                    http_status=404,
                )
            log.info("the upstream forgot its session: re-establishing it")
            self._stop_get_stream()
            # The stale id stays until a new one arrives: if the replay fails (the upstream is
            # still restarting), the next request sends it again, gets its 404, and re-establishes
            # then. Dropped here, every later request went without a session id and got the
            # server's 400 "Missing session ID", a validation failure, for good.
            replay = {**init, "id": self.new_id()}
            try:
                response_headers, answer = await self._upstream.rpc_once(
                    replay, self._own_headers(True), on_other=self._deliver_unsolicited
                )
            except UpstreamFailure as f:
                raise UpstreamFailure(
                    f.kind,
                    Dispatch.NO,
                    bounded_detail(f"re-establishing the expired upstream session failed: {f.detail}"),
                    http_status=f.http_status,
                    retry_after_s=f.retry_after_s,
                ) from None
            if "result" not in answer:
                raise UpstreamFailure(
                    FailureKind.PROTOCOL,
                    Dispatch.NO,
                    "the upstream refused the replayed initialize while re-establishing the session",
                )
            sid = response_headers.get(SESSION_HEADER)
            self.session_id = sid or None
            result = answer["result"]
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                self.protocol_version = result["protocolVersion"]
            self.reestablished += 1
            if self._handshake.initialized is not None:
                response = await self._post_small(self._handshake.initialized, self._own_headers(), "handshake replay")
                if not 200 <= response.status_code < 300:
                    refused = response.failure()
                    raise UpstreamFailure(
                        refused.kind,
                        Dispatch.NO,
                        "replaying notifications/initialized failed",
                        http_status=refused.http_status,
                    )
                self._start_get_stream()

    # -- notifications, responses, cancel, close --------------------------------------------
    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        """A caller's notification, with the caller's own headers (its credential, if any)."""
        self._handshake.observe(message)
        await self._notify(message, {**(headers or {}), **self._session_headers()})
        if message.get("method") == "notifications/initialized":
            self._start_get_stream()

    async def send_response(self, message: Message) -> None:
        """An answer to the server's request: the link's own message, with the accepted credential."""
        await self._notify(message, self._own_headers())

    async def _notify(self, message: Message, h: dict[str, str]) -> None:
        response = await self._post_small(message, h, "notification")
        status = response.status_code
        if 200 <= status < 300:
            self._accepted(h)
            return
        if status == 404 and SESSION_HEADER in h:
            if self._foreign(h):
                raise session_refused(_REFUSED)
            raise UpstreamFailure(
                FailureKind.SESSION_EXPIRED, Dispatch.NO, "the upstream session expired", http_status=404
            )
        raise response.failure()

    async def _cancel_on_wire(self, exchange: Exchange, reason: str | None) -> None:
        if not exchange.written or exchange.method == "initialize":
            return
        params: dict[str, Any] = {"requestId": exchange.upstream_id}
        if reason:
            params["reason"] = reason
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        heard = exchange.heard
        await self._post_cancel(note)
        if not heard:
            # The upstream had not answered the head of the request's POST: it may not have taken
            # the request into its session yet, and the cancellation (a POST on another
            # connection) can overtake it there, be ignored as naming no request in flight, and
            # the request then runs to its end (3 of ~924 cancelled hang attempts in the HTTP load
            # run, on a busy upstream that had just restarted). So it is sent again once the head
            # came (or the exchange ended, or a bound passed): an SDK server writes a request into
            # its session before the head of an event-stream answer and reads its session in
            # order, so the second one finds the request; a second cancellation of a request
            # already cancelled or ended is ignored (the spec lets a receiver ignore those).
            await self._until_heard(exchange)
            await self._post_cancel(note)

    async def _post_cancel(self, note: Message) -> None:
        try:
            await self._post_small(note, self._own_headers(), "cancel notification")
        except UpstreamFailure as f:
            log.debug("cancel notification not delivered: %s", f.detail)

    async def _until_heard(self, exchange: Exchange) -> None:
        """Wait (bounded by the connect timeout) until the upstream answered the head of the
        request's POST, or its exchange ended."""
        task = exchange.transport_state
        if task is None:
            return  # the exchange ended: its task or flight unlinks itself then (`_exchange_ended`)
        loop = asyncio.get_running_loop()
        waiter = exchange.on_heard = loop.create_future()
        waits: set[asyncio.Future[Any]] = {waiter}
        if isinstance(task, asyncio.Task):
            waits.add(task)
        try:
            await asyncio.wait(waits, timeout=self._upstream.connect_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exchange.on_heard = None

    async def _close_session(self) -> None:
        self._stop_get_stream()
        sid, self.session_id = self.session_id, None
        if sid is None:
            return
        h = {SESSION_HEADER: sid}
        if self.protocol_version:
            h[VERSION_HEADER] = self.protocol_version
        if self.caller_authorization is not None:
            h["authorization"] = self.caller_authorization
        try:
            async with asyncio.timeout(self._upstream.connect_timeout_s * 2):
                async with await self._client.request("DELETE", headers=h) as response:
                    status = response.status
            if status not in (200, 202, 204, 404, 405):
                log.debug("upstream answered DELETE with HTTP %s", status)
        except (*CLIENT_ERRORS, TimeoutError) as exc:
            untraced(exc)
            log.debug("DELETE of the upstream session failed: %s", type(exc).__name__)

    # -- resumption of a POST stream (2025-11-25 polling / event-store servers) -------------
    async def _resume(self, ex: Exchange, state: StreamState) -> bool:
        failures = 0
        while failures < RESUME_MAX_ATTEMPTS and not ex.cancelled and not self._closed:
            await asyncio.sleep(min(state.retry_ms or DEFAULT_RETRY_MS, MAX_RETRY_MS) / 1000)
            headers = {"accept": "text/event-stream", **self._own_headers()}
            if state.last_event_id is not None:
                headers[LAST_EVENT_ID_HEADER] = state.last_event_id
            try:
                async with await self._client.request("GET", headers=headers) as response:
                    if response.status != 200 or content_type(response) != "text/event-stream":
                        failures += 1
                        continue
                    failures = 0
                    async for msg in iter_sse_messages(response, state, self._upstream.max_event_bytes):
                        if self._route_stream_message(ex, response, msg):
                            return True
            except (*CLIENT_ERRORS, SseError) as exc:
                untraced(exc)
                failures += 1
        return False

    # -- the standalone GET stream ----------------------------------------------------------
    def _start_get_stream(self) -> None:
        if self._closed or (self._get_task is not None and not self._get_task.done()):
            return
        loop = asyncio.get_running_loop()
        self._opening = opening = loop.create_future()
        self._get_task = task = loop.create_task(self._get_loop(opening))

        def opened(_: object) -> None:
            if not opening.done():
                opening.set_result(None)

        task.add_done_callback(opened)

    def _stop_get_stream(self) -> None:
        task, self._get_task = self._get_task, None
        if task is not None:
            task.cancel()

    async def _get_loop(self, opening: asyncio.Future[None]) -> None:
        state = StreamState()
        failures = 0
        while not self._closed and self.session_id is not None and failures < GET_MAX_FAILURES:
            headers = {"accept": "text/event-stream", **self._own_headers()}
            if state.last_event_id is not None:
                headers[LAST_EVENT_ID_HEADER] = state.last_event_id
            try:
                # The stream holds a connection for as long as it lasts: one of its own, so that
                # hundreds of idle sessions take no place their requests need in the pool.
                async with await self._client.request("GET", headers=headers, dedicated=True) as response:
                    if not opening.done():
                        opening.set_result(None)  # the server has the stream (or refused it)
                    if response.status in (404, 405):
                        return  # no standalone stream offered, or the session is gone
                    if response.status != 200 or content_type(response) != "text/event-stream":
                        failures += 1
                    else:
                        failures = 0
                        async for msg in iter_sse_messages(response, state, self._upstream.max_event_bytes):
                            self._deliver_unsolicited(msg)
            except (*CLIENT_ERRORS, SseError) as exc:
                untraced(exc)  # a response keeps its error, and the error's frames the response
                log.debug("standalone GET stream broke: %s", type(exc).__name__)
                failures += 1
                if not opening.done():
                    opening.set_result(None)  # requests go on; a later attempt may open it
            if failures:
                delay = min(GET_BACKOFF_CAP_S, GET_BACKOFF_BASE_S * 2 ** (failures - 1))
                if state.retry_ms is not None:
                    delay = max(delay, min(state.retry_ms, MAX_RETRY_MS) / 1000)
            else:
                delay = min(state.retry_ms or DEFAULT_RETRY_MS, MAX_RETRY_MS) / 1000
            await asyncio.sleep(delay)


# ---------------------------------------------------------------------------------------------
# the upstream
# ---------------------------------------------------------------------------------------------
class HttpClientOwner:
    """An upstream reached over HTTP: its URL, the proxy's own headers, and one HTTP client
    created on first use (a client binds to the loop of its first request). Shared with sse.py."""

    def __init__(
        self,
        url: str,
        label: str,
        *,
        headers: Mapping[str, str] | None,
        connect_timeout_s: float,
        max_connections: int,
        max_event_bytes: int | None,
        ssl_context: ssl.SSLContext | None = None,
        proxy: ProxyRoute | None = None,
    ) -> None:
        self.url = url
        parts = urlsplit(url)
        self.description = f"{label}:{parts.hostname}:{parts.port or ''}{parts.path}"
        self.connect_timeout_s = connect_timeout_s
        self.max_event_bytes = max_event_bytes
        self._headers = dict(headers or {})
        self._max_connections = max_connections
        # One TLS context and one egress route for the upstream's life (proxy/net/tls.py and
        # egress.py): a client rebuilt after `aclose` reuses them, so nothing is re-read later.
        self._ssl = ssl_context if ssl_context is not None or parts.scheme != "https" else ssl.create_default_context()
        self.proxy = proxy
        self._client: HttpClient = self._new_client()  # here: a bad URL or header fails at start-up
        self.health = UpstreamHealth()
        # --auth passthrough: the upstream authenticates callers, so a 401/403 to the proxy's own
        # probe means it answered (up), not that it is down.
        self.behind_caller_auth = False

    def _new_client(self) -> HttpClient:
        return HttpClient(
            self.url,
            headers=self._headers,
            connect_timeout_s=self.connect_timeout_s,
            max_connections=self._max_connections,
            ssl_context=self._ssl,
            proxy=self.proxy,
        )

    def replace_ssl_context(self, context: ssl.SSLContext) -> None:
        """The reloaded TLS context (proxy/net/tls.py, `TlsWatcher`): every connection opened
        from now on, by this client or one rebuilt later, uses it."""
        self._ssl = context
        self._client.set_ssl_context(context)

    @property
    def client(self) -> HttpClient:
        if self._client.closed:
            self._client = self._new_client()
        return self._client

    async def _close_client(self) -> None:
        await self._client.aclose()

    async def probe(self) -> Capabilities:
        raise NotImplementedError

    async def check(self) -> Capabilities | None:
        """Probe again: an upstream that answers the probe is up, one that refuses the connection
        (or the proxy's credentials) is down. Returns what it speaks now."""
        try:
            caps = await self.probe()
        except UpstreamFailure as failure:
            if self.behind_caller_auth and failure.http_status in (401, 403):
                self.health.answered()  # it wants a caller's credential, which the probe has none of
                return None
            self.health.failed(failure.detail)
            raise
        self.health.answered()
        return caps

    async def get_document(self, target: str, limit: int = 64 * 1024) -> tuple[int, bytes, str | None]:
        """GET `target` on the upstream's origin (its OAuth protected-resource metadata), bounded
        in time (twice the connect timeout) and size; (status, body, its Cache-Control). Raises
        UpstreamFailure."""
        try:
            async with asyncio.timeout(self.connect_timeout_s * 2):
                request = self.client.request("GET", target=target, headers={"accept": "application/json"})
                async with await request as response:
                    return response.status, await read_bounded(response, limit), response.headers.get("cache-control")
        except TimeoutError:
            raise UpstreamFailure(FailureKind.TIMEOUT, Dispatch.NO, "the upstream did not answer in time") from None
        except CLIENT_ERRORS as exc:
            raise self.translate(exc, False, "metadata request") from None

    def translate(self, exc: BaseException, written: bool, what: str = "request") -> UpstreamFailure:
        """`translate_exception`, and a connection that could not be established marks the
        upstream down (a full pool does not: the upstream is busy, not gone)."""
        failure = translate_exception(untraced(exc), written, what)  # see `untraced`: kept as context
        if failure.kind is FailureKind.CONNECT_FAILED and not isinstance(exc, PoolTimeout):
            self.health.failed(failure.detail)
        return failure


class HttpUpstream(HttpClientOwner):
    """A Streamable HTTP MCP server (either era, or both)."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 5.0,
        max_connections: int = 100,
        probe_timeout_s: float = 10.0,
        max_event_bytes: int | None = 16 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
        proxy: ProxyRoute | None = None,
    ) -> None:
        super().__init__(
            url,
            "http",
            headers=headers,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
            max_event_bytes=max_event_bytes,
            ssl_context=ssl_context,
            proxy=proxy,
        )
        self.probe_timeout_s = probe_timeout_s
        self._modern: HttpModernLink | None = None
        self._links: set[_HttpLink] = set()

    async def open(self, era: Era) -> HttpLegacyLink | HttpModernLink:
        if era is Era.MODERN:
            if self._modern is None or self._modern._closed:
                self._modern = HttpModernLink(self)
            return self._modern
        link = HttpLegacyLink(self)
        self._links.add(link)
        return link

    def _forget(self, link: _HttpLink) -> None:
        self._links.discard(link)
        if link is self._modern:
            self._modern = None

    async def aclose(self) -> None:
        links: list[_HttpLink] = list(self._links)
        if self._modern is not None:
            links.append(self._modern)
        await asyncio.gather(*(link.aclose() for link in links), return_exceptions=True)
        await self._close_client()

    async def rpc_once(
        self,
        message: Message,
        headers: Mapping[str, str],
        *,
        on_other: Callable[[Message], None] | None = None,
    ) -> tuple[Headers, Message]:
        """POST one request and read its response (JSON or SSE); other messages go to `on_other`."""
        h = {"accept": ACCEPT_BOTH, "content-type": "application/json", **headers}
        flag = _Written()
        try:
            async with await self.client.request(
                "POST", headers=h, body=dumps(message), on_write=flag.mark, max_body=self.max_event_bytes
            ) as response:
                if not 200 <= response.status < 300:
                    raise await status_failure(response, message.get("id"))
                ctype = content_type(response)
                if ctype == "application/json":
                    messages = iter_json_messages(response)
                elif ctype == "text/event-stream":
                    messages = iter_sse_messages(response, StreamState(), self.max_event_bytes)
                else:
                    raise UpstreamFailure(
                        FailureKind.PROTOCOL,
                        Dispatch.UNKNOWN,
                        bounded_detail(f"upstream answered an unexpected content type {ctype!r}"),
                    )
                async for msg in messages:
                    if "method" not in msg and msg.get("id") in (message.get("id"), None):
                        if not self.health.up:
                            self.health.answered()
                        return response.headers, msg
                    if on_other is not None:
                        on_other(msg)
        except (*CLIENT_ERRORS, SseError) as exc:
            raise self.translate(exc, flag.written) from None
        raise UpstreamFailure(
            FailureKind.CLOSED, Dispatch.UNKNOWN, "the upstream closed the stream before the response arrived"
        )

    async def probe(self) -> Capabilities:
        """Which eras the upstream speaks: `server/discover` first, then a legacy `initialize`."""
        modern = legacy = False
        notes: list[str] = []
        discover = discover_request("probe-discover")
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                _, answer = await self.rpc_once(discover, modern_headers(discover))
            result = answer.get("result")
            versions = result.get("supportedVersions") if isinstance(result, dict) else None
            if isinstance(versions, list):
                modern = any(v in MODERN_VERSIONS for v in versions)
                legacy = any(v in LEGACY_VERSIONS for v in versions)
                notes.append(f"supportedVersions={[v for v in versions if isinstance(v, str)]}")
            else:
                notes.append("server/discover refused")
        except TimeoutError:
            notes.append("server/discover timed out")
        except UpstreamFailure as f:
            if f.kind is FailureKind.CONNECT_FAILED or f.http_status in (401, 403):
                raise
            notes.append(f"server/discover failed: {f.detail}")
        if not legacy:
            legacy, note = await self._probe_legacy()
            notes.append(note)
        return Capabilities(legacy=legacy, modern=modern, detail=bounded_detail("; ".join(notes)))

    async def _probe_legacy(self) -> tuple[bool, str]:
        init = initialize_request("probe-initialize")
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                headers, answer = await self.rpc_once(init, {})
        except TimeoutError:
            return False, "initialize timed out"
        except UpstreamFailure as f:
            if f.kind is FailureKind.CONNECT_FAILED or f.http_status in (401, 403):
                raise
            return False, f"initialize failed: {f.detail}"
        result = answer.get("result")
        if not isinstance(result, dict):
            return False, "initialize refused"
        sid = headers.get(SESSION_HEADER)
        if sid:
            h = {SESSION_HEADER: sid}
            if isinstance(result.get("protocolVersion"), str):
                h[VERSION_HEADER] = result["protocolVersion"]
            with contextlib.suppress(*CLIENT_ERRORS, TimeoutError):
                async with asyncio.timeout(self.probe_timeout_s):
                    async with await self.client.request("DELETE", headers=h):
                        pass
        return True, f"initialize negotiated {result.get('protocolVersion')}"
