"""2026-07-28 requests spread over several children of a stdio command (`--stdio-modern-children N`).

A 2026-07-28 request carries everything it needs, so any child of a server that keeps no state
between requests in its process can answer it. By default (N = 1) one child serves them all, as
one process started by the client would: a server that keeps state in memory (a store its tools
write and read) sees every request. With N > 1 the operator says the server keeps no such state,
and the requests run on up to N children, so a server whose calls use its CPU, or block, is no
longer one process for every caller.

Contract:
- A request goes to the ready child (started, answered) with the fewest requests in flight,
  the first on a tie: at low concurrency every request goes to one child and no other is started.
- When every ready child has a request in flight, one more link's child is started in the
  background (one at a time, up to N); requests keep going to the ready children meanwhile, so
  none waits for a start. Before any child is ready, requests go to the first link (which starts
  its child, as the one 2026 link always did).
- A cancellation (`cancel`) reaches the child that runs the request; a client's notifications
  reach every running child (one 2026 client's notification concerns whichever child serves it
  next).
- Each link supervises its own child (respawn with crash backoff, stdio/link.py); the first link
  is the upstream's own 2026 link (its probe, health and catalog use it as before).
- A child beyond the first with nothing in flight and no request for the idle time
  (`--session-idle-timeout-s`) is stopped (`reap_idle`, from the service's idle reaper); the load
  starts it again when it comes back.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING

from proxy.jsonrpc import Message, RequestId
from proxy.upstream.base import Exchange, OnMessage, UpstreamFailure

if TYPE_CHECKING:
    from proxy.upstream.stdio.link import StdioLink

log = logging.getLogger("proxy.upstream.stdio")


class ModernPool:
    """An `UpstreamLink` over up to N 2026 links of one stdio command (the first given, the rest
    made with `make` when the load asks for them)."""

    def __init__(self, first: StdioLink, size: int, make: Callable[[], StdioLink]) -> None:
        self.era = first.era
        self.links: list[StdioLink] = [first]
        self.size = size
        self._make = make
        self._ids = itertools.count(1)
        self._unsolicited: OnMessage | None = None
        self._starting: asyncio.Task[None] | None = None
        self._closed = False
        self._used: dict[StdioLink, float] = {}  # when each link last got a request

    def new_id(self) -> RequestId:
        # Apart from each link's own ids (integers, for its probes): a request may go to any link.
        return f"m{next(self._ids)}"

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        self._unsolicited = handler
        for link in self.links:
            link.set_unsolicited_handler(handler)

    def _pick(self) -> StdioLink:
        best: StdioLink | None = None
        for link in self.links:
            if link.ready and (best is None or link.in_flight < best.in_flight):
                best = link
        if best is None:
            best = self.links[0]
        elif best.in_flight > 0:
            self._grow()
        self._used[best] = time.monotonic()
        return best

    def _grow(self) -> None:
        """Start one more child in the background when there is room and no start is under way."""
        if self._closed or (self._starting is not None and not self._starting.done()):
            return
        idle = next((link for link in self.links if link.child is None and not link.ready), None)
        if idle is None:
            if len(self.links) >= self.size:
                return
            idle = self._new_link()
            self.links.append(idle)
        self._used[idle] = time.monotonic()
        self._starting = asyncio.get_running_loop().create_task(self._start(idle))

    def _new_link(self) -> StdioLink:
        link = self._make()
        if self._unsolicited is not None:
            link.set_unsolicited_handler(self._unsolicited)
        return link

    def reap_idle(self, idle_s: float, stop: Callable[[Coroutine[object, None, object]], None]) -> int:
        """Stop the children beyond the first with nothing in flight and no request for `idle_s`
        (each link replaced by a fresh one, the old one closed through `stop`, which runs it in
        the background); returns how many were stopped."""
        now = time.monotonic()
        reaped = 0
        for i in range(len(self.links) - 1, 0, -1):
            link = self.links[i]
            if link.child is None or link.in_flight or now - self._used.get(link, 0.0) <= idle_s:
                continue
            if self._starting is not None and not self._starting.done():
                continue  # (this link may be the one starting)
            self.links[i] = self._new_link()
            self._used.pop(link, None)
            stop(link.aclose())
            reaped += 1
        if reaped:
            log.info("stopped %d 2026 upstream children unused for %g s", reaped, idle_s)
        return reaped

    async def _start(self, link: StdioLink) -> None:
        try:
            await link.start()
        except UpstreamFailure as failure:  # counted by the link (`lost`, health); the others serve on
            log.debug("another 2026 child could not start: %s", failure.detail[:200])

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        return await self._pick().send_request(message, on_message=on_message, headers=headers, on_write=on_write)

    def _owner(self, upstream_id: RequestId) -> StdioLink | None:
        """The link a request in flight was sent on (its pending table holds it until answered or
        cancelled; an awaiter's cancellation does not take it out)."""
        return next((link for link in self.links if link.holds(upstream_id)), None)

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        # (A client's cancellation does not come this way: the relay cancels the call, which
        # `cancel`s its exchange on the link that holds it.)
        for link in self.links:
            if link.child is not None:
                await link.send_notification(message, headers=headers)

    async def send_response(self, message: Message) -> None:
        # A 2026-07-28 server sends no request of its own; any answer goes where one would come from.
        await self.links[0].send_response(message)

    @property
    def starting(self) -> bool:
        """No child is ready: the next request starts the first link's (which bounds that start
        itself, so the relay does not count it against its request timer)."""
        return not any(link.ready for link in self.links)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        owner = self._owner(exchange.upstream_id)
        if owner is None:  # answered or failed already: nothing runs to be cancelled
            exchange.cancelled = True
            return
        await owner.cancel(exchange, reason)

    async def aclose(self) -> None:
        # A start under way is not cancelled (the process may exist already): its link, closed
        # here, stops the child it gets (`StdioLink._ensure_child`), and the upstream's own stop
        # waits for starts under way.
        self._closed = True
        for link in self.links:
            await link.aclose()
