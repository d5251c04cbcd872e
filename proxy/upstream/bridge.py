"""A 2026-07-28 link over a 2025 session: 2026 callers in front of a server that speaks only the
2025 handshake revisions.

`ModernOverLegacy` is an `UpstreamLink` of the modern era that the service uses when the upstream
answers `initialize` but not `server/discover`. It holds one 2025 session upstream (a legacy link
of the upstream's own transport, which re-establishes the session itself: a respawned stdio child,
an expired HTTP session), opened with the proxy's own `initialize`, and turns each 2026 request
into a request of that session and each answer back:

- `server/discover` is answered from what `initialize` returned (capabilities, instructions,
  server info), never sent upstream;
- a request loses the 2026 per-request `_meta` keys (protocol version, client info, client
  capabilities, log level), which a 2025 server does not know, and the `task` of a task-augmented
  call (no tasks are bridged: the call runs in place); everything else goes as it came;
- a request that declares client capabilities a 2025 server can ask for (sampling, elicitation,
  roots) goes to the bridge's interactive sessions (bridge_interactive.py), which turn the
  server's questions into input-required rounds; a retry carrying a `requestState` goes there too;
  `inputResponses` without one answer no question of the bridge's and are ignored, as a server
  ignores what it does not recognise;
- a method 2026 removed (`ping`, `logging/setLevel`, `resources/subscribe`, ...) and the 2025-11-25
  task methods are answered "Method not found", as a 2026 server without tasks answers them;
- a result gets `resultType: "complete"` and the server's info in `_meta`; a list result and a
  `resources/read` result get the 2026 caching fields (`ttlMs: 0`, `cacheScope: "private"`: the
  session's answers are not known to be the same for every caller); the 2025-11-25 task field
  `execution` leaves tool definitions (2026 has no core tasks); the 2025 "resource not found"
  (-32002) becomes 2026's -32602;
- `notifications/message` reaches a request's caller only at or above the level the request asked
  for (`io.modelcontextprotocol/logLevel`), none without one, as a 2026 server behaves;
- `subscriptions/listen` is served here: the session's `list_changed` notifications go to every
  listen stream that asked for them, and `resources/updated` to those that named the resource
  (subscribed upstream once per resource while any stream names it, and again when the session is
  re-established);
- on the shared session, which declares no client capability (what the server asks there could
  reach no one caller), a server that honours capabilities does not ask, and one that asks anyway
  gets a JSON-RPC error that says why (`ping` is answered).

Cancellation is the legacy link's (`notifications/cancelled`), and so are timeouts and retries:
the bridge adds none (the engine owns both).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import (
    INVALID_PARAMS,
    LATEST_LEGACY,
    LATEST_MODERN,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    METHOD_NOT_FOUND,
    Message,
    RequestId,
    bounded,
)
from proxy.upstream.base import CLIENT_INFO, SUBSCRIPTION_ID, Era, Exchange, LinkBase, OnMessage, UpstreamLink

if TYPE_CHECKING:
    from proxy.upstream.bridge_interactive import InteractiveCalls

log = logging.getLogger("proxy.upstream.bridge")

# The per-request `_meta` keys of 2026 that a 2025 session carries once, in `initialize`.
MODERN_ONLY_META: Final = frozenset({META_PROTOCOL_VERSION, META_CLIENT_INFO, META_CLIENT_CAPABILITIES, META_LOG_LEVEL})
CONTINUATION: Final = frozenset({"requestState", "inputResponses"})  # a 2026 input-required retry
LIST_METHODS: Final = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list"})
CACHEABLE: Final = LIST_METHODS | {"resources/read"}  # the 2026 results that carry ttlMs and cacheScope
# Methods of the 2025 revisions that 2026-07-28 removed: a 2026 server answers them "Method not found".
REMOVED_IN_2026: Final = frozenset(
    {"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "tasks/list"}
)
# The 2025-11-25 task methods: not bridged (2026-07-28 has no core tasks and the bridge offers no
# tasks extension), answered "Method not found" as a 2026 server without tasks answers them.
TASK_METHODS: Final = frozenset({"tasks/get", "tasks/result", "tasks/cancel"})
RESOURCE_NOT_FOUND_2025: Final = -32002
# The 2026 requests a server may answer with an input-required result.
INTERACTIVE: Final = frozenset({"tools/call", "prompts/get", "resources/read"})
# RFC 5424 severities as MCP names them, least severe first.
LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
# The listen filter's keys and the 2025 notifications each one asks for.
LIST_CHANGED: Final = {
    "toolsListChanged": ("notifications/tools/list_changed", "tools"),
    "promptsListChanged": ("notifications/prompts/list_changed", "prompts"),
    "resourcesListChanged": ("notifications/resources/list_changed", "resources"),
}


def legacy_initialize(request_id: RequestId, capabilities: Mapping[str, Any] | None = None) -> Message:
    """The bridge's `initialize`: the shared session declares no client capability (what the
    server asks on it could reach no one caller); an interactive session declares its caller's."""
    params = {"protocolVersion": LATEST_LEGACY, "capabilities": dict(capabilities or {}), "clientInfo": CLIENT_INFO}
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}


