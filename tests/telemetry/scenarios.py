"""Synthetic event sequences, shaped like the engine's, for the observers' tests and the benchmark.

Each function returns the events of one tools/call in the order the engine emits them:
CallStarted, then per attempt (attempt_context), AttemptStarted, AttemptFinished, and
BackoffStarted before a retry, then CallFinished; a first-attempt success ends in the single
CallSucceeded instead. (The engine emits CallStarted and the first AttemptStarted only when an
observer needs them; these sequences always carry them, and observers that do not need them
must ignore them.)
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BackoffStarted,
    CallFinished,
    CallStarted,
    CallSucceeded,
    Event,
)

CALLER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"


def started(
    call_id: str,
    tool: str,
    *,
    side_effect: str = "read_only",
    session_id: str | None = "session-1",
    trace_meta: Mapping[str, str] | None = None,
    trace_headers: Mapping[str, str] | None = None,
    max_attempts: int = 3,
    policy_version: str = "v1",
) -> CallStarted:
    return CallStarted(
        call_id,
        tool,
        side_effect,
        session_id,
        "legacy",
        policy_version,
        max_attempts,
        10.0,
        trace_meta=dict(trace_meta or {}),
        trace_headers=dict(trace_headers or {}),
    )


def failed_attempt(call_id: str, tool: str, number: int, *, category: str = "transient") -> list[Event]:
    return [
        AttemptStarted(call_id, tool, number, 1.0),
        AttemptFinished(call_id, tool, number, 0.02, "tool_error", category, "yes", "upstream"),
    ]


def ok_attempt(call_id: str, tool: str, number: int) -> list[Event]:
    return [
        AttemptStarted(call_id, tool, number, 1.0),
        AttemptFinished(call_id, tool, number, 0.01, "success", None, "yes", "none"),
    ]


def success(call_id: str, tool: str = "echo", **kw: object) -> list[Event]:
    """A first-attempt success: its attempt and the call end in one `CallSucceeded`."""
    return [
        started(call_id, tool, **kw),  # type: ignore[arg-type]
        AttemptStarted(call_id, tool, 1, 1.0),
        CallSucceeded(call_id, tool, 0.01, 0.012),
    ]


def recovered(call_id: str, tool: str = "flaky_read", *, failures: int = 2, **kw: object) -> list[Event]:
    events: list[Event] = [started(call_id, tool, **kw)]  # type: ignore[arg-type]
    for n in range(1, failures + 1):
        events += failed_attempt(call_id, tool, n)
        events.append(BackoffStarted(call_id, tool, n + 1, 0.05 * n))
    events += ok_attempt(call_id, tool, failures + 1)
    backoff = sum(0.05 * n for n in range(1, failures + 1))
    events.append(CallFinished(call_id, tool, "recovered", None, None, failures + 1, 0.3, backoff, False))
    return events


def unresolved(
    call_id: str,
    tool: str = "always_fail",
    *,
    attempts: int = 3,
    stop_reason: str = "attempts_exhausted",
    outcome_unknown: bool = False,
    **kw: object,
) -> list[Event]:
    events: list[Event] = [started(call_id, tool, **kw)]  # type: ignore[arg-type]
    for n in range(1, attempts + 1):
        events += failed_attempt(call_id, tool, n)
        if n < attempts:
            events.append(BackoffStarted(call_id, tool, n + 1, 0.05))
    events.append(
        CallFinished(
            call_id, tool, "unresolved", stop_reason, "transient", attempts, 0.5, 0.05 * (attempts - 1), outcome_unknown
        )
    )
    return events


def cancelled(call_id: str, tool: str = "hang", **kw: object) -> list[Event]:
    """The caller cancels while attempt 1 is in flight: no AttemptFinished, as the engine does."""
    return [
        started(call_id, tool, **kw),  # type: ignore[arg-type]
        AttemptStarted(call_id, tool, 1, 1.0),
        CallFinished(call_id, tool, "cancelled", "cancelled", None, 0, 0.2, 0.0, False),
    ]
