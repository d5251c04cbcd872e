"""`--stdio-sessions shared`: every 2025 session served by one shared stdio child, for servers that
keep no state per session (docs/reliability.md, "Sessions").

Without it each 2025 session starts its own server process, and a session per call pays a process
start per call. Here one child (started and supervised like any other: respawned after a crash,
its handshake replayed) serves every session:

- The proxy initializes the child once, with its own `initialize` (`notifications/initialized`
  follows), and answers each session's `initialize` itself from that cached result: the session's
  requested revision when it is one of the 2025 revisions (the child itself speaks the latest),
  the child's capabilities without the ones that are per session (`logging`, and `subscribe` of
  `resources`), since one child cannot keep them apart for several clients.
- Request ids and progress tokens are the shared link's own (each session's relay maps them back,
  as on the shared 2026 link), so sessions never see each other's answers or progress.
- What the child sends that cannot be tied to one request (a log line, a server-to-client
  request, a notification without a progress token) reaches no session: it is dropped and counted
  (`mcp_recovery_dropped_messages_total{reason="untied"}`), and a dropped server request is
  answered with an error so the child does not wait for it: the rule of the shared 2026 link
  (docs/security.md, "Isolation").
- Refused per session, with a JSON-RPC error (-32601) that says why: `logging/setLevel` (one level
  would apply to every session) and `resources/subscribe` / `resources/unsubscribe` (updates could
  not be routed to the subscribing session). A session's own notifications other than
  cancellation (`notifications/initialized`, `notifications/roots/list_changed`) are not passed on:
  the child was initialized by the proxy, and a roots request from it could not be tied to one
  session anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import INTERNAL_ERROR, LEGACY_VERSIONS, METHOD_NOT_FOUND, Message, RequestId, error, valid_id
from proxy.telemetry.shed import SHED
from proxy.upstream.base import Era, Exchange, OnMessage, initialize_request

if TYPE_CHECKING:
    from proxy.upstream.stdio import StdioLink, StdioUpstream

log = logging.getLogger("proxy.upstream.stdio_shared")

# Per-session state one child cannot keep apart for several sessions: refused (module docstring).
REFUSED = {
    "logging/setLevel": "log levels are per session, and this proxy serves every session from one shared server",
    "resources/subscribe": "subscriptions are per session, and this proxy serves every session from one shared server",
    "resources/unsubscribe": "subscriptions are per session, and this proxy serves every session from one shared"
    " server",
}


class SharedSessions:
    """The one shared legacy link and the cached answer to its `initialize`."""

    def __init__(self, upstream: StdioUpstream) -> None:
        from proxy.upstream.stdio import StdioLink

        self.upstream = upstream
        self.link: StdioLink = StdioLink(upstream, Era.LEGACY, takes_spare=False)
        self.link.set_unsolicited_handler(self._untied)
        self._initialized: dict[str, Any] | None = None
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    def session(self) -> SessionLink:
        return SessionLink(self)

    async def initialize_result(self) -> dict[str, Any]:
        """The child's answer to the proxy's own `initialize` (asked once; a respawned child gets
        it replayed by the link)."""
        if self._initialized is not None:
            return self._initialized
        async with self._lock:
            if self._initialized is None:
                link = self.link
                ex = await link.send_request(initialize_request(link.new_id()))
                try:
                    response = await asyncio.wait_for(ex.response, self.upstream.handshake_timeout_s)
                except TimeoutError:
                    await link.cancel(ex)
                    raise UpstreamFailure(
                        FailureKind.TIMEOUT, Dispatch.NO, "the shared upstream process did not answer initialize"
                    ) from None
                result = response.get("result")
                if not isinstance(result, dict):
                    raise UpstreamFailure(
                        FailureKind.PROTOCOL, Dispatch.NO, "the shared upstream process refused initialize"
                    )
                await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
                self._initialized = result
        return self._initialized

    def _untied(self, message: Message) -> None:
        """Whatever the child sends that no request of a session is waiting for."""
        method = message.get("method")
        if method is None:
            return  # a late response to a cancelled attempt
        SHED.count("dropped_messages", "untied")
        if "id" in message and valid_id(message["id"]):
            answer = error(message["id"], INTERNAL_ERROR, "the proxy cannot tie this request to one client")
            task = asyncio.get_running_loop().create_task(self.link.send_response(answer))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        await self.link.aclose()


class SessionLink:
    """One 2025 session's view of the shared link: what `Relay` needs of an `UpstreamLink`."""

    era = Era.LEGACY
    shared = True  # the session's relay drops what cannot be tied to one of its requests

    def __init__(self, sessions: SharedSessions) -> None:
        self._sessions = sessions
        self._link = sessions.link
        self._loop: asyncio.AbstractEventLoop | None = None

    def new_id(self) -> RequestId:
        return self._link.new_id()

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        return None  # nothing unsolicited is ever this session's (module docstring)

    @property
    def in_flight(self) -> int:
        return self._link.in_flight

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        method = message.get("method", "")
        if method == "initialize":
            return self._answered(message, {"result": self._session_initialize(message, await self._cached())})
        why = REFUSED.get(method)
        if why is not None:
            return self._answered(message, {"error": error(None, METHOD_NOT_FOUND, f"{method}: {why}")["error"]})
        return await self._link.send_request(message, on_message=on_message, headers=headers)

    async def _cached(self) -> dict[str, Any]:
        return await self._sessions.initialize_result()

    def _session_initialize(self, message: Message, cached: dict[str, Any]) -> dict[str, Any]:
        params = message.get("params")
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        result = dict(cached)
        if isinstance(asked, str) and asked in LEGACY_VERSIONS:
            result["protocolVersion"] = asked
        capabilities = result.get("capabilities")
        if isinstance(capabilities, dict):
            capabilities = {k: v for k, v in capabilities.items() if k != "logging"}
            resources = capabilities.get("resources")
            if isinstance(resources, dict) and "subscribe" in resources:
                capabilities["resources"] = {k: v for k, v in resources.items() if k != "subscribe"}
            result["capabilities"] = capabilities
        return result

    def _answered(self, message: Message, body: dict[str, Any]) -> Exchange:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        ex = Exchange(message["id"], message.get("method", ""), None, loop.create_future(), written=True)
        ex.response.set_result({"jsonrpc": "2.0", "id": message["id"], **body})
        return ex

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        if message.get("method") == "notifications/cancelled":
            await self._link.send_notification(message)
        # anything else a session notifies is not passed on (module docstring)

    async def send_response(self, message: Message) -> None:
        await self._link.send_response(message)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        if exchange.response.done() and exchange.on_message is None and exchange.method in ("initialize", *REFUSED):
            return  # answered by the proxy itself: nothing upstream to cancel
        await self._link.cancel(exchange, reason)

    async def aclose(self) -> None:
        return None  # the shared child serves the other sessions; the relay cancelled this one's requests
