"""A 2025 client that loses a POST's SSE stream mid-call resumes it with GET + Last-Event-ID
(SEP-1699) and gets what it missed, then the rest, then the response — nothing twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = pytest.mark.anyio
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    command = scripted_stdio_command(tmp_path / "journal.jsonl", tmp_path / "state.json")
    with ProxyProcess(upstream=command, log_path=tmp_path / "proxy.log") as p:
        yield p


def events(lines: list[str]) -> list[dict[str, Any]]:
    out, current = [], {}
    for line in lines:
        if not line:
            if current:
                out.append(current)
            current = {}
            continue
        field, _, value = line.partition(":")
        current[field] = value.removeprefix(" ")
    return out


async def test_a_lost_stream_is_resumed_with_last_event_id(proxy: ProxyProcess) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        r = await http.post(proxy.url, json=init, headers=HEADERS)
        session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(
            proxy.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**HEADERS, **session}
        )
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "slow_progress",
                "arguments": {"steps": 6, "delay_s": 0.2},
                "_meta": {"progressToken": "tok"},
            },
        }
        seen: list[str] = []
        async with http.stream("POST", proxy.url, json=call, headers={**HEADERS, **session}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                seen.append(line)
                if sum(1 for e in events(seen) if e.get("data")) == 2:
                    break  # drop the connection after two progress events
        first = events(seen)
        assert first[0]["data"] == "" and "retry" in first[0], "a priming event with an id and a retry delay"
        last_id = [e["id"] for e in first if "id" in e][-1]

        rest: list[str] = []
        async with http.stream("GET", proxy.url, headers={**HEADERS, **session, "last-event-id": last_id}) as resumed:
            async for line in resumed.aiter_lines():
                rest.append(line)
    messages = [json.loads(e["data"]) for e in first + events(rest) if e.get("data")]
    progress = [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == [1, 2, 3, 4, 5, 6], "nothing missed, nothing twice"
    (answer,) = [m for m in messages if m.get("id") == 2]
    assert "result" in answer and not answer["result"].get("isError"), json.dumps(
        answer["result"].get("structuredContent")
    )[:1500]


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18"])
async def test_a_client_of_an_earlier_revision_gets_no_priming_event(proxy: ProxyProcess, version: str) -> None:
    """SEP-1699's priming event is a 2025-11-25 addition: older clients read its empty `data:` as a
    malformed message. Their event ids (resumability is in every 2025 revision) stay."""
    async with httpx.AsyncClient(timeout=20) as http:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }
        r = await http.post(proxy.url, json=init, headers=HEADERS)
        assert r.json()["result"]["protocolVersion"] == version
        session = {"mcp-session-id": r.headers["mcp-session-id"]}
        if version != "2025-03-26":  # a 2025-03-26 client sends no version header
            session["mcp-protocol-version"] = version
        await http.post(
            proxy.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**HEADERS, **session}
        )
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "slow_progress",
                "arguments": {"steps": 2, "delay_s": 0.05},
                "_meta": {"progressToken": 7},
            },
        }
        seen: list[str] = []
        async with http.stream("POST", proxy.url, json=call, headers={**HEADERS, **session}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                seen.append(line)
    streamed = events(seen)
    assert streamed and all(e.get("data") for e in streamed), f"an event without data: {streamed[:3]}"
    assert not any("retry" in e for e in streamed)
    assert all("id" in e for e in streamed), "resumable: every event has an id"
    assert any(json.loads(e["data"]).get("id") == 2 for e in streamed)
