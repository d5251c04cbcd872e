"""`SessionLink`: one 2025 session's view of the shared children (`--stdio-sessions shared`,
shared.py): what `Relay` needs of an `UpstreamLink`.

- Each request is placed on a child (`SharedSessions.place`) under the proxy's own request id, and
  counted in flight there until it is answered, so that what a child sends without naming a
  request can be tied to this session.
- `initialize` is answered by the proxy from the children's first answer (with the session's
  requested revision when it is a 2025 one); `logging/setLevel`, `resources/subscribe` and
  `resources/unsubscribe` are answered by the proxy when the children offer them (shared.py).
- A child's request tied to this session reaches the client under a key of the proxy's (two
  children may use the same id); the client's answer goes back to that child under its own id.
  At most `SERVER_REQUESTS_KEPT` unanswered ones are remembered (then the oldest go).
- Of the session's notifications only cancellations are passed on, to the child the request is on.
- `aclose` leaves the shared children (`SharedSessions.leave`); they serve the other sessions.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from proxy.jsonrpc import LEGACY_VERSIONS, Message, RequestId, valid_id
from proxy.upstream.base import Era, Exchange, OnMessage
from proxy.upstream.stdio.shared import LEVELS, RANK, SharedChild, SharedSessions, subscribe_request

log = logging.getLogger("proxy.upstream.stdio_shared")

SERVER_REQUESTS_KEPT = 1024  # unanswered server requests remembered per session (then the oldest go)


class SessionLink:
    """One 2025 session's view of the shared children: what `Relay` needs of an `UpstreamLink`."""

    era = Era.LEGACY

    def __init__(self, sessions: SharedSessions) -> None:
        self._sessions = sessions
        self.home = home = sessions.home_for_session()
        self._handler: OnMessage = lambda m: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked: dict[str, tuple[SharedChild, RequestId]] = {}  # server requests, by our key
        self._keys = itertools.count(1)
        self._flying: dict[RequestId, SharedChild] = {}
        home.homed.add(self)

    def new_id(self) -> RequestId:
        return self._sessions.new_id()

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        self._handler = handler

    @property
    def in_flight(self) -> int:
        return len(self._flying)

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        method = message.get("method", "")
        if method == "initialize":
            return self._answered(message, {"result": self._session_initialize(message, await self._cached())})
        if method == "logging/setLevel" and self._offers("logging"):
            return self._answered(message, await self._sessions.set_level(self, message))
        if method in ("resources/subscribe", "resources/unsubscribe") and self._offers("subscribe"):
            return self._answered(message, await self._subscription(method, message))
        child = self._sessions.place(self)
        busy = child.busy
        busy[self] = busy.get(self, 0) + 1  # before any wait: the next placement sees it
        try:
            await child.ready()
            # a request cancelled after the child's link wrote it is cancelled by that link
            ex = await child.link.send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        except BaseException:
            self._done(child)
            raise
        ex.transport_state = child
        uid = ex.upstream_id
        self._flying[uid] = child
        ex.response.add_done_callback(lambda _: self._finished(uid, child))
        return ex

    def _finished(self, uid: RequestId, child: SharedChild) -> None:
        self._flying.pop(uid, None)
        self._done(child)

    def _done(self, child: SharedChild) -> None:
        n = child.busy.get(self, 0) - 1
        if n > 0:
            child.busy[self] = n
        else:
            child.busy.pop(self, None)
            child.used_at = time.monotonic()

    def _offers(self, what: str) -> bool:
        """Whether the children said they support it (else the request goes to a child, whose
        own refusal the session gets)."""
        capabilities = (self._sessions.initialize_answer or {}).get("capabilities")
        if not isinstance(capabilities, dict):
            return False
        if what == "logging":
            return "logging" in capabilities
        resources = capabilities.get("resources")
        return isinstance(resources, dict) and bool(resources.get("subscribe"))

    async def _subscription(self, method: str, message: Message) -> dict[str, Any]:
        params = message.get("params")
        uri = params.get("uri") if isinstance(params, dict) else None
        if not isinstance(uri, str):
            return {"error": {"code": -32602, "message": "a resource uri (string) is required"}}
        home = self.home
        await home.ready()
        sessions = home.subscriptions.get(uri)
        if method == "resources/subscribe":
            if sessions:
                sessions.add(self)
                return {"result": {}}
            # (a respawn meanwhile replays the table, this uri included once it is in it)
            response = await home.ask(subscribe_request(method, uri))
            if "error" not in response:
                home.subscriptions.setdefault(uri, set()).add(self)
            return {k: v for k, v in response.items() if k in ("result", "error")}
        if not sessions or self not in sessions:
            return {"result": {}}  # not subscribed: nothing to undo
        sessions.discard(self)
        if sessions:
            return {"result": {}}
        del home.subscriptions[uri]
        response = await home.ask(subscribe_request(method, uri))
        return {k: v for k, v in response.items() if k in ("result", "error")}

    async def _cached(self) -> dict[str, Any]:
        return await self._sessions.initialize_result()

    def _session_initialize(self, message: Message, cached: dict[str, Any]) -> dict[str, Any]:
        params = message.get("params")
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        result = dict(cached)
        if isinstance(asked, str) and asked in LEGACY_VERSIONS:
            result["protocolVersion"] = asked
        return result

    def _answered(self, message: Message, body: dict[str, Any]) -> Exchange:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        ex = Exchange(message["id"], message.get("method", ""), None, loop.create_future(), written=True)
        ex.response.set_result({"jsonrpc": "2.0", "id": message["id"], **body})
        return ex

    # -- from the children ----------------------------------------------------------------------
    def wants(self, message: Message) -> bool:
        level = self._sessions.levels.get(self)
        if level is None:
            return True
        params = message.get("params")
        said = params.get("level") if isinstance(params, dict) else None
        return RANK.get(said, len(LEVELS)) >= RANK[level] if isinstance(said, str) else True

    def deliver(self, message: Message) -> None:
        self._handler(message)

    def server_request(self, child: SharedChild, message: Message) -> None:
        """A child's request tied to this session: under a key of ours (two children may use the
        same id), answered back to that child under its own id."""
        key = f"c{child.index}-{next(self._keys)}"
        asked = self._asked
        if len(asked) >= SERVER_REQUESTS_KEPT:
            old_child, old_id = asked.pop(next(iter(asked)))
            self._sessions.server_requests.pop((old_child.index, old_id), None)
        asked[key] = (child, message["id"])
        self._sessions.server_requests[(child.index, message["id"])] = (self, key)
        self._handler({**message, "id": key})

    def server_request_cancelled(self, child: SharedChild, rid: RequestId, key: str, message: Message) -> None:
        self._asked.pop(key, None)
        self._sessions.server_requests.pop((child.index, rid), None)
        params = message["params"]
        self._handler({**message, "params": {**params, "requestId": key}})

    # -- to the children ------------------------------------------------------------------------
    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        if message.get("method") != "notifications/cancelled":
            return  # anything else a session notifies is not passed on (module docstring)
        params = message.get("params")
        rid = params.get("requestId") if isinstance(params, dict) else None
        child = self._flying.get(rid) if valid_id(rid) else None
        if child is not None:
            await child.link.send_notification(message)

    async def send_response(self, message: Message) -> None:
        key = message.get("id")
        asked = self._asked.pop(key, None) if isinstance(key, str) else None
        if asked is None:
            log.info("dropped a client response for an unknown server request")
            return
        child, rid = asked
        self._sessions.server_requests.pop((child.index, rid), None)
        await child.link.send_response({**message, "id": rid})

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        child = exchange.transport_state
        if isinstance(child, SharedChild):
            await child.link.cancel(exchange, reason)
        # else: answered by the proxy itself, nothing upstream to cancel

    async def aclose(self) -> None:
        # the children serve the other sessions; the relay cancelled this one's requests
        await self._sessions.leave(self)
