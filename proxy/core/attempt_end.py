"""What the end of one attempt means to the engine: success or not, which timer cut it, the
JSON-RPC error it carried, its classification, its metrics labels; and the trace context a call
passes on.

Pure functions of their arguments (no I/O), shared by the engine's fast path and the call's
attempt loop so both read an attempt's end the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.core.deadlines import AttemptTimedOut
from proxy.errors import Dispatch, FailureKind
from proxy.jsonrpc import Message
from proxy.policy.compiled import Category, ToolPolicy
from proxy.recovery import RpcError, TransportError, classify
from proxy.recovery.outcome import Classified, Outcome, outcome_name
from proxy.recovery.timers import cut_by

TRACE_KEYS = ("traceparent", "tracestate")
UNCLASSIFIED = "unclassified"  # the category label of metrics and logs for what nothing classified


def uncancel() -> None:
    """Take back the shutdown's cancellation of the current task: the call answers instead."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


_NO_TRACE: Mapping[str, str] = {}


def trace_entries(source: Mapping[str, Any] | None) -> Mapping[str, str]:
    if not source or ("traceparent" not in source and "tracestate" not in source):
        return _NO_TRACE
    return {k: v for k, v in source.items() if k in TRACE_KEYS and isinstance(v, str)}


def is_success(response: Message) -> bool:
    """What `outcome_from_response` calls a `Success`: an object result that is not isError, and
    no error object."""
    result = response.get("result")
    return (
        result.__class__ is dict and result.get("isError") is not True and response.get("error").__class__ is not dict
    )


def timed_out(
    number: int, timeout_s: float, timeout: TimeoutError, policy: ToolPolicy, deadline_s: float
) -> TransportError:
    """A timed-out attempt: not sent (the send deadline, before any of the request was written),
    silent past the idle timer, or unanswered (a request written but whose hand-over had not
    returned included). The relay's timer (`AttemptTimedOut`) says which; a timeout of any other origin
    counts as sent (dispatch unknown), the side that never repeats a state-changing call. The
    detail names the timer that cut it, its value and the policy key that changes it."""
    was_sent = timeout.sent if isinstance(timeout, AttemptTimedOut) else True
    if not was_sent:
        return TransportError(
            FailureKind.NOT_RUNNING,
            Dispatch.NO,
            f"attempt {number}: the upstream was not ready to take the request before the deadline",
        )
    idle_s = timeout.idle_s if isinstance(timeout, AttemptTimedOut) else None
    return TransportError(
        FailureKind.TIMEOUT, Dispatch.UNKNOWN, cut_by(policy, timeout_s, idle_s, deadline_s).detail(number)
    )


def rpc_error_of(outcome: Outcome | None) -> dict[str, Any] | None:
    """The JSON-RPC error object an attempt ended with: from the wire, or from an HTTP error's body."""
    match outcome:
        case RpcError(error=error):
            return error
        case TransportError(body={"error": dict() as error}):
            return error
        case _:
            return None


def result_label(outcome: Outcome) -> str:
    """The attempt-result label of the metrics: the outcome's shape, with timeouts apart."""
    if isinstance(outcome, TransportError) and outcome.kind is FailureKind.TIMEOUT:
        return "timeout"
    name = outcome_name(outcome)
    return "rpc_error" if name == "jsonrpc_error" else name


def continues(request: Message) -> bool:
    """Whether a tools/call answers an input-required round (it carries `requestState` or
    `inputResponses`)."""
    params = request.get("params") or {}
    return "requestState" in params or "inputResponses" in params


def classify_attempt(outcome: Outcome, policy: ToolPolicy, request: Message) -> Classified:
    """The policy's classification of a failed attempt, but for a JSON-RPC error answering an
    input-required continuation: validation, never retried (the client's protocol machinery
    restarts the rounds; docs/recovery.md); its dispatch and evidence stay as classified."""
    classified = classify(outcome, policy)
    category = classified.category
    if category is None or category is Category.VALIDATION or rpc_error_of(outcome) is None or not continues(request):
        return classified
    return replace(classified, category=Category.VALIDATION, defaulted=False, retryable_hint=None, rule_retryable=None)


def category_label(classified: Classified) -> str | None:
    """The category of metrics and logs: what nothing classified is `unclassified`, whatever
    category the policy gives it in the report (a dashboard must not show it as transient)."""
    if classified.defaulted:
        return UNCLASSIFIED
    return classified.category.value if classified.category is not None else None
