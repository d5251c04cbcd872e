"""The Streamable HTTP frontend: one endpoint serving both protocol eras (pure ASGI, on uvicorn).

- 2025 handshake revisions: `initialize` opens a session (`Mcp-Session-Id`, its own upstream
  link); later POSTs name it (missing → 400, unknown or expired → 404); GET opens the session's
  listen stream (one at a time, else 409); DELETE ends the session. A client that disconnects has
  not cancelled (the spec says so): the request in flight finishes, its answer is dropped.
- 2026-07-28: every POST stands alone. The `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and
  `Mcp-Param-*` headers are checked with the SDK's own validation ladder (`mcp.shared.inbound`),
  so the proxy rejects exactly what the reference server rejects, even in front of a stdio
  upstream that never sees headers. Closing the response stream cancels the request.
- A request's answer is `application/json` when nothing else arrives first, with the HTTP status
  the 2026 table maps its error to; otherwise the response becomes `text/event-stream`, carrying
  the request's notifications and server-to-client requests, then its response, with keep-alive
  comments while nothing happens.
- Safety: Host and Origin are checked against allow-lists (DNS rebinding), bodies are bounded,
  malformed JSON-RPC gets a JSON-RPC error, and nothing a peer sends can crash the proxy.
- Bounded for a client that does not read: every response and listen stream queues at most
  `--stream-buffer-bytes` (then a response stream drops what is not its answer and a listen
  stream is closed, counted), and the buffers kept for resumption are bounded in bytes per
  response (`--replay-stream-bytes`) and in total (`--replay-total-bytes`) (`_Replays`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    MODERN_PROTOCOL_VERSIONS,
    NAME_BEARING_METHODS,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)

from proxy import jsonrpc
from proxy.auth.base import Authenticator, AuthRefused, Principal
from proxy.auth.challenge import (
    WELL_KNOWN,
    challenge,
    metadata_paths,
    metadata_url,
    resource_metadata_of,
    rewrite_challenge,
    rewrite_metadata,
)
from proxy.auth.metadata_cache import MISSING_AGE_S, MetadataCache, max_age
from proxy.auth.vouch import VouchLimited
from proxy.core import capacity
from proxy.core.relay import Relay
from proxy.core.service import Service
from proxy.errors import FailureKind, UpstreamFailure
from proxy.frontend.clients import ClientIdentity
from proxy.frontend.hostcheck import (
    LOOPBACK_HOST_PATTERNS,
    LOOPBACK_ORIGIN_PATTERNS,
    HostAllowList,
    OriginAllowList,
    duplicated,
)
from proxy.jsonrpc import Message
from proxy.settings import LOOPBACK_HOSTS, Settings
from proxy.telemetry.shed import SHED

log = logging.getLogger("proxy.frontend.http")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PING_INTERVAL_S = 15.0
# jwt, tokens: an open listen stream's credential is checked again this often; a revoked token or
# an expired JWT ends the stream (its POSTs already get 401)
CREDENTIAL_RECHECK_S = 5.0
# A POST's disconnect watcher starts only once its request has run this long (up to half as long
# again): most calls are answered sooner, and a watcher is a task plus a wait on uvicorn's receive
# event per request. A client's disconnect is noticed that much later at most.
WATCH_AFTER_S = 0.05
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
_JSON = (b"content-type", b"application/json")
# Headers a request may carry once only: a second one is answered 400 (`McpHttpApp._http`).
_SINGLE_HEADERS = (b"host", b"origin", b"mcp-session-id", b"authorization", b"last-event-id", b"content-type")
RETRY_MS = 1000
# What one response or listen stream may hold for a client that does not read (its writer waits
# on the socket meanwhile). A single message is always taken when nothing is queued, so any
# message within the message limit passes; beyond the bound a request stream drops what is not
# its answer, and a listen stream is closed (the client may open another). The default of
# `--stream-buffer-bytes`; the app passes the configured value to every stream.
STREAM_BUFFER_BYTES: int = Settings.model_fields["stream_buffer_bytes"].default


class ClientGone(Exception):
    pass


class _Stream:
    """An Outbox feeding one HTTP response: messages queue up, serialized once, and wake the
    single writer. The queue is bounded in bytes (`max_bytes`): past the bound a request stream
    drops what is not its answer (the answer is always taken) and a listen stream is closed, both
    counted in `mcp_recovery_dropped_messages_total`. `on_pressure(True)` is called when the
    queue passes half the bound and `on_pressure(False)` when it has drained to a quarter (or the
    stream closes): the relay of a session with its own stdio child pauses reading the child
    meanwhile (backpressure instead of buffering).

    Cheaper than an asyncio.Queue plus asyncio.wait per message: one future at a time, resolved
    by `send`, by `finish` (the handler is over) or by `close`, awaited with a ping timeout.

    `on_stream`, when set, is called once, on the first message that is not the answer to
    `down_id` itself: the POST's handler runs in the request's own task, so the response only
    needs a writer task of its own when it turns into an event stream.
    """

    __slots__ = (
        "_bytes",
        "_closed",
        "_items",
        "_keep",
        "_loop",
        "_waiter",
        "down_id",
        "finished",
        "listen",
        "max_bytes",
        "on_pressure",
        "on_stream",
        "pressured",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        keep_after_close: bool = False,
        listen: bool = False,
        max_bytes: int = STREAM_BUFFER_BYTES,
    ) -> None:
        self._loop = loop  # passed in: on Python 3.11 each get_running_loop() is a getpid() syscall
        self._items: deque[tuple[Message, bytes]] = deque()
        self._bytes = 0
        self.max_bytes = max_bytes
        self.listen = listen
        self.on_pressure: Callable[[bool], None] | None = None
        self.pressured = False
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._keep = keep_after_close  # 2025: a disconnected client may resume the stream
        self.finished = False  # the handler is over: no message follows what is queued
        self.down_id: Any = None
        self.on_stream: Callable[[], None] | None = None

    def send(self, message: Message) -> None:
        if self._closed and not self._keep:
            return
        data = jsonrpc.dumps_out(message)  # once, secrets removed: the writer writes these bytes
        answer = message.get("id") == self.down_id and jsonrpc.is_response(message)
        queued = self._bytes + len(data)
        if queued > self.max_bytes and self._items and not answer:
            if self.listen:  # a listen stream nobody reads: closed rather than fed
                SHED.count("dropped_messages", "listen_closed", len(self._items) + 1)
                self._items.clear()
                self._bytes = 0
                self.close()
            else:
                SHED.count("dropped_messages", "stream_full")
            return
        self._items.append((message, data))
        self._bytes = queued
        if not self.pressured and queued > self.max_bytes // 2 and not self._closed and self.on_pressure is not None:
            self.pressured = True
            self.on_pressure(True)
        start = self.on_stream
        if start is not None and not answer:
            self.on_stream = None
            start()
        self.wake()

    def wake(self, *_: object) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pop(self) -> tuple[Message, bytes] | None:
        """The next message and its serialized form."""
        if not self._items:
            return None
        item = self._items.popleft()
        self._bytes -= len(item[1])
        if self.pressured and self._bytes <= self.max_bytes // 4:
            self._release()
        return item

    def _release(self) -> None:
        self.pressured = False
        if self.on_pressure is not None:
            self.on_pressure(False)

    async def wait(self, timeout_s: float | None) -> None:
        """Until a message arrives or `wake` is called, at most `timeout_s` (None: no limit).

        A plain timer that wakes the waiter (cheaper than an `asyncio.timeout` scope per response).
        """
        loop = self._loop
        self._waiter = waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, self.wake)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None

    @property
    def closed(self) -> bool:
        return self._closed

    def finish(self) -> None:
        self.finished = True
        self.on_stream = None
        self.wake()

    def close(self) -> None:
        self._closed = True
        if self.pressured:
            self._release()
        self.wake()


def _primes(version: str | None) -> bool:
    """Whether a 2025 request's revision has SSE priming events (SEP-1699, 2025-11-25). A request
    without `MCP-Protocol-Version` is 2025-03-26 (the spec's rule; 2025-06-18 clients send it on
    every request after initialize); `initialize` itself has none, so its stream is not primed."""
    return version is not None and version >= "2025-11-25" and version in jsonrpc.LEGACY_VERSIONS


def _sse(data: bytes) -> bytes:
    """One SSE event carrying a message serialized by `jsonrpc.dumps_out`."""
    return b"event: message\ndata: " + data + b"\n\n"


class _Replay:
    """A 2025 POST response stream kept for resumption (SEP-1699): its events by sequence number.

    The POST writes through `target` while its connection lasts; a client that lost the stream
    reconnects with GET and `Last-Event-ID: <key>:<seq>`, gets what it missed, and becomes the
    target for the rest. Bounded: the last `KEEP` events and `_Replays.stream_bytes`, oldest
    evicted first, kept `GRACE_S` after the response; all replays together by
    `_Replays.total_bytes` (see there).
    """

    KEEP = 256
    GRACE_S = 30.0

    def __init__(self, key: str, session_id: str, down_id: Any, store: _Replays) -> None:
        self.key = key
        self.session_id = session_id
        self.down_id = down_id
        self.store = store
        self.events: deque[tuple[int, bytes]] = deque()
        self.bytes = 0
        self.evicted_upto = 0  # the highest sequence number evicted
        self.answer_seq: int | None = None  # the event carrying the request's answer
        self.seq = 0
        self.target: Send | None = None
        self.lock = asyncio.Lock()
        self.finished = asyncio.Event()

    async def emit(self, message: bytes, *, answer: bool = False) -> None:
        """Record the serialized message under its id and write it: one step, so a resumption
        that replays under the same lock neither misses it nor gets it twice."""
        async with self.lock:
            self.seq += 1
            if answer:
                self.answer_seq = self.seq
            data = f"id: {self.key}:{self.seq}\n".encode() + _sse(message)
            self.events.append((self.seq, data))
            self.bytes += len(data)
            self.store.added(self, len(data))
            await self._write_locked(data)

    def evict(self) -> int:
        seq, data = self.events.popleft()
        self.evicted_upto = seq
        self.bytes -= len(data)
        return len(data)

    async def write_ping(self, message: MutableMapping[str, Any]) -> None:
        await self.write(message["body"])

    async def write(self, data: bytes) -> None:
        async with self.lock:
            await self._write_locked(data)

    async def _write_locked(self, data: bytes) -> None:
        if self.target is None:
            return
        try:
            await self.target({"type": "http.response.body", "body": data, "more_body": True})
        except Exception:  # the reader went away: keep recording for the next resumption
            self.target = None


# Resumption buffers: one response may keep its answer (up to the 16 MiB message limit) and some
# notifications; all of them together hold at most `REPLAY_TOTAL_BYTES` (200 calls with 8 MiB
# answers held 1.8 GB for 30 s when only the event count was bounded). Defaults of
# `--replay-stream-bytes` and `--replay-total-bytes`.
REPLAY_STREAM_BYTES: int = Settings.model_fields["replay_stream_bytes"].default
REPLAY_TOTAL_BYTES: int = Settings.model_fields["replay_total_bytes"].default


def _replay_key(n: int) -> str:
    """The key of a resumable stream's event ids (`<key>:<seq>`): 128 random bits, so nobody
    derives another stream's ids from their own (they were `r1`, `r2`, ...), and the counter in
    hex after them, so two keys never collide. At most 22 + 16 characters, never a `:`."""
    return f"{secrets.token_urlsafe(16)}{n:x}"


class _Replays:
    """The 2025 response streams kept for resumption: at most `LIMIT` of them (the oldest
    forgotten), each within `KEEP` events and `stream_bytes`, all within `total_bytes`. Eviction
    takes the oldest event first: of the stream itself for its own bounds, of the oldest stream
    holding any for the total. Evictions are counted in
    `mcp_recovery_resumption_evictions_total{bound}`. A client resuming past an evicted answer is
    told so with a JSON-RPC error for its request, not left waiting."""

    LIMIT = 1024

    def __init__(self, stream_bytes: int = REPLAY_STREAM_BYTES, total_bytes: int = REPLAY_TOTAL_BYTES) -> None:
        self.stream_bytes = stream_bytes
        self.total_bytes = total_bytes
        self.replays: dict[str, _Replay] = {}
        self.held = 0

    def get(self, key: str) -> _Replay | None:
        return self.replays.get(key)

    def new(self, key: str, session_id: str, down_id: Any) -> _Replay:
        if len(self.replays) >= self.LIMIT:
            self.forget(next(iter(self.replays)))
        replay = self.replays[key] = _Replay(key, session_id, down_id, self)
        return replay

    def forget(self, key: str) -> None:
        replay = self.replays.pop(key, None)
        if replay is not None:
            self.held -= replay.bytes
            replay.events.clear()
            replay.bytes = 0

    def added(self, replay: _Replay, size: int) -> None:
        self.held += size
        while len(replay.events) > 1 and (replay.bytes > self.stream_bytes or len(replay.events) > _Replay.KEEP):
            self.held -= replay.evict()
            SHED.count("resumption_evictions", "stream")
        if self.held > self.total_bytes:
            for oldest in list(self.replays.values()):
                while oldest.events and self.held > self.total_bytes:
                    self.held -= oldest.evict()
                    SHED.count("resumption_evictions", "total")
                if self.held <= self.total_bytes:
                    break


async def _respond(
    send: Send, status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    hdrs = list(headers or [])
    if body:
        hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def _respond_json(
    send: Send, status: int, message: Message, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _respond(send, status, jsonrpc.dumps_out(message), [_JSON, *(headers or [])])


async def _respond_error(send: Send, status: int, id_: Any, code: int, text: str) -> None:
    await _respond_json(send, status, jsonrpc.error(id_, code, text))


async def _respond_session_refused(send: Send, id_: Any, failure: UpstreamFailure) -> None:
    """A new session refused: at a limit (proxy/core/capacity.py: 429/503, Retry-After, the limit and
    its flag in the message and `data`) or because the proxy shuts down (503), both -32000; an
    upstream that cannot open one, 502 with the failure's text."""
    if failure.kind is not FailureKind.OVERLOADED:
        await _respond_error(send, 502, id_, jsonrpc.INTERNAL_ERROR, jsonrpc.bounded(failure.detail))
        return
    data = failure.data() if isinstance(failure, capacity.Refusal) else None
    body = jsonrpc.error(id_, jsonrpc.SHUTTING_DOWN, jsonrpc.bounded(failure.detail), data)
    retry = b"%d" % math.ceil(failure.retry_after_s or capacity.RETRY_AFTER_S)
    await _respond_json(send, failure.http_status or 503, body, [(b"retry-after", retry)])


