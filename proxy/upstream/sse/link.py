"""Legacy HTTP+SSE upstream (the 2024-11-05 transport), at the JSON-RPC message level.

A link GETs the SSE URL, waits (bounded) for the `endpoint` event (resolved against the SSE URL,
same origin only), POSTs every message there (202 expected) and reads every response,
notification and server→client request from the one SSE stream. Responses resolve their exchange;
progress whose token is a pending request id goes to that exchange's `on_message`; everything else
(notifications, sampling/elicitation requests) goes to the unsolicited handler: this transport has
no per-request stream, so nothing else can be tied to a request.

A request is delivered by a task of its own (the stream opened if need be, the POST, its 202);
`send_request` returns once the POST started going out, so a caller that stops waiting from then
on cancels a request the server may have taken: `cancel` sends `notifications/cancelled` once the
POST's answer came (the server has the request then; sent earlier it could get there first and be
ignored), or after the connect timeout.

If the SSE stream ends, every pending exchange fails (CLOSED; dispatch unknown once written) and the
next message reconnects and replays the client's handshake (initialize with a fresh id, then
`notifications/initialized`) before it is sent. A 404 on a POST (the server forgot the session)
does the same once, transparently (the request's own exchange waits for its second POST, every
other one fails); a second 404 is `SESSION_EXPIRED`.

`--auth passthrough` (the upstream authenticates its callers): a link belongs to one downstream
2025 session, so its stream is one caller's. Every message a caller sends goes with that
caller's own `Authorization` (or none), never another's. The link keeps the credential the
upstream last accepted on the session (`caller_authorization`: the one the open stream's GET
carried once its endpoint came, or of the last POST answered 2xx; a token refreshed mid-session
takes over once accepted), and its own messages carry it: the GET that reopens a broken stream,
the handshake it replays, its cancellations, answers to the server's requests. The first stream
is opened with the credential of the message that needs it (the session's `initialize`). A
refusal of the stream's GET (401/403) is raised as the upstream's own refusal, challenge
included, for the caller to answer; when a broken stream cannot be reopened with the accepted
credential (401/403) and the message that needed it carries another (a token refreshed since),
that message's caller gets `SESSION_REFUSED` (404): its client opens a session of its own rather
than being asked for a credential it already has. A server binds
its SSE session to the principal of the credential that opened the stream (the MCP SDK answers a
POST from another principal 404, "as if the session did not exist"), so a 404 to a POST whose
credential is not the one the stream was opened with is that refusal, not a forgotten session:
it is `SESSION_REFUSED` at once (a `permission` refusal, relayed to the caller as the server's
404: never retried), and the stream is not reopened with the POST's credential (which would move
the session, and what the server pushes on it, to another principal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import Message, dumps, is_response, loads
from proxy.upstream.base import (
    UPSTREAM_NOTICES,
    Capabilities,
    Era,
    Exchange,
    Handshake,
    Health,
    LinkBase,
    OnMessage,
    PendingTable,
    mark_heard,
    wait_heard,
)
from proxy.upstream.h1 import ProxyRoute
from proxy.upstream.sse.parse import SseError, SseParser
from proxy.upstream.streamable.failures import (
    CLIENT_ERRORS,
    MAX_ERROR_BODY,
    WriteFlag,
    bounded_detail,
    read_bounded,
    session_refused,
    status_failure,
)
from proxy.upstream.streamable.owner import HttpClientOwner

log = logging.getLogger(__name__)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str | None, int | None]:
    """Scheme, host and port (a default port counts as written out: `http://h` is `http://h:80`).
    Raises ValueError for an invalid port."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(scheme)


