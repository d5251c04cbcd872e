"""`--auth passthrough`: what vouching for a credential on a 2025 session may cost the upstream.

The proxy serves some acts on a session itself (its listen stream, a resumed answer, DELETE, a
cancellation, an answer to the server's request) and asks the upstream, with a `ping` on the
session carrying the caller's credential, whether that credential holds the session
(`Relay.vouch`). A caller who knows a session id could otherwise turn every request with a
made-up token into an upstream `ping`. One `VouchGate` per session bounds that:

- A refusal (`AuthRefused`: the upstream's 404, 401 or 403 to the ping) is remembered for
  `REFUSED_TTL_S` under the caller's principal id (`passthrough:<HMAC of the Authorization
  value>`, `anonymous` without one: a keyed hash, never the credential), at most `REFUSED_KEEP`
  of them (the oldest forgotten first). A repeat within that time gets the same refusal without
  a ping.
- While one ping for a principal is in flight, other acts of the same principal wait for its
  verdict (bounded by the ping's own timeout) instead of asking again.
- Pings are a token bucket per session: `burst` at once, then `per_s` a second. Beyond it
  `take` says how long until the next one may go; the frontend answers 429 with `Retry-After`.
- The credential the upstream last accepted on the session never reaches the gate (the relay
  passes it at once), so the owner's own acts cost nothing and are never limited.

Everything here runs on the event loop's thread; nothing blocks. `clock` is injectable for the
unit tests (no sleeping).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from proxy.auth.base import AuthRefused
from proxy.settings import Settings

REFUSED_TTL_S = 30.0
REFUSED_KEEP = 64
# The defaults of --vouch-pings-burst (5) and --vouch-pings-per-s (1): an owner refreshing a
# token, or a second client of the same user, needs one ping now and then; only a spray needs more.
BURST: int = Settings.model_fields["vouch_pings_burst"].default
PER_S: float = Settings.model_fields["vouch_pings_per_s"].default


class VouchLimited(Exception):
    """No ping may go to the upstream for this session now; one may in `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"retry after {retry_after_s:.3f} s")
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, at least 1 (RFC 9110 `Retry-After` takes no fraction)."""
        return str(max(1, math.ceil(self.retry_after_s)))


def fresh(refusal: AuthRefused) -> AuthRefused:
    """A new exception with the refusal's fields: one remembered, or shared between waiters, is
    raised many times, and re-raising one instance chains every raise's frames onto it."""
    return AuthRefused(
        refusal.status,
        refusal.reason,
        refusal.description,
        error=refusal.error,
        scope=refusal.scope,
        challenge=refusal.challenge,
        retry_after_s=refusal.retry_after_s,
    )


class VouchGate:
    __slots__ = ("_at", "_clock", "_refused", "_tokens", "burst", "pending", "per_s")

    def __init__(self, burst: int = BURST, per_s: float = PER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = float(burst)
        self.per_s = per_s
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()
        # principal id -> (the refusal, when it is forgotten)
        self._refused: OrderedDict[str, tuple[AuthRefused, float]] = OrderedDict()
        # principal id -> the verdict of its ping in flight: True it passed, the refusal, or False
        # (no verdict: the ping failed or was cancelled; a waiter asks itself)
        self.pending: dict[str, asyncio.Future[AuthRefused | bool]] = {}

    def refused(self, key: str) -> AuthRefused | None:
        """The upstream's refusal of this principal on the session, if still remembered."""
        entry = self._refused.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._refused[key]
            return None
        return fresh(entry[0])

    def remember(self, key: str, refusal: AuthRefused) -> None:
        self._refused.pop(key, None)
        self._refused[key] = (fresh(refusal), self._clock() + REFUSED_TTL_S)
        while len(self._refused) > REFUSED_KEEP:
            self._refused.popitem(last=False)

    def forget(self, key: str) -> None:
        """The upstream accepted this principal on the session: nothing to remember against it."""
        self._refused.pop(key, None)

    def take(self) -> float:
        """0.0 when a ping may go now (and counts it), else the seconds until one may."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.per_s

    async def ask(self, key: str, ping: Callable[[], Awaitable[None]], loop: asyncio.AbstractEventLoop) -> None:
        """Vouch for principal `key` with `ping` (raising `AuthRefused` when the upstream refuses),
        within this gate: a remembered refusal is raised again without a ping, a ping already in
        flight for the same principal is waited for, and beyond the ping budget `VouchLimited` is
        raised."""
        for _ in range(2):  # a ping in flight that ended without a verdict: ask once more
            remembered = self.refused(key)
            if remembered is not None:
                raise remembered
            pending = self.pending.get(key)
            if pending is None:
                break
            verdict = await asyncio.shield(pending)
            if verdict is True:
                return
            if isinstance(verdict, AuthRefused):
                raise fresh(verdict)
        wait_s = self.take()
        if wait_s > 0.0:
            raise VouchLimited(wait_s)
        mine: asyncio.Future[AuthRefused | bool] = loop.create_future()
        self.pending[key] = mine
        outcome: AuthRefused | bool = False
        try:
            await ping()
            outcome = True
            self.forget(key)
        except AuthRefused as refusal:
            outcome = fresh(refusal)
            self.remember(key, refusal)
            raise
        finally:
            if self.pending.get(key) is mine:
                del self.pending[key]
            mine.set_result(outcome)