async def handshake(
    inner: UpstreamLink, timeout_s: float, capabilities: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Open a 2025 session on `inner` (its `initialize` and `notifications/initialized`, which the
    legacy link keeps and replays when it re-establishes the session), bounded by `timeout_s`;
    the server's `initialize` result. Raises `UpstreamFailure`; `inner` is closed then."""
    try:
        ex = await asyncio.wait_for(inner.send_request(legacy_initialize(inner.new_id(), capabilities)), timeout_s)
        response = await asyncio.wait_for(ex.response, timeout_s)
        result = response.get("result")
        if not isinstance(result, dict):
            error = response.get("error")
            detail = error.get("message") if isinstance(error, dict) else None
            raise UpstreamFailure(
                FailureKind.PROTOCOL,
                Dispatch.NO,
                f"the upstream refused the proxy's 2025 initialize: {bounded(str(detail), 200)}",
            )
        await inner.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
    except TimeoutError:
        await inner.aclose()
        raise UpstreamFailure(
            FailureKind.TIMEOUT, Dispatch.NO, f"the upstream did not answer initialize within {timeout_s:g} s"
        ) from None
    except BaseException:
        await inner.aclose()
        raise
    return result


def without_modern_meta(message: Message) -> Message:
    params = message.get("params")
    if not isinstance(params, dict):
        return message
    meta = params.get("_meta")
    if not isinstance(meta, dict) or not MODERN_ONLY_META.intersection(meta):
        return message
    kept = {k: v for k, v in meta.items() if k not in MODERN_ONLY_META}
    new_params = {k: v for k, v in params.items() if k != "_meta"}
    if kept:
        new_params["_meta"] = kept
    return {**message, "params": new_params}


def asked_capabilities(message: Message) -> dict[str, Any] | None:
    """The client capabilities of a 2026 request that a 2025 server can ask for, as a 2025
    `initialize` declares them; None when it declares none. `roots.listChanged` is dropped: a 2026
    client sends no roots notification."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    declared = meta.get(META_CLIENT_CAPABILITIES) if isinstance(meta, dict) else None
    if not isinstance(declared, dict):
        return None
    caps: dict[str, Any] = {}
    for name in ("sampling", "elicitation", "roots"):
        value = declared.get(name)
        if isinstance(value, dict):
            caps[name] = {k: v for k, v in value.items() if k != "listChanged"} if name == "roots" else value
    return caps or None


def legacy_form(message: Message) -> Message:
    """A 2026 request as the 2025 session gets it: without the 2026 `_meta` keys, and without the
    `task` of a task-augmented request (the bridge offers no tasks, so it is ignored, as a 2026
    server without the tasks extension ignores it: the call runs and answers in place)."""
    message = without_modern_meta(message)
    params = message.get("params")
    if isinstance(params, dict) and "task" in params:
        message = {**message, "params": {k: v for k, v in params.items() if k != "task"}}
    return message


def level_of(message: Message) -> int | None:
    """The index in LOG_LEVELS of the level a 2026 request asked for; None: no log messages."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    level = meta.get(META_LOG_LEVEL) if isinstance(meta, dict) else None
    return LOG_LEVELS.index(level) if level in LOG_LEVELS else None


@dataclass(eq=False, slots=True)
class _Listen:
    """One 2026 `subscriptions/listen` stream served by the bridge."""

    exchange: Exchange
    notifications: frozenset[str]  # 2025 list_changed methods asked for and honoured
    resources: frozenset[str]  # URIs whose `resources/updated` it asked for (and could get)


class ModernOverLegacy:
    """The modern-era link over one 2025 session (see the module's contract). Build it with
    `open`, which performs the handshake."""

    era = Era.MODERN

    def __init__(
        self, inner: UpstreamLink, init_result: dict[str, Any], interactive: InteractiveCalls | None = None
    ) -> None:
        self._inner = inner
        self._init = init_result
        self.interactive = interactive
        self._unsolicited: OnMessage = lambda message: None
        self._listens: dict[RequestId, _Listen] = {}
        self._subscribed: dict[str, int] = {}  # resource URI -> listen streams naming it
        self._background: set[asyncio.Task[Any]] = set()
        inner.set_unsolicited_handler(self._on_unsolicited)
        if isinstance(inner, LinkBase):
            inner.on_reestablished = self._resubscribe

    @classmethod
    async def open(
        cls, inner: UpstreamLink, timeout_s: float, interactive: InteractiveCalls | None = None
    ) -> ModernOverLegacy:
        """Open the shared 2025 session on `inner` (`handshake`); `interactive`: the sessions on
        which a server may ask the caller (bridge_interactive.py), None: it may not. Raises
        `UpstreamFailure`; `inner` is closed then."""
        result = await handshake(inner, timeout_s)
        log.info(
            "2026-07-28 requests are bridged onto a 2025 session (the upstream answered initialize with %s)",
            bounded(str(result.get("protocolVersion")), 40),
        )
        return cls(inner, result, interactive)

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
        method = message.get("method")
        if method == "server/discover":
            return self._answered(message, self.discover())
        if method == "subscriptions/listen":
            return self._listen(message, on_message)
        if method in REMOVED_IN_2026 or method in TASK_METHODS:
            return self._answered(message, error={"code": METHOD_NOT_FOUND, "message": "Method not found"})
        params = message.get("params")
        interactive = self.interactive
        if interactive is not None:
            if isinstance(params, dict) and "requestState" in params:
                return interactive.resume(message, on_message)
            capabilities = asked_capabilities(message)
            if capabilities is not None:
                outer = await interactive.start(
                    message, capabilities, on_message, self.translated, headers=headers, on_write=on_write
                )
                if outer is not None:
                    return outer
        if isinstance(params, dict) and CONTINUATION.intersection(params):
            # Answers to no question of this bridge's: ignored, as a server ignores what it does not
            # recognise.
            message = {**message, "params": {k: v for k, v in params.items() if k not in CONTINUATION}}
        level = level_of(message)
        relayed = self._related(on_message, level)
        inner_ex = await self._inner.send_request(
            legacy_form(message), on_message=relayed, headers=headers, on_write=on_write
        )
        loop = asyncio.get_running_loop()
        outer = Exchange(message["id"], str(method), on_message, loop.create_future(), written=True)
        outer.transport_state = inner_ex
        inner_ex.response.add_done_callback(lambda done: self._answer(outer, str(method), done))
        return outer

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        await self._inner.send_notification(without_modern_meta(message), headers=headers)

    async def send_response(self, message: Message) -> None:
        await self._inner.send_response(message)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        exchange.cancelled = True
        if self.interactive is not None and self.interactive.owns(exchange):
            await self.interactive.cancel(exchange, reason)
            return
        listen = self._listens.pop(exchange.upstream_id, None)
        if listen is not None:
            self._unsubscribe(listen.resources)
            return
        inner_ex = exchange.transport_state
        if isinstance(inner_ex, Exchange):
            await self._inner.cancel(inner_ex, reason)

    async def aclose(self) -> None:
        for listen in self._listens.values():
            if not listen.exchange.response.done():
                listen.exchange.response.set_exception(
                    untraced(UpstreamFailure(FailureKind.CLOSED, Dispatch.UNKNOWN, "the bridged session closed"))
                )
                listen.exchange.response.exception()
        self._listens.clear()
        for task in self._background:
            task.cancel()
        if self.interactive is not None:
            await self.interactive.aclose()
        await self._inner.aclose()

    # -- answers -------------------------------------------------------------------------------

    def _server_meta(self) -> dict[str, Any]:
        info = self._init.get("serverInfo")
        return {META_SERVER_INFO: info} if isinstance(info, dict) else {}

    def _capabilities(self) -> dict[str, Any]:
        """The session's server capabilities as 2026 has them: 2025-11-25 tasks are not bridged
        (2026-07-28 has no core tasks)."""
        caps = self._init.get("capabilities")
        return {k: v for k, v in caps.items() if k != "tasks"} if isinstance(caps, dict) else {}

    def discover(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "supportedVersions": [LATEST_MODERN],
            "capabilities": self._capabilities(),
            "ttlMs": 0,
            "cacheScope": "private",
            "resultType": "complete",
        }
        instructions = self._init.get("instructions")
        if isinstance(instructions, str):
            result["instructions"] = instructions
        if meta := self._server_meta():
            result["_meta"] = meta
        return result

    def _answered(
        self, message: Message, result: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> Exchange:
        """An exchange answered by the bridge itself, nothing sent upstream."""
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        body: Message = {"jsonrpc": "2.0", "id": message["id"]}
        if error is not None:
            body["error"] = error
        else:
            body["result"] = result
        future.set_result(body)
        return Exchange(message["id"], str(message.get("method")), None, future, written=False)

    def _answer(self, outer: Exchange, method: str, done: asyncio.Future[Message]) -> None:
        if outer.response.done():
            return
        if done.cancelled():
            outer.response.cancel()
            return
        exc = done.exception()
        if exc is not None:
            outer.response.set_exception(exc)
            outer.response.exception()
            return
        outer.response.set_result(self.translated(method, done.result()))

    def translated(self, method: str, response: Message) -> Message:
        error = response.get("error")
        if isinstance(error, dict):
            if error.get("code") == RESOURCE_NOT_FOUND_2025:
                return {**response, "error": {**error, "code": INVALID_PARAMS}}
            return response
        result = response.get("result")
        if not isinstance(result, dict):
            return response
        result = {**result, "resultType": result.get("resultType", "complete")}
        if method in CACHEABLE:
            result.setdefault("ttlMs", 0)
            result.setdefault("cacheScope", "private")
            tools = result.get("tools")
            if method == "tools/list" and isinstance(tools, list):
                result["tools"] = [
                    {k: v for k, v in t.items() if k != "execution"} if isinstance(t, dict) else t for t in tools
                ]
        server_meta = self._server_meta()
        if server_meta:
            meta = result.get("_meta")
            result["_meta"] = {**server_meta, **meta} if isinstance(meta, dict) else server_meta
        return {**response, "result": result}

    # -- what the session sends ----------------------------------------------------------------

    def _related(self, on_message: OnMessage | None, level: int | None) -> OnMessage:
        """What the session sends tied to one request: its log messages at the level the request
        asked for, server-to-client requests answered here, everything else to the caller."""

        def relayed(message: Message) -> None:
            method = message.get("method")
            if "id" in message and isinstance(method, str):
                self._answer_server_request(message)
                return
            if method == "notifications/message":
                params = message.get("params")
                severity = params.get("level") if isinstance(params, dict) else None
                if level is None or severity not in LOG_LEVELS or LOG_LEVELS.index(severity) < level:
                    return
            if on_message is not None:
                on_message(message)

        return relayed

    def _on_unsolicited(self, message: Message) -> None:
        method = message.get("method")
        if "id" in message and isinstance(method, str):
            self._answer_server_request(message)
            return
        if not isinstance(method, str):
            return
        if method == "notifications/resources/updated":
            params = message.get("params")
            uri = params.get("uri") if isinstance(params, dict) else None
            for listen in list(self._listens.values()):
                if uri in listen.resources:
                    self._to_listen(listen, message)
            return
        delivered = False
        for listen in list(self._listens.values()):
            if method in listen.notifications:
                self._to_listen(listen, message)
                delivered = True
        if not delivered and method != "notifications/message":
            # A 2025 session's log messages outside any request have no 2026 caller to go to.
            self._unsolicited(message)

    def _answer_server_request(self, message: Message) -> None:
        method = str(message.get("method"))
        if method == "ping":
            reply: Message = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
        else:
            reply = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "error": {
                    "code": METHOD_NOT_FOUND,
                    "message": f"{bounded(method, 80)} is not available: the proxy serves 2026-07-28 clients over this "
                    "2025 session and declared no client capability",
                },
            }
        self._spawn(self._inner.send_response(reply))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- subscriptions/listen --------------------------------------------------------------------

    def _listen(self, message: Message, on_message: OnMessage | None) -> Exchange:
        params = message.get("params")
        wanted = params.get("notifications") if isinstance(params, dict) else None
        if not isinstance(wanted, dict):
            return self._answered(
                message, error={"code": INVALID_PARAMS, "message": "subscriptions/listen needs params.notifications"}
            )
        caps = self._init.get("capabilities")
        caps = caps if isinstance(caps, dict) else {}
        honoured: dict[str, Any] = {}
        notifications: set[str] = set()
        for key, (method, capability) in LIST_CHANGED.items():
            cap = caps.get(capability)
            if wanted.get(key) is True and isinstance(cap, dict) and cap.get("listChanged") is True:
                honoured[key] = True
                notifications.add(method)
        resources: frozenset[str] = frozenset()
        uris = wanted.get("resourceSubscriptions")
        resource_caps = caps.get("resources")
        if (
            isinstance(uris, list)
            and isinstance(resource_caps, dict)
            and resource_caps.get("subscribe") is True
            and all(isinstance(u, str) for u in uris)
        ):
            resources = frozenset(uris)
            honoured["resourceSubscriptions"] = sorted(resources)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        ex = Exchange(message["id"], "subscriptions/listen", on_message, future, written=True)
        listen = _Listen(ex, frozenset(notifications), resources)
        self._listens[ex.upstream_id] = listen
        self._subscribe(resources)
        ack = {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": honoured},
        }
        asyncio.get_running_loop().call_soon(self._to_listen, listen, ack)
        return ex

    def _to_listen(self, listen: _Listen, message: Message) -> None:
        on_message = listen.exchange.on_message
        if on_message is None or listen.exchange.cancelled:
            return
        params = message.get("params")
        params = dict(params) if isinstance(params, dict) else {}
        meta = params.get("_meta")
        params["_meta"] = {**(meta if isinstance(meta, dict) else {}), SUBSCRIPTION_ID: listen.exchange.upstream_id}
        on_message({**message, "params": params})

    def _subscribe(self, uris: frozenset[str]) -> None:
        for uri in uris:
            self._subscribed[uri] = self._subscribed.get(uri, 0) + 1
            if self._subscribed[uri] == 1:
                self._spawn(self._session_request("resources/subscribe", {"uri": uri}))

    def _unsubscribe(self, uris: frozenset[str]) -> None:
        for uri in uris:
            left = self._subscribed.get(uri, 0) - 1
            if left > 0:
                self._subscribed[uri] = left
                continue
            self._subscribed.pop(uri, None)
            self._spawn(self._session_request("resources/unsubscribe", {"uri": uri}))

    def _resubscribe(self) -> None:
        """The session was re-established (a respawned child, an expired HTTP session): the
        resources the listen streams name are subscribed on it again."""
        for uri in self._subscribed:
            self._spawn(self._session_request("resources/subscribe", {"uri": uri}))

    async def _session_request(self, method: str, params: dict[str, Any]) -> None:
        """A request of the bridge's own on the session (subscribe, unsubscribe): its failure is
        logged, the listen streams stay (they get what the session sends)."""
        try:
            ex = await self._inner.send_request(
                {"jsonrpc": "2.0", "id": self._inner.new_id(), "method": method, "params": params}
            )
            response = await asyncio.wait_for(ex.response, 30.0)
        except (UpstreamFailure, TimeoutError) as exc:
            log.info("bridged session: %s failed: %s", method, bounded(str(exc), 200))
            return
        if "error" in response:
            log.info("bridged session: %s refused: %s", method, bounded(str(response["error"]), 200))
