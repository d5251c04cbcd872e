"""The link of a 2025 session while it is not known whether the upstream speaks the 2025
revisions: a stdio server whose `server/discover` names only 2026-07-28, which dual-era servers
(the SDK's) and servers of 2026-07-28 alone both do. Asking a process of its own at start-up
would cost every such upstream one more start; instead the first 2025 sessions find out.

Contract of `ProvingLink`: the session starts on the upstream's own legacy link and the client's
`initialize` goes there. A result settles it: the session stays native, and `on_verdict(True)`.
A refusal that means "not this revision" (-32022 unsupported protocol version, or -32601: the
server has no `initialize`) settles it the other way: the native link is closed, the session
continues on the era bridge (`make_bridge()`, proxy/upstream/bridge_legacy.py), which answers
that same `initialize` from the server's `server/discover`, and `on_verdict(False)`. Any other
answer (an error about the client's own request, a failure) reaches the client as it came and
settles nothing. So does a session on shared stdio children (`--stdio-sessions shared`), whose
`initialize` the proxy sent itself when it started them: where they refused it with one of those
codes, the native link fails with `FailureKind.PROTOCOL` (nothing dispatched) carrying the code
(`UpstreamFailure.refusal_code`), and the session moves onto the bridge the same way; any other
refusal reaches the client as the failure it is. Every other call goes to the link the session is on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import METHOD_NOT_FOUND, UNSUPPORTED_PROTOCOL_VERSION, Message, RequestId, bounded
from proxy.upstream.base import Era, Exchange, OnMessage, UpstreamLink

log = logging.getLogger("proxy.upstream.bridge")

NOT_THIS_REVISION: Final = frozenset({UNSUPPORTED_PROTOCOL_VERSION, METHOD_NOT_FOUND})


class ProvingLink:
    """A 2025 session's link that moves onto the era bridge when the upstream refuses the
    client's `initialize` as a 2026-only server does (see the module's contract)."""

    era = Era.LEGACY

    def __init__(
        self,
        native: UpstreamLink,
        make_bridge: Callable[[], Awaitable[UpstreamLink]],
        on_verdict: Callable[[bool], None],
    ) -> None:
        self._link = native
        self._make_bridge = make_bridge
        self._on_verdict = on_verdict
        self._unsolicited: OnMessage | None = None
        self._proving: set[asyncio.Task[None]] = set()

    def new_id(self) -> RequestId:
        return self._link.new_id()

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        self._unsolicited = handler
        self._link.set_unsolicited_handler(handler)

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        if message.get("method") != "initialize":
            return await self._link.send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        native = self._link
        try:
            ex = await native.send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        except UpstreamFailure as failure:
            if (
                failure.kind is not FailureKind.PROTOCOL
                or failure.dispatched is not Dispatch.NO
                or failure.refusal_code not in NOT_THIS_REVISION
            ):
                raise
            await self._onto_bridge(native, f"the shared children refused it: {bounded(failure.detail, 200)}")
            return await self._link.send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        outer = Exchange(ex.upstream_id, "initialize", on_message, asyncio.get_running_loop().create_future())
        outer.written = ex.written
        outer.transport_state = ex
        task = asyncio.ensure_future(self._prove(outer, ex, message, headers))
        self._proving.add(task)
        task.add_done_callback(self._proving.discard)
        return outer

    async def _prove(self, outer: Exchange, ex: Exchange, message: Message, headers: Mapping[str, str] | None) -> None:
        try:
            response = await asyncio.shield(ex.response)
            error = response.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            if "result" in response:
                self._on_verdict(True)
            elif code in NOT_THIS_REVISION:
                await self._onto_bridge(self._link, f"code {code}")
                bridged = await self._link.send_request(message, headers=headers)
                response = await bridged.response
        except BaseException as exc:  # the client's initialize fails as the link failed it
            if not outer.response.done():
                if isinstance(exc, asyncio.CancelledError):
                    outer.response.cancel()
                else:
                    outer.response.set_exception(untraced(exc))
                    outer.response.exception()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not outer.response.done():
            outer.response.set_result(response)

    async def _onto_bridge(self, native: UpstreamLink, why: str) -> None:
        """The upstream refused a 2025 `initialize`: the session continues on the bridge."""
        bridge = await self._make_bridge()
        self._link = bridge
        if self._unsolicited is not None:
            bridge.set_unsolicited_handler(self._unsolicited)
        await native.aclose()
        log.info("the upstream refused a 2025 initialize (%s): 2025 sessions go over the era bridge", why)
        self._on_verdict(False)

    @property
    def starting(self) -> bool:
        """Whether the link the session is on starts its upstream first and bounds that start
        itself (a stdio child's: proxy/upstream/stdio/link.py), so that the relay does not count
        the start, or the queue for it, against its request timer."""
        return bool(getattr(self._link, "starting", False))

    def pause_reading(self, paused: bool) -> None:
        """Backpressure from the session's client, passed to the link it is on where that link
        takes it (a stdio child's; the bridge's shared 2026 link never pauses for one caller)."""
        pause = getattr(self._link, "pause_reading", None)
        if pause is not None:
            pause(paused)

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        await self._link.send_notification(message, headers=headers)

    async def send_response(self, message: Message) -> None:
        await self._link.send_response(message)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        inner = exchange.transport_state if exchange.method == "initialize" else None
        await self._link.cancel(inner if isinstance(inner, Exchange) else exchange, reason)

    async def aclose(self) -> None:
        for task in list(self._proving):
            task.cancel()
        await self._link.aclose()
