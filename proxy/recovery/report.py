"""The enriched unresolved result (docs/recovery.md, "The unresolved result"), and the two light
touches on other results.

Contract:
- `unresolved_result(...)` returns a CallToolResult dict with `isError: true`. The report (every key
  of the §5 table; schema: proxy/schemas/unresolved-result.schema.json) always travels in
  `_meta["io.mcp-recovery-proxy/unresolved"]`, next to the upstream's own `_meta` keys.
- `structuredContent` carries the report only when `structured=True` (the engine says so when the
  tool declares no `outputSchema` and the client's revision has `structuredContent`): then the
  upstream's own `structuredContent` is merged in, nothing lost (its keys at the top level; a key
  that collides with one of ours, `RESERVED_KEYS`, moves under `upstream`, as does a value that is
  not an object). With `structured=False` the upstream's own `structuredContent`, if any, is kept
  exactly as it came, and nothing of ours is added to it.
- `content` holds the upstream's own content blocks of the last attempt, first and unchanged (many
  clients show only the first block: FastMCP's `ToolError` does, and it must carry the tool's own
  words), then one short text a model can act on (what failed and why, why retrying stopped, what
  is preserved, what to do next). Without upstream content (a transport failure, a refusal before
  attempt 1) the text is the only block, and it quotes the cause: the last attempt's detail (which
  names the timer that cut it, where one did), or for a ledger refusal the earlier call's.
- `isRetryable` false beside a transient category means "the proxy already retried; do not repeat
  the call now", and the text says so in those words (`RETRIED_ALREADY`).
- The time the upstream could not be reached at all (`unreachable_s`: the last run of attempts
  that failed to connect, found it not running, or lost it in flight) is said in the text.
- An unclassified failure (`defaulted`) says so: the text and the suggested action point at the
  tool's own message; never "temporary" or "try again later".
- `outcomeUnknown` is true only for a state-changing tool with an attempt classified transient that
  may have been dispatched: no answer after it was sent (timeout, reset, crash), a transient HTTP
  or JSON-RPC error that left the dispatch unknown, or an `isError` answer classified transient. A
  refusal (validation, permission, business, unclassified) never sets it.
- Details are redacted (no credentials, no argument values) and bounded (300 characters).
  `isRetryable` is false on every result the proxy gives up on.
- `with_attempts_meta(result, attempts)` adds `_meta["io.mcp-recovery-proxy/attempts"]` to a
  success that needed retries and changes nothing else (the input is not mutated).
- `rpc_error_as_result(error)` turns a JSON-RPC error of `tools/call` into an `isError` result,
  so a model can correct itself (the engine skips it when `jsonrpc_errors_as_results` is off); in
  an unresolved result the error itself is kept in the report as `jsonrpcError`, without the
  call's argument values (`redact.scrub_arguments`).
- Suggested actions are deterministic: by stop reason, then category, then the policy's status
  check tool and alternatives, then partial results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from proxy.errors import Dispatch, FailureKind
from proxy.jsonrpc import (
    META_APPROVE_BUDGET,
    META_APPROVED_BUDGET,
    META_ATTEMPTS,
    META_UNREACHABLE_MS,
    META_UNRESOLVED,
    bounded,
)
from proxy.policy.compiled import Category, SideEffect, ToolPolicy
from proxy.recovery.classify import tool_error_text
from proxy.recovery.decide import GiveUp
from proxy.recovery.ledger import ExhaustedEntry
from proxy.recovery.outcome import (
    Classified,
    Evidence,
    EvidenceSource,
    Outcome,
    RpcError,
    Success,
    ToolError,
    TransportError,
    outcome_name,
)
from proxy.recovery.reasons import BUDGET_EXHAUSTED, StopReason
from proxy.recovery.redact import ArgumentValues, argument_values, redact, scrub_arguments

MESSAGE_LIMIT: Final = 1200
PARTIAL_TEXT_LIMIT: Final = 1000
SUMMARY_KEYS: Final = ("errorCategory", "stopReason", "attemptCount", "maxAttempts", "elapsedMs")
LAST_ERROR_LIMIT: Final = 300
RETRIED_ALREADY: Final = (
    "isRetryable is false because the proxy already retried this call within its budget, not because the"
    " failure is permanent: do not repeat the same call now."
)

_MISSING: Final = object()

_CATEGORY_VALUES: Final = frozenset(c.value for c in Category)
_SOURCE_VALUES: Final = frozenset(s.value for s in EvidenceSource)

RESERVED_KEYS: Final = frozenset(
    {
        "errorCategory",
        "isRetryable",
        "retryAfterMs",
        "budgetExhausted",
        "stopReason",
        "attemptCount",
        "maxAttempts",
        "elapsedMs",
        "deadlineMs",
        "attemptedSteps",
        "partialResults",
        "unresolvedSources",
        "outcomeUnknown",
        "operation",
        "suggestedActions",
        "classification",
        "earlierBudget",
        "jsonrpcError",
        "upstream",
    }
)
"""Every key the proxy may write into an unresolved report; upstream structuredContent keys by these names move."""


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt as the engine saw it; times are seconds since the call started."""

    number: int  # 1-based
    started_s: float
    duration_s: float
    outcome: Outcome
    classified: Classified
    backoff_s: float | None = None  # the wait before the next attempt; None for the last one


