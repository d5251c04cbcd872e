"""The enriched unresolved result: every key, schema-valid, upstream content kept, details redacted."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import Dispatch, FailureKind
from proxy.jsonrpc import META_APPROVE_BUDGET, META_ATTEMPTS, META_UNRESOLVED
from proxy.policy.compiled import Category, SideEffect, ToolPolicy
from proxy.recovery.classify import classify
from proxy.recovery.decide import GiveUp, StopReason
from proxy.recovery.ledger import ExhaustedEntry, InMemoryLedger, operation_digest
from proxy.recovery.outcome import Outcome, RpcError, Success, ToolError, TransportError
from proxy.recovery.redact import redact
from proxy.recovery.report import (
    PARTIAL_TEXT_LIMIT,
    RESERVED_KEYS,
    AttemptRecord,
    PartialResult,
    ledger_summary,
    merge_upstream_structured,
    rpc_error_as_result,
    unreachable_s,
    unresolved_result,
    with_attempts_meta,
)

TABLE_KEYS = {
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
}
DIGEST = "0" * 64


def policy(**kw: Any) -> ToolPolicy:
    kw.setdefault("side_effect", SideEffect.READ_ONLY)
    return ToolPolicy(tool="archive_lookup", **kw)


def attempts_of(p: ToolPolicy, *outcomes: Outcome) -> list[AttemptRecord]:
    records = []
    for i, outcome in enumerate(outcomes):
        last = i == len(outcomes) - 1
        records.append(AttemptRecord(i + 1, i * 1.5, 1.0, outcome, classify(outcome, p), None if last else 0.5))
    return records


def build(p: ToolPolicy, reason: StopReason, *outcomes: Outcome, **kw: Any) -> dict[str, Any]:
    kw.setdefault("elapsed_s", 4.0)
    kw.setdefault("deadline_s", p.deadline_s)
    kw.setdefault("arguments_digest", DIGEST)
    kw.setdefault("budget_id", "bud1")
    retry_after = kw.pop("retry_after_s", None)
    return unresolved_result(p, GiveUp(reason, retry_after), attempts=attempts_of(p, *outcomes), **kw)


def summary(result: dict[str, Any]) -> str:
    """The proxy's own text block (the last one: the upstream's own blocks lead)."""
    texts = [b["text"] for b in result["content"] if b.get("type") == "text" and b["text"].startswith("Tool '")]
    assert len(texts) == 1, result["content"]
    return texts[0]


def tool_error(text: str, structured: Any = None) -> ToolError:
    result: dict[str, Any] = {"isError": True, "content": [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    return ToolError(result)


TIMEOUT = TransportError(FailureKind.TIMEOUT, Dispatch.UNKNOWN, "no answer within 4 s")
HTTP503 = TransportError(FailureKind.HTTP_STATUS, Dispatch.YES, "service unavailable", http_status=503)


# (id, policy kwargs, stop reason, outcomes, extra kwargs, expected category, budgetExhausted, outcomeUnknown)
CASES = [
    ("attempts", {}, StopReason.ATTEMPTS_EXHAUSTED, [HTTP503] * 3, {}, "transient", True, False),
    ("deadline", {}, StopReason.DEADLINE_EXHAUSTED, [TIMEOUT], {"retry_after_s": 12.0}, "transient", True, False),
    (
        "validation",
        {},
        StopReason.NOT_RETRYABLE,
        [RpcError({"code": -32602, "message": "bad"})],
        {},
        "validation",
        False,
        False,
    ),
    (
        "permission",
        {},
        StopReason.NOT_RETRYABLE,
        [tool_error("no", {"errorCategory": "permission"})],
        {},
        "permission",
        False,
        False,
    ),
    (
        "business",
        {},
        StopReason.NOT_RETRYABLE,
        [tool_error("too big", {"errorCategory": "business"})],
        {},
        "business",
        False,
        False,
    ),
    ("unclassified", {}, StopReason.NOT_RETRYABLE, [tool_error("weird")], {}, "business", False, False),
    (
        "declined",
        {},
        StopReason.UPSTREAM_DECLINED,
        [tool_error("x", {"errorCategory": "transient", "isRetryable": False})],
        {},
        "transient",
        False,
        False,
    ),
    (
        "outcome-unknown",
        {"side_effect": SideEffect.STATE_CHANGING, "status_check_tool": "refund_status"},
        StopReason.OUTCOME_UNKNOWN,
        [TIMEOUT],
        {},
        "transient",
        False,
        True,
    ),
    ("retry-budget", {}, StopReason.RETRY_BUDGET, [HTTP503], {}, "transient", False, False),
    (
        "circuit-open-mid-call",
        {},
        StopReason.CIRCUIT_OPEN,
        [HTTP503],
        {"retry_after_s": 30.0},
        "transient",
        False,
        False,
    ),
    ("circuit-open-before-first", {}, StopReason.CIRCUIT_OPEN, [], {"retry_after_s": 30.0}, "transient", False, False),
    ("overloaded", {}, StopReason.OVERLOADED, [], {"retry_after_s": 1.0}, "transient", False, False),
]


@pytest.mark.parametrize(
    ("policy_kw", "reason", "outcomes", "kw", "category", "exhausted", "unknown"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_every_key_present_and_schema_valid(
    assert_schema_valid, policy_kw, reason, outcomes, kw, category, exhausted, unknown
):
    p = policy(**policy_kw)
    result = build(p, reason, *outcomes, **kw)
    assert_schema_valid(result)
    s = result["structuredContent"]
    assert TABLE_KEYS <= set(s)
    assert s["isRetryable"] is False
    assert (s["errorCategory"], s["stopReason"]) == (category, reason.value)
    assert (s["budgetExhausted"], s["outcomeUnknown"]) == (exhausted, unknown)
    assert (s["attemptCount"], s["maxAttempts"]) == (len(outcomes), p.attempts)
    assert s["operation"] == {
        "tool": "archive_lookup",
        "sideEffect": p.side_effect.value,
        "argumentsDigest": DIGEST,
        "budgetId": "bud1",
        "approvedBudgetId": None,
    }
    assert [step["number"] for step in s["attemptedSteps"]] == list(range(1, len(outcomes) + 1))
    if "retry_after_s" in kw:
        assert s["retryAfterMs"] == round(kw["retry_after_s"] * 1000)
    assert "archive_lookup" in summary(result) and "Next:" in summary(result)
    assert result["_meta"][META_UNRESOLVED] == {k: v for k, v in s.items() if k in result["_meta"][META_UNRESOLVED]}


def test_attempted_steps_record_timing_outcome_dispatch_and_backoff(assert_schema_valid):
    p = policy()
    result = build(
        p, StopReason.ATTEMPTS_EXHAUSTED, TIMEOUT, HTTP503, tool_error("down", {"errorCategory": "transient"})
    )
    assert_schema_valid(result)
    steps = result["structuredContent"]["attemptedSteps"]
    assert [(s["startedAt"], s["durationMs"], s["backoffMs"]) for s in steps] == [
        (0, 1000, 500),
        (1500, 1000, 500),
        (3000, 1000, None),
    ]
    assert [(s["outcome"], s["dispatched"], s["source"]) for s in steps] == [
        ("transport_error", "unknown", "transport"),
        ("transport_error", "no", "http"),
        ("tool_error", "yes", "upstream"),
    ]
    assert steps[1]["detail"] == "http_status (HTTP 503): service unavailable"


def test_classification_evidence_is_reported():
    p = policy()
    s = build(p, StopReason.ATTEMPTS_EXHAUSTED, HTTP503)["structuredContent"]
    assert s["classification"] == {"source": "http", "code": 503, "rule": None, "defaulted": False}
    s = build(p, StopReason.NOT_RETRYABLE, tool_error("?"))["structuredContent"]
    assert s["classification"] == {"source": "default", "code": None, "rule": None, "defaulted": True}


@pytest.mark.parametrize("reason", [StopReason.ATTEMPTS_EXHAUSTED, StopReason.DEADLINE_EXHAUSTED])
def test_the_upstreams_own_content_leads_unchanged_after_retries_and_the_summary_follows(reason):
    """A client that shows only the first block (FastMCP's ToolError) shows the tool's own words."""
    p = policy()
    upstream = tool_error("archive is down", {"errorCategory": "transient"})
    upstream.result["content"].append({"type": "image", "data": "AAAA", "mimeType": "image/png"})
    result = build(p, reason, upstream)
    assert result["content"][:-1] == upstream.result["content"]
    assert result["content"][0]["text"] == "archive is down"
    assert result["content"][-1]["text"] == summary(result)


def test_upstream_structured_keys_are_kept_and_collisions_moved(assert_schema_valid):
    structured = {
        "errorCategory": "transient",
        "isRetryable": True,
        "rows": [1, 2],
        "upstream": "theirs",
        "earlierBudget": 7,
    }
    result = build(policy(), StopReason.ATTEMPTS_EXHAUSTED, tool_error("x", structured))
    assert_schema_valid(result)
    s = result["structuredContent"]
    assert s["rows"] == [1, 2] and s["isRetryable"] is False
    assert s["upstream"] == {
        "errorCategory": "transient",
        "isRetryable": True,
        "upstream": "theirs",
        "earlierBudget": 7,
    }
    assert "earlierBudget" not in s


@pytest.mark.parametrize("value", [["a", "b"], "text", 42, None, True])
def test_non_object_upstream_structured_content_goes_under_upstream(assert_schema_valid, value):
    result = build(
        policy(),
        StopReason.NOT_RETRYABLE,
        tool_error("x", value)
        if value is not None
        else ToolError({"isError": True, "content": [], "structuredContent": None}),
    )
    assert_schema_valid(result)
    assert result["structuredContent"]["upstream"] == value
    assert isinstance(result["structuredContent"], dict)


def test_a_jsonrpc_error_in_an_http_error_body_is_kept_in_the_report(assert_schema_valid):
    """An HTTP 400 whose body is a JSON-RPC error: the report carries that error (its data
    included, the argument values scrubbed) as for one that came with a 200."""
    error = {"code": -32602, "message": "bad date 1999-13-40", "data": {"field": "from", "got": "1999-13-40"}}
    body = {"jsonrpc": "2.0", "id": 3, "error": error}
    outcome = TransportError(FailureKind.HTTP_STATUS, Dispatch.NO, "bad request", http_status=400, body=body)
    result = build(policy(), StopReason.NOT_RETRYABLE, outcome, arguments={"from": "1999-13-40"})
    assert_schema_valid(result)
    report = result["_meta"][META_UNRESOLVED]
    assert report["jsonrpcError"] == {
        "code": -32602,
        "message": "bad date [argument]",
        "data": {"field": "from", "got": "[argument]"},
    }
    assert (report["classification"]["source"], report["classification"]["code"]) == ("http", 400)
    assert "HTTP 400" in summary(result)


def test_merge_without_upstream_structured_adds_nothing():
    assert merge_upstream_structured({"a": 1}) == {"a": 1}
    assert "upstream" not in build(policy(), StopReason.ATTEMPTS_EXHAUSTED, TIMEOUT)["structuredContent"]
    assert {"stopReason", "upstream"} <= RESERVED_KEYS


def test_jsonrpc_error_becomes_an_is_error_result():
    r = rpc_error_as_result({"code": -32602, "message": "bad date", "data": {"field": "from"}})
    assert r["isError"] is True
    assert "-32602" in r["content"][0]["text"] and "bad date" in r["content"][0]["text"]
    assert r["structuredContent"]["jsonrpcError"] == {"code": -32602, "message": "bad date", "data": {"field": "from"}}
    s = build(policy(), StopReason.NOT_RETRYABLE, RpcError({"code": -32602, "message": "bad date"}))
    assert s["structuredContent"]["jsonrpcError"]["code"] == -32602
    assert s["_meta"][META_UNRESOLVED]["jsonrpcError"]["code"] == -32602
    # the first answer, not retried: the upstream's account leads, the proxy's summary follows
    assert "bad date" in s["content"][0]["text"] and s["content"][1]["text"] == summary(s)


def test_with_attempts_meta_changes_nothing_else():
    result = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"n": 0}, "_meta": {"k": 1}}
    out = with_attempts_meta(result, 3)
    assert out == {**result, "_meta": {"k": 1, META_ATTEMPTS: 3}}
    assert result["_meta"] == {"k": 1}  # not mutated
    assert with_attempts_meta({"content": []}, 2) == {"content": [], "_meta": {META_ATTEMPTS: 2}}


def test_partial_results_and_unresolved_sources(assert_schema_valid):
    p = policy(alternatives=("archive_mirror",))
    partial = PartialResult("primary_history", None, [{"type": "text", "text": "3 orders"}])
    progress = PartialResult("progress", 2, "scanned 40%")
    result = build(
        p,
        StopReason.ATTEMPTS_EXHAUSTED,
        tool_error("first failure", {"errorCategory": "transient"}),
        tool_error("second failure", {"errorCategory": "transient"}),
        partial_results=[partial, progress],
        unresolved_sources=["archive"],
    )
    assert_schema_valid(result)
    s = result["structuredContent"]
    assert s["partialResults"][:2] == [
        {"source": "primary_history", "attempt": None, "content": [{"type": "text", "text": "3 orders"}]},
        {"source": "progress", "attempt": 2, "content": "scanned 40%"},
    ]
    assert s["partialResults"][2] == {
        "source": "failed_attempt",
        "attempt": 1,
        "content": [{"type": "text", "text": "first failure"}],
    }
    assert s["unresolvedSources"] == ["archive"]
    actions = [a["action"] for a in s["suggestedActions"]]
    assert actions == ["retry_later", "approve_budget", "use_alternative", "accept_partial"]
    assert s["suggestedActions"][2]["tool"] == "archive_mirror"
    assert META_APPROVE_BUDGET in s["suggestedActions"][1]["description"]
    assert "2 partial result" not in summary(result)  # three are reported
    assert "3 partial result(s)" in summary(result)


def test_the_upstreams_own_partial_results_are_listed_once_per_value(assert_schema_valid):
    """An error in the errorCategory convention says what it obtained before failing
    (`partialResults`, or `partial_results`): the report lists each distinct value once, with the
    latest attempt that carried it, and suggests accepting it."""
    p = policy()
    first = {"searched": ["2024"], "missing": ["2019", "2020"]}
    later = {"searched": ["2024", "2023"], "missing": ["2019"]}
    result = build(
        p,
        StopReason.ATTEMPTS_EXHAUSTED,
        tool_error("archive down", {"errorCategory": "transient", "partialResults": first}),
        tool_error("archive down", {"errorCategory": "transient", "partial_results": later}),
        tool_error("archive down", {"errorCategory": "transient", "partialResults": dict(first)}),
    )
    assert_schema_valid(result)
    report = result["_meta"][META_UNRESOLVED]
    assert report["partialResults"] == [
        {"source": "upstream", "attempt": 2, "content": later},
        {"source": "upstream", "attempt": 3, "content": first},
    ]
    assert [a["action"] for a in report["suggestedActions"]][-1] == "accept_partial"
    assert "2 partial result(s) in partialResults" in summary(result)
    # the upstream's own structuredContent is still kept whole, the colliding key moved under `upstream`
    assert result["structuredContent"]["upstream"]["partialResults"] == first


def test_partial_results_repeat_no_argument_value(assert_schema_valid):
    """What the upstream echoed in a progress note, its own partial result or an earlier failed
    attempt's text is scrubbed as the details are (the report repeats no argument value)."""
    secret = "wombat-Pq7Zr"
    result = build(
        policy(),
        StopReason.ATTEMPTS_EXHAUSTED,
        tool_error(f"failed for {secret}", {"errorCategory": "transient", "partialResults": {"q": secret, "n": 2}}),
        tool_error("failed again", {"errorCategory": "transient"}),
        arguments={"secret": secret},
        partial_results=[PartialResult("progress", 1, {"progress": 1, "message": f"scanning {secret}"})],
    )
    assert_schema_valid(result)
    partials = result["_meta"][META_UNRESOLVED]["partialResults"]
    assert [(p["source"], p["attempt"]) for p in partials] == [("progress", 1), ("upstream", 1), ("failed_attempt", 1)]
    assert secret not in str(partials)
    assert partials[1]["content"] == {"q": "[argument]", "n": 2}
    assert partials[2]["content"] == [{"type": "text", "text": "failed for [argument]"}]


@pytest.mark.parametrize("value", [None, [], {}, ""])
def test_an_empty_upstream_partial_is_no_partial(value: Any):
    result = build(
        policy(),
        StopReason.ATTEMPTS_EXHAUSTED,
        tool_error("down", {"errorCategory": "transient", "partialResults": value}),
    )
    report = result["_meta"][META_UNRESOLVED]
    assert report["partialResults"] == []
    assert "accept_partial" not in [a["action"] for a in report["suggestedActions"]]
    assert "partial result" not in summary(result)


def test_a_large_upstream_partial_is_bounded_in_the_report():
    rows = [{"order": f"o-{i}", "total": i} for i in range(2000)]
    result = build(
        policy(),
        StopReason.ATTEMPTS_EXHAUSTED,
        tool_error("down", {"errorCategory": "transient", "partialResults": rows}),
        structured=False,
    )
    [partial] = result["_meta"][META_UNRESOLVED]["partialResults"]
    assert partial["source"] == "upstream" and partial["attempt"] == 1
    [block] = partial["content"]
    assert block["type"] == "text" and len(block["text"]) == PARTIAL_TEXT_LIMIT
    assert block["text"].startswith('[{"order":"o-0","total":0}') and block["text"].endswith("…")
    # the tool declares an output schema (structured=False): its own structuredContent is untouched
    assert result["structuredContent"]["partialResults"] == rows


@pytest.mark.parametrize(
    ("reason", "outcome", "expected"),
    [
        (StopReason.NOT_RETRYABLE, RpcError({"code": -32602, "message": "x"}), ["change_input"]),
        (StopReason.NOT_RETRYABLE, tool_error("x", {"errorCategory": "permission"}), ["request_access"]),
        (StopReason.NOT_RETRYABLE, tool_error("x", {"errorCategory": "business"}), ["explain_or_escalate"]),
        (StopReason.NOT_RETRYABLE, tool_error("x"), ["inspect_error"]),
        (
            StopReason.UPSTREAM_DECLINED,
            tool_error("x", {"errorCategory": "transient", "isRetryable": False}),
            ["do_not_repeat"],
        ),
        (StopReason.ATTEMPTS_EXHAUSTED, HTTP503, ["retry_later", "approve_budget"]),
        (StopReason.DEADLINE_EXHAUSTED, TIMEOUT, ["retry_later", "approve_budget"]),
        (StopReason.RETRY_BUDGET, HTTP503, ["retry_later"]),
        (StopReason.CIRCUIT_OPEN, HTTP503, ["retry_later"]),
        (StopReason.SHUTDOWN, TIMEOUT, ["retry_elsewhere"]),
    ],
)
def test_suggested_actions_are_deterministic(reason, outcome, expected):
    first = build(policy(), reason, outcome)["structuredContent"]["suggestedActions"]
    again = build(policy(), reason, outcome)["structuredContent"]["suggestedActions"]
    assert first == again
    assert [a["action"] for a in first] == expected
    # the policy's alternatives follow, whatever stopped the call (but a re-send still running)
    with_alternative = build(policy(alternatives=("mirror",)), reason, outcome)["structuredContent"]
    assert [a["action"] for a in with_alternative["suggestedActions"]] == [*expected, "use_alternative"]


def test_outcome_unknown_suggests_the_status_check_and_says_so():
    p = policy(side_effect=SideEffect.STATE_CHANGING, status_check_tool="refund_status")
    result = build(p, StopReason.OUTCOME_UNKNOWN, TIMEOUT)
    s = result["structuredContent"]
    assert s["outcomeUnknown"] is True
    assert s["suggestedActions"][:2] == [
        {
            "action": "check_status",
            "description": "Check whether the change was applied (with 'refund_status') before doing anything else.",
            "tool": "refund_status",
        },
        {
            "action": "do_not_repeat",
            "description": "Do not repeat this call unchanged: it could apply the change twice.",
        },
    ]
    assert "may have taken effect" in summary(result)


@pytest.mark.parametrize(
    ("outcome", "unknown"),
    [
        (TIMEOUT, True),
        (tool_error("x", {"errorCategory": "transient"}), True),  # executed, transient: may have happened
        (tool_error("x"), False),  # executed and unclassified: a refusal we cannot name, not a maybe
        (tool_error("Input validation error: Invalid arguments for tool t: required"), False),
        (tool_error("MCP error -32602: Tool t not found"), False),  # unknown tool
        (tool_error("Access denied - path outside allowed directories"), False),
        (tool_error("Could not find exact match for edit"), False),
        (tool_error("upstream request timed out"), True),  # a timeout inside the tool: maybe applied
        (RpcError({"code": -32603, "message": "internal"}), True),  # dispatch unknown, transient
        (RpcError({"code": -32601, "message": "Method not found"}), False),
        (tool_error("x", {"errorCategory": "business"}), False),  # the tool said no
        (HTTP503, False),  # refused before processing
        (RpcError({"code": -32602, "message": "x"}), False),
    ],
)
def test_outcome_unknown_for_state_changing_tools(outcome, unknown):
    s = build(policy(side_effect=SideEffect.STATE_CHANGING), StopReason.NOT_RETRYABLE, outcome)["structuredContent"]
    assert s["outcomeUnknown"] is unknown
    s = build(policy(side_effect=SideEffect.IDEMPOTENT), StopReason.NOT_RETRYABLE, outcome)["structuredContent"]
    assert s["outcomeUnknown"] is False


@pytest.mark.parametrize("side_effect", list(SideEffect))
def test_a_re_send_past_its_own_deadline_says_the_execution_runs_on_and_to_ask_again(assert_schema_valid, side_effect):
    # alternatives configured: none is offered while the execution runs on (one beside it could
    # apply a change twice), nor a partial result
    p = policy(side_effect=side_effect, status_check_tool="refund_status", alternatives=("refund_manual",))
    progress = PartialResult("progress", 1, {"progress": 1, "total": 2, "message": "half"})
    result = build(p, StopReason.STILL_RUNNING, partial_results=[progress])
    assert_schema_valid(result)
    s = result["structuredContent"]
    assert (s["stopReason"], s["attemptCount"], s["budgetExhausted"]) == ("still_running", 0, False)
    # unknown only where it matters (a change that may still be applied), and never "do not repeat":
    # repeating is how the answer is received
    assert s["outcomeUnknown"] is (side_effect is SideEffect.STATE_CHANGING)
    assert [a["action"] for a in s["suggestedActions"]] == ["resend"]
    text = summary(result)
    assert "was not run again" in text and "still running" in text
    assert "refund_manual" not in text


def test_ledger_exhausted_points_at_the_earlier_budget(assert_schema_valid):
    p = policy()
    earlier_result = build(p, StopReason.ATTEMPTS_EXHAUSTED, HTTP503, HTTP503, HTTP503, budget_id="old")
    ledger = InMemoryLedger()
    op = operation_digest(p.tool, {"q": 1})
    ledger.record_exhausted(
        op,
        "old",
        StopReason.ATTEMPTS_EXHAUSTED,
        60.0,
        now_s=0.0,
        summary=ledger_summary(earlier_result["structuredContent"]),
    )
    entry = ledger.check(op, now_s=20.0)
    assert isinstance(entry, ExhaustedEntry)
    result = unresolved_result(
        p,
        GiveUp(StopReason.LEDGER_EXHAUSTED, entry.retry_after_s(20.0)),
        attempts=[],
        elapsed_s=0.0,
        deadline_s=10.0,
        arguments_digest=op,
        budget_id=entry.budget_id,
        earlier=entry,
    )
    assert_schema_valid(result)
    s = result["structuredContent"]
    assert (s["stopReason"], s["budgetExhausted"], s["attemptCount"], s["retryAfterMs"]) == (
        "ledger_exhausted",
        True,
        0,
        40_000,
    )
    assert s["operation"]["budgetId"] == "old"
    assert s["errorCategory"] == "transient"
    assert s["classification"] == {"source": "http", "code": 503, "rule": None, "defaulted": False}
    assert s["earlierBudget"] == {
        "budgetId": "old",
        "stopReason": "attempts_exhausted",
        "errorCategory": "transient",
        "attemptCount": 3,
        "maxAttempts": 3,
        "elapsedMs": 4000,
        "lastError": "http_status (HTTP 503): service unavailable",
    }
    assert "approve_budget" in [a["action"] for a in s["suggestedActions"]]
    # the refusal's own words carry the cause and when it ends (it is the only content block)
    (only,) = result["content"]
    assert "transient failure, attempts_exhausted after 3 attempt(s): http_status (HTTP 503)" in only["text"]
    assert "This refusal ends in 40 s" in only["text"] and "approveBudget" in only["text"]
    assert "already retried" in only["text"]


def test_a_transient_failure_given_up_on_says_isretryable_false_means_retried_already():
    for reason in (StopReason.ATTEMPTS_EXHAUSTED, StopReason.DEADLINE_EXHAUSTED):
        result = build(policy(), reason, HTTP503, HTTP503, HTTP503)
        assert result["structuredContent"]["isRetryable"] is False
        assert "isRetryable is false because the proxy already retried" in summary(result)
        assert "do not repeat the same call now" in summary(result)
    # not said where it would be wrong: a validation failure is not "retried already"
    refusal = build(policy(), StopReason.NOT_RETRYABLE, tool_error("bad", {"errorCategory": "validation"}))
    assert "already retried" not in summary(refusal)


def test_a_transport_failure_is_quoted_in_the_text_with_how_long_the_upstream_was_unreachable():
    refused = TransportError(FailureKind.CONNECT_FAILED, Dispatch.NO, "connection refused")
    p = policy()
    attempts = [
        AttemptRecord(1, 0.0, 0.01, refused, classify(refused, p), 2.0),
        AttemptRecord(2, 2.01, 0.01, refused, classify(refused, p), 4.0),
        AttemptRecord(3, 6.02, 0.01, refused, classify(refused, p), None),
    ]
    result = unresolved_result(
        p,
        GiveUp(StopReason.ATTEMPTS_EXHAUSTED),
        attempts=attempts,
        elapsed_s=6.03,
        deadline_s=58.0,
        arguments_digest=DIGEST,
        budget_id="b",
    )
    (only,) = result["content"]
    assert "Cause: connect_failed: connection refused." in only["text"]
    assert "could not be reached for 6.0 s" in only["text"]
    assert unreachable_s(attempts) == pytest.approx(6.02)
    # a success after the outage: up to the attempt that answered
    ok = Success({"content": []})
    answered = [*attempts[:2], AttemptRecord(3, 6.02, 0.5, ok, classify(ok, p), None)]
    assert unreachable_s(answered) == pytest.approx(6.01)
    assert unreachable_s(answered[2:]) is None


def test_an_approved_budget_shows_in_the_new_result(assert_schema_valid):
    result = build(policy(), StopReason.ATTEMPTS_EXHAUSTED, HTTP503, budget_id="new", approved_budget_id="old")
    assert_schema_valid(result)
    assert result["structuredContent"]["operation"]["approvedBudgetId"] == "old"


SECRETS = [
    ("Authorization: Bearer abc.def.ghi", "abc.def.ghi"),
    ("header authorization=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ("call failed with Bearer sk_live_1234567890", "sk_live_1234567890"),
    ("url https://x/y?api_key=SECRET123&z=1", "SECRET123"),
    ('{"password": "hunter22"}', "hunter22"),
    ("token: tok_abcdef123456", "tok_abcdef123456"),
    ("key sk-abcdefghijklmnopqrstuv used", "sk-abcdefghijklmnopqrstuv"),
    ("gh token ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    ("aws AKIAABCDEFGHIJKLMNOP here", "AKIAABCDEFGHIJKLMNOP"),
    ("hex 0123456789abcdef0123456789abcdef01 end", "0123456789abcdef0123456789abcdef01"),
    ("b64 QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVoxMjM0NTY3OA== end", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVoxMjM0NTY3OA"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_nature", "eyJhbGciOiJIUzI1NiJ9"),
]


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_details_never_carry_credentials(text, secret):
    out = redact(text)
    assert secret not in out and "[redacted]" in out


def test_redaction_keeps_ordinary_words():
    text = "connection_refused_by_the_upstream_server_process at port 3001"
    assert redact(text) == text


def test_details_are_bounded_single_line_and_never_echo_arguments(assert_schema_valid):
    args = {"email": "alice@example.com", "nested": {"note": "confidential plan"}, "n": 123456}
    outcome = tool_error(
        "invalid email alice@example.com for confidential plan #123456\n\nAuthorization: Bearer zzzzzzzzz " + "x" * 2000
    )
    result = build(policy(), StopReason.NOT_RETRYABLE, outcome, arguments=args)
    assert_schema_valid(result)
    detail = result["structuredContent"]["attemptedSteps"][0]["detail"]
    assert len(detail) <= 300 and "\n" not in detail
    for leaked in ("alice@example.com", "confidential plan", "123456", "zzzzzzzzz"):
        assert leaked not in detail
    assert "[argument]" in detail
    assert len(summary(result)) <= 1200
    assert "alice@example.com" not in summary(result)


def test_huge_transport_detail_is_bounded():
    outcome = TransportError(FailureKind.CLOSED, Dispatch.UNKNOWN, "y " * 100_000)
    s = build(policy(), StopReason.ATTEMPTS_EXHAUSTED, outcome)["structuredContent"]
    assert len(s["attemptedSteps"][0]["detail"]) == 300


def test_defaulted_category_follows_the_policy_unclassified():
    s = build(policy(unclassified=Category.BUSINESS), StopReason.NOT_RETRYABLE, tool_error("?"))["structuredContent"]
    assert (s["errorCategory"], s["classification"]["defaulted"]) == ("business", True)


@pytest.mark.parametrize(
    "summary",
    [
        {},
        {"errorCategory": "nonsense", "classification": "not a dict"},
        {"errorCategory": "permission", "classification": {"source": "bogus", "code": [1], "rule": 5}},
    ],
)
def test_a_ledger_summary_from_a_shared_store_cannot_break_the_result(assert_schema_valid, summary):
    entry = ExhaustedEntry("op", "old", StopReason.DEADLINE_EXHAUSTED, 0.0, 60.0, summary)
    result = unresolved_result(
        policy(),
        GiveUp(StopReason.LEDGER_EXHAUSTED, 10.0),
        attempts=[],
        elapsed_s=0.0,
        deadline_s=10.0,
        arguments_digest=DIGEST,
        budget_id="old",
        earlier=entry,
    )
    assert_schema_valid(result)
    assert result["structuredContent"]["classification"]["source"] == "default"


def test_scrub_arguments_removes_argument_values_from_a_json_value_and_keeps_its_shape():
    from proxy.recovery.redact import scrub_arguments

    arguments = {"password": "wombat-Pq7Zr", "n": 123456, "short": "ab"}
    data = {"input": {"password": "wombat-Pq7Zr", "n": 123456}, "said": ["failed for wombat-Pq7Zr", 7], "ok": True}
    assert scrub_arguments(data, arguments) == {
        "input": {"password": "[argument]", "n": "[argument]"},
        "said": ["failed for [argument]", 7],
        "ok": True,
    }
    assert scrub_arguments(data, None) is data


def _replace_calls(work: Any) -> int:
    """How many times `work()` calls `str.replace` (a deterministic count of the scrubbing work,
    where a timing would flake on a busy machine)."""
    import sys

    calls = 0

    def profile(_frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if (
            event == "c_call"
            and getattr(arg, "__name__", "") == "replace"
            and getattr(arg, "__self__", None).__class__ is str
        ):
            calls += 1

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return calls


def test_a_call_with_very_many_argument_values_costs_its_report_the_texts_length_not_their_number(
    assert_schema_valid,
):
    """A caller picks how many values its arguments hold (a 4 MiB body carries ~400 000). Each was
    tried against every detail of the report and every string of the error's data: 50 000 values
    and three attempts made 150 000 searches and more (seconds of the event loop, every other
    caller waiting). The values are now indexed once per report, and a text is searched only for
    those that can occur in it."""
    args = {f"key{i}": f"{i:06d}-value" for i in range(50_000)}
    args["secret"] = "wombat-Pq7Zr"
    failing = tool_error("failed for wombat-Pq7Zr and 000123-value, see 049999-value")
    error = RpcError({"code": -32602, "message": "bad 000007-value", "data": {"echo": ["000008-value", 31337]}})
    results: list[dict[str, Any]] = []

    def work() -> None:
        results.append(build(policy(), StopReason.ATTEMPTS_EXHAUSTED, failing, failing, error, arguments=args))

    assert _replace_calls(work) < 5_000
    result = results[0]
    assert_schema_valid(result)
    s = result["structuredContent"]
    text = str(s["attemptedSteps"]) + str(s["jsonrpcError"])
    for leaked in ("wombat-Pq7Zr", "000123-value", "049999-value", "000007-value", "000008-value"):
        assert leaked not in text
    assert s["attemptedSteps"][0]["detail"].count("[argument]") == 3


def test_values_chosen_to_defeat_the_index_cost_a_bounded_amount_and_are_withheld_not_leaked(
    assert_schema_valid,
):
    """Values that all share their first and last characters (and so all look worth trying)
    against a long error text made of them: the report's scrubbing stops at its work budget, and what it could not check
    is withheld whole, never passed on unchecked."""
    from proxy.recovery.redact import WITHHELD

    args = {f"key{i}": f"abcd{i:06d}abcd" for i in range(50_000)}
    echoed = "abcd000123abcd " + "abcd " * 960  # 4800 characters; every value starts and ends as it
    failing = tool_error(echoed)
    error = RpcError({"code": -32602, "message": echoed, "data": {"echo": [echoed, "abcd049999abcd"]}})
    results: list[dict[str, Any]] = []

    def work() -> None:
        results.append(build(policy(), StopReason.ATTEMPTS_EXHAUSTED, failing, error, arguments=args))

    assert _replace_calls(work) < 20_000  # trying each value on each text: over 200 000
    result = results[0]
    assert_schema_valid(result)
    s = result["structuredContent"]
    text = str(s["attemptedSteps"]) + str(s["jsonrpcError"])
    assert "abcd000123abcd" not in text and "abcd049999abcd" not in text
    assert WITHHELD[:40] in text


@pytest.mark.parametrize("many", [False, True], ids=["few-values", "many-values"])
def test_indexed_scrubbing_replaces_exactly_what_trying_every_value_does(many: bool) -> None:
    """The index is only a shortcut: the same text comes out as from trying each value, longest
    first (overlapping values, a value inside another, numbers)."""
    from proxy.recovery.redact import ArgumentValues

    args: dict[str, Any] = {"a": "abcdef", "b": "cdefgh", "c": "abcdefgh", "d": "zzzz", "n": 123456, "e": "xyz"}
    if many:
        args.update({f"pad{i}": f"unused-{i:05d}" for i in range(100)})
    values = ArgumentValues(args)
    for text in ("abcdefgh cdefgh abcdef abc zzzzz 1234567 xyz", "", "abc", "no match here", "zzzzzzzz"):
        naive = text
        for leaf in values.leaves:
            naive = naive.replace(leaf, "[argument]")
        assert values.replace(text) == naive, text
