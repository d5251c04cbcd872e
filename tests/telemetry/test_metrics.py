"""MetricsObserver: synthetic event sequences in, registry values out."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from proxy.telemetry.events import CallFinished, CallStarted, PolicyReloaded, UpstreamStatus
from proxy.telemetry.metrics import MetricsObserver
from tests.telemetry import scenarios


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def observer(registry: CollectorRegistry) -> MetricsObserver:
    return MetricsObserver(registry)


def feed(observer: MetricsObserver, events: list) -> None:
    for event in events:
        observer.on_event(event)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_a_call_recovered_after_two_failures_counts_three_attempts_two_retries_and_one_retry_success(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    feed(observer, scenarios.recovered("c1", "flaky_read", failures=2))
    assert value(registry, "mcp_recovery_calls_total", tool="flaky_read", outcome="recovered") == 1
    assert (
        value(registry, "mcp_recovery_attempts_total", tool="flaky_read", result="tool_error", category="transient")
        == 2
    )
    assert value(registry, "mcp_recovery_attempts_total", tool="flaky_read", result="success", category="none") == 1
    assert value(registry, "mcp_recovery_retries_total", tool="flaky_read") == 2
    assert value(registry, "mcp_recovery_retry_successes_total", tool="flaky_read") == 1
    assert value(registry, "mcp_recovery_call_attempts_bucket", tool="flaky_read", le="2.0") == 0
    assert value(registry, "mcp_recovery_call_attempts_bucket", tool="flaky_read", le="3.0") == 1
    assert value(registry, "mcp_recovery_call_attempts_sum", tool="flaky_read") == 3
    assert value(registry, "mcp_recovery_backoff_delay_seconds_count", tool="flaky_read") == 2
    assert value(registry, "mcp_recovery_backoff_seconds_total", tool="flaky_read") == pytest.approx(0.15)
    assert value(registry, "mcp_recovery_call_duration_seconds_count", tool="flaky_read", outcome="recovered") == 1
    assert value(registry, "mcp_recovery_attempt_duration_seconds_count", tool="flaky_read", result="tool_error") == 2
    assert registry.get_sample_value("mcp_recovery_stops_total", {"tool": "flaky_read", "stop_reason": "none"}) is None


def test_an_unresolved_call_counts_its_stop_reason_and_outcome_unknown(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    feed(observer, scenarios.unresolved("c1", "always_fail", attempts=3, stop_reason="attempts_exhausted"))
    feed(
        observer, scenarios.unresolved("c2", "charge", attempts=1, stop_reason="outcome_unknown", outcome_unknown=True)
    )
    assert value(registry, "mcp_recovery_calls_total", tool="always_fail", outcome="unresolved") == 1
    assert value(registry, "mcp_recovery_stops_total", tool="always_fail", stop_reason="attempts_exhausted") == 1
    assert value(registry, "mcp_recovery_stops_total", tool="charge", stop_reason="outcome_unknown") == 1
    assert value(registry, "mcp_recovery_outcome_unknown_calls_total", tool="charge") == 1
    # Per-tool counters exist at 0 from the tool's first call, so rate() sees the first increment.
    assert registry.get_sample_value("mcp_recovery_outcome_unknown_calls_total", {"tool": "always_fail"}) == 0
    assert registry.get_sample_value("mcp_recovery_calls_total", {"tool": "charge", "outcome": "success"}) == 0
    assert value(registry, "mcp_recovery_retry_successes_total", tool="always_fail") == 0
    assert value(registry, "mcp_recovery_retries_total", tool="always_fail") == 2


def test_a_first_attempt_success_is_one_event_that_counts_its_attempt_and_its_call(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    feed(observer, scenarios.success("c1", "echo"))
    assert value(registry, "mcp_recovery_calls_total", tool="echo", outcome="success") == 1
    assert value(registry, "mcp_recovery_attempts_total", tool="echo", result="success", category="none") == 1
    assert value(registry, "mcp_recovery_attempt_duration_seconds_sum", tool="echo", result="success") == 0.01
    assert value(registry, "mcp_recovery_call_duration_seconds_sum", tool="echo", outcome="success") == 0.012
    assert value(registry, "mcp_recovery_call_attempts_sum", tool="echo") == 1
    assert value(registry, "mcp_recovery_retries_total", tool="echo") == 0
    assert registry.get_sample_value("mcp_recovery_stops_total", {"tool": "echo", "stop_reason": "none"}) is None


def test_calls_in_flight_are_read_from_the_engine_at_scrape_time(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    assert next(m for m in registry.collect() if m.name == "mcp_recovery_calls_in_flight").samples == []
    flying = {"hang": 1, "echo": 0}
    observer.watch_in_flight(lambda: list(flying.items()))
    feed(observer, scenarios.cancelled("c1", "hang")[:2])  # start events change nothing by themselves
    assert value(registry, "mcp_recovery_calls_in_flight", tool="hang") == 1
    assert registry.get_sample_value("mcp_recovery_calls_in_flight", {"tool": "echo"}) == 0
    flying["hang"] = 0
    assert value(registry, "mcp_recovery_calls_in_flight", tool="hang") == 0


def test_a_cancelled_call_counts_as_cancelled(registry: CollectorRegistry, observer: MetricsObserver) -> None:
    feed(observer, scenarios.cancelled("c1", "hang"))
    assert value(registry, "mcp_recovery_calls_total", tool="hang", outcome="cancelled") == 1
    assert value(registry, "mcp_recovery_stops_total", tool="hang", stop_reason="cancelled") == 1
    # No attempt finished and none was counted: attempts per call only records calls that made one.
    assert registry.get_sample_value("mcp_recovery_call_attempts_count", {"tool": "hang"}) is None


def test_upstream_restarts_count_the_growth_of_the_cumulative_figure(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    observer.on_event(UpstreamStatus("stdio:python", up=True))
    assert value(registry, "mcp_recovery_upstream_up", upstream="stdio:python") == 1
    assert value(registry, "mcp_recovery_upstream_restarts_total", upstream="stdio:python") == 0
    observer.on_event(UpstreamStatus("stdio:python", up=False, restarts=0))
    observer.on_event(UpstreamStatus("stdio:python", up=True, restarts=1))
    observer.on_event(UpstreamStatus("stdio:python", up=True, restarts=1))  # repeated status: no new restart
    observer.on_event(UpstreamStatus("stdio:python", up=True, restarts=3))
    assert value(registry, "mcp_recovery_upstream_restarts_total", upstream="stdio:python") == 3
    assert value(registry, "mcp_recovery_upstream_up", upstream="stdio:python") == 1
    observer.on_event(UpstreamStatus("stdio:python", up=False, restarts=3))
    assert value(registry, "mcp_recovery_upstream_up", upstream="stdio:python") == 0


def test_policy_reloads_count_by_result_and_keep_exactly_one_version_series(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    for result in ("ok", "unchanged", "error"):  # known results exist at zero before any reload
        assert registry.get_sample_value("mcp_recovery_policy_reloads_total", {"result": result}) == 0
    observer.on_event(PolicyReloaded("ok", "v1"))
    observer.on_event(PolicyReloaded("ok", "v2"))
    observer.on_event(PolicyReloaded("error", "v2"))
    assert value(registry, "mcp_recovery_policy_reloads_total", result="ok") == 2
    assert value(registry, "mcp_recovery_policy_reloads_total", result="error") == 1
    assert value(registry, "mcp_recovery_policy_reload_ok") == 0
    assert registry.get_sample_value("mcp_recovery_policy_info", {"version": "v1"}) is None
    assert value(registry, "mcp_recovery_policy_info", version="v2") == 1
    observer.on_event(PolicyReloaded("unchanged", "v2"))
    assert value(registry, "mcp_recovery_policy_reload_ok") == 1


def test_the_loaded_policy_version_is_the_info_series(registry: CollectorRegistry, observer: MetricsObserver) -> None:
    observer.set_policy_version("sha-1")  # at start-up
    feed(observer, scenarios.success("c1", policy_version="sha-0"))  # a call's own version sets nothing
    observer.on_event(PolicyReloaded("ok", "sha-2"))
    info = [s for m in registry.collect() if m.name == "mcp_recovery_policy_info" for s in m.samples]
    assert [(s.labels, s.value) for s in info] == [({"version": "sha-2"}, 1.0)]


def test_distinct_tool_labels_are_capped_and_the_rest_become_other(registry: CollectorRegistry) -> None:
    observer = MetricsObserver(registry, max_tools=3)
    for i in range(6):
        feed(observer, scenarios.success(f"c{i}", f"tool{i}"))
    tools = {s.labels["tool"] for m in registry.collect() if m.name == "mcp_recovery_calls" for s in m.samples}
    assert tools == {"tool0", "tool1", "tool2", "other"}
    assert value(registry, "mcp_recovery_calls_total", tool="other", outcome="success") == 3
    # In-flight counts of capped tools are summed under "other".
    observer.watch_in_flight(lambda: [(f"tool{i}", 1) for i in range(6)])
    assert value(registry, "mcp_recovery_calls_in_flight", tool="tool2") == 1
    assert value(registry, "mcp_recovery_calls_in_flight", tool="other") == 3


def test_unexpected_label_values_collapse_to_other() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(registry)
    observer.on_event(scenarios.started("c1", "echo"))
    observer.on_event(CallFinished("c1", "echo", "weird-outcome", "weird-reason", None, 1, 0.1, 0.0, False))
    assert value(registry, "mcp_recovery_calls_total", tool="echo", outcome="other") == 1
    assert value(registry, "mcp_recovery_stops_total", tool="echo", stop_reason="other") == 1


def test_no_global_registry_is_touched() -> None:
    from prometheus_client import REGISTRY

    before = {m.name for m in REGISTRY.collect()}
    MetricsObserver(CollectorRegistry())
    assert not any(name.startswith("mcp_recovery_") for name in before | {m.name for m in REGISTRY.collect()})


def test_every_exported_metric_carries_the_prefix_and_a_help_text(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    feed(observer, scenarios.recovered("c1"))
    observer.on_event(CallStarted("c2", "echo", "read_only", None, "legacy", "v1", 3, 1.0))
    text = generate_latest(registry).decode()
    helps = [line for line in text.splitlines() if line.startswith("# HELP ")]
    assert helps and all(line.split()[2].startswith("mcp_recovery_") for line in helps)
    assert all(len(line.split(maxsplit=3)) == 4 for line in helps)


def test_circuit_open_reads_the_engines_breakers_at_scrape_time(registry: CollectorRegistry) -> None:
    from proxy.policy.compiled import AntiStorm as Limits
    from proxy.policy.compiled import Category, SideEffect, ToolPolicy
    from proxy.recovery.antistorm import AntiStorm

    observer = MetricsObserver(registry)
    assert registry.get_sample_value("mcp_recovery_circuit_open", {"tool": "lookup"}) is None
    antistorm = AntiStorm()
    observer.watch_circuits(antistorm.circuits)
    breaker = ToolPolicy(tool="lookup", side_effect=SideEffect.READ_ONLY, anti_storm=Limits(breaker_failures=2))
    plain = ToolPolicy(tool="echo", side_effect=SideEffect.READ_ONLY)
    antistorm.record("echo", plain, Category.TRANSIENT, 0.0)  # no breaker: not exported
    antistorm.record("lookup", breaker, None, 0.0)
    assert value(registry, "mcp_recovery_circuit_open", tool="lookup") == 0.0
    import time

    now = time.monotonic()
    antistorm.record("lookup", breaker, Category.TRANSIENT, now)
    antistorm.record("lookup", breaker, Category.TRANSIENT, now)
    assert value(registry, "mcp_recovery_circuit_open", tool="lookup") == 1.0
    assert registry.get_sample_value("mcp_recovery_circuit_open", {"tool": "echo"}) is None
    # Cooled down, no call yet: the breaker would let the next call through as its trial, but
    # nothing has closed it, so it is still reported open (an outage under light traffic keeps
    # the gauge at 1 between cooldowns instead of dipping to 0 at each).
    cooled = now + 3600.0
    assert not antistorm.circuit_open("lookup", cooled)
    assert antistorm.circuits(cooled) == [("lookup", True)]
    assert antistorm.admit_first("lookup", breaker, cooled) is None  # the trial starts: half-open
    assert antistorm.circuits(cooled) == [("lookup", True)]
    antistorm.record("lookup", breaker, Category.TRANSIENT, cooled)  # the trial failed: open again
    assert antistorm.circuits(cooled) == [("lookup", True)]
    later = cooled + 3600.0
    assert antistorm.admit_first("lookup", breaker, later) is None
    antistorm.record("lookup", breaker, None, later)  # a trial that succeeded closes it
    assert antistorm.circuits(later) == [("lookup", False)]
    assert value(registry, "mcp_recovery_circuit_open", tool="lookup") == 0.0


def test_successes_counted_in_batches_give_the_same_histograms_as_one_by_one() -> None:
    import random

    from proxy.telemetry.events import CallSucceeded
    from proxy.telemetry.metrics import DURATION_BUCKETS_S, FOLD_AT, _observe

    rng = random.Random(5)
    durations = [*DURATION_BUCKETS_S, -0.001, 0.0, 61.0, *(rng.uniform(0, 2) for _ in range(FOLD_AT + 300))]
    registry = CollectorRegistry()
    observer = MetricsObserver(registry)
    expected = [0.0] * (len(DURATION_BUCKETS_S) + 2)
    for d in durations:  # crosses FOLD_AT once, the rest is folded by the scrape
        observer.on_event(CallSucceeded("c", "echo", d, d))
        _observe(expected, DURATION_BUCKETS_S, d)
    cumulative = 0.0
    for bound, count in zip(DURATION_BUCKETS_S, expected, strict=False):
        cumulative += count
        le = str(float(bound))
        got = value(registry, "mcp_recovery_attempt_duration_seconds_bucket", tool="echo", result="success", le=le)
        assert got == cumulative, le
        call = value(registry, "mcp_recovery_call_duration_seconds_bucket", tool="echo", outcome="success", le=le)
        assert call == got
    total = value(registry, "mcp_recovery_call_duration_seconds_count", tool="echo", outcome="success")
    assert total == len(durations) == value(registry, "mcp_recovery_calls_total", tool="echo", outcome="success")
    assert value(registry, "mcp_recovery_call_duration_seconds_sum", tool="echo", outcome="success") == pytest.approx(
        expected[-1]
    )
    assert value(registry, "mcp_recovery_call_attempts_sum", tool="echo") == len(durations)


def test_a_tool_name_longer_than_the_label_bound_counts_under_other_and_no_series_carries_it(
    registry: CollectorRegistry, observer: MetricsObserver
) -> None:
    """An upstream's tool name is its own text: one of 200,000 characters made every series of the
    tool carry it (10.8 MB of /metrics for 54 series). Past `LABEL_LIMIT` it is `other`."""
    from proxy.telemetry.metrics import BoundedLabel
    from proxy.telemetry.status import LABEL_LIMIT

    long_name = "t" * 200_000
    edge = "e" * LABEL_LIMIT
    for i, name in enumerate([long_name, long_name, long_name, edge]):
        feed(observer, scenarios.recovered(f"c{i}", name, failures=1))
    scrape = generate_latest(registry).decode()
    assert len(scrape) < 100_000, len(scrape)
    assert "t" * (LABEL_LIMIT + 1) not in scrape
    assert value(registry, "mcp_recovery_calls_total", tool="other", outcome="recovered") == 3
    assert value(registry, "mcp_recovery_calls_total", tool=edge, outcome="recovered") == 1, "the bound admits it"
    label = BoundedLabel(5, max_chars=4)
    assert [label("abcd"), label("abcde"), label("abcd")] == ["abcd", "other", "abcd"]