@dataclass(frozen=True, slots=True)
class PartialResult:
    """Something obtained on the way: `source` is e.g. "upstream", "progress" or "failed_attempt"."""

    source: str
    attempt: int | None
    content: Any


def _ms(seconds: float | None) -> int | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(0, round(seconds * 1000))


def outcome_detail(outcome: Outcome, arguments: Mapping[str, Any] | ArgumentValues | None = None) -> str:
    """A redacted, bounded one-line account of what an attempt produced."""
    match outcome:
        case Success():
            text = "success"
        case ToolError(result=result):
            text = tool_error_text(result) or "isError result without text content"
        case RpcError(error=error):
            text = f"JSON-RPC error {error.get('code')}: {error.get('message', '')}"
        case TransportError(kind=kind, http_status=status, detail=detail):
            text = f"{kind.value}" + (f" (HTTP {status})" if status is not None else "") + f": {detail}"
    return redact(str(text), arguments=arguments)


def _step(record: AttemptRecord, arguments: ArgumentValues | None) -> dict[str, Any]:
    c = record.classified
    return {
        "number": record.number,
        "startedAt": _ms(record.started_s) or 0,
        "durationMs": _ms(record.duration_s) or 0,
        "outcome": outcome_name(record.outcome),
        "category": c.category.value if c.category is not None else None,
        "dispatched": c.dispatched.value,
        "source": c.evidence.source.value,
        "detail": outcome_detail(record.outcome, arguments),
        "backoffMs": _ms(record.backoff_s),
    }


def rpc_error_as_result(error: Mapping[str, Any]) -> dict[str, Any]:
    """An `isError` CallToolResult standing for a JSON-RPC error answer to `tools/call`."""
    code = error.get("code")
    message = error.get("message")
    text = f"The upstream answered with JSON-RPC error {code}: {message if isinstance(message, str) else ''}"
    jsonrpc_error: dict[str, Any] = {"code": code, "message": bounded(str(message or ""), PARTIAL_TEXT_LIMIT)}
    if "data" in error:
        jsonrpc_error["data"] = error["data"]
    return {
        "isError": True,
        "content": [{"type": "text", "text": bounded(text, PARTIAL_TEXT_LIMIT)}],
        "structuredContent": {"jsonrpcError": jsonrpc_error},
    }


def with_attempts_meta(
    result: Mapping[str, Any],
    attempts: int,
    approved_budget_id: str | None = None,
    unreachable_s: float | None = None,
) -> dict[str, Any]:
    """The same result with `_meta["io.mcp-recovery-proxy/attempts"] = attempts` added, the
    approved budget it ran under (`approvedBudgetId`), if any, and how long the upstream could not
    be reached before it answered (`unreachableMs`), if it could not: all a success ever gains."""
    out = dict(result)
    meta = result.get("_meta")
    ours: dict[str, Any] = {META_ATTEMPTS: attempts}
    if approved_budget_id is not None:
        ours[META_APPROVED_BUDGET] = approved_budget_id
    if unreachable_s is not None:
        ours[META_UNREACHABLE_MS] = _ms(unreachable_s)
    out["_meta"] = {**(meta if isinstance(meta, dict) else {}), **ours}
    return out


