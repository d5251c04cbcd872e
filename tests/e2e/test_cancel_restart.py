"""An attempt the proxy stops waiting for is cancelled upstream across a restart of the upstream.

The upstream is the scripted SDK server, killed (SIGKILL) and started again on the same port; its
`--hold-calls-s` holds every `hang` call it will take for a while before its SDK app takes it (a
server busy right after its start), while other POSTs, cancellations among them, go through at
once. Each attempt's own timer fires while its request is held; the journal of the server must
then show the attempt `cancelled`, never `completed`.

- 2025 Streamable HTTP: the restarted server forgot the proxy's session; the attempt's own POST is
  answered 404, the proxy re-establishes the session and sends the request again, and that second
  POST is the one held. Its cancellation must wait for the head of the second POST's answer (the
  server took the request), not count the 404's head as that answer.
- Legacy HTTP+SSE: the stream broke with the kill; the next request reopens it, replays the
  handshake and POSTs, and that POST's 202 is held. The proxy stops waiting before the 202 came:
  the request was written, so it must still be cancelled (after the server took it).

- 2026 Streamable HTTP: no session; the attempt is cancelled by closing its POST, which the
  server notices once it takes the request (its SDK app watches the connection from then on).

Real processes: the proxy, the scripted SDK server over Streamable HTTP or SSE, a 2025 session or
2026 requests over raw HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.fixtures.helpers import ScriptedHTTP, free_port
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 90.0
HOLD_S = 5.0
HANG_S = 10.0
MODERN = "2026-07-28"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
# One attempt, given up 3 s in (room for the restart's re-establishment before it), while the
# held request is still held (the hold outlasts it by 2 s or more).
POLICY = "tools: [hang, echo]\nside_effect: read_only\nattempts: 1\nattempt_timeout: 3s\ndeadline: 4s\n"


def call(request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def modern(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """`body` as a 2026 request, and its headers."""
    name = body["params"]["name"]
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {**body, "params": {**body["params"], "_meta": meta}}
    headers = {**HEADERS, "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": name}
    return body, headers


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST: the body, or the last event of an event stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data[-1]))
    return dict(response.json())


async def _restart_then_hang(tmp_path: Path, transport: str, era: str = "2025") -> list[dict[str, Any]]:
    """Through the proxy (a 2025 session, or 2026 requests), call `echo`, restart the upstream, call
    `hang`; the held call's journal events once it ended (cancelled or completed)."""
    journal = Journal(tmp_path / "journal.jsonl")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "hang.yaml").write_text(POLICY)
    port = free_port()
    hold = ("--hold-calls-s", str(HOLD_S))
    first = ScriptedHTTP(journal.path, tmp_path / "state.json", transport=transport, extra=hold, port=port)
    second = ScriptedHTTP(journal.path, tmp_path / "state.json", transport=transport, extra=hold, port=port)
    with first:
        extra = ["--policies", str(policies)]
        url = f"sse+{first.url}" if transport == "sse" else first.url
        with ProxyProcess(upstream_url=url, extra=extra, log_path=tmp_path / "proxy.log") as proxy:
            try:
                with anyio.fail_after(BOUND_S):
                    async with httpx.AsyncClient(timeout=BOUND_S) as http:

                        async def post(body: dict[str, Any]) -> dict[str, Any]:
                            if era == MODERN:
                                body, headers = modern(body)
                                return answer_of(await http.post(proxy.url, json=body, headers=headers))
                            return answer_of(await http.post(proxy.url, json=body, headers=session))

                        session: dict[str, str] = {}
                        if era != MODERN:
                            opened = await http.post(proxy.url, json=INITIALIZE, headers=HEADERS)
                            assert "mcp-session-id" in opened.headers, opened.text
                            session = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]}
                            session["mcp-protocol-version"] = "2025-11-25"
                            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                            await http.post(proxy.url, json=initialized, headers=session)
                        echoed = await post(call(2, "echo", {"text": "x"}))
                        assert echoed["result"]["content"][0]["text"] == "x", echoed
                        first.kill()
                        second.start()
                        answer = await post(call(3, "hang", {"seconds": HANG_S, "call_id": "held"}))
                        report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
                        assert report["stopReason"] == "attempts_exhausted", answer
                        ended: list[dict[str, Any]] = await journal.await_for(
                            lambda j: (
                                j.events(tool="hang", call="held", event="cancelled")
                                or j.events(tool="hang", call="held", event="completed")
                            ),
                            timeout_s=HOLD_S + HANG_S + 30,
                            what="the held attempt ended",
                        )
            finally:
                second.stop()
    assert journal.events(tool="hang", call="held", event="held"), "the restarted server did not hold the call"
    return ended


async def test_a_2025_attempt_sent_again_on_a_reestablished_session_is_cancelled_when_given_up(
    tmp_path: Path,
) -> None:
    ended = await _restart_then_hang(tmp_path, "http")
    assert [e["event"] for e in ended] == ["cancelled"], ended


async def test_an_sse_attempt_given_up_before_its_post_was_accepted_is_cancelled(tmp_path: Path) -> None:
    ended = await _restart_then_hang(tmp_path, "sse")
    assert [e["event"] for e in ended] == ["cancelled"], ended


async def test_a_2026_attempt_given_up_after_a_restart_is_cancelled_by_closing_its_post(tmp_path: Path) -> None:
    ended = await _restart_then_hang(tmp_path, "http", MODERN)
    assert [e["event"] for e in ended] == ["cancelled"], ended
