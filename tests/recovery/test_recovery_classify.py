"""classify(): every source of docs/recovery.md, "Classification", first match wins, evidence kept."""

from __future__ import annotations

import re
from typing import Any

import pytest

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.policy.compiled import Category, Rule, SideEffect, ToolPolicy
from proxy.recovery.classify import classify
from proxy.recovery.outcome import (
    EvidenceSource,
    RpcError,
    Success,
    ToolError,
    TransportError,
    outcome_from_response,
)

T, V, B, P = Category.TRANSIENT, Category.VALIDATION, Category.BUSINESS, Category.PERMISSION
NO, UNKNOWN, YES = Dispatch.NO, Dispatch.UNKNOWN, Dispatch.YES


def policy(**kw: Any) -> ToolPolicy:
    kw.setdefault("side_effect", SideEffect.READ_ONLY)
    return ToolPolicy(tool="lookup", **kw)


def transport(kind: FailureKind, dispatched: Dispatch = NO, **kw: Any) -> TransportError:
    return TransportError(kind=kind, dispatched=dispatched, detail="x", **kw)


def http(status: int, **kw: Any) -> TransportError:
    return TransportError(FailureKind.HTTP_STATUS, Dispatch.YES, f"HTTP {status}", http_status=status, **kw)


def tool_error(text: str = "failed", structured: Any = None, **extra: Any) -> ToolError:
    result: dict[str, Any] = {"isError": True, "content": [{"type": "text", "text": text}], **extra}
    if structured is not None:
        result["structuredContent"] = structured
    return ToolError(result)


@pytest.mark.parametrize(
    ("kind", "adapter_dispatch", "dispatched"),
    [
        (FailureKind.SPAWN_FAILED, NO, NO),
        (FailureKind.CONNECT_FAILED, NO, NO),
        (FailureKind.NOT_RUNNING, NO, NO),
        (FailureKind.OVERLOADED, NO, NO),
        (FailureKind.SESSION_EXPIRED, NO, NO),
        (FailureKind.TIMEOUT, NO, UNKNOWN),
        (FailureKind.TIMEOUT, UNKNOWN, UNKNOWN),
        (FailureKind.CLOSED, UNKNOWN, UNKNOWN),
        (FailureKind.PROTOCOL, UNKNOWN, UNKNOWN),
        # the adapter's own claim wins when it is more cautious than the table
        (FailureKind.CONNECT_FAILED, UNKNOWN, UNKNOWN),
        (FailureKind.CLOSED, YES, YES),
    ],
)
def test_transport_failures_are_transient_with_the_cautious_dispatch(kind, adapter_dispatch, dispatched):
    c = classify(transport(kind, adapter_dispatch), policy())
    assert (c.category, c.dispatched, c.defaulted) == (T, dispatched, False)
    assert (c.evidence.source, c.evidence.code) == (EvidenceSource.TRANSPORT, kind.value)


def test_a_session_refused_to_another_credential_is_permission_and_not_dispatched():
    """passthrough before a legacy SSE server: its 404 to a credential that did not open the
    session refuses that caller (retrying cannot help); a forgotten session stays transient."""
    refused = classify(transport(FailureKind.SESSION_REFUSED, http_status=404), policy())
    assert (refused.category, refused.dispatched, refused.defaulted) == (P, NO, False)
    assert (refused.evidence.source, refused.evidence.code) == (EvidenceSource.HTTP, 404)
    expired = classify(transport(FailureKind.SESSION_EXPIRED, http_status=404), policy())
    assert expired.category is T


def test_policy_rules_never_reclassify_a_local_transport_failure():
    rule = Rule(name="all", category=B, text=re.compile("."), jsonrpc_codes=frozenset({-32603}))
    c = classify(transport(FailureKind.TIMEOUT, UNKNOWN), policy(rules=(rule,)))
    assert c.category is T and c.evidence.source is EvidenceSource.TRANSPORT