def _status_for(message: Message, modern: bool) -> int:
    if modern and "error" in message and isinstance(message["error"], dict):
        return ERROR_CODE_HTTP_STATUS.get(message["error"].get("code"), 200)  # type: ignore[arg-type]
    return 200


_TRACE_HEADERS = ("traceparent", "tracestate")


def _forwarded(headers: dict[str, str], credentials: bool = False) -> dict[str, str] | None:
    """What of the caller's headers the upstream may see: `Mcp-Param-*` (intermediaries must
    forward them) and the W3C trace context (the engine replaces it with the attempt's own when
    tracing is on). Credentials to the upstream are the proxy's own, except with `credentials`
    (`--auth passthrough`): the caller's `Authorization` then goes on unchanged."""
    out = {k: v for k, v in headers.items() if k.startswith("mcp-param-") or k in _TRACE_HEADERS}
    if credentials and "authorization" in headers:
        out["authorization"] = headers["authorization"]
    return out or None


def _plainly_routable(message: Message, headers: dict[str, str]) -> bool:
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
    if version.__class__ is not str or version not in MODERN_PROTOCOL_VERSIONS:
        return False
    method = message.get("method")
    if headers.get(MCP_PROTOCOL_VERSION_HEADER) != version or headers.get(MCP_METHOD_HEADER) != method:
        return False
    key = NAME_BEARING_METHODS.get(method)  # type: ignore[arg-type]
    if key is None:
        return True
    value = params.get(key)  # type: ignore[union-attr]
    return value is None or (headers.get(MCP_NAME_HEADER) == value and not value.startswith("=?"))


