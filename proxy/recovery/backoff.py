"""Backoff delays and the upstream's "wait this long" hints. Pure arithmetic; randomness is an argument.

Contract:
- `backoff_cap_s(backoff, retry_index)` = min(max_s, initial_s * multiplier ** retry_index), where
  `retry_index` is 0 for the first retry. It never overflows and never goes negative.
- `backoff_delay_s(backoff, retry_index, rand)`: full jitter, `rand() * cap` (AWS's "full jitter";
  `rand()` is clamped into [0, 1]); with `jitter: none`, the cap itself.
- `reconnect_delay_s(backoff, retry_index, cap_s, rand)`: the wait after the upstream could not be
  reached (`UNREACHABLE`: connection refused or reset, a process not running or dead in flight):
  `backoff.reconnect_s * multiplier ** retry_index`, capped by `cap_s`, with equal jitter (between
  half and all of it; `jitter: none`, all of it). Unlike full jitter it has a floor, so the
  retries reach across a restart of the upstream (2-5 s) instead of all landing within it.
- `parse_retry_after(value, now_epoch_s)`: an HTTP `Retry-After` (RFC 9110 §10.2.3) as seconds
  from now, never negative, never above `MAX_RETRY_AFTER_S` (a year), never an overflow:
  * delay-seconds, ASCII digits: that many seconds; a fraction (`1.5`) is read too, leniently
    (the RFC defines an integer). A value above the maximum (`99999999999999999999`) is the
    maximum: "not for a very long time", which the caller then refuses to wait for (it gives up
    when the wait exceeds `retry_after_cap_s` or the deadline) and reports as it is.
  * an HTTP-date (IMF-fixdate, or the obsolete RFC 850 and asctime forms; one without a zone is
    GMT, as every HTTP-date is): the seconds until then; a date already past gives 0.0 (the server
    says "now"); one beyond the maximum gives the maximum.
  * anything else gives None (the header is ignored): absent, empty, not a string, signed
    (`-5`, `+5`), an exponent or a unit (`1e3`, `5s`), `NaN`/`inf`, non-ASCII digits, a date
    that does not parse or whose year is out of range.
- `retry_after_ms_s(value)`: an upstream's `retryAfterMs` as seconds; None unless it is a finite,
  non-negative number. `is_negative_pushback(value)` says whether it is a negative number, which
  (as gRPC's negative pushback) means "do not retry".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

from proxy.policy.compiled import Backoff

# The transport failures that mean "the upstream is not there right now" (FailureKind values).
UNREACHABLE: frozenset[str] = frozenset({"connect_failed", "not_running", "spawn_failed", "closed"})
# The longest wait `parse_retry_after` reports: longer than any deadline or Retry-After cap, and
# small enough that it stays a finite float and its milliseconds fit the 64-bit integers JSON
# encoders write.
MAX_RETRY_AFTER_S: float = 365 * 24 * 3600.0
_DELTA_SECONDS = re.compile(r"([0-9]+)(?:\.[0-9]+)?")
_MAX_DIGITS = len(str(int(MAX_RETRY_AFTER_S)))  # an integer part longer than this is over the maximum


def backoff_cap_s(backoff: Backoff, retry_index: int) -> float:
    """The exponential ceiling of the delay before retry number `retry_index` (0-based)."""
    index = max(0, retry_index)
    try:
        grown = backoff.initial_s * backoff.multiplier**index
    except OverflowError:
        grown = math.inf
    if math.isnan(grown):
        grown = math.inf
    return max(0.0, min(backoff.max_s, grown))


def backoff_delay_s(backoff: Backoff, retry_index: int, rand: Callable[[], float]) -> float:
    """The delay before retry number `retry_index` (0-based): full jitter under the capped exponential."""
    return _jittered(backoff_cap_s(backoff, retry_index), floor=0.0, backoff=backoff, rand=rand)


def reconnect_delay_s(backoff: Backoff, retry_index: int, cap_s: float, rand: Callable[[], float]) -> float:
    """The delay before retry `retry_index` (0-based) after the upstream was unreachable."""
    step = Backoff(initial_s=backoff.reconnect_s, max_s=max(backoff.reconnect_s, cap_s), multiplier=backoff.multiplier)
    return _jittered(backoff_cap_s(step, retry_index), floor=0.5, backoff=backoff, rand=rand)


def _jittered(cap: float, *, floor: float, backoff: Backoff, rand: Callable[[], float]) -> float:
    """A random delay between `floor` x cap and cap (full jitter with floor 0; equal jitter with
    0.5); the cap itself with `jitter: none`. A random value outside [0, 1] is clamped."""
    if backoff.jitter == "none":
        return cap
    r = rand()
    if not math.isfinite(r):
        r = 1.0
    return cap * (floor + (1.0 - floor) * min(1.0, max(0.0, r)))


def parse_retry_after(value: str | None, now_epoch_s: float) -> float | None:
    """Seconds to wait from an HTTP Retry-After value (delay-seconds or HTTP-date), at most
    `MAX_RETRY_AFTER_S`; None if absent or unusable (see the module docstring)."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text:
        return None
    number = _DELTA_SECONDS.fullmatch(text)
    if number is not None:
        if len(number.group(1).lstrip("0")) > _MAX_DIGITS:
            return MAX_RETRY_AFTER_S
        return min(float(text), MAX_RETRY_AFTER_S)
    if text[0] in "+-" or text[0].isdigit():
        return None  # a negative, signed or malformed number, not a date
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime and "-0000" carry no zone: an HTTP-date is GMT
        when = when.replace(tzinfo=UTC)
    try:
        delta = when.timestamp() - now_epoch_s
    except (OverflowError, OSError, ValueError):
        return None
    if not math.isfinite(delta):
        return None
    return min(max(0.0, delta), MAX_RETRY_AFTER_S)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def retry_after_ms_s(value: Any) -> float | None:
    """An upstream's `retryAfterMs` in seconds, or None when it is absent, garbage or negative;
    never above `MAX_RETRY_AFTER_S`, as for `Retry-After` (a huge value would overflow the
    milliseconds the report echoes)."""
    if not _is_number(value) or value < 0:
        return None
    seconds = float(value) / 1000.0
    return seconds if seconds < MAX_RETRY_AFTER_S else MAX_RETRY_AFTER_S


def is_negative_pushback(value: Any) -> bool:
    """A negative `retryAfterMs`: the upstream asks not to be retried."""
    return _is_number(value) and value < 0
