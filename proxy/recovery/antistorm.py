"""The anti-storm admission of docs/recovery.md, "Decision": a retry budget and a circuit breaker.

Retries multiply load exactly when an upstream is least able to take it; these two limits keep
the proxy's retries from turning a slow upstream into a dead one. Both are kept per tool of the
engine's upstream (one engine serves one upstream), keyed by the tool's bounded label.

Contract (pure: time is an argument; the engine owns the one instance):
- `admit_first(tool, policy, now_s)` before attempt 1: `Refused(circuit_open, retry_after_s)`
  while the tool's circuit is open, else None; an admitted call counts towards the budget.
  `count_call(tool, now_s)` is the same for a policy without a breaker (nothing can refuse).
- `admit_retry(tool, policy, now_s)` is `decide`'s admission (called only when every other check
  said yes): `Refused(circuit_open)` while open, `Refused(retry_budget)` when the budget has no
  room, else None, and the admitted retry is spent from the budget.
- `record(tool, policy, category, now_s)` after every attempt: the breaker's accounting.
- **Retry budget** (Linkerd's model): over the last `WINDOW_S` seconds, admitted retries number
  at most `retry_budget_ratio` * admitted calls + `retry_budget_min_per_s` * `WINDOW_S`. With both
  unset there is no budget. Counted in one-second buckets.
- **Fleet**: with a shared store (proxy/state) the budget counts every replica's calls and
  retries. This module stays pure and local: the store's sync task reads `counts(tool)` (this
  replica's buckets) and hands back the other replicas' totals over the window with
  `set_others(tool, calls, retries, now_s)`; `admit_retry` adds them while they are younger than
  `OTHERS_FRESH_S` (past that, a store that stopped answering, the budget is this replica's own
  again). No call waits for the store.
- **Circuit breaker** (off unless `breaker_failures` is set): that many consecutive attempts that
  failed `transient` (timeouts, 5xx, crashes, transient tool errors) open the circuit for
  `breaker_cooldown_s`. While open, calls and retries are refused with the cooldown left. Then it
  is half-open: ONE trial call is admitted and the others are refused until it reports (or, if it
  never does, for one more cooldown); a success or any non-transient answer (the upstream is
  answering) closes the circuit, a transient failure opens it again. Outside half-open, a
  success or a non-transient answer resets the count.
- Bounded: at most `MAX_TOOLS` tools are tracked; past that the oldest is forgotten.
- `snapshot(now_s)` reads the table for the status page (circuits and budget use per tool).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from math import floor

from proxy.policy.compiled import Category, ToolPolicy
from proxy.recovery.decide import Refused
from proxy.recovery.reasons import StopReason

WINDOW_S = 10
MAX_TOOLS = 1024
OTHERS_FRESH_S = 2.0


class Circuit(Enum):
    """A tool's circuit breaker. CLOSED -> OPEN after `breaker_failures` transient failures in a
    row; OPEN -> HALF_OPEN at the first admission once the cooldown is over; HALF_OPEN -> CLOSED
    on a success or a non-transient answer, -> OPEN on a transient failure. The value is what the
    status page shows."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class _ToolState:
    # budget: per one-second bucket (its second, calls, retries), WINDOW_S buckets in a ring
    seconds: list[int] = field(default_factory=lambda: [-1] * WINDOW_S)
    calls: list[int] = field(default_factory=lambda: [0] * WINDOW_S)
    retries: list[float] = field(default_factory=lambda: [0] * WINDOW_S)
    # breaker
    breaker: bool = False  # a policy with a breaker was seen for this tool (for the metrics)
    state: Circuit = Circuit.CLOSED
    failures: int = 0
    open_until_s: float = 0.0
    trial_until_s: float = 0.0
    # the other replicas' calls and retries over the window, as the store last said (fleet budget)
    others_calls: int = 0
    others_retries: int = 0
    others_at_s: float = float("-inf")

    def bucket(self, now_s: float) -> int:
        second = math.floor(now_s)
        i = second % WINDOW_S
        if self.seconds[i] != second:
            self.seconds[i] = second
            self.calls[i] = 0
            self.retries[i] = 0
        return i

    def window(self, now_s: float) -> tuple[int, float]:
        oldest = math.floor(now_s) - WINDOW_S + 1
        calls = retries = 0.0
        for i in range(WINDOW_S):
            if self.seconds[i] >= oldest:
                calls += self.calls[i]
                retries += self.retries[i]
        return int(calls), retries


