"""An attempt whose request is written to a stdio child that does not read its stdin: the link's
`send_request` waits for the pipe to drain, and the attempt's timer cuts it there. The request is
in the pipe (the child reads it as soon as it reads again), so the attempt was dispatched as far as
anyone can tell: the engine must record dispatch unknown (never retry a state-changing call on it),
and the link must cancel the request upstream, its `notifications/cancelled` right behind it.

A real child over real pipes (it stops reading when told, until the test signals it), the real
stdio link (a session's own child, or `--stdio-sessions shared`), relay and engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from typing import Any

import pytest

from proxy.core.engine import Engine
from proxy.core.relay import Relay, ToolCatalog
from proxy.policy.compile import compile_files
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream
from tests.core.memory_link import RecordingOutbox

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

BOUND_S = 30.0
# Larger than a pipe (64 KiB) and the transport's write buffer mark together, many times over: the
# write cannot drain while the child does not read.
ARGUMENT_BYTES = 2 * 1024 * 1024

# Answers `initialize`; the tool "stall" answers its pid, then the child reads nothing until
# SIGUSR1; the tool "report" answers what the child read since then (method, id, the requestId
# of a cancellation, the tool's name), its own call included. Any other request: -32601.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    stdin, stdout = sys.stdin.buffer, sys.stdout
    read = []

    def answer(id_, **body):
        stdout.write(json.dumps({"jsonrpc": "2.0", "id": id_, **body}) + "\\n")
        stdout.flush()

    def text(value):
        return {"content": [{"type": "text", "text": value}]}

    while line := stdin.readline():
        msg = json.loads(line)
        method, id_, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        read.append({"method": method, "id": id_, "requestId": params.get("requestId"), "tool": params.get("name")})
        if method is None or id_ is None:
            continue
        if method == "initialize":
            answer(id_, result={"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                                "serverInfo": {"name": "stops-reading", "version": "1"}})
        elif method == "tools/call" and params.get("name") == "stall":
            answer(id_, result=text(str(os.getpid())))
            signal.sigwait({signal.SIGUSR1})
            read.clear()
        elif method == "tools/call" and params.get("name") == "report":
            answer(id_, result=text(json.dumps(read)))
        else:
            answer(id_, error={"code": -32601, "message": "not here"})
    """
)

POLICY = b"tools: [charge]\nattempts: 3\ndeadline: 1500ms\nattempt_timeout: 1s\n"


@pytest.fixture(params=[pytest.param(False, id="asyncio"), pytest.param(True, id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return "asyncio", {"use_uvloop": request.param}


def tool_call(request_id: int, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments or {}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def text_of(response: dict[str, Any]) -> str:
    text: str = response["result"]["content"][0]["text"]
    return text


@pytest.mark.parametrize("shared", [pytest.param(False, id="own-child"), pytest.param(True, id="shared-children")])
async def test_an_attempt_cut_while_its_request_waits_on_a_full_stdin_is_dispatch_unknown_and_cancelled(
    shared: bool,
) -> None:
    command = [sys.executable, "-c", CHILD]
    upstream = StdioUpstream(command, spares=0, shared_sessions=shared, shared_children=1)
    relay: Relay | None = None
    try:
        async with asyncio.timeout(BOUND_S):
            if shared:
                await upstream.probe()  # as the service does at start: the shared child is started
            link = await upstream.open(Era.LEGACY)
            catalog = ToolCatalog()
            # unannotated: state-changing
            catalog.observe({"tools": [{"name": "charge", "inputSchema": {"type": "object"}}]})
            policies = compile_files([("charge.yaml", "charge.yaml", POLICY)])
            engine = Engine(policies=lambda: policies, rand=lambda: 0.0)
            relay = Relay(link, catalog=catalog, tool_calls=engine, session_id="s1")  # type: ignore[arg-type]
            params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
            opened = RecordingOutbox()
            await relay.handle_request({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}, opened)
            assert "result" in opened.messages[0], opened.messages
            pid = int(text_of(await relay.forward(tool_call(1, "stall"), RecordingOutbox())))

            # The child reads nothing now: the request fills its stdin pipe, and the send waits.
            outbox = RecordingOutbox()
            await relay.handle_request(tool_call(2, "charge", {"memo": "x" * ARGUMENT_BYTES}), outbox)
            (answer,) = outbox.messages
            report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
            (step,) = report["attemptedSteps"]
            assert step["dispatched"] == "unknown", step  # written: maybe running, not "not sent"
            assert report["stopReason"] == "outcome_unknown", report
            assert report["outcomeUnknown"] is True and report["attemptCount"] == 1, report

            # The child reads again: the request, then its cancellation right behind it.
            os.kill(pid, signal.SIGUSR1)
            read = json.loads(text_of(await relay.forward(tool_call(3, "report"), RecordingOutbox())))
            charge, cancelled, report_call = read
            assert charge["method"] == "tools/call" and charge["tool"] == "charge", read
            assert cancelled["method"] == "notifications/cancelled" and cancelled["requestId"] == charge["id"], read
            assert report_call["tool"] == "report", read
    finally:
        if relay is not None:
            await relay.aclose()
        await upstream.aclose()
