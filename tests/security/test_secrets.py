"""The secret registry at each place text leaves the proxy, in-process: span
attributes (the SDK's in-memory exporter), failures, caller-bound messages, `redact()` and every
log line. The running proxy is tested end to end in test_secret_canary_e2e.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy import jsonrpc
from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.recovery.redact import redact
from proxy.secret_values import SECRETS
from proxy.telemetry.events import Telemetry
from proxy.telemetry.logsetup import configure
from proxy.telemetry.tracing import build_tracing
from tests.security.test_secret_canary_e2e import AUTH_CANARY, CANARIES, KEY_CANARY, assert_clean
from tests.telemetry import scenarios


@pytest.fixture
def registry() -> Iterator[None]:
    SECRETS.set([AUTH_CANARY, KEY_CANARY])
    yield
    SECRETS.clear()


def test_span_attributes_and_names_carry_no_secret(registry: None) -> None:
    exporter = InMemorySpanExporter()
    observer = build_tracing({}, exporter=exporter, batch=False)
    assert observer is not None
    telemetry = Telemetry([observer])
    tool = f"tool-{CANARIES[0]}"
    for event in scenarios.recovered("c1", tool, session_id=f"s-{CANARIES[1]}"):
        telemetry.emit(event)
    observer.shutdown()
    spans = exporter.get_finished_spans()
    assert spans
    for span in spans:
        assert_clean("a span", f"{span.name} {dict(span.attributes or {})!r} {span.status.description}")


def test_failures_reports_and_caller_bound_messages_lose_the_secret(registry: None) -> None:
    failure = UpstreamFailure(
        FailureKind.HTTP_STATUS,
        Dispatch.NO,
        f"upstream answered HTTP 401 (you sent Authorization: {AUTH_CANARY})",
        http_status=401,
        body={"error": {"code": -1, "message": f"key {KEY_CANARY}", "data": {KEY_CANARY: [AUTH_CANARY]}}},
    )
    assert_clean("an UpstreamFailure", f"{failure.detail} {failure} {failure.body!r}")
    # JSON-escaped inside a serialised message, as an upstream's echo of a quoted value reads.
    SECRETS.set(['Bearer "quoted"-canary'])
    assert b"quoted" not in jsonrpc.dumps_out({"result": {"text": 'got Bearer "quoted"-canary'}})
    SECRETS.set([AUTH_CANARY, KEY_CANARY])
    assert_clean("a caller-bound message", jsonrpc.dumps_out({"error": {"message": AUTH_CANARY}}).decode())
    # The pattern redaction alone keeps neither; the exact match runs first, before any cut.
    assert_clean("redact()", redact(f"{'x' * 290} {KEY_CANARY} {CANARIES[0]}"))
    cut = SECRETS.head(f"abc {KEY_CANARY}", 8)
    assert cut == "abc " and not KEY_CANARY.startswith(cut.strip() or "-")


def test_every_log_line_is_scrubbed_whichever_logger_wrote_it(
    registry: None, capfd: pytest.CaptureFixture[str]
) -> None:
    import logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    # As the proxy runs uvicorn (log_config=None): its loggers have no handler of their own and
    # propagate to the root's. An in-process uvicorn of another test may have configured them.
    uvicorn_error = logging.getLogger("uvicorn.error")
    saved_uvicorn = uvicorn_error.handlers[:], uvicorn_error.propagate, uvicorn_error.level
    uvicorn_error.handlers[:], uvicorn_error.propagate, uvicorn_error.level = [], True, logging.NOTSET
    try:
        configure(level="info", json_lines=True)
        try:
            raise RuntimeError(f"boom {KEY_CANARY}")
        except RuntimeError:
            logging.getLogger("uvicorn.error").exception("Exception in ASGI application %s", AUTH_CANARY)
        logging.getLogger("proxy.service").warning("probe failed", extra={"detail": CANARIES[0]})
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        uvicorn_error.handlers[:], uvicorn_error.propagate, uvicorn_error.level = saved_uvicorn
    err = capfd.readouterr().err
    assert "Exception in ASGI application" in err and "probe failed" in err
    assert_clean("log lines", err)
