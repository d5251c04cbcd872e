"""The session relay: everything that is not recovery, in both directions.

One `Relay` serves one downstream 2025 session (over its own upstream link), or all 2026-07-28
requests (over the shared modern link). It
- forwards client requests with the proxy's own upstream ids and progress tokens, and puts the
  caller's id and token back on what returns;
- hands `tools/call` to the tool-call seam (the recovery engine), which calls `attempt` once per
  attempt;
- maps server-to-client requests (sampling, elicitation, roots) and routes server messages tied to
  no request (`ServerMessages`, proxy/core/server_messages.py: on the shared link such a message
  reaches no caller, and an untied server request is answered upstream with an error so the server
  does not wait for it);
- cancels the upstream attempt of any request whose caller cancelled it or stopped waiting;
- `--auth passthrough` (`vouch`): lets a caller act on a 2025 session in ways the upstream never
  sees (its listen stream, a resumed answer, DELETE, a cancellation, an answer to the server's
  request) only with a credential the upstream accepts on that session (proxy/core/vouching.py).
It never blocks: downstream delivery goes through `Outbox.send`, which only enqueues.

Bounds: every relayed request other than `tools/call` (whose budget the engine owns) has a timeout
(`request_timeout_s`); one that runs out is cancelled upstream the way its transport and revision
require (`_cancel_upstream`), answered with a JSON-RPC error (`REQUEST_TIMEOUT`, -32001) that says
so, and counted (`mcp_recovery_relayed_timeouts_total`). A link that must first start its upstream
and bounds that start itself (`starting`: a stdio child) takes the request without a send deadline:
the timeout then runs from the hand-over, so a queue of child starts is not cut by it. A 2025
`initialize` refused at such a link's limit (a `Refusal`) is counted and logged as the session caps'
refusals are and raised to the frontend, which answers it as one (HTTP 503). Requests long-lived by design
(`LONG_LIVED`: a 2026 subscription stream, a task's result) have none; the in-flight limits bound
them (`max_in_flight` per session or caller, and each client's share across its sessions:
proxy/core/admission.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from types import FunctionType, MethodType
from typing import Any

from proxy.auth.base import Principal
from proxy.auth.challenge import upstream_refusal
from proxy.auth.vouch import VouchGate
from proxy.core import capacity
from proxy.core.admission import Admission, ClientShares
from proxy.core.catalog import Catalogs, ToolCatalog, tool_lister
from proxy.core.deadlines import AttemptTimedOut, AttemptTimer, Deadlines
from proxy.core.lifecycle import InFlight
from proxy.core.outbox import (
    Outbox,
    ProgressRelay,
    SilentProgress,
    ToolCallHandler,
    failure_response,
    progress_token_of,
    timeout_response,
)
from proxy.core.routing import Delivery, ServerRequests
from proxy.core.server_messages import ServerMessages
from proxy.core.task_owners import TaskOwners
from proxy.core.vouching import vouch
from proxy.errors import FailureKind, Refusal, UpstreamFailure, refuses_the_caller
from proxy.jsonrpc import (
    HEADER_MISMATCH,
    SHUTTING_DOWN,
    UNSUPPORTED_PROTOCOL_VERSION,
    Message,
    RequestId,
    bounded,
    error,
    valid_id,
)
from proxy.telemetry.shed import SHED
from proxy.upstream.base import SUBSCRIPTION_ID, Era, Exchange, UpstreamLink

log = logging.getLogger("proxy.relay")

# Requests whose answer may rightly take as long as the caller keeps them open: no request timeout.
LONG_LIVED = frozenset({"subscriptions/listen", "tasks/result"})
# Protocol reads that describe the server and change nothing: one that fails because the upstream
# went away under it is sent once more (`Relay._read`).
RESENT_READS = frozenset(
    {"tools/list", "prompts/list", "resources/list", "resources/templates/list", "server/discover", "ping"}
)
# ... when it failed this way: the process or connection ended, or a replacement is starting.
_GONE = frozenset({FailureKind.CLOSED, FailureKind.NOT_RUNNING, FailureKind.SPAWN_FAILED, FailureKind.CONNECT_FAILED})


class Relay:
    def __init__(
        self,
        link: UpstreamLink,
        *,
        catalog: ToolCatalog | None = None,
        catalogs: Catalogs | None = None,
        tool_calls: ToolCallHandler | None = None,
        session_id: str | None = None,
        shared: bool | None = None,
        request_timeout_s: float | None = None,
        max_in_flight: int | None = None,
        shares: ClientShares | None = None,
        client: Any = None,
        requests: InFlight | None = None,
        owner: str | None = None,
        task_owners: TaskOwners | None = None,
        pass_auth_refusals: bool = False,
        vouch_gate: VouchGate | None = None,
        on_protocol_mismatch: Callable[[], None] | None = None,
    ) -> None:
        self.link = link
        # Every relay of a service shares one: a graceful shutdown waits for, then ends, what is in it.
        self.requests = requests
        self.request_timeout_s = request_timeout_s
        # Upstream requests in flight, per caller (None: the session itself), and each client's
        # share of the upstream across all its sessions and both eras (proxy/core/admission.py).
        self.admission = Admission(max_in_flight, shares, client)
        self.initialized = False  # a 2025 session: the client sent more than its initialize
        self.era = link.era
        # The upstream's tools (proxy/core/catalog.py): `catalog` is the upstream's own; `catalogs`
        # adds one per principal where listings differ per caller (--auth passthrough).
        self.catalogs = catalogs if catalogs is not None else Catalogs()
        if catalog is not None:
            self.catalogs.upstream = catalog
        self.catalog = self.catalogs.upstream
        self._session_catalog: ToolCatalog | None = None  # passthrough: a 2025 session opener's
        # The revision this 2025 session's initialize negotiated (what the result shapes may use);
        # None until then, and for the 2026 relay (each request names its own 2026 revision).
        self.protocol_version: str | None = None
        self.session_id = session_id
        # An object handler (the engine) is called through its bound __call__: calling the instance
        # goes through its type's tp_call, an interpreter frame of its own per call, while a bound
        # method is called like a function.
        handler: Any = tool_calls
        if handler is not None and not isinstance(handler, FunctionType | MethodType):
            handler = handler.__call__
        self._tool_calls: ToolCallHandler | None = handler
        self._inflight: dict[RequestId, asyncio.Task[Any]] = {}
        # Several callers share the modern link (unless the service serves one client, on stdio):
        # what cannot be tied to one of them reaches none (proxy/core/routing.py).
        self.shared = (link.era is Era.MODERN and session_id is None) if shared is None else shared
        self.delivery = Delivery(self.shared)
        self.server_requests = ServerRequests()
        # Backpressure: a link that can pause reading its upstream (a session's own stdio child)
        # is paused while any of the session's streams holds more than its clients read.
        self._pause = getattr(link, "pause_reading", None) if not self.shared else None
        self._pressured = 0
        self._background: set[asyncio.Task[Any]] = set()
        self._deadlines: Deadlines | None = None  # the attempt timers, created on the first one
        self._running_loop: asyncio.AbstractEventLoop | None = None
        # Called when the upstream answers a 2026 header or version error (the service asks the
        # upstream again what it speaks); see `protocol_mismatch`.
        self.on_protocol_mismatch = on_protocol_mismatch
        self.last_activity = time.monotonic()
        # --auth passthrough: an upstream 401/403 (or 404 refusing the caller on the session) is
        # the caller's to answer; `handle_request` raises it as `AuthRefused` (the HTTP frontend
        # answers the same status, with the challenge).
        self.pass_auth_refusals = pass_auth_refusals
        # The principal that opened this 2025 session (jwt, tokens): only it may use the session.
        self.owner = owner
        # --auth passthrough: what `vouch` may cost the upstream (proxy/auth/vouch.py), one per
        # 2025 session.
        self.vouch_gate = vouch_gate
        # --auth jwt|tokens: which principal each task belongs to (one table per service).
        self.task_owners = task_owners
        # What the upstream sends besides answers (proxy/core/server_messages.py).
        self.server_messages = ServerMessages(
            link,
            self.shared,
            self.delivery,
            self.server_requests,
            self.catalogs,
            self.list_tools_soon,
            self._background,
        )
        link.set_unsolicited_handler(self.server_messages.unsolicited)

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop this relay runs on, asked once: on Python 3.11 every asyncio.get_running_loop()
        (and current_task() without a loop) is a getpid() system call."""
        loop = self._running_loop
        if loop is None:
            loop = self._running_loop = asyncio.get_running_loop()
        return loop

    @property
    def busy(self) -> bool:
        return bool(self.delivery.streams) or bool(self._inflight)

    # -- client -> upstream -------------------------------------------------------------------
    async def handle_request(
        self,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None = None,
        *,
        by_id: bool = True,
        caller: Any = None,
        principal: Principal | None = None,
    ) -> None:
        """Relay one request; its response (or nothing, if cancelled) goes to `outbox`.

        `by_id`: the client may cancel it by id (stdio, legacy HTTP); modern HTTP clients cancel by
        closing the stream, and their ids need not be unique across clients. `caller`: on the
        shared relay, whose share of the in-flight cap the request's upstream requests take.
        `principal`: who calls (authentication on), handed to the tool-call seam (budget owner).
        With `pass_auth_refusals`, an upstream HTTP 401/403 (or its 404 refusing the caller on
        this session) raises `AuthRefused` instead of answering the request, so the frontend can
        answer it as that HTTP status.
        """
        down_id = request["id"]
        method = request.get("method")
        self.last_activity = time.monotonic()
        if method != "initialize":
            self.initialized = True
        self.delivery.opened(outbox)
        if self._pause is not None and hasattr(outbox, "on_pressure"):
            outbox.on_pressure = self._pressure
        requests = self.requests
        task = asyncio.current_task(self._loop()) if by_id or requests is not None else None
        if by_id:
            self._inflight[down_id] = task  # type: ignore[assignment]
        if requests is not None:
            requests.enter(task, method in LONG_LIVED)  # type: ignore[arg-type]
        if caller is not None and self.admission.limited:
            self.admission.note_caller(outbox, caller)
        owners = self.task_owners
        try:
            if owners is not None and (refused := owners.refused(request, principal)) is not None:
                outbox.send(refused)  # another principal's task (proxy/core/task_owners.py)
                return
            if method == "tools/call" and self._tool_calls is not None:
                response = await self._tool_calls(self, request, outbox, headers, principal)
            else:
                timeout_s = self.request_timeout_s if method not in LONG_LIVED else None
                try:
                    if method in RESENT_READS:
                        response = await self._read(request, outbox, headers, timeout_s)
                    else:
                        response = await self.forward(request, outbox, headers, timeout_s)
                except AttemptTimedOut:
                    assert timeout_s is not None
                    log.info("%s got no upstream answer within %g s: cancelled", bounded(str(method), 80), timeout_s)
                    SHED.count("relayed_timeouts")
                    response = timeout_response(down_id, method, timeout_s)
                if method == "tools/list" and "result" in response:
                    self.catalog_of(principal).observe(response["result"])
            outbox.send(owners.observed(request, response, principal) if owners is not None else response)
        except UpstreamFailure as failure:
            if self.pass_auth_refusals and refuses_the_caller(failure.kind, failure.http_status):
                raise upstream_refusal(failure) from None
            if isinstance(failure, Refusal) and method == "initialize":
                # a new session refused at a limit of its upstream (a stdio child that did not
                # start): counted and logged as the session caps' refusals, answered by the
                # frontend the same way (HTTP 503, Retry-After)
                raise capacity.refused(failure) from None
            if failure.body is not None:  # a JSON-RPC error that came with an HTTP error status
                self.protocol_mismatch(failure.body.get("error"))
            outbox.send(failure_response(down_id, failure))
        except asyncio.CancelledError:
            # The shutdown grace period ended with this request in flight: the attempt was
            # cancelled upstream on the way here; the caller gets an answer that says why (a
            # tools/call got its unresolved `shutdown` result from the engine instead).
            if requests is None or not requests.ending or task is None or task.cancelling() > 1:
                raise
            task.uncancel()
            outbox.send(error(down_id, SHUTTING_DOWN, "the proxy is shutting down: the request was cancelled upstream"))
        finally:
            self.delivery.closed(outbox)
            if requests is not None:
                requests.leave(task)  # type: ignore[arg-type]
            if by_id and self._inflight.get(down_id) is task:
                del self._inflight[down_id]
            if caller is not None:
                self.admission.forget_caller(outbox)
            self.last_activity = time.monotonic()

    async def _read(
        self, request: Message, outbox: Outbox, headers: Mapping[str, str] | None, timeout_s: float | None
    ) -> Message:
        """`forward` a protocol read (`RESENT_READS`), sent once more when the upstream went away
        under it (a stdio child killed or crashed and being replaced, a connection lost, a restart
        backing off: `retry_after_s` is waited), within what is left of `timeout_s`. A read repeats
        nothing; and a client's `tools/call` must not fail on the listing its SDK makes around it:
        the Python SDK lists tools inside `call_tool` to check a result against the tool's output
        schema, so without this a 2026 call whose tool call the engine answered would come back
        -32603 ("upstream unavailable") when that listing was on a stdio child as it was killed."""
        loop = self._loop()
        started = loop.time()
        try:
            return await self.forward(request, outbox, headers, timeout_s)
        except UpstreamFailure as failure:
            if failure.kind not in _GONE:
                raise
            wait_s = min(failure.retry_after_s or 0.0, 5.0)
            left_s = None if timeout_s is None else timeout_s - (loop.time() - started) - wait_s
            if left_s is not None and left_s <= 0:
                raise
            log.info(
                "%s failed (%s): sent once more", bounded(str(request.get("method")), 40), bounded(failure.detail, 200)
            )
        if wait_s:
            await asyncio.sleep(wait_s)
        return await self.forward(request, outbox, headers, left_s)

    async def forward(
        self,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Message:
        """One attempt, its response returned under the caller's id. Raises UpstreamFailure, or
        `AttemptTimedOut` when `timeout_s` (covering the hand-over and the answer) ran out."""
        token = progress_token_of(request)
        progress = ProgressRelay(token) if token is not None else None
        # A link that must start its upstream first and bounds that start itself (a stdio child:
        # the start queue's progress and the busy-aware start wait) hands the request over without
        # a send deadline: a queue of legitimate starts is not cut by the request timer, which
        # runs from the hand-over (`starting`, proxy/upstream/stdio/link.py).
        send_deadline_s = None if getattr(self.link, "starting", False) else timeout_s
        response = await self.attempt(request, outbox, headers, timeout_s, send_deadline_s, progress)
        method = request.get("method")
        if method == "initialize" and isinstance(response.get("result"), dict):
            version = response["result"].get("protocolVersion")
            self.protocol_version = version if isinstance(version, str) else None
        elif "error" in response:
            self.protocol_mismatch(response["error"])
        return {**response, "id": request["id"]}

    async def attempt(
        self,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None = None,
        response_timeout_s: float | None = None,
        send_deadline_s: float | None = None,
        # Not keyword-only: the engine calls this once per attempt with positional arguments, the
        # form the interpreter specializes (a call with keyword arguments is not).
        progress: ProgressRelay | None = None,
        params: dict[str, Any] | None = None,
        sent: asyncio.Event | None = None,
        idle_s: float | None = None,
    ) -> Message:
        """Send `request` upstream once, with a fresh upstream id, and await its response.

        Returns the upstream's response message (still under the upstream id). Raises
        UpstreamFailure, or `AttemptTimedOut` (a TimeoutError) when no response came within
        `response_timeout_s` of the request being handed to the transport; handing it over
        (starting a stdio child, connecting) is bounded by `send_deadline_s` instead, which also
        caps the response timer (the call's deadline is never passed). `sent` is set once the
        request was handed over (for a caller that waits for that). If the awaiting task is
        cancelled (the caller cancelled, or a timer fired), the upstream exchange is cancelled as
        its transport requires (by the link itself when it is cancelled after writing the request,
        before it returned the exchange); a timer that fires once the link wrote the request raises
        `AttemptTimedOut` with `sent` true, whether or not the hand-over returned.
        `params` replaces the request's params (the engine adds an idempotency key this way).
        `idle_s` (with `response_timeout_s`): the attempt also ends when nothing related to it came
        for that long (`AttemptTimedOut.idle_s` says so); the upstream then gets a progress token
        even when the caller sent none, so that a tool can keep the attempt alive.
        """
        link = self.link
        uid = link.new_id()
        up: Message = {"jsonrpc": "2.0", "id": uid, "method": request["method"]}
        if idle_s is not None and progress is None:
            progress = SilentProgress(None)
        p = params if params is not None else request.get("params")
        if progress is not None and isinstance(p, dict):
            meta = p.get("_meta")
            p = {**p, "_meta": {**(meta if isinstance(meta, dict) else {}), "progressToken": uid}}
        if p is not None:
            up["params"] = p

        down_id = request.get("id")
        timer: AttemptTimer | None = None
        related = self.server_messages.related

        def on_message(message: Message) -> None:
            if timer is not None and timer.idle_s is not None:
                timer.alive_at = timer_loop.time()  # the attempt is alive: its idle timer starts over
            params: Any = message.get("params")
            meta = params.get("_meta") if isinstance(params, dict) else None
            if isinstance(meta, dict) and meta.get(SUBSCRIPTION_ID) == uid:
                message = {**message, "params": {**params, "_meta": {**meta, SUBSCRIPTION_ID: down_id}}}
            related(message, outbox, progress)

        ticket = self.admission.ticket(outbox, self._loop())  # raises at once when the client's share is full
        if response_timeout_s is None:
            async with ticket:
                exchange = await link.send_request(up, on_message=on_message, headers=headers)
                if sent is not None:
                    sent.set()
                try:
                    return await exchange.response
                except asyncio.CancelledError:
                    self._cancel_upstream(exchange, "request cancelled by the proxy")
                    raise
        # One timer (see AttemptTimer), cancelling this task when due, turned into TimeoutError
        # below (what `asyncio.timeout` does, at a fraction of its cost on every attempt).
        deadlines = self._deadlines
        if deadlines is None:
            deadlines = self._deadlines = Deadlines(self._loop())
        timer_loop = loop = deadlines.loop
        now = loop.time()
        deadline_at = now + send_deadline_s if send_deadline_s is not None else math.inf
        timer = deadlines.start(asyncio.current_task(loop), response_timeout_s, deadline_at, now, idle_s)
        sent_ex: Exchange | None = None
        try:
            async with ticket:  # waiting for a slot or the client's share counts against the send deadline
                # `timer.wrote`: a hand-over cut after the link wrote the request still counts as
                # sent (a timer firing says dispatch unknown, never "not sent")
                sent_ex = await link.send_request(up, on_message=on_message, headers=headers, on_write=timer.wrote)
                timer.sent_at = loop.time()
                if sent_ex.asks_input:  # the era bridge: its input-required round trip pauses the timer
                    sent_ex.on_input = timer.waiting
                if timer.when is None:
                    deadlines.enter(timer)
                if sent is not None:
                    sent.set()
                return await sent_ex.response
        except asyncio.CancelledError:
            if sent_ex is not None:
                self._cancel_upstream(sent_ex, "request cancelled by the proxy")
            if timer.fired and timer.task is not None and timer.task.uncancel() == 0:
                # our timer, and nobody else cancelled the task
                raise AttemptTimedOut(timer.sent, idle_s if timer.idled() else None) from None
            raise
        finally:
            deadlines.end(timer)

    def protocol_mismatch(self, error: Any) -> None:
        """An upstream's JSON-RPC error: a 2026 header mismatch (-32020) or unsupported version
        (-32022) means proxy and upstream disagree about the protocol; tell the service."""
        code = error.get("code") if isinstance(error, dict) else None
        if (code == HEADER_MISMATCH or code == UNSUPPORTED_PROTOCOL_VERSION) and self.on_protocol_mismatch is not None:
            self.on_protocol_mismatch()

    def _cancel_upstream(self, exchange: Exchange, reason: str) -> None:
        # The awaiting task's cancellation also cancels the future it awaited; only an actual
        # answer (or failure) means there is nothing left to cancel upstream.
        response = exchange.response
        if exchange.method == "initialize" or (response.done() and not response.cancelled()):
            return
        task = asyncio.create_task(self.link.cancel(exchange, reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def vouch(self, headers: Mapping[str, str] | None, key: str | None = None) -> None:
        """--auth passthrough: whether the caller whose forwarded `headers` these are may act on
        this legacy session where the upstream cannot judge it (proxy/core/vouching.py)."""
        await vouch(self, headers, key, self._loop())

    def catalog_of(self, principal: Principal | None) -> ToolCatalog:
        """The catalog of the tools `principal` is listed (the upstream's own but with passthrough).
        With passthrough, a 2025 session's catalog is its opener's: the upstream binds the session
        to that credential, and lists (and runs) what comes through it as that caller's."""
        if not self.catalogs.per_principal:
            return self.catalog
        if self._session_catalog is not None:
            return self._session_catalog
        return self.catalog if principal is None else self.catalogs.of(principal.id)

    async def lookup_tool(
        self,
        name: str,
        request: Message | None,
        timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
        principal: Principal | None = None,
    ) -> dict[str, Any] | None:
        """The upstream's definition of `name`, waiting at most `timeout_s` for the catalog's
        listing when it has not arrived yet (proxy/core/catalog.py: the listing is not the caller's,
        and is not cut short when the caller stops waiting).

        A modern request's envelope is reused so the listing is a valid 2026 request. With
        `--auth passthrough` the listing carries the caller's `Authorization` (of `headers`, the
        request's forwarded ones), as the request itself does, and fills that principal's catalog.
        """
        catalog = self.catalog_of(principal)
        tool = catalog.tools.get(name)
        if tool is not None or catalog.listed.is_set():
            return tool
        await catalog.ready(self.lister(catalog, request, headers), timeout_s)
        return catalog.tools.get(name)

    def list_tools_soon(self, headers: Mapping[str, str] | None = None, principal: Principal | None = None) -> None:
        """The upstream was reached: list its tools now, unless the catalog has them (a call that
        comes later then knows its tool whatever its deadline). With passthrough only for a caller
        whose credential is at hand (`headers`)."""
        if self.catalogs.per_principal:
            if principal is None:
                return
            if self.session_id is not None and self._session_catalog is None:
                self._session_catalog = self.catalogs.of(principal.id)  # the session's opener
        catalog = self.catalog_of(principal)
        if not catalog.listed.is_set():
            catalog.refresh(self.lister(catalog, None, headers))

    def lister(
        self, catalog: ToolCatalog, request: Message | None, headers: Mapping[str, str] | None
    ) -> Callable[[], Awaitable[None]]:
        """A listing of every page of the upstream's tools into `catalog`, through this relay."""
        return tool_lister(self.forward, catalog, request, headers, modern=self.era is Era.MODERN)

    async def handle_notification(
        self, message: Message, headers: Mapping[str, str] | None = None, principal: Principal | None = None
    ) -> None:
        self.last_activity = time.monotonic()
        self.initialized = True
        if message.get("method") == "notifications/cancelled":
            params = message.get("params")
            request_id = params.get("requestId") if isinstance(params, dict) else None
            task = self._inflight.get(request_id) if valid_id(request_id) else None
            if task is not None:
                task.cancel()
            return
        try:
            await self.link.send_notification(message, headers=headers)
        except UpstreamFailure as failure:
            if self.pass_auth_refusals and refuses_the_caller(failure.kind, failure.http_status):
                # passthrough: the upstream did not accept it from this caller, which must hear so
                # (an HTTP error status instead of 202, the spec's answer to a refused notification)
                raise upstream_refusal(failure) from None
            log.info("could not relay %s upstream: %s", bounded(str(message.get("method")), 80), failure)
        else:
            if message.get("method") == "notifications/initialized":
                self.list_tools_soon(headers, principal)  # the session is usable: know its tools

    async def handle_response(self, message: Message) -> None:
        """The client's answer to a server-to-client request."""
        self.last_activity = time.monotonic()
        upstream_id = self.server_requests.answered(message.get("id"))
        if upstream_id is None:
            log.info("dropped a client response for an unknown request id")
            return
        try:
            await self.link.send_response({**message, "id": upstream_id})
        except UpstreamFailure as failure:
            log.info("could not relay a client response upstream: %s", failure)

    def _pressure(self, on: bool) -> None:
        """A stream of this session passed (True) or drained below (False) its watermark."""
        before = self._pressured
        self._pressured = max(0, before + (1 if on else -1))
        if (before == 0) != (self._pressured == 0):
            self._pause(self._pressured > 0)  # type: ignore[misc]

    def attach_listen(self, outbox: Outbox) -> bool:
        return self.delivery.attach_listen(outbox)

    def detach_listen(self, outbox: Outbox) -> None:
        self.delivery.detach_listen(outbox)

    async def settle(self, timeout_s: float = 1.0) -> None:
        """Wait (bounded) for the upstream cancellations this relay sent in the background, so
        that they reach the upstream before its link or process is closed."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout_s)

    async def end_requests(self) -> None:
        """Cancel every request still running, and wait (bounded) for their upstream cancellations
        to be written."""
        for task in list(self._inflight.values()):
            task.cancel()
        await self.settle()

    async def aclose(self) -> None:
        await self.end_requests()
        if self.era is Era.LEGACY:
            await self.link.aclose()
