"""The enriched unresolved result (docs/recovery.md, "The unresolved result"), and the two light
touches on other results.

Contract:
- `unresolved_result(...)` returns a CallToolResult dict with `isError: true`. The report (every key
  of the schema proxy/schemas/unresolved-result.schema.json) always travels in
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
  or JSON-RPC error that left the dispatch unknown, or an `isError` answer classified transient;
  and for a re-send of a state-changing call whose own deadline passed while the execution it
  repeats still runs (`still_running`: its outcome is not known yet). A refusal (validation,
  permission, business, unclassified) never sets it.
- Details are redacted (no credentials, no argument values) and bounded (300 characters).
  `isRetryable` is false on every result the proxy gives up on.
- `with_attempts_meta(result, attempts)` adds `_meta["io.mcp-recovery-proxy/attempts"]` to a
  success that needed retries and changes nothing else (the input is not mutated).
- `rpc_error_as_result(error)` turns a JSON-RPC error of `tools/call` into an `isError` result,
  so a model can correct itself (the engine skips it when `jsonrpc_errors_as_results` is off); in
  an unresolved result the error itself is kept in the report as `jsonrpcError`, without the
  call's argument values (`redact.scrub_arguments`).
- `partialResults` lists what was obtained on the way: what the engine passes (progress notes),
  then the upstream's own partial results (a failed attempt's `structuredContent` key
  `partialResults` or `partial_results`, the error convention's field beside `errorCategory`;
  each distinct value once, with the latest attempt that carried it; bounded), then the text of
  earlier `isError` attempts that differs from the last one's; each without the call's argument
  values, as the details. Either of the first two adds `accept_partial` to the suggested actions.
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
    META_APPROVED_BUDGET,
    META_ATTEMPTS,
    META_UNREACHABLE_MS,
    META_UNRESOLVED,
    bounded,
    dumps,
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
from proxy.recovery.wording import redirected, suggested_actions, unresolved_message

PARTIAL_TEXT_LIMIT: Final = 1000
# An upstream's own partial result (`UPSTREAM_PARTIAL_KEYS` of a failed attempt's
# `structuredContent`) is copied as it came up to this many characters of compact JSON; a larger
# one as the first `PARTIAL_TEXT_LIMIT` characters of that JSON, in a text block.
UPSTREAM_PARTIAL_LIMIT: Final = 4000
# Where an error in the errorCategory/isRetryable convention carries what it obtained before it
# failed: the report's own key, and the snake_case spelling of the same convention.
UPSTREAM_PARTIAL_KEYS: Final = ("partialResults", "partial_results")
SUMMARY_KEYS: Final = ("errorCategory", "stopReason", "attemptCount", "maxAttempts", "elapsedMs")
LAST_ERROR_LIMIT: Final = 300

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
    """Something obtained on the way, passed in by the engine (`source` "progress"); the report adds
    the upstream's own ("upstream") and the text of earlier failed attempts ("failed_attempt")."""

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


# --- the unresolved result -----------------------------------------------------------------------


def _upstream_partial(result: Mapping[str, Any]) -> Any:
    """What an `isError` result says it obtained before it failed, bounded (see
    `UPSTREAM_PARTIAL_LIMIT`); `_MISSING` when it says nothing (no such key, or an empty value)."""
    structured = result.get("structuredContent")
    if not isinstance(structured, dict):
        return _MISSING
    for key in UPSTREAM_PARTIAL_KEYS:
        value = structured.get(key)
        if value is None or value == [] or value == {} or value == "":
            continue
        try:
            encoded = dumps(value).decode()
        except TypeError:  # nested deeper than orjson writes (a parsed value holds nothing else it cannot)
            return _MISSING
        if len(encoded) <= UPSTREAM_PARTIAL_LIMIT:
            return value
        return [{"type": "text", "text": bounded(encoded, PARTIAL_TEXT_LIMIT)}]
    return _MISSING


def _upstream_partials(attempts: Sequence[AttemptRecord]) -> list[dict[str, Any]]:
    """The upstream's own partial results of the failed attempts, each value once, attributed to
    the latest attempt that carried it (attempts that obtained the same thing list it once)."""
    found: list[tuple[int, Any]] = []
    for record in attempts:
        if isinstance(record.outcome, ToolError):
            value = _upstream_partial(record.outcome.result)
            if value is not _MISSING:
                found = [(number, seen) for number, seen in found if seen != value]
                found.append((record.number, value))
    return [{"source": "upstream", "attempt": number, "content": value} for number, value in found]


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
    outcome_unknown = _is_outcome_unknown(policy, attempts) or (
        stop.reason is StopReason.STILL_RUNNING and policy.side_effect is SideEffect.STATE_CHANGING
    )
    partials = [{"source": bounded(p.source, 100), "attempt": p.attempt, "content": p.content} for p in partial_results]
    upstream_partials = _upstream_partials(attempts)
    partials.extend(upstream_partials)
    partials.extend(_failed_attempt_partials(attempts))
    if partials and arguments:
        # The report repeats no argument value: what the upstream echoed in a progress note, a
        # partial result or a failed attempt's text is scrubbed as the details are.
        scrub = values if values is not None else argument_values(arguments)
        for partial in partials:
            partial["content"] = scrub_arguments(partial["content"], scrub)
    actions = suggested_actions(
        policy,
        stop.reason,
        category,
        defaulted=defaulted,
        outcome_unknown=outcome_unknown,
        budget_id=budget_id,
        retry_after_ms=retry_after_ms,
        has_partials=bool(partial_results or upstream_partials),
        redirected=redirected(evidence),
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
            case TransportError(body={"error": dict() as error}):
                # An HTTP error status whose body is a JSON-RPC error: the summary quotes the
                # status (the cause below); the error itself, with its data, is kept as above.
                rendered = rpc_error_as_result(error)
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
    text = unresolved_message(
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