def _target(url: str) -> str:
    """The request target (path and query) of an absolute URL."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class _Connection:
    """One GET stream and the POST endpoint it announced."""

    def __init__(self, authorization: str | None) -> None:
        self.endpoint: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.reader: asyncio.Task[None] | None = None
        self.alive = True
        self.authorization = authorization  # passthrough: the caller credential the GET carried


class SseLegacyLink(LinkBase):
    era = Era.LEGACY

    def __init__(self, upstream: SseUpstream) -> None:
        self._upstream = upstream
        self._health = upstream.health
        self._client = upstream.client
        self._pending = PendingTable()
        self._handshake = Handshake()
        self._unsolicited: OnMessage = lambda m: None
        self._conn: _Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()  # exchange deliveries and cancellations
        self._handshake_done = False  # the client's initialize succeeded once on some connection
        self._connections = 0
        self.reconnects = 0
        # --auth passthrough: the credential the upstream last accepted on this session (see the
        # module docstring), which only the link's own messages carry
        self.caller_authorization: str | None = None

    def _accepted(self, credential: str | None) -> None:
        if credential is not None and credential != self.caller_authorization:
            self.caller_authorization = credential

    def _own_headers(self) -> dict[str, str] | None:
        """The headers of the link's own messages: the credential the upstream accepted, if any."""
        return {"authorization": self.caller_authorization} if self.caller_authorization is not None else None

    # -- UpstreamLink ---------------------------------------------------------------------

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        if self._closed:
            raise UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, "the upstream link is closed")
        self._handshake.observe(message)
        ex = self._pending.add(message, on_message)
        # The request is delivered by a task of its own (`_deliver`: the stream, the POST, its
        # answer); this returns once the POST started going out, like every link, so a caller
        # that stops waiting from then on cancels a request the server may have taken.
        sent: asyncio.Future[None] = ex.response.get_loop().create_future()
        task = ex.response.get_loop().create_task(self._deliver(ex, message, headers, sent))
        ex.transport_state = task
        self._keep(task)
        try:
            await asyncio.shield(sent)
        except UpstreamFailure:
            self._pending.discard(ex)
            raise
        except asyncio.CancelledError:
            if ex.written:  # the POST went out: it is cancelled as a request that was sent
                if on_write is not None:
                    on_write()  # the delivery task wrote it: the caller hears so before it ends
                self._keep(asyncio.get_running_loop().create_task(self.cancel(ex, "request cancelled by the proxy")))
            else:
                self._pending.discard(ex)
                task.cancel()
            raise
        if on_write is not None:
            on_write()
        if message.get("method") == "initialize":
            ex.response.add_done_callback(self._on_initialize_answer)
        return ex

    def _keep(self, task: asyncio.Task[None]) -> None:
        """Hold `task` (an exchange's delivery, a cancellation) until it ends; `aclose` cancels it."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(
        self, ex: Exchange, message: Message, headers: Mapping[str, str] | None, sent: asyncio.Future[None]
    ) -> None:
        """The exchange task of `ex`: the stream opened (and the handshake replayed) if need be, the
        POST, and its answer; a 404 (the upstream forgot the session) reopens the stream and posts
        once more. `sent` is set once the POST starts going out (`ex.written`) or delivery ended
        before that (failed: its exception); a failure after that fails the exchange."""
        is_init = message.get("method") == "initialize"
        credential = headers.get("authorization") if headers is not None else None

        def on_write() -> None:
            if not sent.done():
                sent.set_result(None)

        try:
            for attempt in range(2):
                endpoint = await self._ensure_connected(replay=not is_init, credential=credential)
                if ex.cancelled or ex.response.done():
                    return  # given up, or failed with the stream it waited for: not sent (again)
                ex.written = ex.heard = False
                status = await self._post(endpoint, message, headers, ex, on_write)
                mark_heard(ex)  # the server has taken the request (or refused it: not written then)
                if status != 404:
                    self._accepted(credential)
                if status == 404 and self._not_the_streams_principal(headers):
                    raise self._refused_by_session_owner()
                if status == 404 and attempt == 0:
                    self._drop_connection("the upstream forgot the SSE session (404)", keep=ex)
                    continue
                if status == 404:
                    raise UpstreamFailure(
                        FailureKind.SESSION_EXPIRED,
                        Dispatch.NO,
                        "the upstream SSE session expired again right after it was re-established",
                        http_status=404,
                    )
                return
        except UpstreamFailure as failure:
            untraced(failure)
            if not sent.done():
                sent.set_exception(failure)
                sent.exception()
            else:
                self._pending.fail(ex, failure)
        except asyncio.CancelledError:
            if not sent.done():
                sent.set_exception(
                    UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, "the proxy closed the upstream link")
                )
                sent.exception()
            raise
        finally:
            if ex.transport_state is asyncio.current_task():
                ex.transport_state = None
            if not sent.done():
                sent.set_result(None)

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        """A caller's notification, with the caller's own headers (its credential, if any)."""
        self._handshake.observe(message)
        credential = headers.get("authorization") if headers is not None else None
        endpoint = await self._ensure_connected(replay=True, credential=credential)
        status = await self._post(endpoint, message, headers, None)
        if status != 404:
            self._accepted(credential)
        if status == 404 and self._not_the_streams_principal(headers):
            raise self._refused_by_session_owner()
        if status == 404:
            self._drop_connection("the upstream forgot the SSE session (404)")
            raise UpstreamFailure(
                FailureKind.SESSION_EXPIRED, Dispatch.NO, "the upstream SSE session expired", http_status=404
            )

    async def send_response(self, message: Message) -> None:
        """An answer to the server's request: the link's own message, with the accepted credential."""
        await self.send_notification(message, headers=self._own_headers())

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        exchange.cancelled = True
        self._pending.discard(exchange)
        if exchange.written and exchange.method != "initialize":
            if not exchange.heard:
                # The POST's answer has not come: the server may not have taken the request into
                # its session yet, and a cancellation (a POST on another connection) could get
                # there first, name no request in flight, be ignored, and the request then run to
                # its end. So it is sent once the answer came (or delivery ended, or a bound
                # passed); a 404 meanwhile means the request was refused, and it is not sent again.
                await wait_heard(exchange, self._upstream.connect_timeout_s)
            conn = self._conn
            if exchange.written and conn is not None and conn.alive:
                params: dict[str, Any] = {"requestId": exchange.upstream_id}
                if reason:
                    params["reason"] = reason
                note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
                with contextlib.suppress(UpstreamFailure):
                    if conn.endpoint.done() and not conn.endpoint.cancelled() and conn.endpoint.exception() is None:
                        await self._post(conn.endpoint.result(), note, self._own_headers(), None)
        task = exchange.transport_state
        if isinstance(task, asyncio.Task) and not task.done() and task is not asyncio.current_task():
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
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        self._drop_connection("the proxy closed the upstream link")
        self._upstream.forget(self)

    def _not_the_streams_principal(self, headers: Mapping[str, str] | None) -> bool:
        """The POST carried a credential other than the one the open stream was opened with."""
        conn = self._conn
        sent = headers.get("authorization") if headers is not None else None
        return conn is not None and conn.alive and sent != conn.authorization

    @staticmethod
    def _refused_by_session_owner() -> UpstreamFailure:
        return session_refused(
            "the upstream refused this credential for the SSE session (404): another credential opened it"
        )

    # -- connection -----------------------------------------------------------------------
    def _on_initialize_answer(self, fut: asyncio.Future[Message]) -> None:
        if not fut.cancelled() and fut.exception() is None and "result" in fut.result():
            self._handshake_done = True

    def _drop_connection(self, why: str, keep: Exchange | None = None) -> None:
        """Close the stream and fail every exchange in flight but `keep` (the request about to be
        sent again on the next stream)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.alive = False
            if conn.reader is not None:
                conn.reader.cancel()
        self._pending.fail_all(FailureKind.CLOSED, why, keep)

    async def _ensure_connected(self, *, replay: bool, credential: str | None = None) -> str:
        """The open stream's endpoint, opening the stream first if there is none: with the
        credential the upstream accepted on the session, or, before it accepted any, `credential`
        (of the message that needs the stream: the session's `initialize`)."""
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and conn.alive:
                return await conn.endpoint
            if self._connections:
                self.reconnects += 1
            held = self.caller_authorization
            try:
                endpoint = await self._connect(held if held is not None else credential)
            except UpstreamFailure as failure:
                if held is not None and credential != held and failure.http_status in (401, 403):
                    raise session_refused(
                        "the upstream refused the credential the SSE session was held with, and another credential"
                        " cannot reopen it (404)"
                    ) from None
                raise
            if replay and self._handshake_done:
                await self._replay_handshake(endpoint)
            return endpoint

    async def _connect(self, credential: str | None) -> str:
        conn = _Connection(credential)
        self._conn = conn
        self._connections += 1
        conn.reader = asyncio.create_task(self._read(conn))
        try:
            async with asyncio.timeout(self._upstream.endpoint_timeout_s):
                return await asyncio.shield(conn.endpoint)
        except TimeoutError:
            self._drop_connection("no endpoint event")
            raise UpstreamFailure(
                FailureKind.PROTOCOL,
                Dispatch.NO,
                "the SSE upstream sent no endpoint event in time",
            ) from None
        except UpstreamFailure:
            if self._conn is conn:
                self._conn = None
            raise

    async def _replay_handshake(self, endpoint: str) -> None:
        init = self._handshake.initialize
        if init is None:
            return
        replay = {**init, "id": self.new_id()}
        ex = self._pending.add(replay, None)
        try:
            own = self._own_headers()
            status = await self._post(endpoint, replay, own, ex)
            if status != 202 and not 200 <= status < 300:
                raise UpstreamFailure(FailureKind.PROTOCOL, Dispatch.NO, f"HTTP {status}")
            async with asyncio.timeout(self._upstream.endpoint_timeout_s * 2):
                answer = await ex.response
            if "result" not in answer:
                raise UpstreamFailure(FailureKind.PROTOCOL, Dispatch.NO, "the upstream refused initialize")
            if self._handshake.initialized is not None:
                await self._post(endpoint, self._handshake.initialized, own, None)
        except (UpstreamFailure, TimeoutError) as exc:
            self._pending.discard(ex)
            detail = exc.detail if isinstance(exc, UpstreamFailure) else "timed out"
            self._drop_connection("handshake replay failed")
            raise UpstreamFailure(
                exc.kind if isinstance(exc, UpstreamFailure) else FailureKind.TIMEOUT,
                Dispatch.NO,
                bounded_detail(f"re-establishing the SSE session failed: {detail}"),
            ) from None
        if self.on_reestablished is not None:
            self.on_reestablished()

    async def _read(self, conn: _Connection) -> None:
        up = self._upstream
        try:
            h = {"accept": "text/event-stream"}
            if conn.authorization is not None:
                h["authorization"] = conn.authorization
            # The session's one stream lasts as long as the session: a connection of its own,
            # outside the pool its POSTs share.
            async with await self._client.request("GET", headers=h, dedicated=True) as response:
                if response.status != 200:
                    failure = await status_failure(response, None)
                    if not conn.endpoint.done():
                        conn.endpoint.set_exception(failure)
                        conn.endpoint.exception()
                    return
                parser = SseParser(up.max_event_bytes)
                async for chunk in response.iter_chunks():
                    for ev in parser.feed(chunk):
                        if ev.event == "endpoint":
                            self._on_endpoint(conn, ev.data.decode("utf-8", "replace").strip())
                        elif ev.event == "message" and ev.data.strip():
                            self._on_data(ev.data)
        except (*CLIENT_ERRORS, SseError) as exc:
            if not conn.endpoint.done():
                conn.endpoint.set_exception(up.translate(exc, False, "SSE connect"))
                conn.endpoint.exception()
            log.debug("SSE upstream stream broke: %s", type(exc).__name__)
        finally:
            if not conn.endpoint.done():
                conn.endpoint.set_exception(
                    UpstreamFailure(FailureKind.PROTOCOL, Dispatch.NO, "the SSE stream ended before its endpoint")
                )
                conn.endpoint.exception()
            if conn.alive:
                conn.alive = False
                if self._conn is conn:
                    self._conn = None
                self._pending.fail_all(FailureKind.CLOSED, "the upstream SSE stream ended")

    def _on_endpoint(self, conn: _Connection, data: str) -> None:
        if conn.endpoint.done():
            return
        base = self._upstream.url
        try:
            target: str | None = urljoin(base, data)
            same = _origin(base) == _origin(target)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            target, same = None, False
        if target is None or not same:
            conn.endpoint.set_exception(
                UpstreamFailure(
                    FailureKind.PROTOCOL, Dispatch.NO, "the SSE upstream announced an endpoint on another origin"
                )
            )
            conn.endpoint.exception()
            return
        conn.endpoint.set_result(target)
        self._accepted(conn.authorization)  # the upstream opened the session's stream with it
        if self._health.state is not Health.UP:  # the server speaks: it announced where to POST
            self._health.answered()

    def _on_data(self, data: bytes) -> None:
        try:
            message = loads(data)
        except ValueError:
            UPSTREAM_NOTICES.log(log, logging.WARNING, "SSE upstream sent an event that is not JSON; dropped")
            return
        if not isinstance(message, dict):
            return
        if is_response(message):
            self._pending.resolve(message)
            if self._health.state is not Health.UP:  # the one check an answer pays for the gauge
                self._health.answered()
            return
        if message.get("method") == "notifications/progress" and self._pending.route_progress(message):
            return
        try:
            self._unsolicited(message)
        except Exception:
            log.exception("unsolicited message handler failed")

    async def _post(
        self,
        endpoint: str,
        message: Message,
        headers: Mapping[str, str] | None,
        ex: Exchange | None,
        written: Callable[[], None] | None = None,
    ) -> int:
        """POST one message to the endpoint. Returns the status when it is 2xx or 404; raises otherwise.
        `written` runs when the POST starts going out, after `ex.written` is set. A request's POST
        (`ex`) waits for a pooled connection within its caller's bound; any other message (a
        notification, an answer, a cancellation) at most the upstream's `wait_s`."""
        flag = WriteFlag()

        def on_write() -> None:
            flag.written = True
            if ex is not None:
                ex.written = True
            if written is not None:
                written()

        h = {"content-type": "application/json", **(headers or {})}
        try:
            async with await self._client.request(
                "POST",
                target=_target(endpoint),
                headers=h,
                body=dumps(message),
                on_write=on_write,
                max_body=MAX_ERROR_BODY,
                wait_s=None if ex is not None else self._upstream.wait_s,
            ) as response:
                status = response.status
                if status == 404:
                    if ex is not None:
                        ex.written = False  # refused: not processed
                    response.release()
                    return status
                if not 200 <= status < 300:
                    raise await status_failure(response, message.get("id"))
                await read_bounded(response)  # "Accepted", or whatever the server says: not needed
                return status
        except CLIENT_ERRORS as exc:
            raise self._upstream.translate(exc, flag.written) from None


