"""The proxy's own upstream credentials never leave the running proxy.

A canary in every configured header, through the real proxy process in front of an upstream that
answers 401 and repeats the headers it received (tests/fixtures/header_echo.py): the readiness
probe's failure, the warning it logs, the error a 2025 caller's `initialize` gets (raw, and
through the SDK's own client) and a 2026 request's error; then /readyz, /metrics, /policies and
the whole log. The canaries are opaque values that the pattern-based redaction cannot recognise;
only the exact-match registry (proxy/secret_values.py) removes them. This file imports nothing of
the fix, so it runs (and fails) on the code before it.
"""

from __future__ import annotations

import json
import subprocess
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, MCPError

from proxy import jsonrpc
from tests.fixtures.helpers import PYTHON, REPO_ROOT, free_port, terminate, wait_port
from tests.proxy_process import ProxyProcess

pytestmark = pytest.mark.slow

AUTH_CANARY = "Custom opaque-canary-Qm7vX2"  # no pattern knows the scheme "Custom"
KEY_CANARY = "zebra.canary.Lk4"  # too short and too plain for the base64/hex patterns
CANARIES = ("opaque-canary-Qm7vX2", "zebra.canary.Lk4")
HEADERS = [f"Authorization: {AUTH_CANARY}", f"X-Api-Key: {KEY_CANARY}"]
BOUND_S = 20.0


def assert_clean(where: str, text: str) -> None:
    for canary in CANARIES:
        assert canary not in text, f"{canary!r} leaked into {where}: {text[:2000]}"


def _echo_upstream(mode: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, str(REPO_ROOT / "tests" / "fixtures" / "header_echo.py"), str(port), mode],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        terminate(proc)


@pytest.fixture
def echo_upstream() -> Iterator[str]:
    yield from _echo_upstream("refuse")


@pytest.fixture
def echo_tools_upstream() -> Iterator[str]:
    yield from _echo_upstream("tools")


def _start_unready(proxy: ProxyProcess) -> None:
    """Start the proxy and wait for its admin port: /readyz stays 503 in front of a 401 upstream."""
    log = open(proxy.log_path, "ab") if proxy.log_path else subprocess.DEVNULL
    proxy.proc = subprocess.Popen(proxy.argv(), cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    wait_port(proxy.admin_port, timeout_s=BOUND_S)
    wait_port(proxy.port, timeout_s=BOUND_S)


@pytest.mark.anyio
async def test_configured_header_values_never_leave_the_proxy(echo_upstream: str, tmp_path: Path) -> None:
    extra = [arg for header in HEADERS for arg in ("--upstream-header", header)]
    proxy = ProxyProcess(upstream_url=echo_upstream, extra=extra, log_path=tmp_path / "proxy.log")
    _start_unready(proxy)
    try:
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            readyz = await http.get(proxy.admin + "/readyz")
            # The probe did run against the echoing upstream: its 401 is the reason given.
            assert readyz.status_code == 503 and "401" in readyz.text, readyz.text
            assert_clean("/readyz", readyz.text)
            for path in ("/metrics", "/policies", "/healthz"):
                answer = await http.get(proxy.admin + path)
                assert answer.status_code == 200
                assert_clean(path, answer.text)
            modern = await http.post(
                proxy.url,
                json={
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {}, "_meta": {jsonrpc.META_PROTOCOL_VERSION: "2026-07-28"}},
                },
                headers={
                    "accept": "application/json, text/event-stream",
                    "mcp-protocol-version": "2026-07-28",
                    "mcp-method": "tools/call",
                    "mcp-name": "echo",
                },
            )
            assert_clean("a 2026 request's answer", modern.text)
            legacy = await http.post(
                proxy.url,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "0"},
                    },
                },
                headers={"accept": "application/json, text/event-stream"},
            )
            # The upstream's own error (its 401 body) is relayed, without the credentials in it.
            assert "unauthorized" in legacy.text, legacy.text
            assert_clean("a raw initialize's answer", legacy.text)
        with pytest.raises(Exception) as caught:
            async with Client(proxy.url, mode="legacy") as client:
                await client.list_tools()
        told = "".join(traceback.format_exception(caught.value))
        assert f"{MCPError.__module__}.MCPError: unauthorized" in told, told
        assert_clean("the SDK client's initialize error", told)
    finally:
        proxy.stop()
    log = (tmp_path / "proxy.log").read_text(errors="replace")
    assert "401" in log, log[-2000:]  # the probe failure was logged: the path that leaked ran
    assert_clean("the proxy's log", log)


