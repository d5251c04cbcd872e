"""A revoked token ends its caller's open listen stream (`--auth tokens`, the real proxy process).

Bob opens a 2025 session and its listen stream (GET), then his token is taken out of the tokens
file (hot-reloaded). Before: his POSTs got 401 while his GET stayed open and kept receiving what
the server sent his session. Now the stream ends within the credential re-check interval (5 s);
alice's stream, whose token stays, is still open. Bounded by `BOUND_S` and the test timeout.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import httpx
import pytest

from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(120)]
BOUND_S = 30.0
ALICE = "alice-token-9f8e7d6c5b4a3210"
BOB = "bob-token-0123456789abcdef01"
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


async def open_session(http: httpx.AsyncClient, url: str, token: str) -> dict[str, str]:
    headers = {**HEADERS, "authorization": f"Bearer {token}"}
    r = await http.post(url, json=INIT, headers=headers)
    assert r.status_code == 200, r.text
    headers |= {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


async def test_a_revoked_token_ends_its_callers_listen_stream(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    extra = ["--auth", "tokens", "--auth-tokens-file", str(tokens)]
    command = scripted_stdio_command(tmp_path / "journal.jsonl")
    with ProxyProcess(upstream=command, extra=extra, log_path=tmp_path / "proxy.log") as proxy:
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            alice, bob = await open_session(http, proxy.url, ALICE), await open_session(http, proxy.url, BOB)
            async with contextlib.AsyncExitStack() as streams:
                alice_stream = await streams.enter_async_context(http.stream("GET", proxy.url, headers=alice))
                bob_stream = await streams.enter_async_context(http.stream("GET", proxy.url, headers=bob))
                assert alice_stream.status_code == bob_stream.status_code == 200
                tokens.write_text(f"alice {ALICE}\n")  # bob's token revoked
                ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
                with anyio.fail_after(BOUND_S):
                    while (await http.post(proxy.url, json=ping, headers=bob)).status_code != 401:  # noqa: ASYNC110
                        await anyio.sleep(0.05)  # polled: a reload offers a client no event
                    async for _ in bob_stream.aiter_raw():  # pings, then the end of the stream
                        pass
                assert bob_stream.is_stream_consumed, "bob's listen stream ended"
                assert (await http.post(proxy.url, json=ping, headers=alice)).status_code == 200
                assert not alice_stream.is_closed
