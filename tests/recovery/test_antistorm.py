"""The anti-storm admission (docs/recovery.md, "Decision"): retry budget and circuit breaker, on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.policy.compiled import AntiStorm as Limits
from proxy.policy.compiled import Category, SideEffect, ToolPolicy
from proxy.recovery.antistorm import MAX_TOOLS, WINDOW_S, AntiStorm, Circuit
from proxy.recovery.reasons import StopReason

T = Category.TRANSIENT


def policy(**limits: Any) -> ToolPolicy:
    base = {"retry_budget_ratio": None, "retry_budget_min_per_s": None, "breaker_failures": None}
    return ToolPolicy(tool="t", side_effect=SideEffect.READ_ONLY, anti_storm=Limits(**{**base, **limits}))


def calls(a: AntiStorm, p: ToolPolicy, n: int, now: float, tool: str = "t") -> None:
    for _ in range(n):
        assert a.admit_first(tool, p, now) is None


def test_the_built_in_limits_are_linkerds_budget_and_no_breaker() -> None:
    limits = ToolPolicy(tool="t", side_effect=SideEffect.READ_ONLY).anti_storm
    assert (limits.retry_budget_ratio, limits.retry_budget_min_per_s, limits.breaker_failures) == (0.2, 10.0, None)


def test_without_budget_settings_retries_are_unlimited() -> None:
    a, p = AntiStorm(), policy()
    calls(a, p, 1, 0.0)
    assert all(a.admit_retry("t", p, 0.5) is None for _ in range(1000))


def test_the_ratio_allows_a_share_of_the_windows_calls() -> None:
    a, p = AntiStorm(), policy(retry_budget_ratio=0.5, retry_budget_min_per_s=0.0)
    calls(a, p, 4, 100.0)
    assert a.admit_retry("t", p, 100.1) is None
    assert a.admit_retry("t", p, 100.2) is None
    refused = a.admit_retry("t", p, 100.3)
    assert refused is not None and refused.reason is StopReason.RETRY_BUDGET and refused.retry_after_s is None
    # calls and retries leave the window together: after it, fresh calls give fresh room
    calls(a, p, 2, 100.0 + WINDOW_S)
    assert a.admit_retry("t", p, 100.0 + WINDOW_S) is None
    assert a.admit_retry("t", p, 100.0 + WINDOW_S) is not None


def test_the_floor_allows_retries_per_second_whatever_the_ratio() -> None:
    a, p = AntiStorm(), policy(retry_budget_ratio=0.0, retry_budget_min_per_s=1.0)
    results = [a.admit_retry("t", p, 50.0 + i * 0.01) for i in range(WINDOW_S + 1)]
    assert all(r is None for r in results[:WINDOW_S])
    assert results[WINDOW_S] is not None and results[WINDOW_S].reason is StopReason.RETRY_BUDGET


def test_budgets_are_per_tool() -> None:
    a, p = AntiStorm(), policy(retry_budget_ratio=0.0, retry_budget_min_per_s=0.1)
    assert a.admit_retry("a", p, 1.0) is None
    assert a.admit_retry("a", p, 1.0) is not None
    assert a.admit_retry("b", p, 1.0) is None


def test_the_breaker_is_off_unless_configured() -> None:
    a, p = AntiStorm(), policy()
    for i in range(50):
        a.record("t", p, T, float(i))
    assert a.admit_first("t", p, 60.0) is None and not a.circuit_open("t", 60.0)


def test_consecutive_transient_failures_open_the_circuit_and_anything_else_resets_the_count() -> None:
    a, p = AntiStorm(), policy(breaker_failures=3, breaker_cooldown_s=5.0)
    a.record("t", p, T, 1.0)
    a.record("t", p, T, 1.1)
    a.record("t", p, None, 1.2)  # a success
    a.record("t", p, T, 1.3)
    a.record("t", p, Category.VALIDATION, 1.4)  # the upstream answered: not a sign of an outage
    a.record("t", p, T, 1.5)
    a.record("t", p, T, 1.6)
    assert a.admit_first("t", p, 1.7) is None
    a.record("t", p, T, 2.0)  # the third in a row
    first = a.admit_first("t", p, 3.0)
    retry = a.admit_retry("t", p, 3.0)
    assert first is not None and first.reason is StopReason.CIRCUIT_OPEN and first.retry_after_s == pytest.approx(4.0)
    assert retry is not None and retry.reason is StopReason.CIRCUIT_OPEN
    assert a.circuit_open("t", 3.0)


def opened(p: ToolPolicy, at: float = 0.0) -> AntiStorm:
    a = AntiStorm()
    for _ in range(p.anti_storm.breaker_failures or 0):
        a.record("t", p, T, at)
    return a


def test_half_open_admits_one_trial_and_its_success_closes_the_circuit() -> None:
    p = policy(breaker_failures=2, breaker_cooldown_s=5.0)
    a = opened(p)
    assert a.admit_first("t", p, 5.0) is None, "the trial call"
    other = a.admit_first("t", p, 5.1)
    assert other is not None and other.reason is StopReason.CIRCUIT_OPEN
    assert a.admit_retry("t", p, 5.1) is not None, "no retries while the trial runs"
    a.record("t", p, None, 5.2)
    assert a.admit_first("t", p, 5.3) is None and a.admit_first("t", p, 5.3) is None
    assert not a.circuit_open("t", 5.3)


def test_a_failed_trial_opens_the_circuit_again_for_a_full_cooldown() -> None:
    p = policy(breaker_failures=2, breaker_cooldown_s=5.0)
    a = opened(p)
    assert a.admit_first("t", p, 6.0) is None
    a.record("t", p, T, 6.5)  # one failure is enough in half-open
    refused = a.admit_first("t", p, 7.0)
    assert refused is not None and refused.retry_after_s == pytest.approx(4.5)
    assert a.admit_first("t", p, 11.5) is None, "the next trial"


def test_a_trial_that_never_reports_is_superseded_after_a_cooldown() -> None:
    p = policy(breaker_failures=1, breaker_cooldown_s=5.0)
    a = opened(p)
    assert a.admit_first("t", p, 5.0) is None  # the trial, then silence (cancelled, say)
    assert a.admit_first("t", p, 9.9) is not None
    assert a.admit_first("t", p, 10.0) is None


def test_breakers_are_per_tool() -> None:
    p = policy(breaker_failures=1, breaker_cooldown_s=5.0)
    a = opened(p)
    assert a.admit_first("t", p, 1.0) is not None
    assert a.admit_first("other", p, 1.0) is None


def test_the_tracked_tools_are_bounded() -> None:
    a, p = AntiStorm(), policy(breaker_failures=1)
    for i in range(MAX_TOOLS + 10):
        a.record(f"tool{i}", p, T, 0.0)
    assert len(a._tools) == MAX_TOOLS


def test_the_breaker_walks_closed_open_half_open_and_back() -> None:
    p = policy(breaker_failures=2, breaker_cooldown_s=5.0)
    a = AntiStorm()

    def circuit(now: float) -> object:
        (row,) = a.snapshot(now)
        return row["circuit"]

    a.record("t", p, None, 0.0)
    assert circuit(0.0) == Circuit.CLOSED.value
    a.record("t", p, T, 0.1)
    assert circuit(0.1) == Circuit.CLOSED.value, "one failure of two"
    a.record("t", p, T, 0.2)
    assert circuit(0.2) == Circuit.OPEN.value
    assert circuit(5.2) == Circuit.HALF_OPEN.value, "cooled down: the next call is the trial"
    assert a.admit_first("t", p, 5.2) is None
    a.record("t", p, T, 5.3)
    assert circuit(5.3) == Circuit.OPEN.value, "a failed trial opens it again"
    assert a.admit_first("t", p, 10.3) is None
    a.record("t", p, Category.VALIDATION, 10.4)
    assert circuit(10.4) == Circuit.CLOSED.value, "any answer of the upstream closes it"
    assert [c.value for c in Circuit] == ["closed", "open", "half_open"]
