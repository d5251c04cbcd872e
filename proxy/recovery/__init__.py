"""The functional core of recovery: classify outcomes, decide, back off, keep budgets, report.

No I/O, no asyncio, no sleeping here: time and randomness are arguments. Only the standard
library and `proxy.policy.compiled`, `proxy.errors`, `proxy.jsonrpc`, `proxy.secret_values` may be imported
(tests/recovery/test_recovery_imports.py enforces it). The engine calls, per `tools/call`:

1. `operation_digest(...)`, `ledger.check(op, now_s)`, `ledger.approve(...)` when an approval is
   present, `decide_first_attempt(...)`; a `GiveUp` → `unresolved_result(...)`.
2. `CallState.start(...)`; for each attempt: `attempt_timeout_s(...)`, the attempt,
   `outcome_from_response(...)` or `TransportError.from_failure(...)`, `classify(...)`,
   `state.attempted()`, `decide(...)`:
   `Deliver` → the result (`with_attempts_meta` if attempts > 1); `Retry` → sleep `delay_s`,
   `state.retried()`, next attempt; `GiveUp` → `unresolved_result(...)`, and
   `ledger.record_exhausted(...)` for the reasons in `LEDGER_RECORDED`.
"""

from proxy.recovery.backoff import backoff_cap_s, backoff_delay_s, parse_retry_after, retry_after_ms_s
from proxy.recovery.classify import classify
from proxy.recovery.decide import (
    Admission,
    CallState,
    Decision,
    Deliver,
    GiveUp,
    Refused,
    Retry,
    attempt_timeout_s,
    decide,
    decide_first_attempt,
    describe_decision_table,
    effective_deadline_s,
)
from proxy.recovery.ledger import (
    ExhaustedEntry,
    InMemoryLedger,
    Ledger,
    new_budget_id,
    operation_digest,
)
from proxy.recovery.outcome import (
    Classified,
    Evidence,
    EvidenceSource,
    Outcome,
    RpcError,
    Success,
    ToolError,
    TransportError,
    outcome_from_response,
)
from proxy.recovery.reasons import BUDGET_EXHAUSTED, LEDGER_RECORDED, StopReason
from proxy.recovery.report import (
    AttemptRecord,
    PartialResult,
    ledger_summary,
    rpc_error_as_result,
    unresolved_result,
    with_attempts_meta,
)

__all__ = [
    "BUDGET_EXHAUSTED",
    "LEDGER_RECORDED",
    "Admission",
    "AttemptRecord",
    "CallState",
    "Classified",
    "Decision",
    "Deliver",
    "Evidence",
    "EvidenceSource",
    "ExhaustedEntry",
    "GiveUp",
    "InMemoryLedger",
    "Ledger",
    "Outcome",
    "PartialResult",
    "Refused",
    "Retry",
    "RpcError",
    "StopReason",
    "Success",
    "ToolError",
    "TransportError",
    "attempt_timeout_s",
    "backoff_cap_s",
    "backoff_delay_s",
    "classify",
    "decide",
    "decide_first_attempt",
    "describe_decision_table",
    "effective_deadline_s",
    "ledger_summary",
    "new_budget_id",
    "operation_digest",
    "outcome_from_response",
    "parse_retry_after",
    "retry_after_ms_s",
    "rpc_error_as_result",
    "unresolved_result",
    "with_attempts_meta",
]