@pytest.mark.anyio
async def test_results_and_reports_of_an_echoing_upstream_carry_no_secret(
    echo_tools_upstream: str, tmp_path: Path
) -> None:
    """Through a real SDK client: a tool whose failures (HTTP 503, retried, then reported
    unresolved) and whose `isError` result repeat the request headers."""
    extra = [*(arg for header in HEADERS for arg in ("--upstream-header", header)), "--call-log", "all"]
    proxy = ProxyProcess(upstream_url=echo_tools_upstream, extra=extra, log_path=tmp_path / "proxy.log")
    proxy.start()
    try:
        async with Client(proxy.url, mode="legacy") as client:
            await client.list_tools()
            unresolved = await client.call_tool("echo_error", {})
            tool_error = await client.call_tool("echo_result", {})
        for name, result in (("the unresolved report", unresolved), ("an isError result", tool_error)):
            assert result.is_error, result
            assert_clean(name, result.model_dump_json())
        # The report is the proxy's, built from the upstream's echo; the tool error is relayed.
        assert "attempts" in unresolved.model_dump_json()
        assert "failed; you sent" in tool_error.model_dump_json()
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            for path in ("/readyz", "/metrics", "/policies"):
                answer = await http.get(proxy.admin + path)
                assert answer.status_code == 200
                assert_clean(path, answer.text)
    finally:
        proxy.stop()
    log = (tmp_path / "proxy.log").read_text(errors="replace")
    assert "echo_error" in log, log[-2000:]  # the call log line of the unresolved call was written
    assert_clean("the proxy's log", log)


# -- a secret the CALLER sends, in a tool call's arguments ----------------------------------------
#
# What "result" means here: the caller sent the value, so the upstream's own content blocks (and a
# JSON-RPC error the upstream wrote), relayed to that same caller, may repeat it; the proxy does
# not rewrite what the upstream says to the caller who asked. What must not repeat it is
# everything the PROXY writes: its unresolved report (the summary text first in `content`, the
# report in `_meta`, each `attemptedSteps` detail), a ledger refusal, the log (with
# `--call-log all`), /metrics, /readyz, /policies and the exported spans.

ARG_CANARY = "wombat-Pq7Zr"  # plain: no credential pattern knows it, only `redact(arguments=...)`
ARG_POLICY = """
retry_on: [transient]
attempts: 2
deadline: 5s
attempt_timeout: 400ms
min_attempt_time: 100ms
backoff: {initial: 10ms, max: 20ms, multiplier: 2, jitter: full}
unclassified: transient
"""
REPORT_KEY = "io.mcp-recovery-proxy/unresolved"


def _proxy_parts(result: Any) -> list[tuple[str, str]]:
    """The parts of a tool result the proxy wrote: its report in `_meta` and its summary block."""
    dumped = result.model_dump(mode="json", by_alias=True)
    meta = dumped.get("_meta") or dumped.get("meta") or {}
    parts = [(f"_meta[{key!r}]", json.dumps(value)) for key, value in meta.items() if key.startswith("io.mcp-recovery")]
    content = dumped.get("content") or []
    if content:  # the proxy's summary is the last block (the upstream's own lead, as they came)
        parts.append(("the summary block", json.dumps(content[-1])))
    return parts


@pytest.mark.anyio
async def test_a_secret_in_the_arguments_is_not_repeated_by_the_proxy(
    echo_tools_upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.telemetry.test_otlp import Receiver

    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "defaults.yaml").write_text(ARG_POLICY)
    arguments = {"password": ARG_CANARY, "note": "x"}
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        extra = ["--call-log", "all", "--policies", str(policies)]
        proxy = ProxyProcess(upstream_url=echo_tools_upstream, extra=extra, log_path=tmp_path / "proxy.log")
        proxy.start()
        try:
            results: dict[str, Any] = {}
            async with Client(proxy.url, mode="legacy") as client:
                await client.list_tools()  # the proxy learns the tools are read-only: retried
                for tool in ("args_transient", "args_rpc_error", "args_result", "args_slow"):
                    results[tool] = await client.call_tool(tool, arguments)
                # The identical call again: refused by the ledger, the upstream untouched.
                results["ledger"] = await client.call_tool("args_transient", arguments)
            for tool, result in results.items():
                assert result.is_error, (tool, result)
                parts = _proxy_parts(result)
                assert parts, (tool, result)
                for where, text in parts:
                    assert ARG_CANARY not in text, f"{ARG_CANARY!r} in {tool}'s {where}: {text[:2000]}"
            # Each path ran: the upstream's echo reached the proxy (the redacted detail says so).
            report = {t: json.dumps(r.model_dump(mode="json", by_alias=True)) for t, r in results.items()}
            assert "attempts_exhausted" in report["args_transient"], report["args_transient"][:2000]
            assert "ledger_exhausted" in report["ledger"], report["ledger"][:2000]
            assert "[argument]" in report["args_transient"], "the echoed value was seen and replaced"
            async with httpx.AsyncClient(timeout=BOUND_S) as http:
                for path in ("/readyz", "/metrics", "/policies"):
                    answer = await http.get(proxy.admin + path)
                    assert answer.status_code == 200
                    assert ARG_CANARY not in answer.text, f"{ARG_CANARY!r} in {path}"
        finally:
            proxy.stop()  # flushes the span exporter
        spans = receiver.spans()
        assert any(s.kind == s.SPAN_KIND_CLIENT for _, s in spans), "attempt spans were exported"
        for _, span in spans:
            assert ARG_CANARY.encode() not in span.SerializeToString(), f"{ARG_CANARY!r} in span {span.name}"
    log = (tmp_path / "proxy.log").read_text(errors="replace")
    assert "args_rpc_error" in log, log[-2000:]  # the call log lines were written
    assert ARG_CANARY not in log, "the proxy's log repeats the argument"
