"""Export over OTLP/HTTP to a receiver this test runs, and read the spans back."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.telemetry.events import Telemetry
from proxy.telemetry.tracing import QuietWhileDown, build_tracing, exporters_from_env
from tests.fixtures.helpers import free_port, wait_port
from tests.telemetry import scenarios
from tests.telemetry.scenarios import CALLER_TRACE_ID, CALLER_TRACEPARENT


class Receiver:
    """A minimal OTLP/HTTP trace receiver (protobuf) on 127.0.0.1, in a thread of this process."""

    def __init__(self, port: int | None = None) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.arrived = threading.Event()
        self.port = port or free_port()

        async def traces(request: Request) -> Response:
            message = ExportTraceServiceRequest()
            message.ParseFromString(await request.body())
            self.requests.append(message)
            self.arrived.set()
            return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

        app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        wait_port(self.port)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def spans(self) -> list:
        return [
            (resource_spans.resource, span)
            for request in self.requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_spans_exported_over_otlp_http_arrive_with_tree_and_attributes(receiver: Receiver) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}"}
    tracing = build_tracing(env)  # the real path: OTEL_* -> OTLPSpanExporter behind a BatchSpanProcessor
    assert tracing is not None
    telemetry = Telemetry([tracing], tracer=tracing)
    events = scenarios.recovered("c1", "flaky_read", failures=2, trace_meta={"traceparent": CALLER_TRACEPARENT})
    for event in events:
        if type(event).__name__ == "AttemptStarted":
            telemetry.attempt_context(event.call_id, event.number)
        telemetry.emit(event)
    assert tracing.force_flush(timeout_s=10)
    tracing.shutdown()

    deadline = time.monotonic() + 10
    while len(receiver.spans()) < 4 and time.monotonic() < deadline:
        receiver.arrived.wait(timeout=0.2)
    got = receiver.spans()
    assert len(got) == 4, got
    resource = got[0][0]
    service = {kv.key: kv.value.string_value for kv in resource.attributes}["service.name"]
    assert service == "mcp-recovery-proxy"
    (root,) = [span for _, span in got if span.kind == span.SPAN_KIND_SERVER]
    children = [span for _, span in got if span.kind == span.SPAN_KIND_CLIENT]
    assert root.trace_id.hex() == CALLER_TRACE_ID
    assert root.name == "tools/call flaky_read"
    assert attributes(root)["mcp_recovery.outcome"] == "recovered"
    assert [event.name for event in root.events] == ["mcp_recovery.backoff"] * 2
    assert sorted(attributes(c)["mcp_recovery.attempt"] for c in children) == [1, 2, 3]
    assert all(c.parent_span_id == root.span_id and c.trace_id == root.trace_id for c in children)
    assert {attributes(c)["gen_ai.tool.name"] for c in children} == {"flaky_read"}


def test_a_collector_that_does_not_answer_is_logged_once_and_the_return_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compose file points the proxy at its profile's collector by default: without the
    profile nothing answers there, and that must be one warning, not one per batch."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # bounds each failed export's retries
    port = free_port()  # nothing listens on it until the receiver starts below
    (exporter,) = exporters_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert isinstance(exporter, QuietWhileDown)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for name in ("a", "b"):
        provider.get_tracer("test").start_span(name).end()
    spans = memory.get_finished_spans()

    def ours(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "proxy.telemetry.tracing" and text in r.getMessage()]

    def theirs() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name.startswith("opentelemetry.exporter.otlp")]

    try:
        with caplog.at_level(logging.INFO):
            assert exporter.export(spans) is SpanExportResult.FAILURE
            first = len(theirs())
            assert first >= 1, "the first failure keeps the exporter's own reason"
            for _ in range(2):
                assert exporter.export(spans) is SpanExportResult.FAILURE
            assert len(ours("cannot be exported")) == 1
            assert len(theirs()) == first, "later failures are not logged"
            with Receiver(port) as receiver:
                assert exporter.export(spans) is SpanExportResult.SUCCESS
                assert receiver.arrived.wait(timeout=10)
            (resumed,) = ours("resumed")
            assert "6 spans were dropped" in resumed.getMessage()  # three failed batches of two
            assert len(receiver.spans()) == 2
    finally:
        exporter.shutdown()
    for name in (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry.exporter.otlp.proto.grpc.exporter",
    ):
        assert not logging.getLogger(name).filters, "shutdown removes the filter"
