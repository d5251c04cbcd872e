"""A 2025 session over a 2026-07-28 link: 2025 clients in front of a server that speaks only
2026-07-28.

`LegacyOverModern` is an `UpstreamLink` of the legacy era that the service gives a 2025 session
when the upstream answers `server/discover` but not `initialize` (and `--era-bridge` is on). It
holds the session state a 2025 server would hold and sends every request on the upstream's shared
2026 link (which it never closes, and whose unsolicited handler it never takes: all it needs comes
with its own requests), translated by proxy/upstream/bridge_shapes.py:

- `initialize` is answered from the server's `server/discover` (asked once per session, bounded by
  `timeout_s`); `notifications/initialized` and every other client notification are absorbed (the
  2026 core has none a 2025 client sends; `notifications/cancelled` is acted on by the relay,
  which cancels the request, and `cancel` then cancels the 2026 request);
- each request carries the session's state in the 2026 per-request `_meta` (protocol version, the
  client's capabilities and info, the level set by `logging/setLevel`), and each result loses the
  2026-only fields (`structuredContent` that is not an object is wrapped);
- a log message reaches the session's client at or above the level it set, and every log message
  before it set one (`UNSET_LEVEL`: what a 2025 server does until its client sets a level); one that
  names no request (a 2026 server over stdio names none) reaches a request's
  client while that request is the only one in flight on the shared link
  (`Exchange.takes_untied_logs`), and no one while several are;
- methods 2026 removed: `ping` is answered here, `logging/setLevel` is stored for the session
  (valid levels only), `resources/subscribe` and `resources/unsubscribe` are served by one
  `subscriptions/listen` stream of the session's, re-opened whenever the set of subscribed URIs
  changes (its `resources/updated` and list-changed notifications go to the session), where the
  server offers resource subscriptions; else -32601 with the reason;
- an input-required result (the server asks the client for sampling, elicitation or roots while
  it serves a request) becomes 2025 server-to-client requests on that request's stream, and the
  request is sent again with the client's answers and the server's `requestState` under a new id,
  round after round (at most `MAX_ROUNDS`), all inside the one exchange the caller awaits: the
  round trip is part of one attempt, never an attempt of its own; while the client is being asked,
  the exchange's `on_input` (the relay's attempt timer) lets only the call's deadline run, and the
  attempt's response timeout starts again when the request is re-sent.
  Where the client did not declare the capability asked for, or answered with an error, the
  request is answered with an error that says so.

Timeouts and retries are the engine's; the bridge adds none (the discover of `initialize` aside).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    Message,
    RequestId,
    bounded,
)
from proxy.telemetry.bridge import BRIDGE
from proxy.upstream.base import SUBSCRIPTION_ID, Era, Exchange, OnMessage, UpstreamLink, discover_request, ours
from proxy.upstream.bridge import LOG_LEVELS
from proxy.upstream.bridge_shapes import (
    continued,
    initialize_result,
    input_requests,
    is_input_required,
    legacy_response,
    modern_request,
)

log = logging.getLogger("proxy.upstream.bridge_legacy")

MAX_ROUNDS: Final = 16  # input-required rounds of one request (a server asking for ever is refused)
LISTEN_ACK_S: Final = 10.0  # a subscribe waits this long, at most, for the listen stream's acknowledgement
# The server capabilities whose list changes a listen stream can ask for, and the filter's keys.
LIST_CHANGED_KEYS: Final = {
    "tools": "toolsListChanged",
    "prompts": "promptsListChanged",
    "resources": "resourcesListChanged",
}


# The level a session asks the server for until its client sends logging/setLevel. The 2025
# specification lets a server choose what to send before then; the SDKs' 2025 servers send every
# level, so a 2025 client sees through the bridge the log messages it would see from them.
UNSET_LEVEL: Final = "debug"


class LegacyOverModern:
    """The legacy-era link of one 2025 session over the upstream's shared 2026 link (see the
    module's contract)."""

    era = Era.LEGACY

    def __init__(self, inner: UpstreamLink, timeout_s: float) -> None:
        self._inner = inner
        self._timeout_s = timeout_s
        self._unsolicited: OnMessage = lambda message: None
        self._discover: dict[str, Any] | None = None
        self.client_capabilities: dict[str, Any] = {}
        self.client_info: dict[str, Any] | None = None
        self.log_level: str | None = None  # set by the client's logging/setLevel
        self._asked: dict[RequestId, asyncio.Future[Message]] = {}  # server requests awaiting the client
        self._ask_ids = itertools.count(1)
        self._drivers: dict[int, asyncio.Task[None]] = {}  # id(outer exchange) -> its driver
        self._subscribed: set[str] = set()
        self._listen: Exchange | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.awaiting_input = 0  # requests whose client is being asked (/metrics: proxy/telemetry/bridge.py)
        BRIDGE.watch_legacy(self)

    # -- UpstreamLink ------------------------------------------------------------------------

    def new_id(self) -> RequestId:
        return self._inner.new_id()

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        self._unsolicited = handler

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        if self._closed:
            raise UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, "the bridged session is closed")
        method = str(message.get("method"))
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "initialize":
            return await self._initialize(message, params, headers)
        if method == "ping":
            return self._answered(message, {})
        if method == "logging/setLevel":
            level = params.get("level")
            if level not in LOG_LEVELS:
                return self._answered(message, error={"code": INVALID_PARAMS, "message": "unknown log level"})
            self.log_level = str(level)
            return self._answered(message, {})
        if method in ("resources/subscribe", "resources/unsubscribe"):
            return await self._subscription(message, method, params, headers)
        up = modern_request(message, self.client_capabilities, self.client_info, self.log_level or UNSET_LEVEL)
        token = up["params"]["_meta"].get("progressToken")
        relayed = self._relayed(token, on_message)
        inner_ex = await self._inner.send_request(up, on_message=relayed, headers=headers, on_write=on_write)
        loop = asyncio.get_running_loop()
        outer = Exchange(message["id"], method, on_message, loop.create_future(), written=True, asks_input=True)
        outer.transport_state = inner_ex
        driver = loop.create_task(self._drive(outer, up, inner_ex, relayed, headers))
        self._drivers[id(outer)] = driver
        driver.add_done_callback(lambda _: self._drivers.pop(id(outer), None))
        return outer

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        """Absorbed: a 2026 server takes no notification from a 2025 client (the module's contract)."""

    async def send_response(self, message: Message) -> None:
        """The client's answer to one of the bridge's input requests."""
        answer_id = message.get("id")
        waiter = self._asked.pop(answer_id, None) if ours(answer_id) else None
        if waiter is None:
            log.info("bridged session: dropped a client answer for no input request of the bridge's")
            return
        if not waiter.done():
            waiter.set_result(message)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        exchange.cancelled = True
        inner_ex = exchange.transport_state
        driver = self._drivers.pop(id(exchange), None)
        if driver is not None:
            driver.cancel()  # (it awaits the 2026 answer shielded: the link's own future stays the link's)
        if isinstance(inner_ex, Exchange) and not inner_ex.response.done():
            await self._inner.cancel(inner_ex, reason)

    async def aclose(self) -> None:
        """Ends this session's requests and listen stream; the shared 2026 link stays open (it is
        the upstream's)."""
        self._closed = True
        for driver in list(self._drivers.values()):
            driver.cancel()
        for waiter in self._asked.values():
            waiter.cancel()
        self._asked.clear()
        listen, self._listen = self._listen, None
        if listen is not None:
            await self._inner.cancel(listen, "the bridged session closed")
        for task in list(self._background):
            task.cancel()

    # -- initialize ----------------------------------------------------------------------------

    async def _initialize(
        self, message: Message, params: dict[str, Any], headers: Mapping[str, str] | None
    ) -> Exchange:
        caps = params.get("capabilities")
        self.client_capabilities = caps if isinstance(caps, dict) else {}
        info = params.get("clientInfo")
        self.client_info = info if isinstance(info, dict) else None
        try:
            ex = await self._inner.send_request(discover_request(self._inner.new_id()), headers=headers)
            response = await asyncio.wait_for(asyncio.shield(ex.response), self._timeout_s)
        except TimeoutError:
            raise UpstreamFailure(
                FailureKind.TIMEOUT,
                Dispatch.NO,
                f"the upstream did not answer server/discover within {self._timeout_s:g} s",
            ) from None
        result = response.get("result")
        if not isinstance(result, dict):
            error = response.get("error")
            return self._answered(message, error=error if isinstance(error, dict) else _error("server/discover failed"))
        self._discover = result
        return self._answered(message, initialize_result(result, params.get("protocolVersion")))

    def _server_capabilities(self) -> dict[str, Any]:
        caps = self._discover.get("capabilities") if self._discover is not None else None
        return caps if isinstance(caps, dict) else {}

    # -- requests and their input-required rounds ------------------------------------------------

    async def _drive(
        self,
        outer: Exchange,
        up: Message,
        inner_ex: Exchange,
        relayed: OnMessage,
        headers: Mapping[str, str] | None,
    ) -> None:
        try:
            answer = await self._rounds(outer, up, inner_ex, relayed, headers)
        except Exception as failure:  # an UpstreamFailure, as the link raised it
            if not outer.response.done():
                outer.response.set_exception(untraced(failure))
                outer.response.exception()
            return
        except asyncio.CancelledError:
            if not outer.response.done():
                outer.response.cancel()
            raise
        if not outer.response.done():
            outer.response.set_result(legacy_response(outer.method, {**answer, "id": outer.upstream_id}))

    async def _rounds(
        self,
        outer: Exchange,
        up: Message,
        inner_ex: Exchange,
        relayed: OnMessage,
        headers: Mapping[str, str] | None,
    ) -> Message:
        """The final answer to `up`: each input-required result is answered by the client and the
        request sent again, at most `MAX_ROUNDS` times."""
        for _ in range(MAX_ROUNDS):
            response = await asyncio.shield(inner_ex.response)
            if not is_input_required(response):
                return response
            result = response["result"]
            asked = input_requests(result, self.client_capabilities)
            if isinstance(asked, str):
                return {"jsonrpc": "2.0", "id": up["id"], "error": _error(asked)}
            answers: dict[str, Any] = {}
            if outer.on_input is not None:
                outer.on_input(True)  # a person may be answering: only the call's deadline runs
            BRIDGE.count_round("2025")
            self.awaiting_input += 1
            try:
                replies = await asyncio.gather(*(self._ask(outer, method, params) for _, method, params in asked))
            finally:
                self.awaiting_input -= 1
                if outer.on_input is not None:
                    outer.on_input(False)
            for (key, method, _), reply in zip(asked, replies, strict=True):
                if not isinstance(reply.get("result"), dict):
                    error = reply.get("error")
                    detail = error.get("message") if isinstance(error, dict) else None
                    why = f"the client refused the server's {method}: {bounded(str(detail), 200)}"
                    return {"jsonrpc": "2.0", "id": up["id"], "error": _error(why)}
                answers[key] = reply["result"]
            up = continued(up, self._inner.new_id(), answers, result.get("requestState"))
            inner_ex = await self._inner.send_request(up, on_message=relayed, headers=headers)
            outer.transport_state = inner_ex
        why = f"the server asked for input more than {MAX_ROUNDS} times in one request"
        return {"jsonrpc": "2.0", "id": up["id"], "error": _error(why)}

    async def _ask(self, outer: Exchange, method: str, params: Any) -> Message:
        """One server-to-client request to the 2025 client, on `outer`'s stream; its answer."""
        ask_id = f"bridge-{next(self._ask_ids)}"
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._asked[ask_id] = waiter
        request: Message = {"jsonrpc": "2.0", "id": ask_id, "method": method}
        if params is not None:
            request["params"] = params
        if outer.on_message is None:
            self._asked.pop(ask_id, None)
            return {"jsonrpc": "2.0", "id": ask_id, "error": _error("no stream to ask the client on")}
        try:
            outer.on_message(request)
            return await waiter
        finally:
            self._asked.pop(ask_id, None)

    # -- resources/subscribe over subscriptions/listen -----------------------------------------

    async def _subscription(
        self, message: Message, method: str, params: dict[str, Any], headers: Mapping[str, str] | None
    ) -> Exchange:
        resources = self._server_capabilities().get("resources")
        if not (isinstance(resources, dict) and resources.get("subscribe") is True):
            why = f"{method} is not available: the server offers no resource subscriptions"
            return self._answered(message, error={"code": METHOD_NOT_FOUND, "message": why})
        uri = params.get("uri")
        if not isinstance(uri, str):
            return self._answered(message, error={"code": INVALID_PARAMS, "message": f"{method} needs params.uri"})
        wanted = self._subscribed | {uri} if method == "resources/subscribe" else self._subscribed - {uri}
        if wanted != self._subscribed:
            self._subscribed = wanted
            await self._relisten(headers)
        return self._answered(message, {})

    async def _relisten(self, headers: Mapping[str, str] | None) -> None:
        """One listen stream naming every subscribed URI (and the list changes the server offers);
        the one before it is cancelled. Waits for its acknowledgement, bounded."""
        old, self._listen = self._listen, None
        if old is not None:
            await self._inner.cancel(old, "the session's subscriptions changed")
        if not self._subscribed:
            return
        caps = self._server_capabilities()
        wanted: dict[str, Any] = {"resourceSubscriptions": sorted(self._subscribed)}
        for capability, key in LIST_CHANGED_KEYS.items():
            cap = caps.get(capability)
            if isinstance(cap, dict) and cap.get("listChanged") is True:
                wanted[key] = True
        listen = modern_request(
            {
                "jsonrpc": "2.0",
                "id": self._inner.new_id(),
                "method": "subscriptions/listen",
                "params": {"notifications": wanted},
            },
            self.client_capabilities,
            self.client_info,
            None,
        )
        acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_message(note: Message) -> None:
            method = note.get("method")
            if method == "notifications/subscriptions/acknowledged":
                if not acknowledged.done():
                    acknowledged.set_result(None)
                return
            if isinstance(method, str) and method.startswith("notifications/") and "id" not in note:
                self._unsolicited(_without_subscription(note))

        ex = self._listen = await self._inner.send_request(listen, on_message=on_message, headers=headers)
        ex.response.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            await asyncio.wait_for(asyncio.shield(acknowledged), LISTEN_ACK_S)
        except TimeoutError:
            log.info("bridged session: the listen stream was not acknowledged within %g s", LISTEN_ACK_S)

    # -- helpers -------------------------------------------------------------------------------

    def _relayed(self, token: object, on_message: OnMessage | None) -> OnMessage:
        """`_progress_under`, with log messages only at or above the level the session set (the
        server filters by the level each request carries, but a log message that names no request
        reaches a request only by being the one in flight: `Exchange.takes_untied_logs`)."""
        relayed = _progress_under(token, on_message)

        def filtered(message: Message) -> None:
            if message.get("method") == "notifications/message":
                params = message.get("params")
                severity = params.get("level") if isinstance(params, dict) else None
                level = self.log_level or UNSET_LEVEL
                if severity not in LOG_LEVELS or LOG_LEVELS.index(severity) < LOG_LEVELS.index(level):
                    return
            relayed(message)

        return filtered

    def _answered(
        self, message: Message, result: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> Exchange:
        """An exchange answered by the bridge itself."""
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        body: Message = {"jsonrpc": "2.0", "id": message["id"]}
        if error is not None:
            body["error"] = error
        else:
            body["result"] = result
        future.set_result(body)
        return Exchange(message["id"], str(message.get("method")), None, future, written=False)


def _error(message: str) -> dict[str, Any]:
    return {"code": INVALID_REQUEST, "message": message}


def _without_subscription(note: Message) -> Message:
    params = note.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or SUBSCRIPTION_ID not in meta:
        return note
    assert isinstance(params, dict)
    kept = {k: v for k, v in meta.items() if k != SUBSCRIPTION_ID}
    new_params = {k: v for k, v in params.items() if k != "_meta"}
    if kept:
        new_params["_meta"] = kept
    return {**note, "params": new_params}


def _progress_under(token: object, on_message: OnMessage | None) -> OnMessage:
    """What the 2026 requests of one exchange send, to its caller: progress under the token of the
    first round (each round's request has its own id, and the token is that id), log messages and
    the rest as they came."""

    def relayed(message: Message) -> None:
        if on_message is None:
            return
        if token is not None and message.get("method") == "notifications/progress":
            params = message.get("params")
            if isinstance(params, dict) and params.get("progressToken") != token:
                message = {**message, "params": {**params, "progressToken": token}}
        on_message(message)

    return relayed
