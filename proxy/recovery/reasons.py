"""Why the proxy stopped trying: one distinct reason per "no" (docs/recovery.md, "Decision"), a bounded label set.

Success is not a stop reason. Each member is also a metric label and the `stopReason` of an
unresolved result.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class StopReason(StrEnum):
    NOT_RETRYABLE = "not_retryable"  # eligibility: the category is not a retryable transient
    UPSTREAM_DECLINED = "upstream_declined"  # eligibility: isRetryable false / negative pushback
    OUTCOME_UNKNOWN = "outcome_unknown"  # eligibility: state-changing and maybe executed
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # budget: total attempts used
    DEADLINE_EXHAUSTED = "deadline_exhausted"  # budget: no useful attempt fits the deadline
    RETRY_BUDGET = "retry_budget"  # admission: the share of retries over a window is spent
    CIRCUIT_OPEN = "circuit_open"  # admission: the breaker of this upstream and tool is open
    OVERLOADED = "overloaded"  # admission: the proxy's own concurrency limit (before attempt 1)
    LEDGER_EXHAUSTED = "ledger_exhausted"  # before attempt 1: this operation's budget ran out earlier
    CANCELLED = "cancelled"  # the caller cancelled (no response is sent), or a 2025 caller disconnected
    SHUTDOWN = "shutdown"  # the proxy is stopping: the call outlived the shutdown grace period
    # a re-send's own deadline passed while the execution it repeats still runs (it runs on)
    STILL_RUNNING = "still_running"


BUDGET_EXHAUSTED: Final = frozenset(
    {StopReason.ATTEMPTS_EXHAUSTED, StopReason.DEADLINE_EXHAUSTED, StopReason.LEDGER_EXHAUSTED}
)
"""Stop reasons that mean the budget ran out (`budgetExhausted: true`)."""

LEDGER_RECORDED: Final = frozenset({StopReason.ATTEMPTS_EXHAUSTED, StopReason.DEADLINE_EXHAUSTED})
"""Stop reasons the engine records in the ledger (docs/recovery.md, "Ledger")."""