def merge_upstream_structured(ours: dict[str, Any], upstream: Any = _MISSING) -> dict[str, Any]:
    """Our structuredContent plus the upstream's, nothing lost (see the module contract)."""
    merged = dict(ours)
    if upstream is _MISSING:
        return merged
    if not isinstance(upstream, dict):
        merged["upstream"] = upstream
        return merged
    reserved = set(ours) | RESERVED_KEYS
    moved = {key: value for key, value in upstream.items() if key in reserved}
    merged.update((key, value) for key, value in upstream.items() if key not in reserved)
    if moved:
        merged["upstream"] = moved
    return merged


def ledger_summary(structured: Mapping[str, Any]) -> dict[str, Any]:
    """What the ledger keeps of an exhausted call's unresolved report (`report_of`)."""
    summary = {key: structured[key] for key in SUMMARY_KEYS if key in structured}
    if isinstance(structured.get("classification"), dict):
        summary["classification"] = dict(structured["classification"])
    steps = structured.get("attemptedSteps")
    if isinstance(steps, list) and steps and isinstance(steps[-1], dict) and isinstance(steps[-1].get("detail"), str):
        summary["lastError"] = bounded(steps[-1]["detail"], LAST_ERROR_LIMIT)  # redacted already (`_step`)
    return summary