def test_transport_error_from_failure_keeps_everything():
    failure = UpstreamFailure(
        FailureKind.HTTP_STATUS, YES, "busy", http_status=429, retry_after_s=3.0, body={"error": {"code": 1}}
    )
    t = TransportError.from_failure(failure)
    assert (t.kind, t.dispatched, t.detail, t.http_status, t.retry_after_s, t.body) == (
        FailureKind.HTTP_STATUS,
        YES,
        "busy",
        429,
        3.0,
        {"error": {"code": 1}},
    )


@pytest.mark.parametrize(
    ("status", "category", "dispatched"),
    [
        (429, T, NO),
        (503, T, NO),
        (500, T, UNKNOWN),
        (502, T, UNKNOWN),
        (504, T, UNKNOWN),
        (408, T, UNKNOWN),
        (401, P, NO),
        (403, P, NO),
        (400, V, NO),
        (405, V, NO),
        (413, V, NO),
        (415, V, NO),
        (422, V, NO),
        (307, V, NO),  # a redirect: not run there, and retrying the same URL cannot help
        (308, V, NO),
    ],
)
def test_http_status_table(status, category, dispatched):
    c = classify(http(status), policy())
    assert (c.category, c.dispatched, c.defaulted) == (category, dispatched, False)
    assert (c.evidence.source, c.evidence.code) == (EvidenceSource.HTTP, status)


def test_http_retry_after_is_carried():
    c = classify(http(429, retry_after_s=2.5), policy())
    assert c.retry_after_s == 2.5


def test_http_rule_takes_precedence_over_the_builtin_table():
    rule = Rule(name="quota-is-business", category=B, http_statuses=frozenset({429}))
    c = classify(http(429), policy(rules=(rule,)))
    assert (c.category, c.dispatched) == (B, NO)
    assert (c.evidence.source, c.evidence.rule, c.evidence.code) == (EvidenceSource.RULE, "quota-is-business", 429)


def test_http_rule_with_text_must_match_both():
    rule = Rule(name="r", category=B, http_statuses=frozenset({503}), text=re.compile("maintenance"))
    assert classify(http(503), policy(rules=(rule,))).category is T
    outcome = TransportError(FailureKind.HTTP_STATUS, YES, "scheduled maintenance", http_status=503)
    assert classify(outcome, policy(rules=(rule,))).category is B


def test_unknown_http_status_uses_the_jsonrpc_body_then_the_default():
    body = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}
    c = classify(http(404, body=body), policy())
    assert (c.category, c.evidence.source, c.evidence.code) == (V, EvidenceSource.JSONRPC, -32602)
    c = classify(http(418), policy())
    assert (c.category, c.defaulted, c.evidence.source, c.evidence.code) == (
        B,
        True,
        EvidenceSource.DEFAULT,
        418,
    )


@pytest.mark.parametrize(
    ("code", "category", "dispatched"),
    [
        (-32700, V, NO),
        (-32600, V, NO),
        (-32601, V, NO),
        (-32602, V, NO),
        (-32603, T, UNKNOWN),
        (-32000, T, UNKNOWN),
        (-32010, T, UNKNOWN),
        (-32019, T, UNKNOWN),
        (-32020, V, NO),
        (-32021, V, NO),
        (-32022, V, NO),
    ],
)
def test_jsonrpc_code_table(code, category, dispatched):
    c = classify(RpcError({"code": code, "message": "m"}), policy())
    assert (c.category, c.dispatched, c.defaulted) == (category, dispatched, False)
    assert (c.evidence.source, c.evidence.code) == (EvidenceSource.JSONRPC, code)


@pytest.mark.parametrize("code", [-32023, -32099, 1, 42, None, "x", True])
def test_unknown_jsonrpc_codes_are_unclassified(code):
    c = classify(RpcError({"code": code, "message": "m"}), policy(unclassified=B))
    assert (c.category, c.defaulted, c.evidence.source) == (B, True, EvidenceSource.DEFAULT)
    assert c.dispatched is UNKNOWN


