"""Classify one attempt's outcome into a category, with the evidence that decided it
(docs/recovery.md, "Classification").

Contract: `classify(outcome, policy)` is a pure function; the first source that matches wins:

1. Transport (`TransportError` of any kind but `http_status`): spawn/connect failure, upstream not
   running, the proxy's own overload, a second session 404 → `transient`, not dispatched; timeout,
   stream/process closed, a non-MCP answer (`protocol`) → `transient`, dispatch unknown. Policy
   rules never apply here: errors raised locally are never mistaken for codes from the wire. The
   dispatch is the more cautious of this table and the adapter's own claim (no < unknown < yes).
   The one exception is `session_refused`: the upstream's 404 to a credential other than the one
   that opened its session (passthrough, legacy SSE) refuses that caller, it did not forget the
   session → `permission`, not dispatched, evidence `http` 404.
2. HTTP status: first the policy rules that list the status (in policy order), then the built-in
   table (429/503 transient not dispatched; 500/502/504/408 transient unknown; 401/403 permission;
   400/405/413/415/422 validation), then the JSON-RPC error the HTTP body carried (step 3).
3. JSON-RPC error code: first the policy rules that list the code, then the built-in table
   (-32700/-32600/-32601/-32602 validation; -32603 and -32000..-32019 transient unknown;
   -32020..-32022 validation, evidence kept). For these outcomes a rule's `text` searches the error
   `message` and its `path` looks into the error `data`.
4. `isError` result (dispatch yes: it executed): the upstream's `structuredContent.errorCategory`
   when it is one of the four values and `trust_error_category` is on (with `isRetryable` and
   `retryAfterMs`); else the policy rules (regex on the joined text content, dotted path into
   `structuredContent`); else the shipped rules for what real servers say (`shipped.py`: evidence
   source `shipped`, the rule's id); else unclassified. An unknown category string falls through
   to the rules. A JSON-RPC error whose code neither a rule nor the table knows is matched the
   same way, the policy's rules by its message and data, then the shipped rules by its message
   (dispatch unknown).
5. Success → category None.

A failure nothing classifies gets the policy's `unclassified` category with `defaulted=True`, and
`decide` never retries it; so does a text a shipped rule recognises as not classifiable (its id is
kept as the evidence's rule). So rules take precedence over the built-in tables for the statuses and
codes they name; a rule that names no matcher matches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from proxy.errors import Dispatch, FailureKind
from proxy.policy.compiled import Category, Rule, ToolPolicy
from proxy.recovery.backoff import is_negative_pushback, retry_after_ms_s
from proxy.recovery.outcome import (
    Classified,
    Evidence,
    EvidenceSource,
    Outcome,
    RpcError,
    Success,
    ToolError,
    TransportError,
)
from proxy.recovery.shipped import shipped_rule_for

_REGEX_INPUT_LIMIT: Final = 65_536
_CATEGORY_VALUES: Final = frozenset(c.value for c in Category)

_DISPATCH_ORDER: Final = {Dispatch.NO: 0, Dispatch.UNKNOWN: 1, Dispatch.YES: 2}

TRANSPORT_TABLE: Final[dict[FailureKind, Dispatch]] = {
    FailureKind.SPAWN_FAILED: Dispatch.NO,
    FailureKind.CONNECT_FAILED: Dispatch.NO,
    FailureKind.NOT_RUNNING: Dispatch.NO,
    FailureKind.OVERLOADED: Dispatch.NO,
    FailureKind.SESSION_EXPIRED: Dispatch.NO,
    FailureKind.TIMEOUT: Dispatch.UNKNOWN,
    FailureKind.CLOSED: Dispatch.UNKNOWN,
    FailureKind.PROTOCOL: Dispatch.UNKNOWN,
}

HTTP_TABLE: Final[dict[int, tuple[Category, Dispatch]]] = {
    429: (Category.TRANSIENT, Dispatch.NO),
    503: (Category.TRANSIENT, Dispatch.NO),
    500: (Category.TRANSIENT, Dispatch.UNKNOWN),
    502: (Category.TRANSIENT, Dispatch.UNKNOWN),
    504: (Category.TRANSIENT, Dispatch.UNKNOWN),
    408: (Category.TRANSIENT, Dispatch.UNKNOWN),
    401: (Category.PERMISSION, Dispatch.NO),
    403: (Category.PERMISSION, Dispatch.NO),
    400: (Category.VALIDATION, Dispatch.NO),
    405: (Category.VALIDATION, Dispatch.NO),
    413: (Category.VALIDATION, Dispatch.NO),
    415: (Category.VALIDATION, Dispatch.NO),
    422: (Category.VALIDATION, Dispatch.NO),
    # A redirect: the server did not run the request, it names another URL. The proxy follows
    # none (a POST's body and credential would go where the operator did not point it), so the
    # call cannot succeed until --upstream names the new place: not transient, never dispatched.
    301: (Category.VALIDATION, Dispatch.NO),
    302: (Category.VALIDATION, Dispatch.NO),
    303: (Category.VALIDATION, Dispatch.NO),
    307: (Category.VALIDATION, Dispatch.NO),
    308: (Category.VALIDATION, Dispatch.NO),
}


def jsonrpc_builtin(code: int) -> tuple[Category, Dispatch] | None:
    """The built-in meaning of a JSON-RPC error code from the upstream, or None."""
    if code in (-32700, -32600, -32601, -32602):
        return Category.VALIDATION, Dispatch.NO
    if code == -32603 or -32019 <= code <= -32000:
        return Category.TRANSIENT, Dispatch.UNKNOWN
    if -32022 <= code <= -32020:  # 2026 header/version mismatch: proxy vs upstream, refused
        return Category.VALIDATION, Dispatch.NO
    return None


_MISSING: Final = object()


@dataclass(frozen=True, slots=True)
class _Subject:
    """What a rule's matchers look at; a matcher whose subject is absent does not match."""

    text: str | None = None
    structured: Any = _MISSING
    jsonrpc_code: int | None = None
    http_status: int | None = None


