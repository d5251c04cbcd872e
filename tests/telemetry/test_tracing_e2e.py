"""Through the real proxy: the upstream receives, on each attempt, the attempt span's traceparent.

The proxy exports over OTLP/HTTP (configured only by OTEL_* variables) to a receiver this test
runs; the scripted upstream journals the `_meta` each execution received. A call that recovers
after two failures must give three executions whose traceparent carries the caller's trace id and,
as parent, the span id of the attempt span with the same number.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import anyio
import pytest
from mcp import Client

from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command
from tests.telemetry.scenarios import CALLER_SPAN_ID, CALLER_TRACE_ID, CALLER_TRACEPARENT
from tests.telemetry.test_otlp import Receiver, attributes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.timeout(90),
]

POLICY = """
retry_on: [transient]
attempts: 3
deadline: 4s
attempt_timeout: 1s
min_attempt_time: 200ms
backoff: {initial: 20ms, max: 100ms, multiplier: 2, jitter: full}
unclassified: transient
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_each_attempt_carries_the_callers_trace_id_with_its_own_span_as_parent(
    tmp_path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "defaults.yaml").write_text(POLICY)
    journal = Journal(tmp_path / "journal.jsonl")
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    cid = uuid.uuid4().hex[:12]
    with ProxyProcess(upstream=command, extra=["--policies", str(policies)], log_path=tmp_path / "proxy.log") as proxy:
        with anyio.fail_after(30):
            async with Client(proxy.url, mode=mode) as client:
                await client.list_tools()  # the proxy learns flaky_read is read-only from the catalog
                result = await client.call_tool(
                    "flaky_read",
                    {"key": uuid.uuid4().hex, "fail_times": 2, "call_id": cid},
                    meta={"traceparent": CALLER_TRACEPARENT},
                )
        assert not result.is_error, result.structured_content
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len([s for _, s in receiver.spans() if s.kind == s.SPAN_KIND_CLIENT]) < 3:
            receiver.arrived.wait(timeout=0.2)
            receiver.arrived.clear()

    spans = [s for _, s in receiver.spans() if s.trace_id.hex() == CALLER_TRACE_ID]
    (root,) = [s for s in spans if s.kind == s.SPAN_KIND_SERVER]
    assert root.parent_span_id.hex() == CALLER_SPAN_ID
    assert attributes(root)["mcp_recovery.outcome"] == "recovered"
    attempt_spans = {attributes(s)["mcp_recovery.attempt"]: s for s in spans if s.kind == s.SPAN_KIND_CLIENT}
    assert sorted(attempt_spans) == [1, 2, 3]

    started = journal.events(tool="flaky_read", event="started", call=cid)
    assert len(started) == 3
    for number, event in enumerate(started, start=1):
        meta = event["attempt_key"]["meta"] or {}
        traceparent = meta.get("traceparent")
        assert traceparent, f"attempt {number} reached the upstream without a traceparent: {meta}"
        _, trace_id, parent_id, _ = traceparent.split("-")
        assert trace_id == CALLER_TRACE_ID
        assert parent_id == attempt_spans[number].span_id.hex()
        assert attempt_spans[number].parent_span_id == root.span_id


async def test_a_traceparent_http_header_is_the_callers_context_too(
    tmp_path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    journal = Journal(tmp_path / "journal.jsonl")
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}, "_meta": envelope},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "echo",
        "traceparent": CALLER_TRACEPARENT,
    }
    with ProxyProcess(upstream=command, log_path=tmp_path / "proxy.log") as proxy:
        async with httpx.AsyncClient(timeout=20) as http:
            response = await http.post(proxy.url, json=body, headers=headers)
        assert response.status_code == 200 and "result" in response.json()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not [
            s for _, s in receiver.spans() if s.trace_id.hex() == CALLER_TRACE_ID and s.kind == s.SPAN_KIND_SERVER
        ]:
            receiver.arrived.wait(timeout=0.2)
            receiver.arrived.clear()
    (root,) = [s for _, s in receiver.spans() if s.trace_id.hex() == CALLER_TRACE_ID and s.kind == s.SPAN_KIND_SERVER]
    assert root.parent_span_id.hex() == CALLER_SPAN_ID
    (event,) = journal.events(tool="echo", event="started")
    assert event["attempt_key"]["meta"]["traceparent"].split("-")[1] == CALLER_TRACE_ID
