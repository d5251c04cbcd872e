"""The shipped classification rules: real servers' texts, their precedence, and their evidence."""

from __future__ import annotations

import re
import re._parser as sre_parse  # the stdlib's own regex parser: to check the patterns' shape
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import Dispatch
from proxy.policy.compiled import Category, Rule, SideEffect, ToolPolicy
from proxy.recovery.classify import classify
from proxy.recovery.decide import CallState, GiveUp, decide
from proxy.recovery.outcome import EvidenceSource, RpcError, ToolError
from proxy.recovery.shipped import SHIPPED_RULES, shipped_rule_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "recovery.md"
V, P, T, B = Category.VALIDATION, Category.PERMISSION, Category.TRANSIENT, Category.BUSINESS


def policy(**kw: Any) -> ToolPolicy:
    kw.setdefault("side_effect", SideEffect.READ_ONLY)
    return ToolPolicy(tool="t", **kw)


def tool_error(text: str, structured: Any = None) -> ToolError:
    result: dict[str, Any] = {"isError": True, "content": [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    return ToolError(result)


EXAMPLES = [(rule.id, rule.category, text) for rule in SHIPPED_RULES for text in rule.examples]


@pytest.mark.parametrize(("rule_id", "category", "text"), EXAMPLES, ids=[f"{e[0]}-{i}" for i, e in enumerate(EXAMPLES)])
def test_every_documented_example_is_classified_by_its_row(rule_id, category, text):
    c = classify(tool_error(text), policy())
    assert c.evidence.rule == rule_id
    if category is None:
        assert (c.defaulted, c.evidence.source) == (True, EvidenceSource.DEFAULT)
    else:
        assert (c.category, c.defaulted, c.evidence.source) == (category, False, EvidenceSource.SHIPPED)
        assert c.dispatched is Dispatch.YES


# What the reference servers answer (their texts verbatim), and what each must become.
REAL_TEXTS = [
    ('MCP error -32602: Input validation error: Invalid arguments for tool echo: [{"code": "invalid_type"}]', V),
    (
        "Error executing tool get_current_time: 1 validation error for get_current_timeArguments\n"
        "timezone\n  Field required [type=missing, input_value={}, input_type=dict]",
        V,
    ),
    ("MCP error -32602: Tool no_such_tool not found", V),
    ("Unknown tool: no_such_tool", V),
    ("Access denied - path outside allowed directories: /etc not in /tmp/x", P),
    ("ENOENT: no such file or directory, stat '/tmp/x/missing'", V),
    ("Error executing tool get_current_time: Invalid timezone: 'No time zone found with key Mars/Base'", V),
    (
        "Cmd('git') failed due to: exit code(1)\n"
        "  stderr: 'error: pathspec 'nope' did not match any file(s) known to git'",
        V,
    ),
    ("Could not find exact match for edit:\nfoo", V),
    ("fetch failed: connect ECONNREFUSED 127.0.0.1:9", T),
    ("HTTP 429 Too Many Requests", T),
]


@pytest.mark.parametrize(("text", "category"), REAL_TEXTS)
def test_what_real_servers_say(text, category):
    c = classify(tool_error(text), policy())
    assert (c.category, c.evidence.source) == (category, EvidenceSource.SHIPPED)


def test_order_policy_rules_and_the_upstreams_category_come_first():
    text = "Entity with name Alice not found"
    override = Rule(name="missing-is-business", category=B, text=re.compile("not found"))
    c = classify(tool_error(text), policy(rules=(override,)))
    assert (c.category, c.evidence.source, c.evidence.rule) == (B, EvidenceSource.RULE, "missing-is-business")
    c = classify(tool_error(text, {"errorCategory": "permission"}), policy())
    assert (c.category, c.evidence.source) == (P, EvidenceSource.UPSTREAM)
    c = classify(tool_error(text, {"errorCategory": "permission"}), policy(trust_error_category=False))
    assert (c.category, c.evidence.source) == (V, EvidenceSource.SHIPPED)


def test_a_jsonrpc_code_nobody_knows_is_matched_by_its_message_and_known_codes_keep_their_row():
    c = classify(RpcError({"code": -31999, "message": "read ECONNRESET"}), policy())
    assert (c.category, c.dispatched, c.evidence.source, c.evidence.rule) == (
        T,
        Dispatch.UNKNOWN,
        EvidenceSource.SHIPPED,
        "connection-failure",
    )
    c = classify(RpcError({"code": -32602, "message": "Tool x not found"}), policy())
    assert (c.category, c.evidence.source) == (V, EvidenceSource.JSONRPC)


@pytest.mark.parametrize(
    "text",
    ["something odd happened", "Error executing tool crashy", "", "Tool returned 42 widgets"],
)
def test_what_no_row_recognises_stays_unclassified_and_is_never_retried(text):
    p = policy()
    c = classify(tool_error(text), p)
    assert (c.defaulted, c.evidence.source, c.evidence.rule, c.category) == (True, EvidenceSource.DEFAULT, None, B)
    decision = decide(p, CallState.start(p, now_s=0.0).attempted(), c, now_s=0.1, rand=lambda: 0.5)
    assert isinstance(decision, GiveUp) and decision.reason.value == "not_retryable"


def test_a_transient_row_is_retried_for_a_read_only_tool():
    p = policy()
    c = classify(tool_error("upstream request timed out"), p)
    decision = decide(p, CallState.start(p, now_s=0.0).attempted(), c, now_s=0.1, rand=lambda: 0.5)
    assert not isinstance(decision, GiveUp)


def _repeats(node: Any, inside: bool) -> None:
    """Fail on a repeat inside a repeat (the shape of catastrophic backtracking)."""
    for op, av in node:
        if op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT):
            assert not inside, "nested quantifier"
            _repeats(av[2], True)
        elif op is sre_parse.SUBPATTERN:
            _repeats(av[3], inside)
        elif op is sre_parse.BRANCH:
            for branch in av[1]:
                _repeats(branch, inside)
        elif op in (sre_parse.GROUPREF, sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            raise AssertionError(f"{op} is not linear-time")


@pytest.mark.parametrize("rule", SHIPPED_RULES, ids=lambda r: r.id)
def test_patterns_have_no_nested_quantifiers_and_no_back_references(rule):
    _repeats(sre_parse.parse(rule.pattern.pattern), False)
    assert rule.pattern.flags & re.IGNORECASE


def test_the_docs_table_lists_every_row_in_order():
    text = DOC.read_text(encoding="utf-8")
    rows = re.findall(
        r"^\| `([a-z0-9-]+)` \| (validation|permission|transient|business|stays unclassified) \|", text, re.M
    )
    assert [r[0] for r in rows] == [rule.id for rule in SHIPPED_RULES]
    for (_, label), rule in zip(rows, SHIPPED_RULES, strict=True):
        assert label == (rule.category.value if rule.category else "stays unclassified")


def test_first_row_wins():
    assert shipped_rule_for("Output validation error: Invalid structured content") is SHIPPED_RULES[0]
