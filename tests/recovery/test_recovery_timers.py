"""proxy.recovery.timers: the answer of an attempt a timer cut names that timer, its value and the
policy key (and file) that changes it."""

from __future__ import annotations

from types import MappingProxyType

from proxy.policy.compiled import SideEffect, ToolPolicy
from proxy.recovery.timers import cut_by

SOURCES = MappingProxyType(
    {
        "idle_timeout_s": "policies/search.yaml:idle_timeout",
        "attempt_timeout_s": "policies/search.yaml:attempt_timeout",
        "deadline_s": "built-in",
    }
)


def policy(**kw: float | None) -> ToolPolicy:
    return ToolPolicy(tool="search", side_effect=SideEffect.READ_ONLY, sources=SOURCES, **kw)  # type: ignore[arg-type]


def test_an_idle_timer_cut_names_idle_timeout_its_value_its_file_and_how_to_turn_it_off():
    p = policy(deadline_s=58.0, attempt_timeout_s=58.0, idle_timeout_s=30.0)
    text = cut_by(p, 58.0, 30.0, 58.0).detail(1)
    assert text.startswith("attempt 1: no answer and no progress for 30s: cut by idle_timeout 30s")
    assert "(search.yaml:idle_timeout)" in text and "idle_timeout: null" in text


def test_an_attempt_timeout_cut_names_attempt_timeout():
    p = policy(deadline_s=58.0, attempt_timeout_s=20.0)
    cut = cut_by(p, 20.0, None, 58.0)
    assert (cut.key, cut.value_s) == ("attempt_timeout", 20.0)
    assert "cut by attempt_timeout 20s (search.yaml:attempt_timeout)" in cut.detail(2)


def test_the_deadline_and_the_callers_deadline_are_told_apart():
    p = policy(deadline_s=58.0, attempt_timeout_s=58.0)
    assert cut_by(p, 58.0, None, 58.0).key == "deadline"
    # attempt 2 got what the deadline left (less than attempt_timeout): the deadline cut it
    assert cut_by(policy(deadline_s=58.0, attempt_timeout_s=40.0), 12.5, None, 58.0).key == "deadline"
    caller = cut_by(p, 5.0, None, 5.0)
    assert caller.key == "caller_deadline" and "io.mcp-recovery-proxy/deadlineMs" in caller.detail(1)
