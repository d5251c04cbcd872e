"""What the proxy keeps per tool for `policies suggest` (proxy/telemetry/observed.py): fed through
the real engine over an in-memory link where the question is what a call leaves behind (the
redaction, the rule that matched, the latency), and by events directly where the question is the
bounds under a flood. Memory is checked as a bound by construction (counts and lengths), never
measured."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from proxy.core.engine import Engine
from proxy.core.relay import Relay, ToolCatalog
from proxy.policy.compile import compile_files
from proxy.policy.compiled import PolicySet
from proxy.secret_values import SECRETS
from proxy.telemetry.events import AttemptFinished, CallReported, CallSucceeded, Telemetry
from proxy.telemetry.observed import (
    MAX_RULES,
    MAX_TEXTS,
    MAX_TOOLS,
    NAME_LIMIT,
    TEXT_LIMIT,
    UPPERS_S,
    ObservedTools,
    bucket_of,
)
from tests.core.memory_link import RecordingOutbox
from tests.core.test_engine_in_memory import TRANSIENT, ScriptedLink

SECRET_ARG = "canary-argument-Zq81"
PROXY_SECRET = "proxy-own-credential-9Xw2"


def _request(name: str = "read", arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": name, "arguments": arguments or {}}}


def _relay(link: ScriptedLink, observed: ObservedTools, policy_yaml: str | None = None) -> Relay:
    policies = (
        compile_files([("read.yaml", "read.yaml", policy_yaml.encode())]) if policy_yaml else PolicySet(version="test")
    )
    catalog = ToolCatalog()
    catalog.observe(
        {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    )
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0, telemetry=Telemetry([observed]))
    return Relay(link, catalog=catalog, tool_calls=engine)  # type: ignore[arg-type]


def _tool(observed: ObservedTools, name: str = "read") -> dict[str, Any]:
    (tool,) = [t for t in observed.snapshot()["tools"] if t["tool"] == name]
    return tool


def _unclassified(text: str) -> dict[str, Any]:
    return {"isError": True, "content": [{"type": "text", "text": text}]}


@pytest.mark.anyio
async def test_an_unclassified_text_is_kept_without_credentials_or_argument_values() -> None:
    observed = ObservedTools()
    text = f"ledger refused order for {SECRET_ARG} with Bearer abcdefghijklmnopqrstuv and key {PROXY_SECRET}"
    relay = _relay(ScriptedLink([_unclassified(text)]), observed)
    SECRETS.set([PROXY_SECRET])
    try:
        await relay.handle_request(_request(arguments={"customer": SECRET_ARG}), RecordingOutbox())
    finally:
        SECRETS.set([])
    tool = _tool(observed)
    assert tool["unclassified"] == 1
    (kept,) = tool["texts"]
    assert kept["count"] == 1 and kept["outcome"] == "tool_error"
    assert kept["text"].startswith("ledger refused order for [argument] with Bearer [redacted]")
    dumped = json.dumps(observed.snapshot())
    assert SECRET_ARG not in dumped and PROXY_SECRET not in dumped and "abcdefghijklmnop" not in dumped


@pytest.mark.anyio
async def test_a_classified_failure_leaves_no_text_and_its_rule_is_counted() -> None:
    observed = ObservedTools()
    policy = (
        "tools: [read]\nattempts: 2\nbackoff: {initial: 1ms}\n"
        "rules:\n  - {name: busy-rule, category: transient, text: 'lock wait'}\n"
    )
    relay = _relay(ScriptedLink([_unclassified("lock wait timeout"), {"content": []}]), observed, policy)
    await relay.handle_request(_request(), RecordingOutbox())
    tool = _tool(observed)
    assert tool["texts"] == [] and tool["unclassified"] == 0
    assert tool["rules_matched"] == {"busy-rule": 1}
    assert tool["successes"] == 1, "the second attempt's success is a latency sample"


@pytest.mark.anyio
async def test_first_attempt_successes_and_retried_ones_are_both_latency_samples() -> None:
    observed = ObservedTools()
    await _relay(ScriptedLink([{"content": []}]), observed).handle_request(_request(), RecordingOutbox())
    await _relay(ScriptedLink([TRANSIENT, {"content": []}]), observed).handle_request(_request(), RecordingOutbox())
    tool = _tool(observed)
    assert tool["successes"] == 2 and sum(count for _, count in tool["latency_buckets"]) == 2
    assert tool["p50_ms"] is not None and tool["p99_ms"] >= tool["p50_ms"]


def test_the_tools_kept_stay_within_their_bound_under_a_flood_of_distinct_names() -> None:
    observed = ObservedTools()
    flood = 5 * MAX_TOOLS
    for i in range(flood):
        name = f"tool-{i}-" + "x" * 1000
        observed.on_event(CallSucceeded("", name, 0.01, 0.01))
        observed.on_event(AttemptFinished("c", name, 2, 0.01, "tool_error", "unclassified", "yes", "default"))
    snapshot = observed.snapshot()
    assert len(observed.tools) == MAX_TOOLS and len(snapshot["tools"]) == MAX_TOOLS
    assert snapshot["dropped_tools"] == 2 * (flood - MAX_TOOLS), "every event of a tool past the bound is counted"
    assert all(len(t["tool"]) <= NAME_LIMIT for t in snapshot["tools"])
    # A long name is kept once under its bounded label, not once per event.
    kept = snapshot["tools"][0]
    assert kept["successes"] == 1 and kept["unclassified"] == 1


def test_the_texts_kept_per_tool_stay_within_their_bound_under_a_flood_of_distinct_texts() -> None:
    observed = ObservedTools()
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    flood = 1000
    for i in range(flood):
        # distinct beyond their digits (so each is a text of its own), and long
        text = " ".join(words[(i >> k) % len(words)] for k in range(12)) + f" {i} " + "y" * 50_000
        report = {
            "classification": {"defaulted": True, "code": None},
            "attemptedSteps": [{"outcome": "tool_error", "detail": text}],
        }
        observed.on_event(CallReported("c", "read", report))
    tool = _tool(observed)
    assert len(tool["texts"]) == MAX_TEXTS
    assert all(len(t["text"]) <= TEXT_LIMIT for t in tool["texts"])
    assert sum(t["count"] for t in tool["texts"]) + tool["texts_dropped"] == flood
    # The bound by construction: texts per tool times the characters of one.
    assert sum(len(t["text"]) for t in tool["texts"]) <= MAX_TEXTS * TEXT_LIMIT


def test_texts_that_differ_only_in_digits_are_one_entry_and_the_most_frequent_comes_first() -> None:
    observed = ObservedTools()
    texts = [
        "order 17 is locked by job 4",
        "order 2981 is locked by job 77",
        "quota spent",
        "order 5 is locked by job 1",
    ]
    for text in texts:
        report = {
            "classification": {"defaulted": True, "code": None},
            "attemptedSteps": [{"outcome": "tool_error", "detail": text}],
        }
        observed.on_event(CallReported("c", "read", report))
    assert [(t["text"], t["count"]) for t in _tool(observed)["texts"]] == [
        ("order 17 is locked by job 4", 3),
        ("quota spent", 1),
    ]


def test_a_report_that_is_not_unclassified_or_has_no_attempt_leaves_no_text() -> None:
    observed = ObservedTools()
    classified = {"classification": {"defaulted": False}, "attemptedSteps": [{"outcome": "tool_error", "detail": "x"}]}
    refused = {"classification": {"defaulted": True}, "attemptedSteps": []}
    observed.on_event(CallReported("c", "read", classified))
    observed.on_event(CallReported("c", "read", refused))
    assert observed.snapshot()["tools"] == []


def test_the_rule_names_kept_per_tool_stay_within_their_bound() -> None:
    observed = ObservedTools()
    for i in range(10 * MAX_RULES):
        observed.on_event(AttemptFinished("c", "read", 1, 0.01, "tool_error", "transient", "yes", "rule", f"r{i}"))
    observed.on_event(AttemptFinished("c", "read", 1, 0.01, "tool_error", "transient", "yes", "shipped", "s1"))
    tool = _tool(observed)
    assert len(tool["rules_matched"]) == MAX_RULES and tool["rules_dropped"] == 9 * MAX_RULES
    assert "s1" not in tool["rules_matched"], "a shipped rule is not a policy rule"


def test_a_timer_cut_counts_as_a_timeout_and_not_as_a_latency_sample() -> None:
    observed = ObservedTools()
    observed.on_event(AttemptFinished("c", "read", 1, 5.0, "timeout", "transient", "unknown", "transport"))
    tool = _tool(observed)
    assert tool["timeouts"] == 1 and tool["successes"] == 0 and tool["p99_ms"] is None


@pytest.mark.parametrize(
    "durations",
    [[0.010] * 99 + [2.0], [i / 1000 for i in range(1, 1001)], [0.0004, 0.0004], [7200.0, 0.5]],
    ids=["one-slow", "uniform", "below-first-bound", "past-the-last-bound"],
)
def test_quantiles_are_never_below_the_true_value_and_at_most_one_bucket_above(durations: list[float]) -> None:
    observed = ObservedTools()
    for seconds in durations:
        observed.on_event(CallSucceeded("", "read", seconds, seconds))
    tool = _tool(observed)
    ordered = sorted(durations)
    for key, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        true_ms = ordered[max(1, math.ceil(q * len(ordered))) - 1] * 1000  # the rank the estimate counts to
        estimate = tool[key]
        assert estimate >= true_ms - 1e-6, (key, estimate, true_ms)
        assert estimate <= max(true_ms * 2**0.25, 1.0) + 1e-6 or estimate == tool["slowest_ms"], (
            key,
            estimate,
            true_ms,
        )
    assert tool["slowest_ms"] == pytest.approx(max(durations) * 1000)


def test_every_duration_falls_in_the_bucket_whose_bounds_hold_it() -> None:
    for seconds in [0.0, 0.001, 0.0011, 0.5, 1.0, 3.3, 59.9, 600.0, UPPERS_S[-1], UPPERS_S[-1] * 1.01]:
        index = bucket_of(seconds)
        if index < len(UPPERS_S):
            assert seconds <= UPPERS_S[index] + 1e-12
        if 0 < index <= len(UPPERS_S):
            assert seconds > UPPERS_S[index - 1]