class _LateWatches:
    """Disconnect watchers of POST requests, started `WATCH_AFTER_S` after the request began.

    A request answered sooner never gets one (nothing to watch: its answer is written next); a
    client that disconnects before then is noticed at that point, which only delays the
    cancellation of a 2026 request by at most 1.5 x `WATCH_AFTER_S`. Pending requests are kept in
    arrival order (their due times increase), and one loop timer is armed for the oldest."""

    __slots__ = ("_app", "_handle", "_loop", "_pending", "_started")

    def __init__(self, app: McpHttpApp, loop: asyncio.AbstractEventLoop) -> None:
        self._app = app
        self._loop = loop
        self._pending: dict[_Stream, tuple[float, Receive, asyncio.Task[None] | None]] = {}
        self._started: dict[_Stream, asyncio.Task[None]] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, stream: _Stream, receive: Receive, cancel: asyncio.Task[None] | None) -> None:
        due = self._loop.time() + WATCH_AFTER_S
        self._pending[stream] = (due, receive, cancel)
        if self._handle is None:
            self._handle = self._loop.call_at(due, self._sweep)

    def end(self, stream: _Stream) -> None:
        """The request is over: forget it, or stop its watcher."""
        if self._pending.pop(stream, None) is None:
            watcher = self._started.pop(stream, None)
            if watcher is not None:
                watcher.cancel()

    def _sweep(self) -> None:
        self._handle = None
        pending = self._pending
        horizon = self._loop.time() + 0.001  # loop timers are millisecond-grained
        while pending:
            stream = next(iter(pending))
            due, receive, cancel = pending[stream]
            if due > horizon:
                # A sweep for a batch of requests, not one a request: a watcher may start up to
                # half of WATCH_AFTER_S late.
                self._handle = self._loop.call_at(max(due, horizon + WATCH_AFTER_S / 2), self._sweep)
                return
            del pending[stream]
            self._started[stream] = self._loop.create_task(self._app._watch_disconnect(receive, stream, cancel))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _refusal_error(id_: Any, refused: AuthRefused) -> Message:
    """A refusal that can no longer be an HTTP status (the answer already streams): a JSON-RPC
    error saying which status the upstream answered."""
    return jsonrpc.error(
        id_,
        jsonrpc.INTERNAL_ERROR,
        f"the upstream refused the request's credentials (HTTP {refused.status})",
        {"io.mcp-recovery-proxy/upstreamFailure": {"kind": "http_status", "httpStatus": refused.status}},
    )


METADATA_BYTES = 64 * 1024