def report_of(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The unresolved report a result carries in its `_meta`, or None."""
    meta = result.get("_meta")
    report = meta.get(META_UNRESOLVED) if isinstance(meta, Mapping) else None
    return report if isinstance(report, dict) else None


# --- suggested actions ---------------------------------------------------------------------------

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


def _redirected(evidence: Evidence) -> bool:
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
    if outcome_unknown:
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


def _message(
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


# --- the unresolved result -----------------------------------------------------------------------


def _failed_attempt_partials(attempts: Sequence[AttemptRecord]) -> list[dict[str, Any]]:
    """Text of earlier failed attempts (the last one's content follows the message instead)."""
    partials = []
    last = attempts[-1].outcome if attempts else None
    last_text = tool_error_text(last.result) if isinstance(last, ToolError) else None
    for record in attempts[:-1]:
        if isinstance(record.outcome, ToolError):
            text = tool_error_text(record.outcome.result)
            if text and text != last_text:
                partials.append(
                    {
                        "source": "failed_attempt",
                        "attempt": record.number,
                        "content": [{"type": "text", "text": bounded(text, PARTIAL_TEXT_LIMIT)}],
                    }
                )
    return partials


_UNREACHABLE_KINDS: Final = frozenset(
    {FailureKind.CONNECT_FAILED, FailureKind.NOT_RUNNING, FailureKind.SPAWN_FAILED, FailureKind.CLOSED}
)


def unreachable_s(attempts: Sequence[AttemptRecord]) -> float | None:
    """How long the upstream could not be reached, as the last run of attempts that failed to reach
    it saw it: from the end of the run's first attempt (the upstream was found gone) to the start
    of the attempt after the run (it answered then), or to the end of the run's last attempt. None
    when no attempt failed that way."""
    end = len(attempts)
    answered = bool(end) and not _unreachable(attempts[end - 1])
    if answered:
        end -= 1  # a success (or another failure) after the outage
    first = end
    while first > 0 and _unreachable(attempts[first - 1]):
        first -= 1
    if first == end:
        return None
    gone = attempts[first].started_s + attempts[first].duration_s
    back = attempts[end].started_s if answered else attempts[end - 1].started_s + attempts[end - 1].duration_s
    return max(0.0, back - gone)


def _unreachable(record: AttemptRecord) -> bool:
    outcome = record.outcome
    return isinstance(outcome, TransportError) and outcome.kind in _UNREACHABLE_KINDS


def _is_outcome_unknown(policy: ToolPolicy, attempts: Sequence[AttemptRecord]) -> bool:
    """A state-changing call may have taken effect: some attempt failed transiently after it may
    have reached the tool. A refusal, even one that executed (dispatch yes), changed nothing; an
    unclassified failure is not known to be transient, whatever label the policy gives it."""
    if policy.side_effect is not SideEffect.STATE_CHANGING:
        return False
    for record in attempts:
        c = record.classified
        if c.category is Category.TRANSIENT and not c.defaulted and c.dispatched is not Dispatch.NO:
            return True
    return False


def _earlier_budget(earlier: ExhaustedEntry) -> dict[str, Any]:
    """What the exhausted earlier call reported, keeping only well-formed values."""
    out: dict[str, Any] = {"budgetId": earlier.budget_id, "stopReason": earlier.reason.value}
    if earlier.summary.get("errorCategory") in _CATEGORY_VALUES:
        out["errorCategory"] = earlier.summary["errorCategory"]
    for key in ("attemptCount", "maxAttempts", "elapsedMs"):
        value = earlier.summary.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= (1 if key == "maxAttempts" else 0):
            out[key] = value
    last = earlier.summary.get("lastError")
    if isinstance(last, str) and last:
        out["lastError"] = redact(last, LAST_ERROR_LIMIT)  # from a shared store too: bounded again
    return out


def _preflight_classification(stop: GiveUp, earlier: ExhaustedEntry | None) -> tuple[Category, Evidence, bool]:
    """The category and evidence of a call stopped before attempt 1 (ledger, breaker, overload)."""
    if earlier is None:  # breaker or overload: transient, not dispatched (docs/recovery.md, "Classification")
        return Category.TRANSIENT, Evidence(EvidenceSource.TRANSPORT, code=stop.reason.value), False
    raw = earlier.summary.get("errorCategory")
    category = Category(raw) if raw in _CATEGORY_VALUES else Category.TRANSIENT
    previous = earlier.summary.get("classification")
    if not isinstance(previous, Mapping):
        return category, Evidence(EvidenceSource.DEFAULT), False
    source = previous.get("source")
    code = previous.get("code")
    rule = previous.get("rule")
    return (
        category,
        Evidence(
            EvidenceSource(source) if source in _SOURCE_VALUES else EvidenceSource.DEFAULT,
            code=code if isinstance(code, str | int) and not isinstance(code, bool) else None,
            rule=rule if isinstance(rule, str) else None,
        ),
        previous.get("defaulted") is True,
    )


def unresolved_result(
    policy: ToolPolicy,
    stop: GiveUp,
    *,
    attempts: Sequence[AttemptRecord],
    elapsed_s: float,
    deadline_s: float,
    arguments_digest: str,
    budget_id: str,
    arguments: Mapping[str, Any] | None = None,
    partial_results: Sequence[PartialResult] = (),
    unresolved_sources: Sequence[str] | None = None,
    earlier: ExhaustedEntry | None = None,
    approved_budget_id: str | None = None,
    structured: bool = True,
) -> dict[str, Any]:
    """The enriched `isError` result of a call the proxy gives up on.

    - `attempts`: every attempt made (empty when the call stopped before attempt 1); the last
      one's classification is the call's.
    - `arguments`: used only to scrub their values out of details; never echoed.
    - `earlier`: the ledger entry that stopped the call (`ledger_exhausted`); `budget_id` then
      names the earlier budget.
    - `approved_budget_id`: the earlier budget an approval consumed to open this one.
    - `structured`: whether the report may also go into `structuredContent` (see the module
      contract); it always goes into `_meta`.
    """
    last = attempts[-1] if attempts else None
    values = argument_values(arguments) if attempts else None  # walked once for every detail below
    classified = last.classified if last is not None else None
    if classified is not None and classified.category is not None:
        category, evidence, defaulted = classified.category, classified.evidence, classified.defaulted
    else:
        category, evidence, defaulted = _preflight_classification(stop, earlier)
    classification = {
        "source": evidence.source.value,
        "code": bounded(evidence.code, 100) if isinstance(evidence.code, str) else evidence.code,
        "rule": bounded(evidence.rule, 200) if evidence.rule is not None else None,
        "defaulted": defaulted,
    }

    retry_after_ms = _ms(stop.retry_after_s)
    outcome_unknown = _is_outcome_unknown(policy, attempts)
    partials = [{"source": bounded(p.source, 100), "attempt": p.attempt, "content": p.content} for p in partial_results]
    partials.extend(_failed_attempt_partials(attempts))
    actions = suggested_actions(
        policy,
        stop.reason,
        category,
        defaulted=defaulted,
        outcome_unknown=outcome_unknown,
        budget_id=budget_id,
        retry_after_ms=retry_after_ms,
        has_partials=bool(partial_results),
        redirected=_redirected(evidence),
    )
    report: dict[str, Any] = {
        "errorCategory": category.value,
        "isRetryable": False,
        "retryAfterMs": retry_after_ms,
        "budgetExhausted": stop.reason in BUDGET_EXHAUSTED,
        "stopReason": stop.reason.value,
        "attemptCount": len(attempts),
        "maxAttempts": policy.attempts,
        "elapsedMs": _ms(elapsed_s) or 0,
        "deadlineMs": _ms(deadline_s) or 0,
        "attemptedSteps": [_step(record, values) for record in attempts],
        "partialResults": partials,
        "unresolvedSources": [bounded(s, 200) for s in (unresolved_sources or [policy.tool])],
        "outcomeUnknown": outcome_unknown,
        "operation": {
            "tool": policy.tool,
            "sideEffect": policy.side_effect.value,
            "argumentsDigest": arguments_digest,
            "budgetId": budget_id,
            "approvedBudgetId": approved_budget_id,
        },
        "suggestedActions": actions,
        "classification": classification,
    }
    if earlier is not None:
        report["earlierBudget"] = _earlier_budget(earlier)

    upstream_result: Mapping[str, Any] | None = None
    if last is not None:
        match last.outcome:
            case ToolError(result=result):
                upstream_result = result
            case RpcError(error=error):
                rendered = rpc_error_as_result(error)
                upstream_result = {"content": rendered["content"]}
                # The report is the proxy's: the error's text and data repeat no argument value
                # (the content block after the summary is the upstream's own, relayed as is).
                report["jsonrpcError"] = scrub_arguments(rendered["structuredContent"]["jsonrpcError"], values)
            case _:
                upstream_result = None
    upstream_content: list[Any] = []
    upstream_structured: Any = _MISSING
    upstream_meta: Any = None
    if upstream_result is not None:
        content = upstream_result.get("content")
        if isinstance(content, list):
            upstream_content = list(content)
        upstream_structured = upstream_result.get("structuredContent", _MISSING)
        upstream_meta = upstream_result.get("_meta")

    cause = None
    if last is not None and isinstance(last.outcome, TransportError):
        cause = outcome_detail(last.outcome, values)
    text = _message(
        policy=policy,
        reason=stop.reason,
        category=category,
        classified=classified,
        evidence=evidence,
        defaulted=defaulted,
        attempts=len(attempts),
        elapsed_s=elapsed_s,
        deadline_s=deadline_s,
        partials=len(partials),
        outcome_unknown=outcome_unknown,
        retry_after_ms=retry_after_ms,
        actions=actions,
        cause=cause,
        earlier=report.get("earlierBudget"),
        unreachable=unreachable_s(attempts),
    )
    summary = {"type": "text", "text": text}
    # The tool's own words lead, unchanged: a client that shows one block (FastMCP's ToolError)
    # shows them; our summary follows (module contract).
    out: dict[str, Any] = {"isError": True, "content": [*upstream_content, summary]}
    if structured:
        out["structuredContent"] = merge_upstream_structured(report, upstream_structured)
    elif upstream_structured is not _MISSING:
        out["structuredContent"] = upstream_structured
    out["_meta"] = {**(upstream_meta if isinstance(upstream_meta, dict) else {}), META_UNRESOLVED: report}
    return out
