"""The token bucket behind the proxy's bounded log lines (proxy/telemetry/budget.py)."""

from __future__ import annotations

import types

import pytest

from proxy.telemetry import budget
from proxy.telemetry.budget import TokenBucket


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_a_burst_then_the_rate_and_the_refused_are_counted(clock: list[float]) -> None:
    bucket = TokenBucket(burst=3, rate=2.0)
    assert [bucket.allow() for _ in range(5)] == [True, True, True, False, False]
    assert bucket.dropped == 2
    clock[0] += 0.5  # one token at 2 a second
    assert bucket.allow() and not bucket.allow()
    assert bucket.take_dropped() == 3 and bucket.take_dropped() == 0


def test_an_idle_bucket_refills_to_its_burst_and_no_further(clock: list[float]) -> None:
    bucket = TokenBucket(burst=2, rate=100.0)
    assert bucket.allow() and bucket.allow() and not bucket.allow()
    clock[0] += 3600.0
    assert [bucket.allow() for _ in range(3)] == [True, True, False]


def test_a_rate_of_zero_allows_the_burst_only(clock: list[float]) -> None:
    bucket = TokenBucket(burst=1, rate=0.0)
    clock[0] += 1e6
    assert bucket.allow() and not bucket.allow()