class SseUpstream(HttpClientOwner):
    """A legacy HTTP+SSE server: legacy era only, one SSE connection per downstream session."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 5.0,
        max_connections: int = 100,
        endpoint_timeout_s: float = 10.0,
        max_event_bytes: int | None = 16 * 1024 * 1024,
        wait_s: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        proxy: ProxyRoute | None = None,
    ) -> None:
        super().__init__(
            url,
            "sse",
            headers=headers,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
            max_event_bytes=max_event_bytes,
            wait_s=wait_s,
            ssl_context=ssl_context,
            proxy=proxy,
        )
        self.endpoint_timeout_s = endpoint_timeout_s
        self._links: set[SseLegacyLink] = set()
        self.speaks_modern = False  # never: what a refused probe (passthrough) cannot ask is known here

    async def probe(self) -> Capabilities:
        """Open the SSE stream and wait for its `endpoint` event: legacy only, never modern."""
        link = await self.open(Era.LEGACY)
        try:
            endpoint = await link._ensure_connected(replay=False)
        finally:
            await link.aclose()
        path = urlsplit(endpoint).path
        return Capabilities(legacy=True, modern=False, detail=f"legacy HTTP+SSE, endpoint {path}")

    async def open(self, era: Era) -> SseLegacyLink:
        if era is Era.MODERN:
            raise UpstreamFailure(
                FailureKind.PROTOCOL, Dispatch.NO, "legacy SSE upstream speaks only the 2025 handshake revisions"
            )
        link = SseLegacyLink(self)
        self._links.add(link)
        return link

    def forget(self, link: LinkBase) -> None:
        if isinstance(link, SseLegacyLink):
            self._links.discard(link)

    async def aclose(self) -> None:
        await asyncio.gather(*(link.aclose() for link in list(self._links)), return_exceptions=True)
        await self._close_client()
