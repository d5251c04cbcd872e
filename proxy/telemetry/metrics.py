"""Prometheus metrics from the engine's events (prefix `mcp_recovery_`), on the proxy's own registry.

Contract:
- `MetricsObserver(registry)` registers every metric on `registry` (never the global registry) and
  turns events into counter, gauge and histogram updates. It observes; it never decides, and it
  never raises into traffic (the `Telemetry` fan-out contains it anyway).
- Labels are bounded: `tool` comes already capped by the engine (catalog names or "other"), and
  this observer caps the distinct values again (`max_tools`, default 200, then "other") as defence
  in depth; `upstream` is capped the same way. `outcome`, `result`, `category`, `stop_reason`,
  `dispatched` and reload `result` are closed vocabularies; an unexpected value becomes "other".
- Known label values of the small closed sets (reload results; per tool, the call outcomes,
  retries and outcome-unknown calls, the first time the tool is seen) are created at 0, so a
  dashboard or alert that watches for them reads a real zero instead of a missing series, and
  `rate()` sees the first increment.
- The metric table lives in docs/observability.md; tests/telemetry keeps the two in step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from proxy.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BackoffStarted,
    CallFinished,
    CallStarted,
    Event,
    PolicyReloaded,
    UpstreamStatus,
)

PREFIX = "mcp_recovery_"
OTHER = "other"
NONE = "none"

# Tool calls last from milliseconds (a cached read) to a minute (a slow crawl): 5 ms … 60 s.
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
BACKOFF_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 10)

OUTCOMES = frozenset({"success", "recovered", "unresolved", "tool_error", "cancelled"})
RESULTS = frozenset({"success", "tool_error", "rpc_error", "transport_error", "timeout", "cancelled"})
CATEGORIES = frozenset({"transient", "validation", "business", "permission"})
STOP_REASONS = frozenset(
    {
        "not_retryable",
        "upstream_declined",
        "outcome_unknown",
        "attempts_exhausted",
        "deadline_exhausted",
        "retry_budget",
        "circuit_open",
        "overloaded",
        "ledger_exhausted",
        "cancelled",
    }
)
RELOAD_RESULTS = ("ok", "unchanged", "error")


def _closed(value: str | None, allowed: frozenset[str]) -> str:
    if value is None:
        return NONE
    return value if value in allowed else OTHER


class BoundedLabel:
    """Admits the first `limit` distinct values; every later new value maps to "other".

    A value keeps the label it got the first time, so increments and decrements of one series
    (calls in flight) always meet.
    """

    __slots__ = ("_limit", "_seen")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit and value != OTHER:
            self._seen.add(value)
            return value
        return OTHER


CircuitSource = Callable[[float], list[tuple[str, bool]]]


class _CircuitCollector:
    """`mcp_recovery_circuit_open{tool}`, read from the engine's anti-storm state at scrape time
    (nothing to update per call). Only tools whose policy has a circuit breaker appear."""

    def __init__(self, label: Callable[[str], str]) -> None:
        self.source: CircuitSource | None = None
        self._label = label

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        if self.source is not None:
            merged: dict[str, bool] = {}
            for tool, refusing in self.source(time.monotonic()):
                label = self._label(tool)
                merged[label] = merged.get(label, False) or refusing
            for label, refusing in merged.items():
                family.add_metric([label], 1.0 if refusing else 0.0)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            PREFIX + "circuit_open",
            "1 while the tool's circuit breaker refuses calls (open, or half-open with its trial call running).",
            labels=("tool",),
        )


class MetricsObserver:
    """Turns telemetry events into Prometheus metrics on `registry`."""

    def __init__(self, registry: CollectorRegistry, *, max_tools: int = 200, max_upstreams: int = 16) -> None:
        self.registry = registry
        self._tool = BoundedLabel(max_tools)
        self._upstream = BoundedLabel(max_upstreams)
        self._restarts_seen: dict[str, int] = {}
        self._policy_version: str | None = None
        self._touched: set[str] = set()

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, registry=registry, buckets=buckets)

        # labels() validates, sorts and locks on every call; the children of these bounded label
        # sets are looked up once and kept (the label values are already capped).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._success: dict[str, tuple[Any, ...]] = {}
        self.calls = counter("calls", "Finished tools/call requests by outcome.", ("tool", "outcome"))
        self.calls_in_flight = gauge("calls_in_flight", "tools/call requests being handled now.", ("tool",))
        self.call_duration = histogram(
            "call_duration_seconds",
            "Time from a tools/call's arrival to its answer, all attempts and backoff included.",
            ("tool", "outcome"),
            DURATION_BUCKETS_S,
        )
        self.attempts_per_call = histogram(
            "call_attempts", "Upstream attempts used by one tools/call.", ("tool",), ATTEMPT_BUCKETS
        )
        self.attempts = counter(
            "attempts", "Finished upstream attempts by result and failure category.", ("tool", "result", "category")
        )
        self.attempt_duration = histogram(
            "attempt_duration_seconds", "Duration of one upstream attempt.", ("tool", "result"), DURATION_BUCKETS_S
        )
        self.retries = counter("retries", "Retry attempts started (attempts after the first).", ("tool",))
        self.retry_successes = counter(
            "retry_successes", "Retry attempts (attempts after the first) that succeeded.", ("tool",)
        )
        self.stops = counter(
            "stops",
            "Calls that ended without success, by the reason the proxy stopped trying.",
            ("tool", "stop_reason"),
        )
        self.outcome_unknown = counter(
            "outcome_unknown_calls",
            "Calls answered while the upstream may or may not have executed the last attempt.",
            ("tool",),
        )
        self.backoff_seconds = counter(
            "backoff_seconds", "Time calls spent waiting between attempts (measured at call end).", ("tool",)
        )
        self.backoff_delay = histogram(
            "backoff_delay_seconds", "Backoff delays scheduled before a retry.", ("tool",), BACKOFF_BUCKETS_S
        )
        self.upstream_up = gauge("upstream_up", "1 while the upstream answers, 0 while it does not.", ("upstream",))
        self.upstream_restarts = counter(
            "upstream_restarts", "Restarts of supervised upstream children.", ("upstream",)
        )
        self.policy_reloads = counter("policy_reloads", "Policy reloads by result.", ("result",))
        self.policy_reload_ok = gauge(
            "policy_reload_ok", "1 when the last policy reload succeeded (or nothing changed), 0 when it failed."
        )
        self.policy_info = gauge("policy_info", "The active policy set's version (value always 1).", ("version",))
        for result in RELOAD_RESULTS:
            self.policy_reloads.labels(result=result)
        self.policy_reload_ok.set(1)
        self._circuits = _CircuitCollector(self._tool)
        registry.register(self._circuits)

    def watch_circuits(self, source: CircuitSource) -> None:
        """Export the circuit-breaker state `source(now_s)` gives: the engine's `antistorm.circuits`,
        on the monotonic clock the engine uses."""
        self._circuits.source = source

    # ------------------------------------------------------------------------------ events

    def _tool_label(self, tool: str) -> str:
        """The bounded label of `tool`; its per-tool counters start at 0 the first time it is seen.

        A counter that first appears already at 1 makes `rate()`/`increase()` miss that first
        event; creating the series at 0 lets alerts and dashboards see it.
        """
        label = self._tool(tool)
        if label not in self._touched:
            self._touched.add(label)
            for outcome in OUTCOMES:
                self.calls.labels(tool=label, outcome=outcome)
            self.retries.labels(tool=label)
            self.retry_successes.labels(tool=label)
            self.outcome_unknown.labels(tool=label)
        return label

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def on_event(self, event: Event) -> None:
        match event:
            case AttemptFinished():
                self._attempt_finished(event)
            case AttemptStarted():
                if event.number > 1:
                    self._child(self.retries, self._tool_label(event.tool)).inc()
            case CallStarted():
                self._child(self.calls_in_flight, self._tool_label(event.tool)).inc()
                if event.policy_version:
                    self._set_policy_version(event.policy_version)
            case CallFinished():
                self._call_finished(event)
            case BackoffStarted():
                self._child(self.backoff_delay, self._tool_label(event.tool)).observe(max(event.delay_s, 0.0))
            case UpstreamStatus():
                self._upstream_status(event)
            case PolicyReloaded():
                result = event.result if event.result in RELOAD_RESULTS else OTHER
                self.policy_reloads.labels(result=result).inc()
                self.policy_reload_ok.set(0 if result == "error" else 1)
                if result == "ok" and event.version:
                    self._set_policy_version(event.version)

    def _success_children(self, tool: str) -> tuple[Any, ...]:
        """The series a first-attempt success touches, per tool label, looked up once."""
        children = self._success.get(tool)
        if children is None:
            children = self._success[tool] = (
                self._child(self.attempts, tool, "success", NONE),
                self._child(self.attempt_duration, tool, "success"),
                self._child(self.calls_in_flight, tool),
                self._child(self.calls, tool, "success"),
                self._child(self.call_duration, tool, "success"),
                self._child(self.attempts_per_call, tool),
            )
        return children

    def _attempt_finished(self, event: AttemptFinished) -> None:
        tool = self._tool_label(event.tool)
        if event.result == "success" and event.category is None:  # the common case, straight to its series
            attempts, attempt_duration = self._success_children(tool)[:2]
            attempts.inc()
            attempt_duration.observe(max(event.duration_s, 0.0))
            if event.number > 1:
                self._child(self.retry_successes, tool).inc()
            return
        result = _closed(event.result, RESULTS)
        category = _closed(event.category, CATEGORIES)
        self._child(self.attempts, tool, result, category).inc()
        self._child(self.attempt_duration, tool, result).observe(max(event.duration_s, 0.0))
        if event.number > 1 and result == "success":
            self._child(self.retry_successes, tool).inc()

    def _call_finished(self, event: CallFinished) -> None:
        tool = self._tool_label(event.tool)
        if event.outcome == "success" and event.stop_reason is None and not event.backoff_s:
            _, _, in_flight, calls, call_duration, attempts_per_call = self._success_children(tool)
            in_flight.dec()
            calls.inc()
            call_duration.observe(max(event.duration_s, 0.0))
            attempts_per_call.observe(event.attempts)
            if event.outcome_unknown:
                self._child(self.outcome_unknown, tool).inc()
            return
        outcome = _closed(event.outcome, OUTCOMES)
        self._child(self.calls_in_flight, tool).dec()
        self._child(self.calls, tool, outcome).inc()
        self._child(self.call_duration, tool, outcome).observe(max(event.duration_s, 0.0))
        if event.attempts > 0:
            self._child(self.attempts_per_call, tool).observe(event.attempts)
        if event.stop_reason is not None:
            self._child(self.stops, tool, _closed(event.stop_reason, STOP_REASONS)).inc()
        if event.outcome_unknown:
            self._child(self.outcome_unknown, tool).inc()
        if event.backoff_s > 0:
            self._child(self.backoff_seconds, tool).inc(event.backoff_s)

    def _upstream_status(self, event: UpstreamStatus) -> None:
        upstream = self._upstream(event.upstream)
        self.upstream_up.labels(upstream=upstream).set(1 if event.up else 0)
        restarts = self.upstream_restarts.labels(upstream=upstream)  # the series exists from the first status
        # `restarts` is cumulative per upstream; a smaller figure means the supervisor itself started over.
        previous = self._restarts_seen.get(event.upstream, 0)
        if event.restarts > previous:
            restarts.inc(event.restarts - previous)
        self._restarts_seen[event.upstream] = event.restarts
        if len(self._restarts_seen) > 64:  # bounded: forget the oldest upstream
            self._restarts_seen.pop(next(iter(self._restarts_seen)))

    def _set_policy_version(self, version: str) -> None:
        version = version[:64]
        if version == self._policy_version:
            return
        if self._policy_version is not None:
            self.policy_info.remove(self._policy_version)
        self.policy_info.labels(version=version).set(1)
        self._policy_version = version
