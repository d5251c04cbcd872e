"""Admission of upstream requests: in-flight slots per session (or caller) and per client across sessions.

Contract:
- `Slots(limit, max_waiters=None)`: at most `limit` holders at once; the rest wait in arrival
  order (a slot passes straight from the one who frees it to the next waiter). Cancel-safe: a
  waiter cancelled after a slot was handed to it passes the slot on. With `max_waiters`, a taker
  that would make the queue longer than that is refused at once (`SharesFull`), so what waits is
  bounded too. `force_take` takes a slot even past the limit (a holder that must not wait: it lowers
  what the others may take, never blocks).
- `ClientShares(limit)`: one `Slots` per client key, shared by every relay of one upstream (every
  2025 session of the client and its 2026 requests), so one client's share of the upstream's
  concurrency is bounded in total however many sessions it opens. Idle entries are forgotten once
  there are many, so the map is bounded by the clients active at once.
- `Admission`: one relay's limits. `ticket(outbox)` says what a request of that outbox must hold
  upstream: a slot of its session's (or, on the shared 2026 relay, its caller's) `max_in_flight`,
  then a slot of its client's share; `async with ticket:` takes them (waiting in turn) and gives
  back exactly what was taken, whatever ends the request. A client whose share is in use and whose
  queue is full is refused at once (`ticket` raises an `OVERLOADED` failure that was not sent,
  counted as `mcp_recovery_http_refused_total{reason="upstream_share"}`).

No I/O, no locks: everything runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.telemetry.shed import SHED


class SharesFull(Exception):
    """A taker found the queue of waiters at its bound."""


class Slots:
    __slots__ = ("held", "limit", "max_waiters", "waiters")

    def __init__(self, limit: int, max_waiters: int | None = None) -> None:
        self.limit = limit
        self.max_waiters = max_waiters
        self.held = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        if self.held < self.limit and not self.waiters:
            self.held += 1
            return True
        return False

    def force_take(self) -> None:
        self.held += 1

    async def take(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.max_waiters is not None and len(self.waiters) >= self.max_waiters:
            raise SharesFull
        waiter: asyncio.Future[None] = loop.create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give_back()
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            raise

    def give_back(self) -> None:
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                if self.held <= self.limit:
                    waiter.set_result(None)  # the slot passes on: `held` stays
                    return
                waiters.appendleft(waiter)  # forced holders took it past the limit: not yet
                break
        self.held -= 1

    @property
    def idle(self) -> bool:
        return self.held == 0 and not self.waiters


class ClientShares:
    """Per-client `Slots` of `limit` (and as many waiting), across every relay of one upstream."""

    FORGET_ABOVE = 256

    __slots__ = ("by_client", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.by_client: dict[Any, Slots] = {}

    def of(self, client: Any) -> Slots:
        slots = self.by_client.get(client)
        if slots is None:
            if len(self.by_client) >= self.FORGET_ABOVE:
                self.forget_idle()
            slots = self.by_client[client] = Slots(self.limit, max_waiters=self.limit)
        return slots

    def forget_idle(self) -> None:
        for key, slots in list(self.by_client.items()):
            if slots.idle:
                del self.by_client[key]


class Admission:
    """One relay's in-flight limits: `max_in_flight` per caller (None: the session itself) and,
    with `shares`, the client's share of the upstream (`client` for a 2025 session; on the shared
    relay each request's caller, noted with `note_caller`)."""

    __slots__ = ("caller_of", "client", "max_in_flight", "shares", "slots")

    # Idle per-caller entries are forgotten once there are more than this.
    FORGET_ABOVE = 64

    def __init__(self, max_in_flight: int | None, shares: ClientShares | None, client: Any) -> None:
        self.max_in_flight = max_in_flight
        self.shares = shares
        self.client = client
        self.slots: dict[Any, Slots] = {}
        self.caller_of: dict[Any, Any] = {}  # the shared relay: which caller an outbox serves

    @property
    def limited(self) -> bool:
        return self.max_in_flight is not None or self.shares is not None

    def note_caller(self, outbox: Any, caller: Any) -> None:
        self.caller_of[outbox] = caller

    def forget_caller(self, outbox: Any) -> None:
        self.caller_of.pop(outbox, None)

    def ticket(self, outbox: Any, loop: asyncio.AbstractEventLoop) -> Ticket:
        """What a request of `outbox` must hold; slots free now are taken at once. Raises the
        refusal when the client's share and its queue are full."""
        slots: Slots | None = None
        waiting = False
        if self.max_in_flight is not None:
            key = self.caller_of.get(outbox)
            slots = self.slots.get(key)
            if slots is None:
                slots = self.slots[key] = Slots(self.max_in_flight)
            waiting = not slots.try_take()
        share: Slots | None = None
        share_waiting = False
        if self.shares is not None:
            client = self.client if self.client is not None else self.caller_of.get(outbox)
            if client is not None:
                share = self.shares.of(client)
                # Taken once the session's own slot is (a request waiting for that one must not
                # hold a connection of the client's share meanwhile).
                share_waiting = waiting or not share.try_take()
                if not waiting and share_waiting and len(share.waiters) >= self.shares.limit:
                    if slots is not None:
                        self.free(slots)
                    raise self.refused()
        return Ticket(self, loop, slots, waiting, share, share_waiting)

    def free(self, slots: Slots) -> None:
        slots.give_back()
        if slots.idle and len(self.slots) > self.FORGET_ABOVE:  # bounded: forget idle callers once there are many
            for key, entry in list(self.slots.items()):
                if entry.idle:
                    del self.slots[key]

    def refused(self) -> UpstreamFailure:
        """A client with its whole share of the upstream in flight and as many requests waiting:
        refused at once, before anything was sent (counted)."""
        SHED.count("http_refused", "upstream_share")
        assert self.shares is not None
        limit = self.shares.limit
        return UpstreamFailure(
            FailureKind.OVERLOADED,
            Dispatch.NO,
            f"this client has its share of the upstream in use ({limit} requests in flight and {limit} waiting)",
        )


class Ticket:
    """The slots one request holds: `async with ticket:` waits for those not yet taken (waiting
    counts against whatever timer the caller runs) and gives back, on the way out, exactly the
    ones it took."""

    __slots__ = ("admission", "loop", "share", "share_waiting", "slots", "waiting")

    def __init__(
        self,
        admission: Admission,
        loop: asyncio.AbstractEventLoop,
        slots: Slots | None,
        waiting: bool,
        share: Slots | None,
        share_waiting: bool,
    ) -> None:
        self.admission = admission
        self.loop = loop
        self.slots = slots
        self.waiting = waiting  # for `slots`; once taken, given back at the end
        self.share = share
        self.share_waiting = share_waiting

    async def __aenter__(self) -> Ticket:
        try:
            if self.waiting:
                assert self.slots is not None
                await self.slots.take(self.loop)
                self.waiting = False
            if self.share_waiting:
                share = self.share
                assert share is not None
                if not share.try_take():
                    try:
                        await share.take(self.loop)
                    except SharesFull:
                        raise self.admission.refused() from None
                self.share_waiting = False
        except BaseException:
            self.release()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        if self.slots is not None and not self.waiting:
            self.admission.free(self.slots)
            self.slots = None
        if self.share is not None and not self.share_waiting:
            self.share.give_back()
            self.share = None