def test_jsonrpc_rule_maps_any_code_and_precedes_the_table():
    rules = (
        Rule(name="app-busy", category=T, jsonrpc_codes=frozenset({1001})),
        Rule(name="internal-is-business", category=B, jsonrpc_codes=frozenset({-32603})),
    )
    c = classify(RpcError({"code": 1001, "message": "busy"}), policy(rules=rules))
    assert (c.category, c.dispatched, c.evidence.rule, c.evidence.code) == (T, UNKNOWN, "app-busy", 1001)
    c = classify(RpcError({"code": -32603, "message": "x"}), policy(rules=rules))
    assert (c.category, c.evidence.source) == (B, EvidenceSource.RULE)


def test_a_rule_naming_no_code_overrides_a_shipped_row_for_an_unknown_codes_message():
    """docs/recovery.md's example: a rule `{text: "not found", category: business}` overrides the
    shipped not-found row for a JSON-RPC error as for an isError text; not for a code the built-in
    table knows (only a rule naming the code overrides that)."""
    error = RpcError({"code": -32099, "message": "Entity Alice not found", "data": {"kind": "person"}})
    shipped = classify(error, policy())
    assert (shipped.category, shipped.evidence.source) == (V, EvidenceSource.SHIPPED)
    by_text = Rule(name="missing-is-business", category=B, text=re.compile("not found"))
    c = classify(error, policy(rules=(by_text,)))
    assert (c.category, c.dispatched, c.evidence.source) == (B, UNKNOWN, EvidenceSource.RULE)
    assert (c.evidence.rule, c.evidence.code) == ("missing-is-business", -32099)
    by_path = Rule(name="person", category=B, path=("kind",), equals=("person",))
    assert classify(error, policy(rules=(by_path,))).evidence.rule == "person"
    other_code = Rule(name="other", category=B, jsonrpc_codes=frozenset({7}), text=re.compile("not found"))
    assert classify(error, policy(rules=(other_code,))).evidence.source is EvidenceSource.SHIPPED
    known = RpcError({"code": -32603, "message": "Entity Alice not found"})
    assert classify(known, policy(rules=(by_text,))).evidence.source is EvidenceSource.JSONRPC


def test_jsonrpc_rule_text_and_path_look_at_message_and_data():
    rule = Rule(
        name="locked",
        category=B,
        jsonrpc_codes=frozenset({-32000}),
        text=re.compile("locked"),
        path=("reason",),
        equals=("LOCKED",),
    )
    p = policy(rules=(rule,))
    hit = RpcError({"code": -32000, "message": "row locked", "data": {"reason": "LOCKED"}})
    miss = RpcError({"code": -32000, "message": "row locked", "data": {"reason": "OTHER"}})
    assert classify(hit, p).category is B
    assert classify(miss, p).evidence.source is EvidenceSource.JSONRPC


@pytest.mark.parametrize("value", ["transient", "validation", "business", "permission"])
def test_trusted_error_category_is_believed(value):
    c = classify(tool_error(structured={"errorCategory": value}), policy())
    assert (c.category, c.dispatched, c.defaulted) == (Category(value), YES, False)
    assert (c.evidence.source, c.evidence.code) == (EvidenceSource.UPSTREAM, value)


def test_trusted_is_retryable_false_and_retry_after_ms_are_read():
    c = classify(
        tool_error(structured={"errorCategory": "transient", "isRetryable": False, "retryAfterMs": 1500}),
        policy(),
    )
    assert (c.retryable_hint, c.retry_after_s) == (False, 1.5)


def test_negative_retry_after_ms_is_a_decline():
    c = classify(tool_error(structured={"errorCategory": "transient", "retryAfterMs": -1}), policy())
    assert (c.retryable_hint, c.retry_after_s) == (False, None)


def test_distrusted_error_category_falls_to_rules_then_default():
    structured = {"errorCategory": "transient", "isRetryable": True, "retryAfterMs": 10}
    rule = Rule(name="timeout-text", category=B, text=re.compile("failed"))
    c = classify(tool_error(structured=structured), policy(trust_error_category=False, rules=(rule,)))
    assert (c.category, c.evidence.source, c.retryable_hint, c.retry_after_s) == (B, EvidenceSource.RULE, None, None)
    c = classify(tool_error(structured=structured), policy(trust_error_category=False))
    assert (c.category, c.defaulted, c.evidence.source) == (B, True, EvidenceSource.DEFAULT)


