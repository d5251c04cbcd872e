"""The 2025 Streamable HTTP link: one downstream session, one upstream HTTP session.

`HttpLegacyLink` forwards the client's own `initialize`, keeps `Mcp-Session-Id` and the negotiated
`MCP-Protocol-Version`, opens the standalone GET event stream after `notifications/initialized`
(requests wait for it, bounded: a server drops what it pushes before the stream is open), reads
it with bounded reconnects (`Last-Event-ID`, the server's `retry`), resumes a broken POST stream
the same way, cancels with `notifications/cancelled`, and DELETEs the session on close.

A session the upstream forgot is re-established once, transparently: a 404 to a request that
carried a session id (the spec's answer), or a 400 whose body names the session or an
uninitialized server (`forgot_session`), means the request was refused before it ran. The link
replays the client's `initialize` (fresh id) and `notifications/initialized`, then sends the
request again; a second such answer right after is `SESSION_EXPIRED`.

`--auth passthrough` (the upstream authenticates callers, and a server such as the MCP SDK's binds
each session to the principal that opened it, answering its id used with another principal's
credential 404, "as if the session did not exist"): every message a caller sends goes with that
caller's own `Authorization` (or none), never another's. The link keeps the credential the
upstream last accepted on the session (`caller_authorization`: the one of the last request
answered 2xx; a token refreshed mid-session takes over once accepted), and only its own requests
carry it: the listen stream, cancellations, the replayed handshake, answers to the server's
requests, DELETE. A 404 (or forgotten-session 400) to a request carrying that credential is a
forgotten session, re-established with it; to any other credential it is that caller's refusal,
`SESSION_REFUSED` (`session_refused`): relayed as the 404, never retried, the session not moved.
The price: a refreshed token whose first request meets an upstream that restarted gets the 404
too, and its client opens a new session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import Message
from proxy.upstream.base import Era, Exchange, Handshake, wait_heard
from proxy.upstream.h1 import Response
from proxy.upstream.sse.parse import SseError
from proxy.upstream.streamable.failures import CLIENT_ERRORS, bounded_detail, session_refused
from proxy.upstream.streamable.headers import LAST_EVENT_ID_HEADER, SESSION_HEADER, VERSION_HEADER
from proxy.upstream.streamable.link import Expired, FirstAnswer, HttpLink
from proxy.upstream.streamable.messages import StreamState, content_type, iter_sse_messages
from proxy.upstream.streamable.owner import HttpClientOwner
from proxy.upstream.streamable.posts import rpc_once

log = logging.getLogger(__name__)

# Standalone GET stream / POST stream resumption: bounded reconnects.
GET_BACKOFF_BASE_S: Final = 0.5
GET_BACKOFF_CAP_S: Final = 30.0
GET_MAX_FAILURES: Final = 8
RESUME_MAX_ATTEMPTS: Final = 3
DEFAULT_RETRY_MS: Final = 1000
MAX_RETRY_MS: Final = 30_000

_REFUSED: Final = "the upstream refused this credential for the session (404): another credential holds it"


class HttpLegacyLink(HttpLink):
    """One downstream 2025 session ↔ one upstream HTTP session."""

    era = Era.LEGACY

    def __init__(self, upstream: HttpClientOwner) -> None:
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

    def accepted(self, headers: Mapping[str, str]) -> None:
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
        return session_refused(_REFUSED) if self._foreign(headers) else Expired()

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
        self,
        ex: Exchange,
        message: Message,
        extra: dict[str, str],
        sent: asyncio.Future[None],
        first: FirstAnswer | None,
    ) -> None:
        for attempt in range(2):
            stale = self.session_id if first is None else first[1].get(SESSION_HEADER)
            try:
                await self._post_exchange(ex, message, extra, sent, first)
                return
            except Expired:
                first = None
                if attempt == 1:
                    raise UpstreamFailure(
                        FailureKind.SESSION_EXPIRED,
                        Dispatch.NO,
                        "the upstream session expired again right after it was re-established",
                        http_status=404,
                    ) from None
                if ex.cancelled:
                    return  # given up meanwhile (`cancel` ends the exchange): never sent again
                await self._reestablish(stale)
                if ex.cancelled:
                    return

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
            # then. Without an id, every later request would get the server's 400 "Missing
            # session ID", a validation failure, for good.
            replay = {**init, "id": self.new_id()}
            try:
                response_headers, answer = await rpc_once(
                    self.owner, replay, self._own_headers(True), on_other=self._deliver_unsolicited
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
            if self.on_reestablished is not None:
                self.on_reestablished()

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
            self.accepted(h)
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
            # the request then runs to its end (a busy upstream that just restarted does this).
            # So it is sent again once the head came (or the exchange ended, or a bound passed):
            # an SDK server writes a request into its session before the head of an event-stream
            # answer and reads its session in order, so the second one finds the request; a
            # second cancellation of a request already cancelled or ended is ignored (the spec
            # lets a receiver ignore those).
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
        await wait_heard(exchange, self.owner.connect_timeout_s)

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
            async with asyncio.timeout(self.owner.connect_timeout_s * 2):
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
                    async for msg in iter_sse_messages(response, state, self.owner.max_event_bytes):
                        if self.route_stream_message(ex, response, msg):
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
                        async for msg in iter_sse_messages(response, state, self.owner.max_event_bytes):
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
