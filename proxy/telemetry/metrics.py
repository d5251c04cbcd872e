"""Prometheus metrics from the engine's events (prefix `mcp_recovery_`), on the proxy's own registry.

Contract:
- `MetricsObserver(registry)` registers every metric on `registry` (never the global registry) and
  turns events into counter, gauge and histogram updates. It observes; it never decides, and it
  never raises into traffic (the `Telemetry` fan-out contains it anyway).
- Labels are bounded: `tool` comes already capped by the engine (catalog names or "other"), and
  this observer caps the distinct values again (`max_tools`, default 200, then "other") as defence
  in depth; `upstream` is capped the same way. A value longer than `LABEL_LIMIT` (128: the
  length the MCP spec says a tool name should stay within, and the status page's cut) is never a
  label: it counts under "other" like a value past the cap, so an upstream that lists a tool
  named with 200,000 characters cannot put them into every series of it. `outcome`, `result`, `category`, `stop_reason`,
  `dispatched` and reload `result` are closed vocabularies; an unexpected value becomes "other".
- Calls in flight and circuit states are read from the engine at scrape time (`watch_in_flight`,
  `watch_circuits`): nothing is updated per call for them, and they need no start event
  (`needs_starts = False`). The policy version is set at start-up (`set_policy_version`) and by
  successful reloads.
- Known label values of the small closed sets (reload results; per tool, the call outcomes,
  retries and outcome-unknown calls, the first time the tool is seen) are created at 0, so a
  dashboard or alert that watches for them reads a real zero instead of a missing series, and
  `rate()` sees the first increment.
- The metric table lives in docs/observability.md; tests/telemetry keeps the two in step.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from proxy.telemetry.bridge import BridgeCollector
from proxy.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BackoffStarted,
    CallFinished,
    CallStarted,
    CallSucceeded,
    Event,
    PolicyReloaded,
    UpstreamStatus,
)
from proxy.telemetry.gc_pauses import GcPauseCollector
from proxy.telemetry.loop_lag import LoopLag
from proxy.telemetry.shed import ShedCollector
from proxy.telemetry.status import LABEL_LIMIT

PREFIX = "mcp_recovery_"
OTHER = "other"
NONE = "none"

# Tool calls last from milliseconds (a cached read) to a minute (a slow crawl): 5 ms … 60 s.
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
BACKOFF_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 10)
_ONE_ATTEMPT = bisect_left(ATTEMPT_BUCKETS, 1)
FOLD_AT = 1024  # pending first-attempt successes of one tool counted in one batch

OUTCOMES = frozenset({"success", "recovered", "unresolved", "tool_error", "cancelled"})
RESULTS = frozenset({"success", "tool_error", "rpc_error", "transport_error", "timeout", "cancelled"})
CATEGORIES = frozenset({"transient", "validation", "business", "permission", "unclassified"})
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
        "shutdown",
        "still_running",
    }
)
RELOAD_RESULTS = ("ok", "unchanged", "error")


def _closed(value: str | None, allowed: frozenset[str]) -> str:
    if value is None:
        return NONE
    return value if value in allowed else OTHER


class BoundedLabel:
    """Admits the first `limit` distinct values of at most `max_chars` characters; every later new
    value, and every longer one, maps to "other".

    A value keeps the label it got the first time, so increments and decrements of one series
    (calls in flight) always meet. The length is checked once per admitted value (a known value
    returns before it).
    """

    __slots__ = ("_limit", "_max_chars", "_seen")

    def __init__(self, limit: int, max_chars: int = LABEL_LIMIT) -> None:
        self._limit = limit
        self._max_chars = max_chars
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit and value != OTHER and len(value) <= self._max_chars:
            self._seen.add(value)
            return value
        return OTHER


CircuitSource = Callable[[float], list[tuple[str, bool]]]
InFlightSource = Callable[[], list[tuple[str, int]]]


class _ToolGauge:
    """A per-tool gauge read from the engine at scrape time (nothing is updated per call):
    `source()` gives (tool, value) pairs; tools beyond the label cap are merged under "other"
    with `merge` (a sum for counts, `or` for states)."""

    def __init__(
        self,
        name: str,
        doc: str,
        label: Callable[[str], str],
        merge: Callable[[float, float], float],
    ) -> None:
        self.name, self.doc = PREFIX + name, doc
        self.source: Callable[[], list[tuple[str, float]]] | None = None
        self._label = label
        self._merge = merge

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.doc, labels=("tool",))

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.doc, labels=("tool",))
        if self.source is not None:
            merged: dict[str, float] = {}
            for tool, value in self.source():
                label = self._label(tool)
                merged[label] = self._merge(merged[label], value) if label in merged else value
            for label, value in merged.items():
                family.add_metric([label], float(value))
        yield family


class _Series:
    """One per-call metric family kept as plain numbers on the event loop, exported at scrape time.

    prometheus_client's children take a lock and validate on every update (about 9 us for the five
    updates of a successful call); the per-call series are only ever updated and scraped on the
    event loop's thread, so they are plain dict cells here and prometheus_client does the
    exposition. A counter's cell is `[value]`; a histogram's is `[bucket counts..., +Inf, sum]`.
    """

    __slots__ = ("bounds", "cells", "doc", "labels", "les", "name")

    def __init__(self, name: str, doc: str, labels: tuple[str, ...], bounds: tuple[float, ...] | None = None) -> None:
        self.name = PREFIX + name
        self.doc = doc
        self.labels = labels
        self.bounds = bounds
        self.les = [floatToGoString(b) for b in bounds] + ["+Inf"] if bounds is not None else []
        self.cells: dict[tuple[str, ...], list[float]] = {}

    def cell(self, key: tuple[str, ...]) -> list[float]:
        """The series of `key`, created at zero if new."""
        found = self.cells.get(key)
        if found is None:
            size = 1 if self.bounds is None else len(self.bounds) + 2
            found = self.cells[key] = [0.0] * size
        return found

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        self.cell(key)[0] += amount

    def observe(self, key: tuple[str, ...], value: float) -> None:
        _observe(self.cell(key), self.bounds, value)  # type: ignore[arg-type]

    def family(self) -> Metric:
        if self.bounds is None:
            counter = CounterMetricFamily(self.name, self.doc, labels=self.labels)
            for key, (value,) in list(self.cells.items()):
                counter.add_metric(key, value)
            return counter
        histogram = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, cell in list(self.cells.items()):
            total, buckets = 0.0, []
            for le, count in zip(self.les, cell, strict=False):
                total += count
                buckets.append((le, total))
            histogram.add_metric(key, buckets, cell[-1])
        return histogram


def _fold_observations(cell: list[float], bounds: tuple[float, ...], values: list[float]) -> None:
    """`_observe` for many values at once (sorts `values` in place)."""
    values.sort()
    done = bisect_left(values, 0.0)  # negatives count as 0, as in _observe: in the first bucket
    cell[-1] += sum(values[done:]) if done else sum(values)
    below = 0
    for i, bound in enumerate(bounds):
        upto = bisect_right(values, bound)  # values <= bound ("le")
        cell[i] += upto - below
        below = upto
    cell[len(bounds)] += len(values) - below


def _observe(cell: list[float], bounds: tuple[float, ...], value: float) -> None:
    value = max(value, 0.0)
    cell[bisect_left(bounds, value)] += 1  # the first bucket whose bound is >= value ("le")
    cell[-1] += value


class _SeriesCollector:
    def __init__(self, series: list[_Series], before: Callable[[], None]) -> None:
        self.series = series
        self.before = before  # folds what is pending into the series

    def describe(self) -> Iterator[Metric]:
        for one in self.series:
            yield (CounterMetricFamily if one.bounds is None else HistogramMetricFamily)(
                one.name, one.doc, labels=one.labels
            )

    def collect(self) -> Iterator[Metric]:
        self.before()
        for one in self.series:
            yield one.family()


class MetricsObserver:
    """Turns telemetry events into Prometheus metrics on `registry`.

    The per-call series are updated and read on the event loop's thread only (the admin server
    serves /metrics on the same loop); see `_Series`.
    """

    needs_starts = False  # nothing here is read from CallStarted or a first AttemptStarted
    needs_call_ids = False  # series are per tool, never per call

    def __init__(self, registry: CollectorRegistry, *, max_tools: int = 200, max_upstreams: int = 16) -> None:
        self.registry = registry
        self._tool = BoundedLabel(max_tools)
        self._upstream = BoundedLabel(max_upstreams)
        self._restarts_seen: dict[str, int] = {}
        self._policy_version: str | None = None
        self._touched: set[str] = set()

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=registry)

        self.calls = _Series("calls", "Finished tools/call requests by outcome.", ("tool", "outcome"))
        self.call_duration = _Series(
            "call_duration_seconds",
            "Time from a tools/call's arrival to its answer, all attempts and backoff included.",
            ("tool", "outcome"),
            DURATION_BUCKETS_S,
        )
        self.attempts_per_call = _Series(
            "call_attempts", "Upstream attempts used by one tools/call.", ("tool",), ATTEMPT_BUCKETS
        )
        self.attempts = _Series(
            "attempts", "Finished upstream attempts by result and failure category.", ("tool", "result", "category")
        )
        self.attempt_duration = _Series(
            "attempt_duration_seconds", "Duration of one upstream attempt.", ("tool", "result"), DURATION_BUCKETS_S
        )
        self.retries = _Series("retries", "Retry attempts started (attempts after the first).", ("tool",))
        self.retry_successes = _Series(
            "retry_successes", "Retry attempts (attempts after the first) that succeeded.", ("tool",)
        )
        self.stops = _Series(
            "stops",
            "Calls that ended without success, by the reason the proxy stopped trying.",
            ("tool", "stop_reason"),
        )
        self.outcome_unknown = _Series(
            "outcome_unknown_calls",
            "Calls answered while the upstream may or may not have executed the last attempt.",
            ("tool",),
        )
        self.backoff_seconds = _Series(
            "backoff_seconds", "Time calls spent waiting between attempts (measured at call end).", ("tool",)
        )
        self.backoff_delay = _Series(
            "backoff_delay_seconds", "Backoff delays scheduled before a retry.", ("tool",), BACKOFF_BUCKETS_S
        )
        registry.register(
            _SeriesCollector(
                [
                    self.calls,
                    self.call_duration,
                    self.attempts_per_call,
                    self.attempts,
                    self.attempt_duration,
                    self.retries,
                    self.retry_successes,
                    self.stops,
                    self.outcome_unknown,
                    self.backoff_seconds,
                    self.backoff_delay,
                ],
                self.fold,
            )
        )
        # The cells a first-attempt success touches, per tool label, looked up once.
        self._success: dict[str, tuple[list[float], list[float], list[float], list[float], list[float]]] = {}
        # First-attempt successes not yet counted, per tool: (attempt durations, call durations).
        self._pending: dict[str, tuple[list[float], list[float]]] = {}
        self.upstream_up = gauge("upstream_up", "1 while the upstream answers, 0 while it does not.", ("upstream",))
        self.upstream_restarts = Counter(
            PREFIX + "upstream_restarts", "Restarts of supervised upstream children.", ("upstream",), registry=registry
        )
        self.policy_reloads = Counter(
            PREFIX + "policy_reloads", "Policy reloads by result.", ("result",), registry=registry
        )
        self.policy_reload_ok = gauge(
            "policy_reload_ok", "1 when the last policy reload succeeded (or nothing changed), 0 when it failed."
        )
        self.policy_info = gauge("policy_info", "The active policy set's version (value always 1).", ("version",))
        for result in RELOAD_RESULTS:
            self.policy_reloads.labels(result=result)
        self.policy_reload_ok.set(1)
        self._circuits = _ToolGauge(
            "circuit_open",
            "1 while the tool's circuit breaker refuses calls (open, or half-open with its trial call running).",
            self._tool,
            lambda a, b: max(a, b),
        )
        registry.register(self._circuits)
        self._in_flight = _ToolGauge(
            "calls_in_flight", "tools/call requests being handled now.", self._tool, lambda a, b: a + b
        )
        registry.register(self._in_flight)
        registry.register(ShedCollector())
        registry.register(BridgeCollector())
        registry.register(GcPauseCollector())
        self.loop_lag = LoopLag()  # started by the proxy on its running loop (server.run)
        registry.register(self.loop_lag)

    def watch_in_flight(self, source: InFlightSource) -> None:
        """Export the calls in flight per tool `source()` gives: the engine's `in_flight_by_tool`."""
        self._in_flight.source = source  # type: ignore[assignment]

    def watch_circuits(self, source: CircuitSource) -> None:
        """Export the circuit-breaker state `source(now_s)` gives: the engine's `antistorm.circuits`,
        on the monotonic clock the engine uses (only tools whose policy has a breaker appear)."""
        self._circuits.source = lambda: [
            (tool, 1.0 if refusing else 0.0) for tool, refusing in source(time.monotonic())
        ]

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
                self.calls.cell((label, outcome))
            self.retries.cell((label,))
            self.retry_successes.cell((label,))
            self.outcome_unknown.cell((label,))
        return label

    def handler_for(self, event_type: type) -> Callable[[Event], None] | None:
        """`Telemetry`'s routing: a first-attempt success straight to its handler; start events never."""
        if event_type is CallSucceeded:
            return self._call_succeeded  # type: ignore[return-value]
        if event_type is CallStarted:
            return None
        return self.on_event

    def on_event(self, event: Event) -> None:
        match event:
            case CallSucceeded():
                self._call_succeeded(event)
            case AttemptFinished():
                self._attempt_finished(event)
            case AttemptStarted():
                if event.number > 1:
                    self.retries.inc((self._tool_label(event.tool),))
            case CallFinished():
                self._call_finished(event)
            case BackoffStarted():
                self.backoff_delay.observe((self._tool_label(event.tool),), event.delay_s)
            case UpstreamStatus():
                self._upstream_status(event)
            case PolicyReloaded():
                result = event.result if event.result in RELOAD_RESULTS else OTHER
                self.policy_reloads.labels(result=result).inc()
                self.policy_reload_ok.set(0 if result == "error" else 1)
                if result == "ok" and event.version:
                    self.set_policy_version(event.version)

    def _success_cells(self, tool: str) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
        """The cells a first-attempt success of `tool` (as the event names it) touches, looked up once."""
        label = self._tool_label(tool)
        cells = self._success[tool] = (
            self.attempts.cell((label, "success", NONE)),
            self.attempt_duration.cell((label, "success")),
            self.calls.cell((label, "success")),
            self.call_duration.cell((label, "success")),
            self.attempts_per_call.cell((label,)),
        )
        if len(self._success) > 4 * len(self._touched) + 64:  # bounded: names beyond the label cap
            self._success.clear()
        return cells

    def _call_succeeded(self, event: CallSucceeded) -> None:
        """Nearly every call: its two durations are only noted here and counted in batches
        (`fold`, at every scrape and every `FOLD_AT` calls of a tool), where a sort and a bisection
        per bucket bound replace a bucket lookup and five updates per call."""
        pending = self._pending.get(event.tool)
        if pending is None:
            if len(self._pending) >= 4 * len(self._touched) + 64:  # bounded: fold and forget
                self.fold()
                self._pending.clear()
            pending = self._pending[event.tool] = ([], [])
        attempts, calls = pending
        attempts.append(event.attempt_s)
        calls.append(event.duration_s)
        if len(attempts) >= FOLD_AT:
            self._fold(event.tool, pending)

    def fold(self) -> None:
        """Count the pending first-attempt successes into the series (before every scrape)."""
        for tool, pending in list(self._pending.items()):
            if pending[0]:
                self._fold(tool, pending)

    def _fold(self, tool: str, pending: tuple[list[float], list[float]]) -> None:
        cells = self._success.get(tool)
        if cells is None:
            cells = self._success_cells(tool)
        attempts, attempt_duration, calls, call_duration, attempts_per_call = cells
        attempt_s, call_s = pending
        n = len(attempt_s)
        attempts[0] += n
        calls[0] += n
        _fold_observations(attempt_duration, DURATION_BUCKETS_S, attempt_s)
        _fold_observations(call_duration, DURATION_BUCKETS_S, call_s)
        attempts_per_call[_ONE_ATTEMPT] += n
        attempts_per_call[-1] += n
        attempt_s.clear()
        call_s.clear()

    def _attempt_finished(self, event: AttemptFinished) -> None:
        tool = self._tool_label(event.tool)
        result = _closed(event.result, RESULTS)
        self.attempts.inc((tool, result, _closed(event.category, CATEGORIES)))
        self.attempt_duration.observe((tool, result), event.duration_s)
        if event.number > 1 and result == "success":
            self.retry_successes.inc((tool,))

    def _call_finished(self, event: CallFinished) -> None:
        tool = self._tool_label(event.tool)
        outcome = _closed(event.outcome, OUTCOMES)
        self.calls.inc((tool, outcome))
        self.call_duration.observe((tool, outcome), event.duration_s)
        if event.attempts > 0:
            self.attempts_per_call.observe((tool,), event.attempts)
        if event.stop_reason is not None:
            self.stops.inc((tool, _closed(event.stop_reason, STOP_REASONS)))
        if event.outcome_unknown:
            self.outcome_unknown.inc((tool,))
        if event.backoff_s > 0:
            self.backoff_seconds.inc((tool,), event.backoff_s)

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

    def set_policy_version(self, version: str) -> None:
        """The `policy_info` series: the version loaded at start-up, then each successful reload."""
        version = version[:64]
        if version == self._policy_version:
            return
        if self._policy_version is not None:
            self.policy_info.remove(self._policy_version)
        self.policy_info.labels(version=version).set(1)
        self._policy_version = version
