"""Operation budgets across calls: one budget per operation, never silently reset (docs/recovery.md, "Ledger").

Contract:
- `operation_digest(...)` identifies an operation: SHA-256 (hex) over the canonical JSON (sorted
  keys, `separators=(",", ":")`, `ensure_ascii=False`, UTF-8) of `{"upstream", "tool",
  "arguments"}` plus `"caller"` when a caller identity is given. The proxy-added idempotency key
  (an argument named by the policy) is left out, so every attempt and every identical call share
  one digest; only a top-level argument of that name is removed.
- `Ledger` is a synchronous Protocol, and the engine calls it directly on the event loop; the
  in-memory implementation does no I/O, so that is cheap. With a shared store (proxy/state,
  docs/state.md) an `InMemoryLedger` is the store's local view, kept current from the store; the
  asynchronous `SharedState` does what needs the store (approvals, records, clears).
- Time is an argument: every method takes `now_s` (a monotonic or epoch clock, but one clock per
  ledger). `InMemoryLedger(clock)` accepts a clock used only when `now_s` is omitted.
- `check` returns the live entry of an exhausted operation, `approve` opens one fresh budget for
  an approval naming that entry's `budget_id` (single use: a second use is refused, and so is an
  approval naming any other budget), `clear` forgets an operation that later succeeded.
- Entries expire after their window; the store keeps at most `max_entries` (oldest evicted).
- `InMemoryLedger.entries(now_s, limit=)` lists the live entries for the status page (not part
  of the Protocol: a ledger without it shows none there).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

from proxy.recovery.reasons import StopReason

DEFAULT_MAX_ENTRIES = 10_000


def canonical_json(value: Any) -> str:
    """The canonical JSON text the digest is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def operation_digest(
    tool: str,
    arguments: Mapping[str, Any] | None,
    idempotency_key_name: str | None = None,
    caller: str | None = None,
    *,
    upstream: str = "",
) -> str:
    """SHA-256 hex digest of (upstream, tool, arguments minus the proxy's idempotency key[, caller])."""
    args = dict(arguments or {})
    if idempotency_key_name is not None:
        args.pop(idempotency_key_name, None)
    subject: dict[str, Any] = {"upstream": upstream, "tool": tool, "arguments": args}
    if caller is not None:
        subject["caller"] = caller
    return hashlib.sha256(canonical_json(subject).encode("utf-8")).hexdigest()


def new_budget_id(rand_bytes: bytes) -> str:
    """A short URL-safe budget id from random bytes (the engine passes `os.urandom(9)`: 12 chars)."""
    if len(rand_bytes) < 6:
        raise ValueError("a budget id needs at least 6 random bytes")
    return base64.urlsafe_b64encode(rand_bytes).decode("ascii").rstrip("=")


@dataclass(frozen=True, slots=True)
class ExhaustedEntry:
    """An operation whose budget ran out, and what the earlier call reported."""

    op: str
    budget_id: str
    reason: StopReason
    recorded_at_s: float
    expires_at_s: float
    summary: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    approved: bool = False  # the single approval of this budget has been used

    def retry_after_s(self, now_s: float) -> float:
        return max(0.0, self.expires_at_s - now_s)


class Ledger(Protocol):
    def record_exhausted(
        self,
        op: str,
        budget_id: str,
        reason: StopReason,
        window_s: float,
        now_s: float | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> ExhaustedEntry: ...

    def check(self, op: str, now_s: float | None = None) -> ExhaustedEntry | None: ...

    def approve(self, op: str, budget_id: str, now_s: float | None = None) -> bool: ...

    def clear(self, op: str) -> None: ...


class InMemoryLedger:
    """The default ledger: a bounded, insertion-ordered map of exhausted operations."""

    def __init__(self, clock: Callable[[], float] | None = None, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._clock = clock
        self._max = max_entries
        self._entries: OrderedDict[str, ExhaustedEntry] = OrderedDict()
        # The entry count as a C-level callable: the engine asks "is it empty?" on every call, and
        # `__len__` is a Python frame.
        self.size: Callable[[], int] = self._entries.__len__

    def __len__(self) -> int:
        return len(self._entries)

    def _now(self, now_s: float | None) -> float:
        if now_s is not None:
            return now_s
        if self._clock is None:
            raise ValueError("InMemoryLedger needs now_s or a clock")
        return self._clock()

    def _live(self, op: str, now_s: float) -> ExhaustedEntry | None:
        entry = self._entries.get(op)
        if entry is None:
            return None
        if now_s >= entry.expires_at_s:
            del self._entries[op]
            return None
        return entry

    def record_exhausted(
        self,
        op: str,
        budget_id: str,
        reason: StopReason,
        window_s: float,
        now_s: float | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> ExhaustedEntry:
        now = self._now(now_s)
        entry = ExhaustedEntry(
            op=op,
            budget_id=budget_id,
            reason=reason,
            recorded_at_s=now,
            expires_at_s=now + max(0.0, window_s),
            summary=MappingProxyType(dict(summary or {})),
        )
        self._entries.pop(op, None)
        self._entries[op] = entry
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return entry

    def check(self, op: str, now_s: float | None = None) -> ExhaustedEntry | None:
        return self._live(op, self._now(now_s))

    def approve(self, op: str, budget_id: str, now_s: float | None = None) -> bool:
        entry = self._live(op, self._now(now_s))
        if entry is None or entry.approved or entry.budget_id != budget_id:
            return False
        # Keep the entry (other identical calls stay blocked), but the approval is now spent.
        self._entries[op] = replace(entry, approved=True)
        return True

    def clear(self, op: str) -> None:
        self._entries.pop(op, None)

    def ops(self) -> list[str]:
        """Every operation held (live or not yet expired on read), oldest first: a copy."""
        return list(self._entries)

    def entries(self, now_s: float | None = None, *, limit: int = 100) -> list[ExhaustedEntry]:
        """The live entries, most recently recorded first, at most `limit` (for the status page;
        expired ones are skipped, not removed: a read changes nothing)."""
        now = self._now(now_s)
        out: list[ExhaustedEntry] = []
        for entry in reversed(self._entries.values()):
            if now < entry.expires_at_s:
                out.append(entry)
                if len(out) >= limit:
                    break
        return out
