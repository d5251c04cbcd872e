"""The deploy files against promtool and against the metrics the observer really exports."""

from __future__ import annotations

import re
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from proxy.telemetry.events import PolicyReloaded, UpstreamStatus
from proxy.telemetry.metrics import MetricsObserver
from proxy.telemetry.setup import build_telemetry
from tests.telemetry import promql, scenarios

pytestmark = pytest.mark.slow

NEEDS_PROMTOOL = pytest.mark.skipif(
    promql.promtool() is None,
    reason="promtool not found: install Debian's `prometheus` package (apt-get install -y prometheus)",
)


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = promql.promtool()
    assert tool is not None
    return subprocess.run(
        [tool, *args], cwd=promql.PROMETHEUS_DIR, capture_output=True, text=True, timeout=60, check=False
    )


def with_a_breaker(observer: MetricsObserver) -> None:
    """Give the observer an engine's anti-storm state with one tool under a circuit breaker."""
    from proxy.policy.compiled import AntiStorm as Limits
    from proxy.policy.compiled import SideEffect, ToolPolicy
    from proxy.recovery.antistorm import AntiStorm

    antistorm = AntiStorm()
    policy = ToolPolicy(tool="lookup", side_effect=SideEffect.READ_ONLY, anti_storm=Limits(breaker_failures=3))
    antistorm.record("lookup", policy, None, 0.0)
    observer.watch_circuits(antistorm.circuits)


def exported_text() -> str:
    """The exposition of a bundle that saw every kind of event."""
    bundle = build_telemetry(None, environ={})
    with_a_breaker(bundle.metrics)
    bundle.metrics.watch_in_flight(lambda: [("echo", 1)])  # the engine's counts (tested with the engine)
    events = (
        scenarios.success("c1")
        + scenarios.recovered("c2")
        + scenarios.unresolved("c3")
        + scenarios.unresolved("c4", "charge", attempts=1, stop_reason="outcome_unknown", outcome_unknown=True)
        + scenarios.cancelled("c5")
    )
    for event in [*events, UpstreamStatus("stdio:python", True, 1), PolicyReloaded("ok", "v1")]:
        bundle.telemetry.emit(event)
    return generate_latest(bundle.registry).decode()


def exported_samples() -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in exported_text().splitlines() if line and line[0] != "#"}


@NEEDS_PROMTOOL
def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@NEEDS_PROMTOOL
def test_promtool_rule_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@NEEDS_PROMTOOL
def test_promtool_checks_the_scrape_config() -> None:
    result = run_promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@NEEDS_PROMTOOL
def test_promtool_finds_the_exposition_clean() -> None:
    tool = promql.promtool()
    assert tool is not None
    result = subprocess.run(
        [tool, "check", "metrics"], input=exported_text(), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


def test_no_dashboard_or_rule_query_hides_a_missing_series() -> None:
    exprs = [e for _, _, e in promql.dashboard_targets()] + [e for _, e in promql.rule_exprs()]
    assert exprs
    offending = [e for e in exprs if promql.hides_missing(e)]
    assert not offending, f"queries that would hide a missing series: {offending}"
    # the check itself: what it must catch, and the same metric read two ways that it must not
    assert promql.hides_missing("sum(rate(mcp_recovery_calls_total[5m])) or vector(0)")
    assert promql.hides_missing("mcp_recovery_calls_total or on() mcp_recovery_policy_reload_ok")
    assert promql.hides_missing("absent(mcp_recovery_calls_total)")
    young_or_old = "(mcp_recovery_x_total unless mcp_recovery_x_total offset 9m) or increase(mcp_recovery_x_total[9m])"
    assert not promql.hides_missing(young_or_old)


def test_every_metric_the_dashboard_and_rules_use_is_exported() -> None:
    samples = exported_samples()
    used = set()
    for _, _, expr in promql.dashboard_targets():
        used |= promql.metric_names(expr)
    for _, expr in promql.rule_exprs():
        used |= promql.metric_names(expr)
    for query in promql.dashboard_variable_queries():
        used |= promql.metric_names(query)
    assert used
    assert used <= samples, f"used but never exported: {sorted(used - samples)}"


def test_rule_unit_tests_use_the_exported_series_names_and_labels() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(registry)
    with_a_breaker(observer)
    for event in scenarios.recovered("c1") + scenarios.unresolved("c2") + scenarios.cancelled("c3"):
        observer.on_event(event)
    observer.on_event(UpstreamStatus("stdio:python", True, 1))
    labels_of: dict[str, set[str]] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            labels_of.setdefault(sample.name, set()).update(sample.labels)
    for series in promql.rules_test_series():
        name, _, rest = series.partition("{")
        keys = set(re.findall(r"(\w+)=", rest)) - {"job", "instance"}  # added by Prometheus at scrape time
        assert name in labels_of, f"{name} is not a series the proxy exports"
        exported = labels_of[name] - {"le"}
        assert keys - {"le"} == exported, f"{series}: labels {sorted(keys)} != {sorted(labels_of[name])}"


def test_the_dashboard_covers_what_operators_asked_for() -> None:
    titles = {title for _, title, _ in promql.dashboard_targets()}
    for wanted in (
        "Call rate by outcome",
        "Retry rate",
        "Retry success ratio",
        "Unresolved calls by tool",
        "Stop reasons by tool",
        "Call latency p50 / p95 / p99",
        "Attempts per call",
        "Outcome-unknown calls",
        "Upstream restarts",
        "Policy reload failures",
    ):
        assert wanted in titles


def test_the_dashboard_uses_a_datasource_variable_not_a_fixed_uid() -> None:
    import json

    for path in promql.DASHBOARDS:
        board = json.loads(path.read_text())
        assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in board["templating"]["list"])
        text = path.read_text()
        uids = set(re.findall(r'"uid": "([^"]*)"', text)) - {board["uid"], "-- Grafana --"}
        assert uids == {"${datasource}"}
