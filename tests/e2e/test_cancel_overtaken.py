"""A 2025 attempt's cancellation must not be lost to a busy HTTP upstream.

In the HTTP leg of the load run (bench/load_faults.py) 3 of ~924 cancelled hang attempts ran to
their end on an upstream process that stayed alive: the upstream, busy right after a restart,
had not yet taken the request into its session when the proxy, whose attempt timer had fired, sent
its `notifications/cancelled` on another connection; the cancellation got there first, named no
request in flight, was ignored, and the request then ran. Here the scripted server holds every
`hang` call (`--hold-calls-s`) before its SDK app takes it, while other POSTs go through, which
makes that order certain: the proxy's cancellation must still stop the attempt (the journal shows
it `cancelled`, never `completed`).

Real processes: the proxy, the scripted SDK server over Streamable HTTP, a 2025 session over raw HTTP.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.fixtures.helpers import ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 60.0
HOLD_S = 1.5
HANG_S = 4.0
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
CALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "hang", "arguments": {"seconds": 4.0, "call_id": "held"}},
}
POLICY = "tools: [hang]\nside_effect: read_only\nattempts: 1\nattempt_timeout: 300ms\ndeadline: 1s\n"


async def test_a_cancellation_that_overtakes_its_request_upstream_is_sent_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "hang.yaml").write_text(POLICY)
    with ScriptedHTTP(journal.path, tmp_path / "state.json", extra=("--hold-calls-s", str(HOLD_S))) as server:
        extra = ["--policies", str(policies)]
        with ProxyProcess(upstream_url=server.url, extra=extra, log_path=tmp_path / "proxy.log") as proxy:
            with anyio.fail_after(BOUND_S):
                async with httpx.AsyncClient(timeout=BOUND_S) as http:
                    # a 2025 session, left open while the held request reaches the server
                    opened = await http.post(proxy.url, json=INITIALIZE, headers=HEADERS)
                    session = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]}
                    session["mcp-protocol-version"] = "2025-11-25"
                    await http.post(
                        proxy.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session
                    )
                    answer = (await http.post(proxy.url, json=CALL, headers=session)).json()
                    report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
                    assert report["stopReason"] == "attempts_exhausted", answer
                    # the held request reaches the server's session after the proxy gave up on it
                    ended = await journal.await_for(
                        lambda j: (
                            j.events(tool="hang", call="held", event="cancelled")
                            or j.events(tool="hang", call="held", event="completed")
                        ),
                        timeout_s=HOLD_S + HANG_S + 30,
                        what="the held attempt ended",
                    )
    assert journal.events(tool="hang", call="held", event="held"), "the server did not hold the call"
    assert [e["event"] for e in ended] == ["cancelled"], journal.events(tool="hang", call="held")
