"""`--auth passthrough` with TypeScript SDK clients (tests/interop/ts_client.mjs over Streamable
HTTP) in front of the Python SDK's server that does its own authentication and binds each session
to the principal that opened it (tests/fixtures/protected_server.py, journaling every request's
principal as it arrives).

A TS client of bob's, started on alice's proxy session (as the SDK's client does when it
reconnects: no initialize), gets the upstream's 404 as its transport error, before any result:
the session is neither re-established nor moved under bob's credential, and alice's own TS client
on that session still reaches the upstream as alice, also once a spray of made-up tokens at her
session has spent its budget of vouch pings (the sprayers get 429; her accepted credential asks
nothing). What a TS application does on that 404, a session of its own (initialize), works for
bob. Every process is started and stopped by its pid.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.auth.rig import open_session, protected_server
from tests.fixtures.helpers import free_port
from tests.interop.harness import Call, Prerequisites, Target, TsClient, TsConnectFailed, started
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.interop]
BOUND_S = 30.0
ALICE = "alice-00-ts-token-5e2a7c"
BOB = "bob-0000-ts-token-91d3f4"


@pytest.fixture
def passthrough(tmp_path: Path) -> Iterator[tuple[ProxyProcess, Path]]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ALICE} mcp:read\n{BOB} mcp:read\n")
    journal = tmp_path / "journal.jsonl"
    with protected_server("protected_server.py", tokens, journal, bound_s=BOUND_S) as port:
        proxy = ProxyProcess(upstream_url=f"http://127.0.0.1:{port}/mcp", log_path=tmp_path / "proxy.log")
        proxy.port = free_port()
        # one ping per 1000 s after the burst: a spray spends a session's budget whatever the pace
        proxy.extra = [
            "--auth",
            "passthrough",
            "--public-url",
            f"http://127.0.0.1:{proxy.port}/mcp",
            "--vouch-pings-burst",
            "2",
            "--vouch-pings-per-s",
            "0.001",
        ]
        with started(proxy):
            yield proxy, tmp_path / "requests.jsonl"


def requests_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


async def test_a_ts_client_on_another_principals_session_gets_the_404_and_the_session_stays_its_owners(
    prereq: Prerequisites, passthrough: tuple[ProxyProcess, Path]
) -> None:
    proxy, journal = passthrough
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, proxy.url, ALICE)
    sid = session["mcp-session-id"]
    before = len(requests_of(journal))

    bobs = {"MCP_INTEROP_AUTHORIZATION": f"Bearer {BOB}", "MCP_INTEROP_SESSION_ID": sid}
    with pytest.raises(TsConnectFailed) as refused:
        TsClient(prereq, Target(url=proxy.url), env=bobs)  # its first request: tools/list
    error = refused.value.error
    assert error["code"] == 404 and "Session not found" in error["message"], error

    # A spray of made-up tokens at her session spends its budget of pings (then 429) ...
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        statuses = []
        for i in range(4):
            headers = {"mcp-session-id": sid, "accept": "text/event-stream", "authorization": f"Bearer made-up-{i}"}
            async with http.stream("GET", proxy.url, headers=headers) as sprayed:
                statuses.append(sprayed.status_code)
    assert statuses == [401, 401, 429, 429], statuses
    # ... and her own TS client, whose credential the upstream accepted, is served as before
    alices = {"MCP_INTEROP_AUTHORIZATION": f"Bearer {ALICE}", "MCP_INTEROP_SESSION_ID": sid}
    with TsClient(prereq, Target(url=proxy.url), env=alices) as alice:
        reply = alice.call(Call("whoami", {"tag": "a"}))
        assert reply.ok and reply.result["content"][0]["text"] == "alice-00:a", reply  # type: ignore[index]

    # what the application does with that 404: a session of its own
    with TsClient(prereq, Target(url=proxy.url), env={"MCP_INTEROP_AUTHORIZATION": f"Bearer {BOB}"}) as bob:
        reply = bob.call(Call("whoami", {"tag": "b"}))
        assert reply.ok and reply.result["content"][0]["text"] == "bob-0000:b", reply  # type: ignore[index]

    seen = requests_of(journal)[before:]
    assert [r["client"] for r in seen if r["rpc"] == "ping"] == ["?", "?"], seen  # the burst, no more
    by_bob = [r["rpc"] for r in seen if r["client"] == BOB[:8] and r["method"] == "POST"]
    assert by_bob.count("initialize") == 1, seen  # his own session's, never one on alice's
    assert by_bob[0] == "tools/list", seen  # the refused request, first
