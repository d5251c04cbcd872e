"""`TokenBucket`: how many of something a peer can make the proxy do per second, with a burst.

Contract: `allow()` is true for `burst` calls at once, then for `rate` a second (refilled by the
monotonic clock, never above `burst`); what it refused since the last call it allowed is counted
in `dropped`, which the user reads and resets (`take_dropped`) to say so once logging resumes.
Used for the log lines a peer's traffic causes one by one: an upstream's messages
(`NoticeBudget`, proxy/upstream/base.py), a stdio child's output (`LineBudget`,
proxy/upstream/stdio/process.py) and uvicorn's per-request warnings (`WarningBudget`,
proxy/telemetry/logsetup.py). Not thread-safe: each is used from the event loop's thread (a
logging filter runs in the thread that logs, which for these loggers is that one).
"""

from __future__ import annotations

import time


class TokenBucket:
    __slots__ = ("at", "burst", "dropped", "rate", "tokens")

    def __init__(self, burst: float, rate: float) -> None:
        self.burst = float(burst)
        self.rate = rate
        self.tokens = self.burst
        self.at = time.monotonic()
        self.dropped = 0  # refused since the last `take_dropped`

    def allow(self) -> bool:
        """Take one token if there is one; else count the refusal."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            self.dropped += 1
            return False
        self.tokens -= 1.0
        return True

    def take_dropped(self) -> int:
        """How many were refused since the last call, and start counting again."""
        dropped, self.dropped = self.dropped, 0
        return dropped
