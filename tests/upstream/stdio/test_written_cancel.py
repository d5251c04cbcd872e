"""An attempt whose request is written to a stdio child that does not read its stdin: the link's
`send_request` waits for the pipe to drain, and the attempt's timer cuts it there. The request is
in the pipe (the child reads it as soon as it reads again), so the attempt was dispatched as far as
anyone can tell: the engine must record dispatch unknown (never retry a state-changing call on it),
and the link must cancel the request upstream, its `notifications/cancelled` right behind it.

A real child over real pipes (it stops reading after `initialize` until the test signals it), the
real stdio link, relay and engine.
"""

from __future__ import annotations

import asyncio
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

# Answers `initialize` (after saying its pid), then reads nothing until SIGUSR1; from then on it
# says what each message it reads is.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    stdin, stdout = sys.stdin.buffer, sys.stdout

    def say(**data):
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": data}}
        stdout.write(json.dumps(note) + "\\n")
        stdout.flush()

    init = json.loads(stdin.readline())
    say(pid=os.getpid())
    result = {"protocolVersion": init["params"]["protocolVersion"], "capabilities": {"tools": {}},
              "serverInfo": {"name": "stops-reading", "version": "1"}}
    stdout.write(json.dumps({"jsonrpc": "2.0", "id": init["id"], "result": result}) + "\\n")
    stdout.flush()
    signal.sigwait({signal.SIGUSR1})
    while line := stdin.readline():
        msg = json.loads(line)
        params = msg.get("params") or {}
        say(got=msg.get("method"), id=msg.get("id"), requestId=params.get("requestId"))
    """
)

POLICY = "tools: [charge]\nattempts: 3\ndeadline: 1500ms\nattempt_timeout: 1s\n"


@pytest.fixture(params=[pytest.param(False, id="asyncio"), pytest.param(True, id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return "asyncio", {"use_uvloop": request.param}


async def test_an_attempt_cut_while_its_request_waits_on_a_full_stdin_is_dispatch_unknown_and_cancelled() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=0)
    link = await upstream.open(Era.LEGACY)
    catalog = ToolCatalog()
    catalog.observe({"tools": [{"name": "charge", "inputSchema": {"type": "object"}}]})  # unannotated: state-changing
    policies = compile_files([("charge.yaml", "charge.yaml", POLICY.encode())])
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0)
    relay = Relay(link, catalog=catalog, tool_calls=engine, session_id="s1")  # type: ignore[arg-type]
    notes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    link.set_unsolicited_handler(lambda m: notes.put_nowait(m["params"]["data"]))
    try:
        async with asyncio.timeout(BOUND_S):
            params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
            opened = RecordingOutbox()
            await relay.handle_request(init, opened)
            assert "result" in opened.messages[0], opened.messages
            pid = (await notes.get())["pid"]  # said before its answer: here by now

            # The child reads nothing now: the request fills its stdin pipe, and the send waits.
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "charge", "arguments": {"memo": "x" * ARGUMENT_BYTES}},
            }
            outbox = RecordingOutbox()
            await relay.handle_request(call, outbox)
            (answer,) = outbox.messages
            report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
            (step,) = report["attemptedSteps"]
            assert step["dispatched"] == "unknown", step  # written: maybe running, not "not sent"
            assert report["stopReason"] == "outcome_unknown", report
            assert report["outcomeUnknown"] is True and report["attemptCount"] == 1, report

            # The child reads again: the request, then its cancellation right behind it.
            os.kill(pid, signal.SIGUSR1)
            got = await notes.get()
            assert got["got"] == "tools/call", got
            request_id = got["id"]
            got = await notes.get()
            assert got == {"got": "notifications/cancelled", "id": None, "requestId": request_id}, got
    finally:
        await relay.aclose()
        await upstream.aclose()