def test_rule_on_text_matches_the_joined_text_content():
    rule = Rule(name="rate", category=T, text=re.compile(r"rate limit.*second block"), retryable=None)
    result = {
        "isError": True,
        "content": [
            {"type": "text", "text": "rate limit"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "text", "text": "second block"},
        ],
    }
    assert classify(ToolError(result), policy(rules=(rule,))).category is T
    rule_dotall = Rule(name="rate", category=T, text=re.compile(r"limit\nsecond"))
    assert classify(ToolError(result), policy(rules=(rule_dotall,))).evidence.rule == "rate"


@pytest.mark.parametrize(
    ("structured", "equals", "matches"),
    [
        ({"error": {"code": "E_LOCKED"}}, ("E_LOCKED",), True),
        ({"error": {"code": "E_OTHER"}}, ("E_LOCKED",), False),
        ({"error": {"code": "E_OTHER"}}, None, True),  # path must merely exist
        ({"error": {}}, None, False),
        ({"error": {"code": 1}}, (True,), False),  # True is not 1
        ({"error": {"code": True}}, (True,), True),
        ({"error": {"code": 5}}, (5, 6), True),
        ([{"error": {"code": 5}}], (5,), False),  # not an object at the root
    ],
)
def test_rule_on_structured_path(structured, equals, matches):
    rule = Rule(name="locked", category=B, path=("error", "code"), equals=equals, retryable=False)
    c = classify(tool_error(structured=structured), policy(rules=(rule,), trust_error_category=False))
    assert (c.evidence.source is EvidenceSource.RULE) is matches
    if matches:
        assert (c.category, c.rule_retryable) == (B, False)


def test_rules_are_tried_in_order_first_match_wins():
    rules = (
        Rule(name="first", category=P, text=re.compile("denied")),
        Rule(name="second", category=B, text=re.compile("denied")),
    )
    assert classify(tool_error("access denied"), policy(rules=rules)).evidence.rule == "first"


def test_rule_without_matchers_matches_nothing():
    c = classify(tool_error("x"), policy(rules=(Rule(name="empty", category=B),)))
    assert c.defaulted


@pytest.mark.parametrize("claimed", ["Transient", "fatal", 3, None])
def test_unknown_category_string_is_unclassified_and_never_trusted(claimed):
    structured = {"errorCategory": claimed} if claimed is not None else {"other": 1}
    c = classify(tool_error(structured=structured), policy(unclassified=V))
    assert (c.category, c.defaulted, c.evidence.source, c.dispatched) == (V, True, EvidenceSource.DEFAULT, YES)


def test_non_object_structured_content_is_not_a_category():
    c = classify(tool_error(structured=["transient"]), policy())
    assert c.defaulted


def test_tool_error_was_executed_so_dispatch_is_yes_even_for_state_changing():
    c = classify(tool_error(structured={"errorCategory": "transient"}), policy(side_effect=SideEffect.STATE_CHANGING))
    assert (c.category, c.dispatched) == (T, YES)


@pytest.mark.parametrize(
    "result",
    [
        {"content": [{"type": "text", "text": "ok"}]},
        {"content": []},  # an empty list is a success
        {"content": [{"type": "text", "text": "0 matches"}], "structuredContent": {"matches": []}},
        {"resultType": "input_required", "inputRequests": {}},
        {"task": {"taskId": "t1", "status": "working"}},
        {"isError": False, "content": []},
    ],
)
def test_successes_pass_through_with_no_category(result):
    outcome = outcome_from_response({"jsonrpc": "2.0", "id": 1, "result": result})
    assert outcome == Success(result)
    c = classify(outcome, policy())
    assert c.category is None and c.is_success


def test_outcome_from_response_shapes():
    assert isinstance(outcome_from_response({"error": {"code": -32602, "message": "x"}}), RpcError)
    assert isinstance(outcome_from_response({"result": {"isError": True, "content": []}}), ToolError)
    bad = outcome_from_response({"result": "nope"})
    assert isinstance(bad, TransportError) and bad.kind is FailureKind.PROTOCOL
    assert classify(bad, policy()).dispatched is UNKNOWN