class AntiStorm:
    def __init__(self) -> None:
        self._tools: dict[str, _ToolState] = {}

    def _state(self, tool: str) -> _ToolState:
        st = self._tools.get(tool)
        if st is None:
            if len(self._tools) >= MAX_TOOLS:
                del self._tools[next(iter(self._tools))]
            st = self._tools[tool] = _ToolState()
        return st

    # -- admission ------------------------------------------------------------------------------
    def admit_first(self, tool: str, policy: ToolPolicy, now_s: float) -> Refused | None:
        st = self._state(tool)
        refused = self._breaker_admits(st, policy, now_s, first=True)
        if refused is not None:
            return refused
        st.calls[st.bucket(now_s)] += 1
        return None

    def count_call(self, tool: str, now_s: float) -> None:
        """`admit_first` for a call nothing can refuse (its policy has no breaker): only the count."""
        st = self._tools.get(tool) or self._state(tool)
        second = floor(now_s)  # _ToolState.bucket, inline (floor() to an int: a third of int(now_s // 1))
        i = second % WINDOW_S
        if st.seconds[i] == second:
            st.calls[i] += 1
        else:
            st.seconds[i] = second
            st.calls[i] = 1
            st.retries[i] = 0

    def admit_retry(self, tool: str, policy: ToolPolicy, now_s: float) -> Refused | None:
        st = self._state(tool)
        refused = self._breaker_admits(st, policy, now_s, first=False)
        if refused is not None:
            return refused
        ratio = policy.anti_storm.retry_budget_ratio
        floor = policy.anti_storm.retry_budget_min_per_s
        if ratio is not None or floor is not None:
            calls, retries = st.window(now_s)
            if now_s - st.others_at_s < OTHERS_FRESH_S:
                calls += st.others_calls
                retries += st.others_retries
            allowed = (ratio or 0.0) * calls + (floor or 0.0) * WINDOW_S
            if retries + 1 > allowed:
                return Refused(StopReason.RETRY_BUDGET, None)
        st.retries[st.bucket(now_s)] += 1
        return None

    # -- fleet (the shared store's sync task) -----------------------------------------------------
    def counts(self) -> list[tuple[str, list[tuple[int, int, int]]]]:
        """(tool, [(second, calls, retries) for each bucket with counts]) for every tracked tool: this
        replica's own counts, which the store's sync task adds to the fleet's."""
        out = []
        for tool, st in list(self._tools.items()):
            buckets = [
                (st.seconds[i], st.calls[i], int(st.retries[i]))
                for i in range(WINDOW_S)
                if st.seconds[i] >= 0 and (st.calls[i] or st.retries[i])
            ]
            if buckets:
                out.append((tool, buckets))
        return out

    def own_window(self, tool: str, now_s: float) -> tuple[int, int]:
        st = self._tools.get(tool)
        if st is None:
            return 0, 0
        calls, retries = st.window(now_s)
        return calls, int(retries)

    def set_others(self, tool: str, calls: int, retries: int, now_s: float) -> None:
        """The other replicas' calls and retries over the window ending now (never negative)."""
        st = self._state(tool)
        st.others_calls = max(0, calls)
        st.others_retries = max(0, retries)
        st.others_at_s = now_s

    def _breaker_admits(self, st: _ToolState, policy: ToolPolicy, now_s: float, *, first: bool) -> Refused | None:
        if st.state is Circuit.CLOSED or policy.anti_storm.breaker_failures is None:
            return None
        if st.state is Circuit.OPEN:
            if now_s < st.open_until_s:
                return Refused(StopReason.CIRCUIT_OPEN, st.open_until_s - now_s)
            st.state = Circuit.HALF_OPEN
            st.trial_until_s = 0.0
        # half-open: one trial call at a time; a trial that never reported is superseded
        if first and now_s >= st.trial_until_s:
            st.trial_until_s = now_s + self._cooldown_s(policy)
            return None
        return Refused(StopReason.CIRCUIT_OPEN, max(st.trial_until_s - now_s, 0.0) or None)

    # -- accounting -----------------------------------------------------------------------------
    def record(self, tool: str, policy: ToolPolicy, category: Category | None, now_s: float) -> None:
        """An attempt ended: `category` is None for a success."""
        threshold = policy.anti_storm.breaker_failures
        if threshold is None:
            return
        st = self._state(tool)
        st.breaker = True
        if category is not Category.TRANSIENT:
            st.failures = 0
            st.state = Circuit.CLOSED
            return
        st.failures += 1
        if st.state is Circuit.HALF_OPEN or st.failures >= threshold:
            st.state = Circuit.OPEN
            st.open_until_s = now_s + self._cooldown_s(policy)
            st.failures = 0

    def circuit_open(self, tool: str, now_s: float) -> bool:
        """Whether the tool's circuit refuses calls now (open, or half-open with a trial running)."""
        st = self._tools.get(tool)
        if st is None:
            return False
        match st.state:
            case Circuit.CLOSED:
                return False
            case Circuit.OPEN:
                return now_s < st.open_until_s
            case Circuit.HALF_OPEN:
                return now_s < st.trial_until_s

    def circuits(self, now_s: float) -> list[tuple[str, bool]]:
        """(tool, not closed) for every tracked tool whose policy has a breaker (for /metrics; safe
        to call from another thread: it reads a snapshot of the table). Open stays open after its
        cooldown until a trial call closes it: between the cooldown's end and the next call (the
        trial) the breaker refuses nothing, yet nothing has shown the upstream recovered, and an
        alert on an outage that lasts must not see it end at every cooldown."""
        return [(tool, st.state is not Circuit.CLOSED) for tool, st in list(self._tools.items()) if st.breaker]

    def snapshot(self, now_s: float) -> list[dict[str, object]]:
        """Per tracked tool, for the status page: the circuit (`closed`, `open` with the seconds
        left, `half_open`; None without a breaker), consecutive transient failures, and the calls
        and retries admitted in the budget's window. A read: nothing here changes state."""
        out: list[dict[str, object]] = []
        for tool, st in list(self._tools.items()):
            calls, retries = st.window(now_s)
            circuit: str | None = None
            open_for_s = 0.0
            if st.breaker:
                if st.state is Circuit.OPEN and now_s < st.open_until_s:
                    circuit, open_for_s = Circuit.OPEN.value, st.open_until_s - now_s
                elif st.state is not Circuit.CLOSED:
                    circuit = Circuit.HALF_OPEN.value  # cooled down: the next call is the trial
                else:
                    circuit = Circuit.CLOSED.value
            out.append(
                {
                    "tool": tool,
                    "circuit": circuit,
                    "open_for_s": round(open_for_s, 3),
                    "failures": st.failures,
                    "window_s": WINDOW_S,
                    "window_calls": calls,
                    "window_retries": retries,
                }
            )
        return out

    @staticmethod
    def _cooldown_s(policy: ToolPolicy) -> float:
        return policy.anti_storm.breaker_cooldown_s or DEFAULT_COOLDOWN_S


DEFAULT_COOLDOWN_S = 30.0
