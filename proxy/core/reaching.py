"""The way a 2026 `tools/call` reaches the engine while the upstream cannot be reached.

The 2026 relay exists once the upstream answered a probe. Before that (the upstream not started
yet, crash-looping, refusing connections, a probe timed out), a tool call must still get the
recovery contract's answer: its attempts classified (transient, not dispatched), retried within
its budget, and the unresolved report if the upstream stays away. No transport layer answers a
tool call on its own (an HTTP 503 with a bare -32603 is no answer a model can act on).

Contract:
- `ReachingLink` is an `UpstreamLink` for the 2026 era whose every request first reaches the
  upstream: `reach()` (the service's `modern_relay`, which probes the upstream once more) either
  gives the real 2026 relay, whose link then takes the request, or raises the `UpstreamFailure`
  that says why not (not dispatched). A reached upstream without the 2026 revision is a failure
  too (as the upstream's own 400 would be: validation, not dispatched): the answer says so.
- One reach at a time, shared by the calls that wait for it, never cancelled by one of them
  (an attempt's timer stops its own wait, not the service's probe).
- Cancelling an exchange cancels it on the link that took it; `on_write` is the real link's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message, RequestId
from proxy.upstream.base import Era, Exchange, OnMessage, UpstreamLink

if TYPE_CHECKING:
    from proxy.core.relay import Relay


class ReachingLink:
    era = Era.MODERN

    def __init__(self, reach: Callable[[], Awaitable[Relay | None]]) -> None:
        self._reach = reach
        self._task: asyncio.Task[UpstreamLink] | None = None
        self._ids = itertools.count(1)
        self._taken: dict[RequestId, UpstreamLink] = {}  # exchanges in flight: the link that took each

    def new_id(self) -> RequestId:
        return f"reaching-{next(self._ids)}"  # never one the real link hands out itself

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        pass  # the real relay receives the upstream's own messages

    async def _reached(self) -> UpstreamLink:
        relay = await self._reach()
        if relay is None:
            # what a 2025-only server answers a 2026 request: refused before processing
            raise UpstreamFailure(
                FailureKind.HTTP_STATUS,
                Dispatch.NO,
                "the upstream does not speak the 2026-07-28 revision",
                http_status=400,
            )
        return relay.link

    async def link(self) -> UpstreamLink:
        task = self._task
        if task is None or task.done():
            task = self._task = asyncio.get_running_loop().create_task(self._reached())
            task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        link = await self.link()
        # cancelled after the real link wrote the request: that link cancels it upstream itself
        exchange = await link.send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        self._taken[exchange.upstream_id] = link
        # answered: nothing left to cancel (a cancelled one waits for `cancel`, which pops it)
        exchange.response.add_done_callback(
            lambda done: None if done.cancelled() else self._taken.pop(exchange.upstream_id, None)
        )
        return exchange

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        link = self._taken.pop(exchange.upstream_id, None)
        if link is not None:
            await link.cancel(exchange, reason)

    async def send_notification(self, message: Message, *, headers: Any = None) -> None:
        await (await self.link()).send_notification(message, headers=headers)

    async def send_response(self, message: Message) -> None:
        await (await self.link()).send_response(message)

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # seen, also when every waiter stopped waiting
