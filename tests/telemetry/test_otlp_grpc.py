"""Export over OTLP/gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) to a receiver this test runs: grpcio's
own server with the OTLP trace service from opentelemetry-proto, on 127.0.0.1 only. Then the
clear message when gRPC is chosen but its optional extra is missing."""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import pytest

from proxy.telemetry.events import Telemetry
from proxy.telemetry.tracing import build_tracing
from tests.telemetry import scenarios
from tests.telemetry.scenarios import CALLER_TRACE_ID, CALLER_TRACEPARENT

grpc = pytest.importorskip("grpc")
trace_service_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
trace_service_pb2_grpc = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc")


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.arrived = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")  # loopback, a port the OS picks

    def Export(self, request: Any, context: Any) -> Any:  # the gRPC service's method name
        self.requests.append(request)
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Any]:
        return [
            span
            for request in self.requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]


@pytest.fixture
def receiver() -> Iterator[GrpcReceiver]:
    r = GrpcReceiver()
    r.server.start()
    try:
        yield r
    finally:
        r.server.stop(grace=None).wait(10)


def test_spans_exported_over_otlp_grpc_arrive_with_their_tree(receiver: GrpcReceiver) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
    }
    tracing = build_tracing(env)
    assert tracing is not None, "grpc picked the gRPC exporter"
    telemetry = Telemetry([tracing], tracer=tracing)
    for event in scenarios.recovered("c1", "flaky_read", failures=1, trace_meta={"traceparent": CALLER_TRACEPARENT}):
        if type(event).__name__ == "AttemptStarted":
            telemetry.attempt_context(event.call_id, event.number)
        telemetry.emit(event)
    assert tracing.force_flush(timeout_s=10)
    tracing.shutdown()
    deadline = time.monotonic() + 10
    while len(receiver.spans()) < 3 and time.monotonic() < deadline:
        receiver.arrived.wait(timeout=0.2)
    spans = receiver.spans()
    assert len(spans) == 3, spans
    (root,) = [s for s in spans if s.kind == s.SPAN_KIND_SERVER]
    assert root.trace_id.hex() == CALLER_TRACE_ID and root.name == "tools/call flaky_read"
    assert all(s.parent_span_id == root.span_id for s in spans if s is not root)


def test_grpc_without_its_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_import = builtins.__import__

    def without_grpc_exporter(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry.exporter.otlp.proto.grpc"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_grpc_exporter)
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    with caplog.at_level(logging.ERROR, logger="proxy.telemetry.tracing"):
        assert build_tracing(env) is None
    assert "mcp-recovery-proxy[otlp-grpc]" in caplog.text