class McpHttpApp:
    def __init__(self, service: Service, settings: Settings, *, auth: Authenticator | None = None) -> None:
        self.service = service
        self.path = settings.listen_path.rstrip("/") or "/"
        # Identity (proxy/auth/): every MCP request is authenticated before anything else is done
        # with it; None (`--auth none`) costs the request path nothing.
        self.auth = auth
        mode = auth.mode if auth is not None else "none"
        self._forward_credentials = mode == "passthrough"
        self._binds_sessions = mode in ("jwt", "tokens")
        self.public_url = settings.public_url or (
            f"http://{_url_host(settings.listen_host)}:{settings.listen_port}{settings.listen_path}"
        )
        self.metadata_url = metadata_url(self.public_url)
        self._metadata_paths = metadata_paths(self.path) if auth is not None else frozenset()
        self._issuer = settings.auth_issuer if mode == "jwt" else None
        self._upstream_metadata_target: str | None = None  # passthrough: see _note_upstream_metadata
        self._metadata_cache = MetadataCache()
        self.max_body = settings.max_body_bytes
        host = settings.listen_host
        loopback = host in LOOPBACK_HOSTS
        hosts = list(settings.allowed_hosts)
        origins = list(settings.allowed_origins)
        if loopback:
            hosts += LOOPBACK_HOST_PATTERNS
            origins += LOOPBACK_ORIGIN_PATTERNS
        self.allowed_hosts = HostAllowList(hosts) if hosts else None  # None: any Host (non-loopback, no list)
        self.stream_buffer_bytes = settings.stream_buffer_bytes
        # jwt and tokens: per-client limits count by the principal the proxy verified (proxy/frontend/clients.py)
        self.clients = ClientIdentity(
            trusts_proxies=bool(settings.forwarded_allow_ips), by_principal=self._binds_sessions
        )
        self._replays = _Replays(settings.replay_stream_bytes, settings.replay_total_bytes)
        self._replay_ids = itertools.count(1)
        self._watches: _LateWatches | None = None  # created in the loop, on the first POST
        # Open 2025 listen streams: they never end by themselves, so shutdown ends them
        # (`close_streams`) instead of uvicorn cancelling their tasks after its grace period.
        self._listening: set[_Stream] = set()
        self._shutting_down = False
        self.allowed_origins = OriginAllowList(origins)
        if not loopback and not settings.allowed_hosts:
            log.warning(
                "listening on %s without --allowed-host (MCP_RECOVERY_ALLOWED_HOSTS): any Host header is accepted", host
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._http(scope, receive, send)
        except ClientGone:
            return
        except Exception:  # the proxy never crashes because a peer misbehaved
            log.exception("unexpected error serving %s %s", scope.get("method"), scope.get("path"))
            with contextlib.suppress(Exception):
                await _respond_error(send, 500, None, jsonrpc.INTERNAL_ERROR, "internal proxy error")

    # -- identity (proxy/auth/) ----------------------------------------------------------------
    async def _refuse(self, send: Send, refused: AuthRefused, method: str, request_id: Any = None) -> None:
        """A 401/403 with its `WWW-Authenticate` challenge (a 404 as for an unknown session);
        counted and logged, never with the credential (the refusal's text never holds one)."""
        SHED.count("auth_failures", refused.reason)
        log.info("refused %s: HTTP %d %s (%s)", method, refused.status, refused.reason, refused.description)
        if refused.status == 404:  # passthrough: the upstream refused this caller on the session named
            await _respond_error(send, 404, request_id, jsonrpc.INVALID_REQUEST, "Session not found")
            return
        if refused.status == 503:  # jwt: the issuer's keys cannot be had; the caller's token is not at fault
            body = {"error": "temporarily_unavailable", "error_description": refused.description}
            retry = str(max(1, round(refused.retry_after_s or 1))).encode()
            await _respond(send, 503, jsonrpc.dumps_out(body), [_JSON, (b"retry-after", retry)])
            return
        if refused.challenge is not None:  # passthrough: the upstream's own, pointed at our metadata
            self._note_upstream_metadata(refused.challenge)
            value = rewrite_challenge(refused.challenge, self.metadata_url)
        else:
            value = challenge(refused, self.metadata_url)
        body = {"error": refused.error or "unauthorized", "error_description": refused.description}
        await _respond(
            send,
            refused.status,
            jsonrpc.dumps_out(body),
            [_JSON, (b"www-authenticate", value.encode("latin-1", "replace"))],
        )

    def _session(self, session_id: str | None, principal: Principal | None) -> Relay | None:
        """The 2025 session named, if it is this principal's (jwt, tokens: a session belongs to the
        principal that opened it; another principal gets "not found", as for an unknown id)."""
        relay = self.service.sessions.get(session_id) if session_id is not None else None
        if relay is not None and relay.owner is not None and (principal is None or principal.id != relay.owner):
            SHED.count("auth_failures", "session_owner")
            log.info("refused session %s…: opened by another principal", (session_id or "")[:8])
            return None
        return relay

    async def _vouched(
        self,
        send: Send,
        relay: Relay,
        headers: dict[str, str],
        method: str,
        principal: Principal | None,
        request_id: Any = None,
    ) -> bool:
        """passthrough: the caller may act on the session without a request the upstream judges
        (`Relay.vouch`: the listen stream, a resumed answer, DELETE, a cancellation, an answer to
        the server's request). False once the refusal was answered: the upstream's 404 (another
        principal's session), 401 or 403 (remembered a while per principal: a repeat is answered
        the same without asking again), 429 with `Retry-After` when the session's budget of such
        questions is spent (proxy/auth/vouch.py), or 502 when the upstream could not be asked.
        Without passthrough, the session lookup (`_session`) already decided."""
        if not self._forward_credentials:
            return True
        try:
            await relay.vouch(_forwarded(headers, True), principal.id if principal is not None else None)
        except AuthRefused as refused:
            await self._refuse(send, refused, method, request_id)
            return False
        except VouchLimited as limited:
            # 429, not 503: the caller's credential is what is unverified, not the proxy that is
            # unwell; the owner's accepted credential never gets here.
            SHED.count("http_refused", "vouch_rate")
            log.info("%s refused: too many credentials the upstream has not accepted on the session", method)
            body = jsonrpc.error(
                request_id,
                jsonrpc.INTERNAL_ERROR,
                "too many credentials the upstream has not accepted were put to it on this session; retry later",
            )
            await _respond_json(send, 429, body, [(b"retry-after", limited.retry_after_header.encode())])
            return False
        except (UpstreamFailure, TimeoutError):
            log.info("%s refused: the upstream could not be asked whether the credential holds the session", method)
            await _respond_error(
                send,
                502,
                request_id,
                jsonrpc.INTERNAL_ERROR,
                "the upstream could not be asked whether this credential may use the session",
            )
            return False
        return True

    async def _scopes_suffice(self, send: Send, relay: Relay, message: Message, principal: Principal) -> bool:
        """A tools/call whose policy names `required_scopes` the principal lacks: 403
        insufficient_scope (where the proxy knows the principal's scopes: jwt, tokens)."""
        if message.get("method") != "tools/call" or not principal.scopes_known:
            return True
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        policy_for = getattr(self.service.tool_calls, "policy_for", None)
        if not isinstance(name, str) or policy_for is None:
            return True
        required = policy_for(name, relay.catalog.annotations(name)).required_scopes
        missing = principal.lacks(required)
        if not missing:
            return True
        refused = AuthRefused(
            403,
            "insufficient_scope",
            f"this tool requires the scopes: {' '.join(sorted(required))}",
            error="insufficient_scope",
            scope=required,
        )
        await self._refuse(send, refused, "POST")
        return False

    async def _metadata(self, send: Send, method: str) -> None:
        """The protected-resource metadata (RFC 9728), at every path a client probes. jwt and
        tokens: the proxy's own. passthrough: the upstream's, with `resource` set to the public URL."""
        if method not in ("GET", "HEAD"):
            await _respond(send, 405, b"", [(b"allow", b"GET")])
            return
        if self._forward_credentials:
            document = await self._upstream_metadata()
            if document is None:
                await _respond(send, 404, b"Not Found", [(b"content-type", b"text/plain")])
                return
        else:
            document = {"resource": self.public_url, "bearer_methods_supported": ["header"]}
            if self._issuer:
                document["authorization_servers"] = [self._issuer]
            scopes = self._policy_scopes()
            if scopes:
                document["scopes_supported"] = scopes
        await _respond(send, 200, jsonrpc.dumps_out(document), [_JSON, (b"cache-control", b"max-age=300")])

    def _policy_scopes(self) -> list[str]:
        policies = getattr(self.service.tool_calls, "policies", None)
        if policies is None:
            return []
        current = policies()
        layers = [*current.exact.values(), *(layer for _, layer in current.globs)]
        if current.defaults is not None:
            layers.append(current.defaults)
        return sorted({s for layer in layers for s in layer.values.get("required_scopes", ())})

    def _note_upstream_metadata(self, upstream_challenge: str | None) -> None:
        """Remember where the upstream's challenge says its metadata lives, if that is on the
        upstream's own origin (a URL elsewhere is not fetched: the proxy is no open fetcher)."""
        named = resource_metadata_of(upstream_challenge)
        url = getattr(self.service.upstream, "url", None)
        if named is None or not isinstance(url, str):
            return
        try:
            there, home = urlsplit(named), urlsplit(url)
            same = (there.scheme, there.hostname, there.port) == (home.scheme, home.hostname, home.port)
        except ValueError:
            return
        if same and there.path.startswith("/") and not there.fragment:
            self._upstream_metadata_target = there.path + (f"?{there.query}" if there.query else "")

    async def _upstream_metadata(self) -> dict[str, Any] | None:
        """The upstream's metadata document, fetched once per its max-age (proxy/auth/metadata_cache.py)."""
        return await self._metadata_cache.get(self._fetch_upstream_metadata)

    async def _fetch_upstream_metadata(self) -> tuple[dict[str, Any] | None, float]:
        """The upstream's metadata document and how long it may be kept: where its challenge said
        (on its own origin), else at the well-known path followed by the upstream's own path, else
        the bare well-known path (RFC 9728 §3.1, what clients try)."""
        fetch = getattr(self.service.upstream, "get_document", None)
        url = getattr(self.service.upstream, "url", None)
        if fetch is None or not isinstance(url, str):
            return None, 0.0
        if self._upstream_metadata_target is None and self.service.probe_refusal is not None:
            self._note_upstream_metadata(self.service.probe_refusal.challenge)
        upstream_path = urlsplit(url).path.rstrip("/")
        targets = (self._upstream_metadata_target, WELL_KNOWN + upstream_path, WELL_KNOWN)
        for target in dict.fromkeys(t for t in targets if t is not None):
            try:
                status, raw, cache_control = await fetch(target, METADATA_BYTES)
            except UpstreamFailure as failure:
                log.info("the upstream's protected-resource metadata could not be fetched: %s", failure.detail)
                return None, 0.0
            if status != 200:
                continue
            try:
                document = rewrite_metadata(jsonrpc.loads(raw), url, self.public_url)
            except ValueError:
                document = None
            if document is not None:
                return document, max_age(cache_control)
        return None, MISSING_AGE_S

    def close_streams(self) -> None:
        """The server is shutting down: end every open listen stream (each writes its closing
        chunk and returns), and open no new one."""
        self._shutting_down = True
        for stream in list(self._listening):
            stream.close()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.service.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                # Everything built so far (modules, settings, policies, the SDK's models) lives as
                # long as the process: out of the collector's reach, a full collection walks only
                # what traffic created instead of the whole start-up heap.
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.service.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].rstrip("/") or "/"
        if path != self.path and path not in self._metadata_paths:
            await _respond(send, 404, b"Not Found", [(b"content-type", b"text/plain")])
            return
        # Header values are trimmed as RFC 9110 says (some HTTP parsers keep surrounding blanks);
        # ASGI servers give header names in lower case already.
        raw = scope["headers"]
        headers = {k.decode("latin-1"): v.decode("latin-1").strip() for k, v in raw}
        if len(headers) < len(raw):
            twice = next((name for name in _SINGLE_HEADERS if duplicated(raw, name)), None)
            if twice is not None:
                # A header that names one thing, given twice: which one a check read and which one
                # a later hop (an ingress, a gateway, the upstream) reads may differ, so the request
                # is refused rather than judged on either (RFC 9112 asks for 400 on a second Host).
                # The 2026 routing headers are the SDK ladder's (-32020, `_check_modern_headers`).
                text = b"Duplicate " + twice + b" header"
                await _respond(send, 400, text, [(b"content-type", b"text/plain")])
                return
        host = headers.get("host", "")
        if self.allowed_hosts is not None and not self.allowed_hosts(host):
            await _respond(send, 421, b"Invalid Host header", [(b"content-type", b"text/plain")])
            return
        origin = headers.get("origin")
        if origin is not None and not self.allowed_origins(origin):
            await _respond(send, 403, b"Invalid Origin header", [(b"content-type", b"text/plain")])
            return
        method = scope["method"]
        if method == "GET" and self.service.draining:
            SHED.count("http_refused", "shutdown")
            await _respond_error(send, 503, None, jsonrpc.SHUTTING_DOWN, "the proxy is shutting down")
            return
        if path != self.path:
            await self._metadata(send, method)
            return
        principal: Principal | None = None
        if self.auth is not None:
            try:
                principal = await self.auth.authenticate(headers)
            except AuthRefused as refused:
                await self._refuse(send, refused, method)
                return
        if method == "POST":
            await self._post(scope, receive, send, headers, principal)
        elif method == "GET":
            await self._get(receive, send, headers, principal)
        elif method == "DELETE":
            await self._delete(send, headers, principal)
        else:
            await _respond(send, 405, b"", [(b"allow", b"GET, POST, DELETE")])

    # -- POST ---------------------------------------------------------------------------------
    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> bytes | None:
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], principal: Principal | None
    ) -> None:
        ctype = headers.get("content-type", "")
        if not ctype.lower().startswith("application/json"):
            await _respond_error(send, 415, None, jsonrpc.INVALID_REQUEST, "Content-Type must be application/json")
            return
        accept = headers.get("accept", "*/*").lower()
        if not any(a in accept for a in ("application/json", "text/event-stream", "*/*")):
            await _respond_error(send, 406, None, jsonrpc.INVALID_REQUEST, "Accept must include application/json")
            return
        body = await self._read_body(receive, headers)
        if body is None:
            await _respond_error(send, 413, None, jsonrpc.INVALID_REQUEST, f"body exceeds {self.max_body} bytes")
            return
        try:
            message = jsonrpc.loads(body)
        except jsonrpc.TooDeep as exc:
            await _respond_error(send, 400, None, jsonrpc.PARSE_ERROR, f"Parse error: {exc}")
            return
        except (ValueError, RecursionError):
            await _respond_error(send, 400, None, jsonrpc.PARSE_ERROR, "Parse error: the body is not valid JSON")
            return
        if isinstance(message, list):
            await _respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "JSON-RPC batches are not supported")
            return
        problem = jsonrpc.validate(message)
        if problem is not None:
            id_ = message.get("id") if isinstance(message, dict) and jsonrpc.valid_id(message.get("id")) else None
            await _respond_error(send, 400, id_, jsonrpc.INVALID_REQUEST, f"Invalid Request: {problem}")
            return
        if self.service.draining and "id" in message and "method" in message:
            # A new request while shutting down (notifications and a client's answers to server
            # requests still reach the calls in flight): refused, so a client retries elsewhere.
            SHED.count("http_refused", "shutdown")
            await _respond_error(send, 503, message["id"], jsonrpc.SHUTTING_DOWN, "the proxy is shutting down")
            return
        version = headers.get("mcp-protocol-version")
        if version in jsonrpc.MODERN_VERSIONS and message.get("method") == "initialize" and "id" in message:
            # A 2026 endpoint has no handshake: initialize is an unknown method there.
            await _respond_error(send, 404, message["id"], jsonrpc.METHOD_NOT_FOUND, "Method not found: initialize")
            return
        modern = (version in jsonrpc.MODERN_VERSIONS or jsonrpc.is_modern_request(message)) and (
            message.get("method") != "initialize"
        )
        if modern:
            await self._post_modern(scope, receive, send, headers, message, principal)
        else:
            await self._post_legacy(scope, receive, send, headers, message, version, principal)

    async def _post_modern(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        message: Message,
        principal: Principal | None,
    ) -> None:
        if "id" not in message or "method" not in message:
            # 2026 HTTP defines no client-to-server notifications or responses: acknowledge and drop.
            await _respond(send, 202)
            return
        try:
            relay = await self.service.modern_relay_for(message)  # a tools/call: always one
        except UpstreamFailure as failure:
            await _respond_error(send, 503, message["id"], jsonrpc.INTERNAL_ERROR, jsonrpc.bounded(failure.detail))
            return
        if relay is None:
            if message.get("method") == "server/discover":
                await _respond_error(send, 404, message["id"], jsonrpc.METHOD_NOT_FOUND, "Method not found")
            else:
                await _respond_json(
                    send,
                    400,
                    jsonrpc.error(
                        message["id"],
                        jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
                        "Unsupported protocol version",
                        {"supported": list(jsonrpc.LEGACY_VERSIONS), "requested": jsonrpc.LATEST_MODERN},
                    ),
                )
            return
        forwarded = _forwarded(headers, self._forward_credentials)
        rejection = self._check_modern_headers(scope, headers, message)
        if rejection is None and message.get("method") == "tools/call":
            claimed = forwarded is not None and any(k.startswith("mcp-param-") for k in forwarded)
            rejection = await self._check_param_headers(relay, headers, message, claimed, principal)
        if rejection is not None:
            await _respond_json(
                send,
                ERROR_CODE_HTTP_STATUS.get(rejection.code, 400),
                jsonrpc.error(message["id"], rejection.code, rejection.message, rejection.data),
            )
            return
        if principal is not None and not await self._scopes_suffice(send, relay, message, principal):
            return
        caller = self.clients.key(scope, headers, principal)
        await self._answer(relay, message, receive, send, forwarded, modern=True, caller=caller, principal=principal)

    def _check_modern_headers(self, scope: Scope, headers: dict[str, str], message: Message) -> Any:
        if len(headers) != len(scope["headers"]):  # some header name came twice: is it a routing one?
            raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
            duplicated = find_duplicated_routing_header(raw)
            if duplicated is not None:
                return InboundLadderRejection(
                    code=jsonrpc.HEADER_MISMATCH, message=f"{duplicated} header appears more than once"
                )
        if _plainly_routable(message, headers):
            return None
        verdict = classify_inbound_request(message, headers=headers)
        return verdict if isinstance(verdict, InboundLadderRejection) else None

    async def _check_param_headers(
        self, relay: Relay, headers: dict[str, str], message: Message, claimed: bool, principal: Principal | None
    ) -> Any:
        """`claimed`: the request carries `Mcp-Param-*` headers."""
        params = message.get("params") or {}
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None
        if not arguments and not claimed:
            return None
        # a listing the proxy makes for this caller carries its credential (passthrough), nothing else
        credential = headers.get("authorization") if self._forward_credentials else None
        tool = await relay.lookup_tool(
            name,
            message,
            headers={"authorization": credential} if credential is not None else None,
            principal=principal,
        )
        if tool is None:
            return None  # an unknown tool: the upstream owns that answer
        if not claimed and not relay.catalog_of(principal).declares_param_headers(name):
            return None  # nothing to mirror and nothing claimed: skip the schema walk
        return validate_mcp_param_headers(tool.get("inputSchema"), arguments, headers)

    async def _post_legacy(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        message: Message,
        version: str | None,
        principal: Principal | None,
    ) -> None:
        service = self.service
        if message.get("method") == "initialize":
            if not service.legacy_supported():
                await _respond_json(
                    send,
                    400,
                    jsonrpc.error(
                        message.get("id"),
                        jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
                        "this upstream serves only the 2026-07-28 protocol; the initialize handshake is not accepted",
                        {"supported": list(jsonrpc.MODERN_VERSIONS)},
                    ),
                )
                return
            if "id" not in message:
                await _respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "initialize must be a request")
                return
            try:
                new_id, new_relay = await service.new_session(self.clients.key(scope, headers, principal))
            except UpstreamFailure as failure:
                await _respond_session_refused(send, message["id"], failure)
                return
            if self._binds_sessions and principal is not None:
                new_relay.owner = principal.id
            credentials = _forwarded(headers, True) if self._forward_credentials else None
            ok = await self._answer(
                new_relay, message, receive, send, credentials, modern=False, session_id=new_id, principal=principal
            )
            if not ok:
                await service.close_session(new_id)
            return
        if version is not None and version not in jsonrpc.LEGACY_VERSIONS:
            await _respond_error(
                send,
                400,
                message.get("id"),
                jsonrpc.INVALID_REQUEST,
                f"Unsupported MCP-Protocol-Version: {jsonrpc.bounded(version, 40)}",
            )
            return
        session_id = headers.get("mcp-session-id")
        if session_id is None:
            await _respond_error(
                send, 400, message.get("id"), jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID"
            )
            return
        relay = self._session(session_id, principal)
        if relay is None:
            await _respond_error(send, 404, message.get("id"), jsonrpc.INVALID_REQUEST, "Session not found")
            return
        if jsonrpc.is_request(message):
            if principal is not None and not await self._scopes_suffice(send, relay, message, principal):
                return
            await self._answer(
                relay,
                message,
                receive,
                send,
                _forwarded(headers, self._forward_credentials),
                modern=False,
                session_id=session_id,
                prime=_primes(version),
                principal=principal,
            )
        elif jsonrpc.is_notification(message):
            # A cancellation is acted on here (the request's task is cancelled), not judged by the
            # upstream; any other notification goes upstream with the caller's own credential.
            if message.get("method") == "notifications/cancelled" and not await self._vouched(
                send, relay, headers, "POST", principal
            ):
                return
            credentials = _forwarded(headers, True) if self._forward_credentials else None
            try:
                await relay.handle_notification(message, credentials, principal)
            except AuthRefused as refused:  # passthrough: the upstream refused the caller's credential
                await self._refuse(send, refused, "POST")
                return
            await _respond(send, 202)
        else:
            # An answer to the server's request goes upstream as the session's own message.
            if not await self._vouched(send, relay, headers, "POST", principal):
                return
            await relay.handle_response(message)
            await _respond(send, 202)

    async def _answer(
        self,
        relay: Relay,
        request: Message,
        receive: Receive,
        send: Send,
        forward_headers: dict[str, str] | None,
        *,
        modern: bool,
        session_id: str | None = None,
        caller: str | None = None,
        prime: bool = False,
        principal: Principal | None = None,
    ) -> bool:
        """Run one request through the relay and write its answer (JSON, or SSE once it streams).

        The relay runs in this request's own task: a request is written upstream, and its answer
        written back, without waiting for a second task to be scheduled behind every other request
        of the same burst. Only a response that becomes an event stream gets a writer task (the
        handler goes on producing while the writer waits on the socket). Cancelling the request
        (2026: the client closed its POST; 2025: `notifications/cancelled` or the session ended)
        cancels this task while the handler runs; that cancellation ends here.

        A 2025 client that disconnects has not cancelled a `tools/call` (the spec says so; the
        engine finishes the attempt in flight and starts no other). Any other request of a
        disconnected 2025 client is cancelled upstream if its response had not become an event
        stream yet: no event id was given, so nothing can resume it and its answer could reach
        no one; one that had is kept (a client may resume it), bounded by the request timeout.

        Returns whether a successful result was written (initialize keeps its session only then).
        """
        loop = asyncio.get_running_loop()  # once per request (a getpid() syscall on Python 3.11)
        task = asyncio.current_task(loop)
        assert task is not None
        stream = _Stream(loop, keep_after_close=not modern, max_bytes=self.stream_buffer_bytes)
        down_id = stream.down_id = request["id"]
        extra = [(b"mcp-session-id", session_id.encode())] if session_id else []
        writer: asyncio.Task[bool] | None = None

        def start_writer() -> None:
            nonlocal writer
            writer = loop.create_task(self._write_stream(stream, down_id, send, extra, modern, session_id, prime))

        stream.on_stream = start_writer
        watches = self._watches
        if watches is None:
            watches = self._watches = _LateWatches(self, loop)
        watches.add(stream, receive, task if modern or request.get("method") != "tools/call" else None)
        failed = False
        refused: AuthRefused | None = None
        try:
            try:
                await relay.handle_request(
                    request, stream, forward_headers, by_id=not modern, caller=caller, principal=principal
                )
            except asyncio.CancelledError:
                if task.uncancel() > 0:
                    raise  # not (only) the request's cancellation: the server stops this task
            except AuthRefused as refusal:  # passthrough: the upstream refused the caller's credential
                refused = refusal
                if writer is not None:  # the answer is an event stream already: no status to set
                    stream.send(_refusal_error(down_id, refusal))
            except Exception:
                log.exception("relaying %s failed", request.get("method"))
                failed = True
            # Nothing may cancel this task once the handler is over (a stray cancellation while
            # the answer is written would reach uvicorn as an application error).
            watches.end(stream)
            stream.finish()
            if writer is not None:
                return await writer
            if refused is not None:
                await self._refuse(send, refused, "POST", down_id)
                return False
            item = stream.pop()
            if item is None:
                if failed:
                    await _respond_error(send, 500, down_id, jsonrpc.INTERNAL_ERROR, "internal proxy error")
                    return False
                # Cancelled: a cancelled request gets no response; its stream just ends.
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return False
            first, data = item
            ok = "result" in first
            await _respond(send, _status_for(first, modern), data, [_JSON, *extra])
            return ok
        finally:
            watches.end(stream)
            stream.close()
            if writer is not None and not writer.done():
                writer.cancel()

    async def _write_stream(
        self,
        stream: _Stream,
        down_id: Any,
        send: Send,
        extra: list[tuple[bytes, bytes]],
        modern: bool,
        session_id: str | None,
        prime: bool,
    ) -> bool:
        """The response as an event stream: what the handler sends, then its answer; keep-alive
        comments meanwhile. Returns whether a successful result was written."""
        try:
            first = stream.pop()
            assert first is not None
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})
            if not modern and session_id is not None:
                return await self._stream_resumable(stream, first, down_id, send, session_id, prime)
            ok = False
            item: tuple[Message, bytes] | None = first
            while item is not None:
                message, data = item
                await send({"type": "http.response.body", "body": _sse(data), "more_body": True})
                if jsonrpc.is_response(message) and message.get("id") == down_id:
                    ok = "result" in message
                    break
                item = await self._next(stream, ping=send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return ok
        except BaseException:
            stream.close()  # nobody reads what the handler still sends
            raise

    async def _stream_resumable(
        self,
        stream: _Stream,
        first: tuple[Message, bytes],
        down_id: Any,
        send: Send,
        session_id: str,
        prime: bool,
    ) -> bool:
        """A 2025 SSE response whose events carry ids, so a client that lost it can resume it
        (resumability and event ids are in every 2025 revision); `prime`: it opens with the
        2025-11-25 priming event."""
        replay = self._replays.new(_replay_key(next(self._replay_ids)), session_id, down_id)
        replay.target = send
        ok = False
        try:
            if prime:
                # SEP-1699 (2025-11-25): a priming event (an id, no data) and the reconnection
                # delay. An older client reads an empty `data:` as a malformed message (the Python
                # SDK 1.9 logs an error and a traceback for each), so it goes to 2025-11-25+ only.
                await replay.write(f"id: {replay.key}:0\nretry: {RETRY_MS}\ndata: \n\n".encode())
            item: tuple[Message, bytes] | None = first
            while item is not None:
                message, data = item
                answer = jsonrpc.is_response(message) and message.get("id") == down_id
                await replay.emit(data, answer=answer)
                if answer:
                    ok = "result" in message
                    break
                item = await self._next(stream, ping=replay.write_ping)
        finally:
            replay.finished.set()
            asyncio.get_running_loop().call_later(_Replay.GRACE_S, self._replays.forget, replay.key)
        async with replay.lock:
            target, replay.target = replay.target, None
        if target is send:
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        return ok

    async def _resume(self, send: Send, receive: Receive, replay: _Replay, after: int) -> None:
        """GET with Last-Event-ID: what the client missed, then the rest of the stream as it comes."""
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        async with replay.lock:
            for seq, data in list(replay.events):
                if seq > after:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            lost = replay.answer_seq
            if lost is not None and after < lost <= replay.evicted_upto:
                # The answer was evicted to keep the buffers bounded: say so rather than end the
                # stream as if the request had been cancelled.
                note = jsonrpc.error(
                    replay.down_id,
                    jsonrpc.INTERNAL_ERROR,
                    "the answer is no longer held for resumption (the proxy's resumption buffers are full)",
                )
                await send({"type": "http.response.body", "body": _sse(jsonrpc.dumps_out(note)), "more_body": True})
            if not replay.finished.is_set():
                replay.target = send
        if not replay.finished.is_set():
            gone = asyncio.ensure_future(self._wait_disconnect(receive))
            done = asyncio.ensure_future(replay.finished.wait())
            try:
                await asyncio.wait({gone, done}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                done.cancel()
            async with replay.lock:
                if replay.target is send:
                    replay.target = None
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _wait_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def _next(self, stream: _Stream, ping: Send) -> tuple[Message, bytes] | None:
        """The next message for this response; None once the handler ended without one more."""
        while True:
            item = stream.pop()
            if item is not None:
                return item
            if stream.finished:
                return None
            await stream.wait(PING_INTERVAL_S)
            if stream._items or stream.finished:
                continue
            await ping({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})

    async def _watch_disconnect(self, receive: Receive, stream: _Stream, cancel: asyncio.Task[None] | None) -> None:
        with contextlib.suppress(Exception):
            while (await receive())["type"] != "http.disconnect":
                pass
            log.debug("client disconnected")
            resumable = stream._keep and stream.on_stream is None  # a 2025 response that became a stream
            stream.close()
            # 2026 HTTP: closing the response stream is the cancellation; 2025: see `_answer`.
            if cancel is not None and not resumable:
                cancel.cancel()

    # -- GET and DELETE -------------------------------------------------------------------------
    async def _get(self, receive: Receive, send: Send, headers: dict[str, str], principal: Principal | None) -> None:
        if headers.get("mcp-protocol-version") in jsonrpc.MODERN_VERSIONS:
            await _respond(send, 405, b"", [(b"allow", b"POST")])
            return
        if "text/event-stream" not in headers.get("accept", "").lower():
            await _respond_error(send, 406, None, jsonrpc.INVALID_REQUEST, "Accept must include text/event-stream")
            return
        session_id = headers.get("mcp-session-id")
        relay = self._session(session_id, principal) if session_id else None
        if session_id is None:
            await _respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID")
            return
        if relay is None:
            await _respond_error(send, 404, None, jsonrpc.INVALID_REQUEST, "Session not found")
            return
        if not await self._vouched(send, relay, headers, "GET", principal):
            return
        last_event = headers.get("last-event-id", "")
        key, _, seq = last_event.partition(":")
        replay = self._replays.get(key)
        # Only this session's own stream resumes. Another session's key, a forged, malformed or
        # forgotten one are all alike: the GET opens the listen stream (or gets its 409), so the
        # answer never tells whether a key exists elsewhere. `seq` in ASCII digits and bounded:
        # `isdigit` alone takes `²` (a latin-1 header byte) and thousands of digits, on which
        # `int` raises (a 500 and a traceback per request).
        if (
            replay is not None
            and replay.session_id == session_id
            and seq.isascii()
            and seq.isdigit()
            and len(seq) <= 18
        ):
            await self._resume(send, receive, replay, int(seq))
            return
        if self._shutting_down:
            await _respond_error(send, 503, None, jsonrpc.INTERNAL_ERROR, "the proxy is shutting down")
            return
        stream = _Stream(asyncio.get_running_loop(), listen=True, max_bytes=self.stream_buffer_bytes)
        if not relay.attach_listen(stream):
            await _respond_error(send, 409, None, jsonrpc.INVALID_REQUEST, "Conflict: a listen stream is already open")
            return
        gone = asyncio.create_task(self._watch_disconnect(receive, stream, None))
        self._listening.add(stream)
        recheck = principal is not None and self._binds_sessions and self.auth is not None
        wait_s = min(PING_INTERVAL_S, CREDENTIAL_RECHECK_S) if recheck else PING_INTERVAL_S
        pinged_at = checked_at = time.monotonic()
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*_SSE_HEADERS, (b"mcp-session-id", session_id.encode())],
                }
            )
            while not stream.closed and session_id in self.service.sessions:
                item = stream.pop()
                if item is not None:
                    await send({"type": "http.response.body", "body": _sse(item[1]), "more_body": True})
                    continue
                await stream.wait(wait_s)
                now = time.monotonic()
                if recheck and now - checked_at >= CREDENTIAL_RECHECK_S:
                    checked_at = now
                    if not await self._still_valid(headers):
                        break
                if stream.closed or stream._items or now - pinged_at < PING_INTERVAL_S:
                    continue
                pinged_at = now
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._listening.discard(stream)
            gone.cancel()
            stream.close()
            relay.detach_listen(stream)

    async def _still_valid(self, headers: dict[str, str]) -> bool:
        """Whether a listen stream's credential still authenticates (jwt, tokens)."""
        assert self.auth is not None
        try:
            await self.auth.authenticate(headers)
        except AuthRefused as refused:
            log.info("closing a listen stream: its credential no longer authenticates (%s)", refused.reason)
            return False
        return True

    async def _delete(self, send: Send, headers: dict[str, str], principal: Principal | None) -> None:
        if headers.get("mcp-protocol-version") in jsonrpc.MODERN_VERSIONS:
            await _respond(send, 405, b"", [(b"allow", b"POST")])
            return
        session_id = headers.get("mcp-session-id")
        if session_id is None:
            await _respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID")
            return
        relay = self._session(session_id, principal)
        if relay is not None and not await self._vouched(send, relay, headers, "DELETE", principal):
            return
        if relay is not None and await self.service.close_session(session_id):
            await _respond(send, 200)
        else:
            await _respond_error(send, 404, None, jsonrpc.INVALID_REQUEST, "Session not found")
