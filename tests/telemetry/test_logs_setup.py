"""Call log lines and the assembled telemetry bundle."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from proxy.telemetry.events import PolicyReloaded
from proxy.telemetry.logs import CallLogObserver
from proxy.telemetry.logsetup import JsonFormatter
from proxy.telemetry.setup import build_telemetry
from tests.telemetry import scenarios

FIELDS = {"call_id", "tool", "outcome", "stop_reason", "category", "attempts", "duration_ms", "outcome_unknown"}


def test_one_json_line_per_call_outcome_with_the_documented_fields_and_no_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    observer = CallLogObserver()
    with caplog.at_level(logging.INFO, logger="proxy.calls"):
        for event in scenarios.recovered("c1") + scenarios.unresolved("c2", stop_reason="attempts_exhausted"):
            observer.on_event(event)
    assert len(caplog.records) == 2
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert all(FIELDS <= set(line) for line in lines)
    assert (lines[0]["outcome"], lines[0]["attempts"], lines[0]["stop_reason"]) == ("recovered", 3, None)
    assert (lines[1]["outcome"], lines[1]["stop_reason"], lines[1]["level"]) == (
        "unresolved",
        "attempts_exhausted",
        "warning",
    )
    assert lines[1]["logger"] == "proxy.calls"
    assert "arguments" not in lines[0] and "key" not in lines[0]


def test_the_plain_message_names_the_tool_and_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="proxy.calls"):
        for event in scenarios.success("c9", "echo"):
            CallLogObserver().on_event(event)
    assert caplog.records[0].getMessage().startswith("tools/call echo call_id=c9 outcome=success attempts=1")


@pytest.mark.parametrize(
    ("mode", "logged"),
    [("all", ["success", "recovered", "unresolved"]), ("problems", ["recovered", "unresolved"]), ("off", [])],
)
def test_call_log_mode_decides_which_calls_get_a_line(
    caplog: pytest.LogCaptureFixture, mode: str, logged: list[str]
) -> None:
    observer = CallLogObserver(mode=mode)  # type: ignore[arg-type]
    events = scenarios.success("c1") + scenarios.recovered("c2") + scenarios.unresolved("c3")
    with caplog.at_level(logging.INFO, logger="proxy.calls"):
        for event in events:
            observer.on_event(event)
    assert [r.outcome for r in caplog.records] == logged  # type: ignore[attr-defined]


def test_the_shipped_default_logs_problems_only(caplog: pytest.LogCaptureFixture) -> None:
    bundle = build_telemetry(None, environ={})
    with caplog.at_level(logging.INFO, logger="proxy.calls"):
        for event in scenarios.success("c1") + scenarios.recovered("c2"):
            bundle.telemetry.emit(event)
    assert [r.outcome for r in caplog.records] == ["recovered"]  # type: ignore[attr-defined]


def test_build_telemetry_without_otel_variables_has_metrics_logs_and_no_tracing() -> None:
    bundle = build_telemetry(None, environ={})
    assert bundle.tracing is None
    assert bundle.telemetry.attempt_context("c1", 1) is None
    for event in scenarios.recovered("c1"):
        bundle.telemetry.emit(event)
    text = generate_latest(bundle.registry).decode()
    assert 'mcp_recovery_calls_total{outcome="recovered",tool="flaky_read"} 1.0' in text
    assert "process_cpu_seconds_total" in text
    assert "_created" not in text


def test_build_telemetry_with_an_exporter_traces_and_the_log_line_carries_the_trace_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    bundle = build_telemetry(SimpleNamespace(call_log="all"), environ={}, span_exporter=exporter)
    assert bundle.tracing is not None
    with caplog.at_level(logging.INFO, logger="proxy.calls"):
        for event in scenarios.success("c1", trace_meta={"traceparent": scenarios.CALLER_TRACEPARENT}):
            if type(event).__name__ == "AttemptStarted":
                assert bundle.telemetry.attempt_context("c1", 1) is not None
            bundle.telemetry.emit(event)
    assert caplog.records[0].trace_id == scenarios.CALLER_TRACE_ID  # type: ignore[attr-defined]
    import asyncio

    asyncio.run(bundle.shutdown())
    assert len(exporter.get_finished_spans()) == 2
    assert bundle.telemetry.attempt_context("c2", 1) is None  # after shutdown: pass-through


def test_the_policy_reload_hook_emits_policy_reloaded() -> None:
    bundle = build_telemetry(None, environ={})
    bundle.on_policy_reload("error", "v1", "bad file")
    assert bundle.registry.get_sample_value("mcp_recovery_policy_reloads_total", {"result": "error"}) == 1
    bundle.telemetry.emit(PolicyReloaded("ok", "v2"))
    assert bundle.registry.get_sample_value("mcp_recovery_policy_info", {"version": "v2"}) == 1


def test_a_loggers_warnings_are_bounded_and_the_next_line_counts_what_was_dropped() -> None:
    """uvicorn writes a warning per malformed request (no text of the caller's, but at its pace):
    a bucket lets `burst` through, then `rate` a second; errors always pass."""
    from proxy.telemetry.logsetup import WarningBudget

    budget = WarningBudget(burst=5, rate=0.0)
    logger = logging.getLogger("tests.warning-budget")
    logger.propagate = False
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    logger.addHandler(handler)
    logger.addFilter(budget)
    try:
        for _ in range(1000):
            logger.warning("Invalid HTTP request received.")
        logger.error("an error is never held back")
        invalid = "Invalid HTTP request received."
        assert [r.getMessage() for r in seen] == [invalid] * 5 + ["an error is never held back"]
        budget.bucket.tokens = 1.0  # as if time had refilled one
        logger.warning("Invalid HTTP request received.")
        assert seen[-1].getMessage() == (
            "Invalid HTTP request received. (995 more warnings of this logger were not logged before this one)"
        )
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(budget)


def test_configure_bounds_uvicorns_warnings_once_however_often_it_runs() -> None:
    from proxy.telemetry.logsetup import UVICORN_WARNINGS, configure

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure(level="info")
        configure(level="info")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert logging.getLogger("uvicorn.error").filters.count(UVICORN_WARNINGS) == 1


@pytest.mark.parametrize("json_lines", [False, True], ids=["plain", "json"])
def test_a_tool_name_and_every_extra_field_stay_bounded_in_a_log_line(
    caplog: pytest.LogCaptureFixture, json_lines: bool
) -> None:
    """A 200,000-character tool name an upstream listed went into the call log's message and its
    `tool` field whole: with --log-json a 216,657-character line per call."""
    from proxy.telemetry.logsetup import MAX_FIELD_CHARS, SecretScrubbingFormatter
    from proxy.telemetry.status import LABEL_LIMIT

    formatter = SecretScrubbingFormatter(JsonFormatter() if json_lines else logging.Formatter("%(message)s"))
    long_name = "t" * 200_000
    with caplog.at_level(logging.INFO, logger="proxy.calls"):
        for event in scenarios.success("c1", long_name) + scenarios.success("c2", "echo"):
            CallLogObserver().on_event(event)
    lines = [formatter.format(record) for record in caplog.records]
    assert all(len(line) < 1000 for line in lines), [len(line) for line in lines]
    if json_lines:
        fields = [json.loads(line) for line in lines]
        assert fields[0]["tool"] == "t" * (LABEL_LIMIT - 1) + "…" and fields[1]["tool"] == "echo"
    else:
        assert lines[0].startswith("tools/call " + "t" * (LABEL_LIMIT - 1) + "… call_id=c1")

    # any other logger's extras, of any type, are bounded by the JSON formatter itself
    record = logging.LogRecord("x", logging.INFO, __file__, 0, "m", (), None)
    record.__dict__.update(text="x" * 100_000, items=["y"] * 100_000, small={"a": [1]}, count=7, flag=None)
    out = json.loads(JsonFormatter().format(record))
    assert len(out["text"]) == len(out["items"]) == MAX_FIELD_CHARS and out["text"].endswith("…")
    assert (out["small"], out["count"], out["flag"]) == ({"a": [1]}, 7, None)
