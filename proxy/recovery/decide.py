"""Decide what follows an attempt: deliver, retry after a delay, or give up with one stop reason.

Contract (docs/recovery.md, "Decision"; Envoy's two stages, "would we retry" then "may we retry"):
- `decide(policy, state, classified, now_s=, rand=, admission=, cancelled=)` is pure: time and
  randomness are arguments, and `admission` is called at most once, and only when every other
  check said yes (it may spend a retry-budget token). The first "no" wins, in this order:
  cancelled; success → `Deliver`; eligibility (not_retryable, upstream_declined,
  outcome_unknown); budget (attempts_exhausted, deadline_exhausted); admission (retry_budget,
  circuit_open, or whatever `Refused` reason the admission returns).
- The backoff is the policy's (full jitter) after an answer or a timeout, and its reconnect wait
  (`backoff.reconnect`, equal jitter) after a failure to reach the upstream at all, so that the
  attempts reach across a restart.
- Only `transient` failures listed in `policy.retry_on` are retryable; a defaulted (unclassified)
  failure and a failure matched by a rule with `retryable=False` never are.
- `decide_first_attempt(...)` runs before attempt 1: cancelled, ledger_exhausted (unless an
  approval was granted), then admission (overloaded, circuit_open).
- `CallState` is the per-call record the engine threads through: `start()`, then `attempted()`
  after each attempt and `retried()` before each retry. `attempts_made` counts total attempts,
  the first included; `retry_index` is 0 for the first retry.
- `describe_decision_table()` lists every stop reason with its stage, condition and an example;
  docs/recovery.md prints the same table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from proxy.errors import Dispatch
from proxy.policy.compiled import Category, SideEffect, ToolPolicy
from proxy.recovery.backoff import UNREACHABLE, backoff_delay_s, reconnect_delay_s
from proxy.recovery.ledger import ExhaustedEntry
from proxy.recovery.outcome import Classified, EvidenceSource
from proxy.recovery.reasons import StopReason

__all__ = [
    "Admission",
    "CallState",
    "Decision",
    "DecisionRow",
    "Deliver",
    "GiveUp",
    "Refused",
    "Retry",
    "StopReason",
    "attempt_timeout_s",
    "decide",
    "decide_first_attempt",
    "describe_decision_table",
    "effective_deadline_s",
]


def effective_deadline_s(policy: ToolPolicy, caller_deadline_ms: Any = None) -> float:
    """The call's deadline: the policy's, shortened (never lengthened) by the caller's `deadlineMs`.

    A caller value that is not a finite positive number (bool, string, 0, negative, NaN) is ignored.
    """
    deadline = policy.deadline_s
    if caller_deadline_ms is None:
        return deadline
    if (
        isinstance(caller_deadline_ms, int | float)
        and not isinstance(caller_deadline_ms, bool)
        and math.isfinite(caller_deadline_ms)
        and caller_deadline_ms > 0
    ):
        deadline = min(deadline, caller_deadline_ms / 1000.0)
    return deadline


class CallState(NamedTuple):
    """Per-call retry state: what has been spent so far (instants are on the engine's monotonic clock).
    Immutable; a named tuple because every call builds one (a third of a frozen dataclass's cost)."""

    attempts_made: int
    started_at_s: float
    deadline_at_s: float
    retry_index: int = 0

    @classmethod
    def start(cls, policy: ToolPolicy, *, now_s: float, caller_deadline_ms: Any = None) -> CallState:
        return cls(0, now_s, now_s + effective_deadline_s(policy, caller_deadline_ms), 0)

    def attempted(self) -> CallState:
        """After an attempt finished (a session re-send that was refused before processing is not one)."""
        return CallState(self.attempts_made + 1, self.started_at_s, self.deadline_at_s, self.retry_index)

    def retried(self) -> CallState:
        """After the backoff of a `Retry`, before the next attempt."""
        return CallState(self.attempts_made, self.started_at_s, self.deadline_at_s, self.retry_index + 1)

    @property
    def deadline_s(self) -> float:
        return self.deadline_at_s - self.started_at_s

    def deadline_left_s(self, now_s: float) -> float:
        return max(0.0, self.deadline_at_s - now_s)


def attempt_timeout_s(policy: ToolPolicy, state: CallState, now_s: float) -> float:
    """The hard timeout of an attempt starting now: min(policy attempt timeout, deadline left)."""
    return max(0.0, min(policy.attempt_timeout_s, state.deadline_at_s - now_s))


@dataclass(frozen=True, slots=True)
class Deliver:
    """A success: pass the result through (with the attempts in `_meta` when there were retries)."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Wait `delay_s`, then start the next attempt with a hard timeout of `attempt_timeout_s`."""

    delay_s: float
    retry_index: int
    attempt_timeout_s: float
    retry_after_s: float | None = None  # the upstream's requested wait, when it was honoured


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop: build the unresolved result (or, for `cancelled`, send nothing)."""

    reason: StopReason
    retry_after_s: float | None = None


Decision = Deliver | Retry | GiveUp
_DELIVER = Deliver()  # immutable and field-less: one instance serves every success


@dataclass(frozen=True, slots=True)
class Refused:
    """An admission's "no": `retry_budget`, `circuit_open` or `overloaded`, maybe with a wait."""

    reason: StopReason
    retry_after_s: float | None = None


Admission = Callable[[float], Refused | None]
"""Called with `now_s`; returns None when admitted. The engine's anti-storm state lives behind it."""


def _admit(admission: Admission | None, now_s: float) -> GiveUp | None:
    if admission is None:
        return None
    refused = admission(now_s)
    if refused is None:
        return None
    return GiveUp(refused.reason, refused.retry_after_s)


def decide(
    policy: ToolPolicy,
    state: CallState,
    classified: Classified,
    *,
    now_s: float,
    rand: Callable[[], float],
    admission: Admission | None = None,
    cancelled: bool = False,
) -> Decision:
    """What follows the attempt `state.attempts_made` whose outcome was `classified`."""
    if cancelled:
        return GiveUp(StopReason.CANCELLED)
    category = classified.category
    if category is None:
        return _DELIVER
    known_wait = classified.retry_after_s

    # Eligibility: would we retry this outcome at all?
    if (
        category is not Category.TRANSIENT
        or category not in policy.retry_on
        or classified.defaulted
        or classified.rule_retryable is False
    ):
        return GiveUp(StopReason.NOT_RETRYABLE, known_wait)
    if classified.retryable_hint is False:
        return GiveUp(StopReason.UPSTREAM_DECLINED, known_wait)
    if (
        policy.side_effect is SideEffect.STATE_CHANGING
        and classified.dispatched is not Dispatch.NO
        and policy.idempotency_key is None
    ):
        return GiveUp(StopReason.OUTCOME_UNKNOWN, known_wait)

    # Budget: may we retry within the attempts and the deadline?
    if state.attempts_made >= policy.attempts:
        return GiveUp(StopReason.ATTEMPTS_EXHAUSTED, known_wait)
    evidence = classified.evidence
    if evidence.source is EvidenceSource.TRANSPORT and evidence.code in UNREACHABLE:
        # Nobody answered: wait for a restart (equal jitter, a floor), not a few hundred ms.
        delay = reconnect_delay_s(policy.backoff, state.retry_index, policy.retry_after_cap_s, rand)
    else:
        delay = backoff_delay_s(policy.backoff, state.retry_index, rand)
    if known_wait is not None:
        if known_wait > policy.retry_after_cap_s:
            return GiveUp(StopReason.DEADLINE_EXHAUSTED, known_wait)
        delay = max(delay, known_wait)
    remaining = state.deadline_at_s - (now_s + delay)
    if remaining <= 0 or remaining < policy.min_attempt_s:
        return GiveUp(StopReason.DEADLINE_EXHAUSTED, known_wait)

    # Admission: does the anti-storm state let this retry through?
    refused = _admit(admission, now_s)
    if refused is not None:
        return refused
    return Retry(
        delay_s=delay,
        retry_index=state.retry_index,
        attempt_timeout_s=min(policy.attempt_timeout_s, remaining),
        retry_after_s=known_wait,
    )


def decide_first_attempt(
    *,
    now_s: float,
    exhausted: ExhaustedEntry | None = None,
    approved: bool = False,
    admission: Admission | None = None,
    cancelled: bool = False,
) -> GiveUp | None:
    """Before attempt 1: None to go ahead, or why not.

    `exhausted` is `ledger.check(op)`; `approved` is `ledger.approve(op, approval)` for a call that
    carried `io.mcp-recovery-proxy/approveBudget`. A ledger refusal reports when the entry expires.
    """
    if cancelled:
        return GiveUp(StopReason.CANCELLED)
    if exhausted is not None and not approved:
        return GiveUp(StopReason.LEDGER_EXHAUSTED, exhausted.retry_after_s(now_s))
    return _admit(admission, now_s)


@dataclass(frozen=True, slots=True)
class DecisionRow:
    reason: StopReason
    stage: str  # proxy | caller | re-send | preflight | eligibility | budget | admission
    condition: str
    example: str


_TABLE: tuple[DecisionRow, ...] = (
    DecisionRow(
        StopReason.SHUTDOWN,
        "proxy",
        "the proxy is stopping (SIGTERM, or its stdio client closed stdin) and the call was still running when"
        " the shutdown grace period ended: the attempt in flight is cancelled upstream",
        "a 60 s report still running 20 s after SIGTERM with --shutdown-grace-s 20",
    ),
    DecisionRow(
        StopReason.CANCELLED,
        "caller",
        "the caller cancelled the request (no response is sent), or a 2025 HTTP caller of a read-only tool"
        " disconnected (no new attempt; the result waits for a resumed stream)",
        "notifications/cancelled arrives during the backoff before attempt 2",
    ),
    DecisionRow(
        StopReason.STILL_RUNNING,
        "re-send",
        "the call repeats one whose answer was lost and which still runs, and this call's own deadline (its"
        " deadlineMs) passed first: nothing is attempted for it, the execution runs on for the next re-send",
        "a re-send with deadlineMs 1000 of a create_refund that has run 20 s of its 60 s",
    ),
    DecisionRow(
        StopReason.LEDGER_EXHAUSTED,
        "preflight",
        "the same operation exhausted its budget within the ledger window and no approval names it",
        "an identical search_orders call 20 s after one that used 3 of 3 attempts",
    ),
    DecisionRow(
        StopReason.OVERLOADED,
        "preflight",
        "the proxy's own concurrency limit refuses the call before attempt 1",
        "200 calls in flight with a limit of 200",
    ),
    DecisionRow(
        StopReason.NOT_RETRYABLE,
        "eligibility",
        "category is not transient, not in retry_on, unclassified (defaulted), or a rule says retryable: false",
        "HTTP 403 (permission); isError with errorCategory validation; isError without any category",
    ),
    DecisionRow(
        StopReason.UPSTREAM_DECLINED,
        "eligibility",
        "the upstream said isRetryable: false, or a negative retryAfterMs",
        "isError {errorCategory: transient, isRetryable: false}",
    ),
    DecisionRow(
        StopReason.OUTCOME_UNKNOWN,
        "eligibility",
        "state_changing tool without idempotency key, and the attempt's dispatch is unknown or yes",
        "create_refund times out after the request was written",
    ),
    DecisionRow(
        StopReason.ATTEMPTS_EXHAUSTED,
        "budget",
        "attempts made >= policy attempts (total attempts, the first included)",
        "the third 503 of a read_only tool with attempts: 3",
    ),
    DecisionRow(
        StopReason.DEADLINE_EXHAUSTED,
        "budget",
        "after the backoff (or Retry-After), less than min_attempt_s of the deadline would remain, "
        "or the Retry-After exceeds retry_after_cap_s",
        "429 with Retry-After: 60 under a 10 s deadline (retryAfterMs reported)",
    ),
    DecisionRow(
        StopReason.CIRCUIT_OPEN,
        "admission",
        "the breaker of this upstream and tool is open (before attempt 1 or before a retry)",
        "five consecutive timeouts opened the breaker for 30 s",
    ),
    DecisionRow(
        StopReason.RETRY_BUDGET,
        "admission",
        "the retry budget (share of retries over a window) refuses the retry",
        "an upstream outage where retries already make 20 % of the traffic",
    ),
)


def describe_decision_table() -> tuple[DecisionRow, ...]:
    """Every stop reason, in the order the checks run, with its condition and an example."""
    return _TABLE
