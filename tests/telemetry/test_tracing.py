"""TracingObserver with the SDK's in-memory exporter: span tree, attributes, attempt trace context."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.telemetry.events import Telemetry
from proxy.telemetry.tracing import QuietWhileDown, TracingObserver, build_tracing, exporters_from_env
from tests.telemetry import scenarios
from tests.telemetry.scenarios import CALLER_SPAN_ID, CALLER_TRACE_ID, CALLER_TRACEPARENT


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Iterator[TracingObserver]:
    observer = build_tracing({}, exporter=exporter, batch=False)
    assert observer is not None
    yield observer
    observer.shutdown()


def run(telemetry: Telemetry, events: list) -> dict[int, dict[str, str] | None]:
    """Feed events like the engine does: ask for each attempt's context just before AttemptStarted."""
    contexts: dict[int, dict[str, str] | None] = {}
    for event in events:
        if type(event).__name__ == "AttemptStarted":
            contexts[event.number] = telemetry.attempt_context(event.call_id, event.number)
        telemetry.emit(event)
    return contexts


def parse(traceparent: str) -> tuple[str, str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, flags


def hexid(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, list[ReadableSpan]]:
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(roots) == 1, [s.name for s in spans]
    children = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.attributes["mcp_recovery.attempt"]
    )
    return roots[0], children


