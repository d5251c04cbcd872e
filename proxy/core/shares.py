"""Shares of a bounded resource: in-flight slots, per session and per client across sessions.

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

No I/O, no locks: everything runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any


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
