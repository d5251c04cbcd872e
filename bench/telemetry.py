"""Micro-benchmark of the telemetry observers: added CPU per tools/call.

    .venv/bin/python bench/telemetry.py [--calls 20000]

It feeds N synthetic event sequences (the engine's order: CallStarted, attempt context,
AttemptStarted, AttemptFinished, BackoffStarted, CallFinished; a mix of 70% first-attempt success,
20% recovered after two failures, 10% unresolved after three attempts) through `Telemetry` with:
  - no observers (the baseline: the fan-out and the event objects themselves),
  - metrics + call log (the log at WARNING, so the INFO lines are filtered as in a quiet deployment),
  - metrics + call log + tracing (spans to an exporter that drops them, behind a BatchSpanProcessor),
and prints CPU microseconds per call (process time) and the difference against the baseline.
A second table feeds the events as the engine emits them today (a first-attempt success is one
`CallSucceeded` through `emit_success`; start events only when an observer wants them; a report
event for an unresolved call when one takes it) to metrics + call log, with and without the status
page's observer (`--admin`), so its own cost per call shows.
This measures the observers alone: no network, no engine, no export. It is not an end-to-end figure.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry

from proxy.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BackoffStarted,
    CallFinished,
    CallReported,
    CallStarted,
    CallSucceeded,
    Telemetry,
)
from proxy.telemetry.logs import CallLogObserver
from proxy.telemetry.metrics import MetricsObserver
from proxy.telemetry.status import StatusObserver
from proxy.telemetry.tracing import build_tracing

TOOLS = [f"tool_{i}" for i in range(20)]
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[object]) -> SpanExportResult:  # type: ignore[override]
        return SpanExportResult.SUCCESS


def one_call(telemetry: Telemetry, i: int) -> None:
    call_id = f"c{i}"
    tool = TOOLS[i % len(TOOLS)]
    kind = i % 10
    failures = 0 if kind < 7 else (2 if kind < 9 else 3)
    attempts = min(failures + 1, 3)
    telemetry.emit(
        CallStarted(call_id, tool, "read_only", "s1", "legacy", "v1", 3, 10.0, trace_meta={"traceparent": TRACEPARENT})
    )
    for n in range(1, attempts + 1):
        telemetry.attempt_context(call_id, n)
        telemetry.emit(AttemptStarted(call_id, tool, n, 1.0))
        ok = n > failures
        telemetry.emit(
            AttemptFinished(
                call_id,
                tool,
                n,
                0.01,
                "success" if ok else "tool_error",
                None if ok else "transient",
                "yes",
                "upstream",
            )
        )
        if not ok and n < attempts:
            telemetry.emit(BackoffStarted(call_id, tool, n + 1, 0.05))
    if failures == 0:
        outcome, reason = "success", None
    elif failures < 3:
        outcome, reason = "recovered", None
    else:
        outcome, reason = "unresolved", "attempts_exhausted"
    telemetry.emit(CallFinished(call_id, tool, outcome, reason, None, attempts, 0.1, 0.05 * failures, False))


REPORT = {"errorCategory": "transient", "stopReason": "attempts_exhausted", "attemptCount": 3, "message": "x" * 200}


def one_call_shipped(telemetry: Telemetry, i: int) -> None:
    """The events of one call as the engine emits them (see proxy/core/engine.py)."""
    tool = TOOLS[i % len(TOOLS)]
    kind = i % 10
    if kind < 7:
        call_id = f"c{i}" if telemetry.success_ids else ""
        telemetry.emit_success(CallSucceeded(call_id, tool, 0.01, 0.011, None))
        return
    call_id = f"c{i}"
    failures = 2 if kind < 9 else 3
    attempts = min(failures + 1, 3)
    if telemetry.starts:
        telemetry.emit(CallStarted(call_id, tool, "read_only", "s1", "legacy", "v1", 3, 10.0))
    for n in range(1, attempts + 1):
        if n > 1 or telemetry.starts:
            telemetry.emit(AttemptStarted(call_id, tool, n, 1.0))
        ok = n > failures
        result, category = ("success", None) if ok else ("tool_error", "transient")
        telemetry.emit(AttemptFinished(call_id, tool, n, 0.01, result, category, "yes", "upstream"))
        if not ok and n < attempts:
            telemetry.emit(BackoffStarted(call_id, tool, n + 1, 0.05))
    if failures < 3:
        outcome, reason = "recovered", None
    else:
        outcome, reason = "unresolved", "attempts_exhausted"
        if telemetry.reports:
            telemetry.emit(CallReported(call_id, tool, REPORT))
    telemetry.emit(CallFinished(call_id, tool, outcome, reason, None, attempts, 0.1, 0.05 * failures, False))


def measure(telemetry: Telemetry, calls: int, call: object = one_call) -> float:
    run = call if callable(call) else one_call
    for i in range(min(1000, calls)):  # warm-up: label children created, code paths hot
        run(telemetry, i)
    start = time.process_time()
    for i in range(calls):
        run(telemetry, i)
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the best is kept")
    args = parser.parse_args()
    logging.getLogger("proxy.calls").setLevel(logging.WARNING)
    logging.getLogger("proxy.calls").addHandler(logging.NullHandler())
    logging.getLogger("proxy.calls").propagate = False

    def baseline() -> Telemetry:
        return Telemetry([])

    def metrics() -> Telemetry:
        return Telemetry([CallLogObserver(), MetricsObserver(CollectorRegistry())])

    def metrics_tracing() -> Telemetry:
        tracing = build_tracing({}, exporter=DropExporter())
        assert tracing is not None
        return Telemetry(
            [CallLogObserver(trace_id=tracing.trace_id), MetricsObserver(CollectorRegistry()), tracing], tracer=tracing
        )

    results = {}
    for name, factory in (("off", baseline), ("metrics+logs", metrics), ("metrics+logs+tracing", metrics_tracing)):
        results[name] = min(measure(factory(), args.calls) for _ in range(args.repeat))
    base = results["off"]
    print(
        f"telemetry micro-benchmark (observers only, no I/O): {args.calls} synthetic calls, "
        f"1.6 attempts per call on average, best of {args.repeat}"
    )
    print(f"{'configuration':<24}{'CPU us/call':>14}{'added us/call':>16}")
    for name, us in results.items():
        print(f"{name:<24}{us:>14.1f}{us - base:>16.1f}")

    def metrics_status() -> Telemetry:
        return Telemetry([CallLogObserver(), MetricsObserver(CollectorRegistry()), StatusObserver()])

    shipped = {}
    for name, factory in (("metrics+logs", metrics), ("metrics+logs+status", metrics_status)):
        shipped[name] = min(measure(factory(), args.calls, one_call_shipped) for _ in range(args.repeat))
    print()
    print("events as the engine emits them (70% first-attempt successes as one CallSucceeded):")
    print(f"{'configuration':<24}{'CPU us/call':>14}{'added us/call':>16}")
    for name, us in shipped.items():
        print(f"{name:<24}{us:>14.1f}{us - shipped['metrics+logs']:>16.1f}")


if __name__ == "__main__":
    main()