def test_a_call_recovered_after_two_failures_is_one_server_span_with_three_attempt_children(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    telemetry = Telemetry([tracing], tracer=tracing)
    run(telemetry, scenarios.recovered("c1", "flaky_read", failures=2, trace_meta={"traceparent": CALLER_TRACEPARENT}))
    root, attempts = tree(exporter)
    assert root.name == "tools/call flaky_read"
    assert hexid(root.context.trace_id, 32) == CALLER_TRACE_ID
    assert root.parent is not None and hexid(root.parent.span_id, 16) == CALLER_SPAN_ID
    assert root.parent.is_remote
    expected = {
        "mcp.method.name": "tools/call",
        "gen_ai.tool.name": "flaky_read",
        "mcp.session.id": "session-1",
        "mcp_recovery.side_effect": "read_only",
        "mcp_recovery.outcome": "recovered",
        "mcp_recovery.attempts": 3,
    }
    assert {k: root.attributes.get(k) for k in expected} == expected
    assert "mcp_recovery.stop_reason" not in root.attributes
    assert "error.type" not in root.attributes
    assert [e.name for e in root.events] == ["mcp_recovery.backoff", "mcp_recovery.backoff"]
    assert [e.attributes["mcp_recovery.next_attempt"] for e in root.events] == [2, 3]

    assert [a.name for a in attempts] == ["tools/call flaky_read"] * 3
    for number, span in enumerate(attempts, start=1):
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.context.trace_id == root.context.trace_id
        attrs = span.attributes
        assert attrs["mcp.method.name"] == "tools/call"
        assert attrs["gen_ai.tool.name"] == "flaky_read"
        assert attrs["mcp.session.id"] == "session-1"
        assert attrs["mcp_recovery.attempt"] == number
        assert attrs["mcp_recovery.dispatched"] == "yes"
        if number < 3:
            assert attrs["mcp_recovery.category"] == "transient"
            assert attrs["error.type"] == "tool_error"
            assert span.status.status_code is StatusCode.ERROR
        else:
            assert "mcp_recovery.category" not in attrs and "error.type" not in attrs
            assert span.status.status_code is not StatusCode.ERROR
    assert tracing.open_calls == 0


def test_an_upstreams_tool_name_of_any_length_reaches_spans_cut_to_128_characters(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    """The tool name is the upstream's text: a 200,000-character one is cut in the span names and
    `gen_ai.tool.name`, as the logs, the metrics and the status page cut it."""
    telemetry = Telemetry([tracing], tracer=tracing)
    name = "t" * 200_000
    run(telemetry, scenarios.recovered("c1", name, failures=1))
    root, attempts = tree(exporter)
    for span in (root, *attempts):
        assert span.name == "tools/call " + "t" * 127 + "…"
        assert span.attributes["gen_ai.tool.name"] == "t" * 127 + "…"


def test_each_attempt_context_carries_the_callers_trace_id_and_that_attempts_span_as_parent(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    telemetry = Telemetry([tracing], tracer=tracing)
    meta = {"traceparent": CALLER_TRACEPARENT, "tracestate": "vendor=abc"}
    contexts = run(telemetry, scenarios.recovered("c1", failures=2, trace_meta=meta))
    _, attempts = tree(exporter)
    assert sorted(contexts) == [1, 2, 3]
    for span in attempts:
        ctx = contexts[span.attributes["mcp_recovery.attempt"]]
        assert ctx is not None
        trace_id, parent_id, flags = parse(ctx["traceparent"])
        assert trace_id == CALLER_TRACE_ID
        assert parent_id == hexid(span.context.span_id, 16)
        assert flags == "01"
        assert ctx["tracestate"] == "vendor=abc"


def test_http_headers_give_the_parent_when_meta_has_no_traceparent(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    telemetry = Telemetry([tracing], tracer=tracing)
    run(telemetry, scenarios.success("c1", trace_meta={}, trace_headers={"Traceparent": CALLER_TRACEPARENT}))
    root, _ = tree(exporter)
    assert hexid(root.context.trace_id, 32) == CALLER_TRACE_ID


def test_meta_wins_over_headers(tracing: TracingObserver, exporter: InMemorySpanExporter) -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    telemetry = Telemetry([tracing], tracer=tracing)
    run(
        telemetry,
        scenarios.success("c1", trace_meta={"traceparent": CALLER_TRACEPARENT}, trace_headers={"traceparent": other}),
    )
    root, _ = tree(exporter)
    assert hexid(root.context.trace_id, 32) == CALLER_TRACE_ID


def test_a_malformed_caller_traceparent_starts_a_new_trace(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    telemetry = Telemetry([tracing], tracer=tracing)
    run(telemetry, scenarios.success("c1", trace_meta={"traceparent": "not-a-traceparent"}))
    root, _ = tree(exporter)
    assert root.parent is None and root.context.trace_id != 0


def test_an_unresolved_call_span_carries_stop_reason_and_error_type(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    telemetry = Telemetry([tracing], tracer=tracing)
    run(
        telemetry,
        scenarios.unresolved(
            "c1",
            "charge",
            attempts=1,
            stop_reason="outcome_unknown",
            outcome_unknown=True,
            side_effect="state_changing",
        ),
    )
    root, attempts = tree(exporter)
    assert root.attributes["mcp_recovery.stop_reason"] == "outcome_unknown"
    assert root.attributes["mcp_recovery.side_effect"] == "state_changing"
    assert root.attributes["mcp_recovery.outcome"] == "unresolved"
    assert root.attributes["mcp_recovery.outcome_unknown"] is True
    assert root.attributes["error.type"] == "outcome_unknown"
    assert root.status.status_code is StatusCode.ERROR
    assert len(attempts) == 1


def test_a_cancelled_call_ends_its_in_flight_attempt_span(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    telemetry = Telemetry([tracing], tracer=tracing)
    run(telemetry, scenarios.cancelled("c1"))
    root, attempts = tree(exporter)
    assert root.attributes["mcp_recovery.outcome"] == "cancelled"
    assert [a.attributes["mcp_recovery.result"] for a in attempts] == ["abandoned"]
    assert tracing.open_calls == 0


def test_calls_that_never_finish_are_evicted_beyond_the_cap(exporter: InMemorySpanExporter) -> None:
    tracing = build_tracing({}, exporter=exporter, batch=False, max_open_calls=5)
    assert tracing is not None
    for i in range(12):
        tracing.on_event(scenarios.started(f"c{i}", "hang"))
        tracing.attempt_context(f"c{i}", 1)
    assert tracing.open_calls == 5
    evicted = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert len(evicted) == 7 and all(s.attributes["mcp_recovery.evicted"] for s in evicted)
    assert tracing.attempt_context("c0", 2) is None  # evicted: the caller's context passes through
    assert tracing.attempt_context("c11", 2) is not None
    tracing.shutdown()


def test_an_unknown_call_gets_no_attempt_context(tracing: TracingObserver) -> None:
    assert tracing.attempt_context("never-started", 1) is None


def test_tracing_off_gives_no_attempt_context_and_no_observer() -> None:
    assert build_tracing({}) is None
    assert Telemetry([]).attempt_context("c1", 1) is None


def test_the_global_tracer_provider_is_never_set(tracing: TracingObserver) -> None:
    # The mcp SDK opens its own spans whenever a global provider is set: ours must stay private.
    assert not isinstance(trace.get_tracer_provider(), type(tracing.provider))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["OTLPSpanExporter"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, ["OTLPSpanExporter"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["OTLPSpanExporter"]),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["ConsoleSpanExporter"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, []),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, []),
    ],
)
def test_exporters_follow_the_standard_otel_variables(env: dict[str, str], expected: list[str]) -> None:
    exporters = exporters_from_env(env)
    try:
        # An OTLP exporter comes wrapped, so that a collector that does not answer is logged once.
        assert [type(e.inner if isinstance(e, QuietWhileDown) else e).__name__ for e in exporters] == expected
        assert all(isinstance(e, QuietWhileDown) == (type(e).__name__ != "ConsoleSpanExporter") for e in exporters)
    finally:
        for e in exporters:
            e.shutdown()


def test_the_otlp_endpoint_gets_the_traces_path() -> None:
    (exporter,) = exporters_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"})
    try:
        assert isinstance(exporter, QuietWhileDown)
        assert exporter.inner._endpoint == "http://127.0.0.1:4318/v1/traces"  # type: ignore[attr-defined]
    finally:
        exporter.shutdown()


def test_the_principal_is_a_span_attribute_when_authentication_is_on(
    tracing: TracingObserver, exporter: InMemorySpanExporter
) -> None:
    from proxy.telemetry.events import CallFinished

    telemetry = Telemetry([tracing], tracer=tracing)
    run(
        telemetry,
        [scenarios.started("c1", "echo")._replace(principal="token:alice"), *scenarios.ok_attempt("c1", "echo", 1)],
    )
    telemetry.emit(CallFinished("c1", "echo", "success", None, None, 1, 0.01, 0.0, False, "token:alice"))
    root, _ = tree(exporter)
    assert root.attributes["mcp_recovery.principal"] == "token:alice"
    run(telemetry, [scenarios.started("c2", "echo"), *scenarios.ok_attempt("c2", "echo", 1)])
    telemetry.emit(CallFinished("c2", "echo", "success", None, None, 1, 0.01, 0.0, False))
    unauthenticated = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER and s is not root]
    assert unauthenticated and "mcp_recovery.principal" not in unauthenticated[0].attributes
