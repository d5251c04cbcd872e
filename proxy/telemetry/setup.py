"""Assembles the proxy's telemetry from its settings: metrics, tracing (when configured), call logs.

Contract:
- `build_telemetry(settings)` returns a `TelemetryBundle`:
  - `.telemetry`: the `Telemetry` fan-out to hand to the engine (call log first, so it can read the
    trace id of a call before the tracing observer closes it; then metrics; then tracing);
  - `.registry`: the proxy's own `CollectorRegistry` (never the global one) for `/metrics`,
    with process metrics (`process_*`) and `python_info` on it;
  - `.tracing`: the `TracingObserver`, or None when no `OTEL_*` exporter is configured;
  - `.status`: the status page's `StatusObserver` when the admin endpoint is on (`--admin`: the
    only reader of what it keeps), else None;
  - `.observed`: the per-tool `ObservedTools` (latency, unclassified texts, rules matched) that
    `/status.json` carries for `policies suggest`, on the same condition;
  - `.on_policy_reload(result, version, error)`: a `PolicyStore(on_reload=...)` hook that emits
    `PolicyReloaded`;
  - `async .shutdown()`: ends open spans and flushes the span processor (off the event loop).
- Settings carry process configuration only; tracing is configured by the standard `OTEL_*`
  environment variables (see proxy/telemetry/tracing.py), so `environ` is a parameter for tests.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, disable_created_metrics

from proxy.telemetry.events import Observer, PolicyReloaded, Telemetry
from proxy.telemetry.logs import CallLogObserver
from proxy.telemetry.metrics import MetricsObserver
from proxy.telemetry.observed import ObservedTools
from proxy.telemetry.status import StatusObserver
from proxy.telemetry.tracing import TracingObserver, build_tracing


@dataclass
class TelemetryBundle:
    telemetry: Telemetry
    registry: CollectorRegistry
    metrics: MetricsObserver
    tracing: TracingObserver | None
    status: StatusObserver | None = None
    observed: ObservedTools | None = None

    def on_policy_reload(self, result: str, version: str, error: str | None = None) -> None:
        """`PolicyStore`'s `on_reload` hook: the error text is logged by the store, never a label."""
        self.telemetry.emit(PolicyReloaded(result, version))

    async def shutdown(self) -> None:
        if self.tracing is not None:
            tracing, self.tracing = self.tracing, None
            self.telemetry.tracer = None
            await asyncio.to_thread(tracing.shutdown)


def build_telemetry(
    settings: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
    registry: CollectorRegistry | None = None,
) -> TelemetryBundle:
    """The proxy's telemetry; `settings` is the proxy's `Settings` (optional limits are read from it)."""
    # `*_created` series double the scrape for no dashboard's benefit (process-wide switch; the proxy owns it).
    disable_created_metrics()
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    metrics = MetricsObserver(registry, max_tools=int(getattr(settings, "metrics_max_tools", 200) or 200))
    tracing = build_tracing(os.environ if environ is None else environ, exporter=span_exporter)
    call_log = CallLogObserver(
        trace_id=tracing.trace_id if tracing else None, mode=getattr(settings, "call_log", "problems")
    )
    observers: list[Observer] = [call_log, metrics]
    admin = bool(getattr(settings, "admin", None))
    status = StatusObserver() if admin else None
    observed = ObservedTools() if admin else None
    if status is not None:
        observers.append(status)
    if observed is not None:
        observers.append(observed)
    if tracing is not None:
        observers.append(tracing)
    return TelemetryBundle(Telemetry(observers, tracer=tracing), registry, metrics, tracing, status, observed)