def _lookup(value: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    current = value
    for part in path:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return False, None
    return True, current


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # True is not 1 in a policy file
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    return bool(a == b)


def rule_matches(rule: Rule, subject: _Subject) -> bool:
    """Every matcher the rule sets must match; a rule that sets none matches nothing."""
    used = False
    if rule.text is not None:
        used = True
        if subject.text is None or rule.text.search(subject.text[:_REGEX_INPUT_LIMIT]) is None:
            return False
    if rule.path is not None:
        used = True
        if subject.structured is _MISSING:
            return False
        found, value = _lookup(subject.structured, rule.path)
        if not found:
            return False
        if rule.equals is not None and not any(_same(value, e) for e in rule.equals):
            return False
    if rule.jsonrpc_codes:
        used = True
        if subject.jsonrpc_code is None or subject.jsonrpc_code not in rule.jsonrpc_codes:
            return False
    if rule.http_statuses:
        used = True
        if subject.http_status is None or subject.http_status not in rule.http_statuses:
            return False
    return used


def _first_rule(policy: ToolPolicy, subject: _Subject, *, needs: str | None = None) -> Rule | None:
    for rule in policy.rules:
        if needs == "http" and not rule.http_statuses:
            continue
        if needs == "jsonrpc" and not rule.jsonrpc_codes:
            continue
        if rule_matches(rule, subject):
            return rule
    return None


def _by_rule(
    rule: Rule,
    dispatched: Dispatch,
    code: str | int | None,
    *,
    hint: bool | None = None,
    retry_after_s: float | None = None,
) -> Classified:
    return Classified(
        category=rule.category,
        dispatched=dispatched,
        evidence=Evidence(EvidenceSource.RULE, code=code, rule=rule.name),
        retryable_hint=hint,
        retry_after_s=retry_after_s,
        rule_retryable=rule.retryable,
    )


def _defaulted(
    policy: ToolPolicy,
    dispatched: Dispatch,
    code: str | int | None,
    *,
    hint: bool | None = None,
    retry_after_s: float | None = None,
    rule: str | None = None,
) -> Classified:
    return Classified(
        category=policy.unclassified,
        dispatched=dispatched,
        evidence=Evidence(EvidenceSource.DEFAULT, code=code, rule=rule),
        retryable_hint=hint,
        retry_after_s=retry_after_s,
        defaulted=True,
    )


def _shipped(
    text: str | None,
    policy: ToolPolicy,
    dispatched: Dispatch,
    code: str | int | None,
    *,
    hint: bool | None = None,
    retry_after_s: float | None = None,
) -> Classified:
    """The shipped rules on `text` (after the policy's own), else unclassified."""
    rule = shipped_rule_for(text[:_REGEX_INPUT_LIMIT]) if text else None
    if rule is None or rule.category is None:
        return _defaulted(
            policy, dispatched, code, hint=hint, retry_after_s=retry_after_s, rule=rule.id if rule else None
        )
    return Classified(
        category=rule.category,
        dispatched=dispatched,
        evidence=Evidence(EvidenceSource.SHIPPED, code=code, rule=rule.id),
        retryable_hint=hint,
        retry_after_s=retry_after_s,
    )


def _cautious(a: Dispatch, b: Dispatch) -> Dispatch:
    return a if _DISPATCH_ORDER[a] >= _DISPATCH_ORDER[b] else b


def _jsonrpc(error: dict[str, Any], http_status: int | None, policy: ToolPolicy) -> Classified | None:
    """Classify a JSON-RPC error; None when neither a rule nor the built-in table knows the code."""
    raw = error.get("code")
    code = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if code is None:
        return None
    message = error.get("message")
    subject = _Subject(
        text=message if isinstance(message, str) else None,
        structured=error.get("data", _MISSING),
        jsonrpc_code=code,
        http_status=http_status,
    )
    builtin = jsonrpc_builtin(code)
    rule = _first_rule(policy, subject, needs="jsonrpc")
    if rule is not None:
        return _by_rule(rule, builtin[1] if builtin else Dispatch.UNKNOWN, code)
    if builtin is not None:
        category, dispatched = builtin
        return Classified(category, dispatched, Evidence(EvidenceSource.JSONRPC, code=code))
    return None


def _http(outcome: TransportError, status: int, policy: ToolPolicy) -> Classified:
    body_error = outcome.body.get("error") if isinstance(outcome.body, dict) else None
    error = body_error if isinstance(body_error, dict) else None
    texts = [outcome.detail]
    if error is not None and isinstance(error.get("message"), str):
        texts.append(error["message"])
    raw_code = error.get("code") if error is not None else None
    subject = _Subject(
        text="\n".join(texts),
        structured=error.get("data", _MISSING) if error is not None else _MISSING,
        jsonrpc_code=raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None,
        http_status=status,
    )
    builtin = HTTP_TABLE.get(status)
    rule = _first_rule(policy, subject, needs="http")
    if rule is not None:
        return _by_rule(rule, builtin[1] if builtin else Dispatch.UNKNOWN, status, retry_after_s=outcome.retry_after_s)
    if builtin is not None:
        category, dispatched = builtin
        return Classified(
            category,
            dispatched,
            Evidence(EvidenceSource.HTTP, code=status),
            retry_after_s=outcome.retry_after_s,
        )
    if error is not None:
        by_code = _jsonrpc(error, status, policy)
        if by_code is not None:
            return by_code
    return _defaulted(policy, Dispatch.UNKNOWN, status, retry_after_s=outcome.retry_after_s)


def _transport(outcome: TransportError, policy: ToolPolicy) -> Classified:
    if outcome.kind is FailureKind.HTTP_STATUS:
        if outcome.http_status is None:
            return _defaulted(policy, Dispatch.UNKNOWN, outcome.kind.value)
        return _http(outcome, outcome.http_status, policy)
    if outcome.kind is FailureKind.SESSION_REFUSED:
        return Classified(Category.PERMISSION, Dispatch.NO, Evidence(EvidenceSource.HTTP, code=404))
    dispatched = _cautious(TRANSPORT_TABLE.get(outcome.kind, Dispatch.UNKNOWN), outcome.dispatched)
    return Classified(
        Category.TRANSIENT,
        dispatched,
        Evidence(EvidenceSource.TRANSPORT, code=outcome.kind.value),
        retry_after_s=outcome.retry_after_s,
    )


def tool_error_text(result: dict[str, Any]) -> str:
    """The text content blocks of a CallToolResult, joined by newlines."""
    content = result.get("content")
    if not isinstance(content, list):
        return ""
    return "\n".join(
        block["text"]
        for block in content
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
    )


def _tool_error(result: dict[str, Any], policy: ToolPolicy) -> Classified:
    structured = result.get("structuredContent", _MISSING)
    hint: bool | None = None
    retry_after_s: float | None = None
    claimed: Any = None
    if policy.trust_error_category and isinstance(structured, dict):
        retryable = structured.get("isRetryable")
        if isinstance(retryable, bool):
            hint = retryable
        if is_negative_pushback(structured.get("retryAfterMs")):
            hint = False
        retry_after_s = retry_after_ms_s(structured.get("retryAfterMs"))
        claimed = structured.get("errorCategory")
        if isinstance(claimed, str) and claimed in _CATEGORY_VALUES:
            return Classified(
                Category(claimed),
                Dispatch.YES,
                Evidence(EvidenceSource.UPSTREAM, code=claimed),
                retryable_hint=hint,
                retry_after_s=retry_after_s,
            )
    subject = _Subject(text=tool_error_text(result), structured=structured)
    rule = _first_rule(policy, subject)
    if rule is not None:
        return _by_rule(rule, Dispatch.YES, None, hint=hint, retry_after_s=retry_after_s)
    code = claimed[:64] if isinstance(claimed, str) else None
    return _shipped(subject.text, policy, Dispatch.YES, code, hint=hint, retry_after_s=retry_after_s)


SUCCESS = Classified(None, Dispatch.YES, Evidence(EvidenceSource.UPSTREAM))  # immutable: shared by every success


def classify(outcome: Outcome, policy: ToolPolicy) -> Classified:
    """The category, dispatch and evidence of one attempt's outcome (see the module docstring)."""
    match outcome:
        case Success():
            return SUCCESS
        case TransportError():
            return _transport(outcome, policy)
        case RpcError():
            by_code = _jsonrpc(outcome.error, outcome.http_status, policy)
            if by_code is not None:
                return by_code
            # A code nothing knows: the policy's rules that name no code (their text searches the
            # message, their path the data) come before the shipped rules, as for an isError text.
            message = outcome.error.get("message")
            text = message if isinstance(message, str) else None
            subject = _Subject(text=text, structured=outcome.error.get("data", _MISSING), jsonrpc_code=outcome.code)
            rule = _first_rule(policy, subject)
            if rule is not None:
                return _by_rule(rule, Dispatch.UNKNOWN, outcome.code)
            return _shipped(text, policy, Dispatch.UNKNOWN, outcome.code)
        case ToolError():
            return _tool_error(outcome.result, policy)
