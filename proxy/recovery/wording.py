"""What an unresolved result says in words: the message a model reads and the suggested actions a
coordinator acts on.

Contract: pure functions of the stop reason, the classification, the policy and the attempts.
`message` is one short text (what failed and why, why retrying stopped, what is preserved, what to
do next), bounded by `MESSAGE_LIMIT`; it never calls an unclassified failure temporary. The
suggested actions are deterministic: by stop reason, then category, then the policy's status check
tool and alternatives, then partial results (docs/recovery.md, "The unresolved result").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxy.jsonrpc import META_APPROVE_BUDGET, bounded
from proxy.policy.compiled import Category, ToolPolicy
from proxy.recovery.outcome import Classified, Evidence, EvidenceSource
from proxy.recovery.reasons import BUDGET_EXHAUSTED, StopReason

MESSAGE_LIMIT: Final = 1200
RETRIED_ALREADY: Final = (
    "isRetryable is false because the proxy already retried this call within its budget, not because the"
    " failure is permanent: do not repeat the same call now."
)

_BY_CATEGORY: Final[dict[Category, tuple[str, str]]] = {
    Category.VALIDATION: ("change_input", "Correct the arguments named in the error, then call again."),
    Category.PERMISSION: (
        "request_access",
        "Obtain the missing access or credentials, or escalate to someone who has them.",
    ),
    Category.BUSINESS: (
        "explain_or_escalate",
        "A domain rule refused the request: explain it to the user or escalate; do not force it.",
    ),
}


# An HTTP redirect: the upstream named another URL and did not run the request (the proxy follows
# none), so the call is not the caller's to change but the operator's upstream to point elsewhere.
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_REDIRECTED: Final = (
    "fix_upstream",
    "The upstream answered with a redirect and did not run the call: the proxy must be pointed at the"
    " new URL (--upstream) by its operator. The call itself needs no change.",
)


def redirected(evidence: Evidence) -> bool:
    return evidence.source is EvidenceSource.HTTP and evidence.code in REDIRECT_STATUSES


def _action(action: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"action": action, "description": description, **{k: v for k, v in extra.items() if v is not None}}


def suggested_actions(
    policy: ToolPolicy,
    reason: StopReason,
    category: Category,
    *,
    defaulted: bool,
    outcome_unknown: bool,
    budget_id: str,
    retry_after_ms: int | None,
    has_partials: bool,
    redirected: bool = False,
) -> list[dict[str, Any]]:
    """Deterministic next steps for a coordinator or a model. `redirected`: the failure was an
    HTTP redirect (the operator's to fix, not the caller's input)."""
    actions: list[dict[str, Any]] = []
    # still_running: the execution goes on and a re-send is answered by it, never run again, so
    # neither checking nor holding back applies: the one next step is to ask again.
    if outcome_unknown and reason is not StopReason.STILL_RUNNING:
        actions.append(
            _action(
                "check_status",
                "Check whether the change was applied"
                + (f" (with '{policy.status_check_tool}')" if policy.status_check_tool else "")
                + " before doing anything else.",
                tool=policy.status_check_tool,
            )
        )
        actions.append(_action("do_not_repeat", "Do not repeat this call unchanged: it could apply the change twice."))
    match reason:
        case StopReason.ATTEMPTS_EXHAUSTED | StopReason.DEADLINE_EXHAUSTED | StopReason.LEDGER_EXHAUSTED:
            actions.append(
                _action(
                    "retry_later",
                    "The cause may still be temporary: try again later, not immediately.",
                    retryAfterMs=retry_after_ms,
                )
            )
            actions.append(
                _action(
                    "approve_budget",
                    f"A coordinator may approve one fresh budget by sending _meta "
                    f'"{META_APPROVE_BUDGET}": "{budget_id}" with the identical call.',
                    budgetId=budget_id,
                )
            )
        case StopReason.RETRY_BUDGET | StopReason.CIRCUIT_OPEN | StopReason.OVERLOADED:
            actions.append(
                _action(
                    "retry_later",
                    "The upstream or the proxy is shedding load: try again later.",
                    retryAfterMs=retry_after_ms,
                )
            )
        case StopReason.SHUTDOWN:
            actions.append(
                _action(
                    "retry_elsewhere",
                    "This proxy was stopping: send the call again to a replica that is running"
                    " (check the status of a state-changing call first).",
                )
            )
        case StopReason.UPSTREAM_DECLINED:
            actions.append(_action("do_not_repeat", "The upstream said repeating this call will not help."))
        case StopReason.STILL_RUNNING:
            # The one next step: an alternative tool or a partial result would act beside an
            # execution that goes on (a state-changing one could apply its change twice).
            return [
                _action(
                    "resend",
                    "The call still runs upstream: send this identical call again (the same arguments, and"
                    " the same idempotency key if it had one) to receive its answer. The proxy answers it"
                    " with that execution and does not run the tool again while it keeps the answer.",
                )
            ]
        case _:
            pass
    if defaulted:
        actions.append(
            _action(
                "inspect_error",
                "The proxy could not classify this failure: read the tool's own message and decide from it.",
            )
        )
    elif redirected:
        actions.append(_action(*_REDIRECTED))
    elif category in _BY_CATEGORY:
        actions.append(_action(*_BY_CATEGORY[category]))
    for alternative in policy.alternatives:
        actions.append(_action("use_alternative", f"Use '{alternative}' to obtain what is missing.", tool=alternative))
    if has_partials:
        actions.append(_action("accept_partial", "Use the partial results and name what is still missing."))
    seen: set[tuple[str, str | None]] = set()
    unique = []
    for action in actions:
        key = (action["action"], action.get("tool"))
        if key not in seen:
            seen.add(key)
            unique.append(action)
    return unique


# --- the message ---------------------------------------------------------------------------------


def _evidence_phrase(evidence: Evidence, category: Category, defaulted: bool) -> str:
    match evidence.source:
        case EvidenceSource.TRANSPORT:
            return f"transport failure {evidence.code}"
        case EvidenceSource.HTTP:
            if evidence.code in REDIRECT_STATUSES:
                return f"HTTP {evidence.code}: a redirect, the request was not run"
            return f"HTTP {evidence.code}"
        case EvidenceSource.JSONRPC:
            return f"JSON-RPC error {evidence.code}"
        case EvidenceSource.UPSTREAM:
            return "as reported by the upstream"
        case EvidenceSource.RULE:
            return f"policy rule '{evidence.rule}'"
        case EvidenceSource.SHIPPED:
            return f"shipped rule '{evidence.rule}'"
        case EvidenceSource.DEFAULT:
            return f"unclassified, reported as {category.value}" if defaulted else "unclassified"
    return ""


def _why(reason: StopReason, policy: ToolPolicy, c: Classified | None, attempts: int, deadline_s: float) -> str:
    match reason:
        case StopReason.NOT_RETRYABLE:
            if c is not None and c.defaulted:
                return "Not retried: the proxy does not retry a failure it could not classify."
            if c is not None and c.rule_retryable is False:
                return "Not retried: a policy rule marks this failure as not retryable."
            if c is not None and c.category is Category.TRANSIENT:
                return "Not retried: this tool's policy does not retry transient failures."
            return "Not retried: repeating the same call unchanged would fail the same way."
        case StopReason.UPSTREAM_DECLINED:
            return "Not retried: the upstream said retrying would not help."
        case StopReason.OUTCOME_UNKNOWN:
            return "Not retried: the tool changes state and the failed attempt may have taken effect."
        case StopReason.ATTEMPTS_EXHAUSTED:
            return f"Stopped after {attempts} of {policy.attempts} attempts: the attempt budget is spent."
        case StopReason.DEADLINE_EXHAUSTED:
            return f"Stopped after {attempts} attempt(s): the {deadline_s:g} s deadline leaves no room for another."
        case StopReason.RETRY_BUDGET:
            return "Stopped: the proxy's retry budget for this upstream is spent (too many retries recently)."
        case StopReason.CIRCUIT_OPEN:
            return "Stopped: the circuit breaker for this upstream and tool is open."
        case StopReason.OVERLOADED:
            return "Not attempted: the proxy is at its concurrency limit."
        case StopReason.LEDGER_EXHAUSTED:
            return "Not attempted: an identical call already exhausted its budget; the upstream was not called again."
        case StopReason.CANCELLED:
            # Only a 2025 HTTP caller that disconnected reads this (a resumed stream): a caller
            # that cancelled gets no response at all.
            return "Stopped: the caller disconnected; the attempt in flight was finished and no new one was started."
        case StopReason.SHUTDOWN:
            return (
                "Stopped: the proxy is shutting down and the call outlived its grace period;"
                " the attempt in flight was cancelled upstream."
            )
        case StopReason.STILL_RUNNING:
            return (
                "Not attempted: this call repeats one whose answer was lost and whose execution is still"
                f" running upstream; this call's {deadline_s:g} s deadline passed first. The tool was not"
                " run again and its execution goes on."
            )


def unresolved_message(
    *,
    policy: ToolPolicy,
    reason: StopReason,
    category: Category,
    classified: Classified | None,
    evidence: Evidence,
    defaulted: bool,
    attempts: int,
    elapsed_s: float,
    deadline_s: float,
    partials: int,
    outcome_unknown: bool,
    retry_after_ms: int | None,
    actions: Sequence[Mapping[str, Any]],
    cause: str | None = None,
    earlier: Mapping[str, Any] | None = None,
    unreachable: float | None = None,
) -> str:
    if defaulted:
        # Nothing recognised the failure: the category is only the policy's label, so the text
        # says so and sends the reader to the tool's own words instead of guessing a cause.
        what = (
            f"Tool '{bounded(policy.tool, 100)}' failed with an error the proxy could not classify "
            f"(reported as {category.value}, the policy's label for unclassified failures) after "
            f"{attempts} attempt(s) in {elapsed_s:.1f} s; the tool's own message is in this result."
        )
    else:
        what = (
            f"Tool '{bounded(policy.tool, 100)}' did not complete: {category.value} failure "
            f"({_evidence_phrase(evidence, category, defaulted)}) after {attempts} attempt(s) in {elapsed_s:.1f} s."
        )
    parts = [what]
    if cause:
        parts.append(f"Cause: {cause}.")
    if unreachable is not None:
        parts.append(f"The upstream could not be reached for {unreachable:.1f} s.")
    why = _why(reason, policy, classified, attempts, deadline_s)
    if earlier is not None:
        previous = f"{earlier.get('errorCategory', 'unknown')} failure, {earlier.get('stopReason')}"
        if isinstance(earlier.get("attemptCount"), int):
            previous += f" after {earlier['attemptCount']} attempt(s)"
        why += f" The earlier call's cause: {previous}"
        why += f": {bounded(earlier['lastError'], 200)}." if earlier.get("lastError") else "."
    if retry_after_ms is not None:
        if reason is StopReason.LEDGER_EXHAUSTED:
            why += (
                f" This refusal ends in {retry_after_ms / 1000:.0f} s, or at once for a call that approves"
                " a fresh budget."
            )
        else:
            why += f" Earliest sensible retry: in {retry_after_ms} ms."
    parts.append(why)
    if category is Category.TRANSIENT and not defaulted and reason in BUDGET_EXHAUSTED | {StopReason.LEDGER_EXHAUSTED}:
        parts.append(RETRIED_ALREADY)
    preserved = f"Preserved: {attempts} attempt(s) in attemptedSteps"
    if partials:
        preserved += f", {partials} partial result(s) in partialResults"
    preserved += "."
    if outcome_unknown:
        preserved += " The outcome is unknown: the change may have been applied."
    parts.append(preserved)
    parts.append(f"Next: {' '.join(str(a['description']) for a in actions[:2])}")
    return bounded(" ".join(part for part in parts if part), MESSAGE_LIMIT)
