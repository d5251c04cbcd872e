"""A 2025 client that loses a POST's SSE stream mid-call resumes it with GET + Last-Event-ID
(SEP-1699) and gets what it missed, then the rest, then the response — nothing twice."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
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


async def open_2025(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    r = await http.post(url, json=init, headers=HEADERS)
    session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=note, headers={**HEADERS, **session})).status_code == 202
    return session


async def streamed_call(http: httpx.AsyncClient, url: str, session: dict[str, str], id_: int) -> list[dict[str, Any]]:
    """A call whose answer streams (progress first); its events, read to the end."""
    call = {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "tools/call",
        "params": {"name": "slow_progress", "arguments": {"steps": 2, "delay_s": 0.01}, "_meta": {"progressToken": 1}},
    }
    lines: list[str] = []
    async with http.stream("POST", url, json=call, headers={**HEADERS, **session}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            lines.append(line)
    return events([*lines, ""])


async def test_event_ids_are_unguessable_and_another_sessions_or_a_forged_one_resumes_nothing(
    proxy: ProxyProcess,
) -> None:
    """Event ids were `r1:0`, `r2:0`, ...: whoever saw one of theirs could name everyone's. Now
    each stream's key holds 128 random bits. A GET naming another session's real event id, a
    forged one, or its own key with a malformed sequence (`²`, thousands of digits: `int` raised
    on both, a 500) is answered as an unknown id: here, with the session's listen stream already
    open, the same 409 and body for all, so the answer says nothing of what exists elsewhere."""
    async with httpx.AsyncClient(timeout=20) as http:
        mine, theirs = await open_2025(http, proxy.url), await open_2025(http, proxy.url)
        my_events = await streamed_call(http, proxy.url, mine, 2)
        their_events = await streamed_call(http, proxy.url, theirs, 3)
        my_key, their_key = (e[0]["id"].partition(":")[0] for e in (my_events, their_events))
        for key in (my_key, their_key):
            assert re.fullmatch(r"[A-Za-z0-9_-]{22}[0-9a-f]+", key), key
        assert my_key[:22] != their_key[:22]
        assert {e["id"].partition(":")[0] for e in my_events if "id" in e} == {my_key}

        # the owner resumes its own stream from its first event: the rest, answer included
        resumed: list[str] = []
        get = {**HEADERS, **mine, "last-event-id": f"{my_key}:0"}
        async with http.stream("GET", proxy.url, headers=get) as again:
            assert again.status_code == 200
            async for line in again.aiter_lines():
                resumed.append(line)
        replayed = [json.loads(e["data"]) for e in events([*resumed, ""]) if e.get("data")]
        assert any(m.get("id") == 2 and "result" in m for m in replayed), replayed

        listen = {**HEADERS, **mine}
        async with http.stream("GET", proxy.url, headers=listen) as held:
            assert held.status_code == 200  # the session's listen stream, held open meanwhile
            answers = []
            for last in (
                f"{their_key}:0",  # another session's real id
                f"{their_key}:1",
                f"{secrets.token_urlsafe(16)}1:0",  # forged
                "r1:0",  # the old scheme
                f"{my_key}:\u00b2",  # its own key, a digit `int` does not read (one latin-1 byte)
                f"{my_key}:{'9' * 5000}",  # its own key, more digits than `int` reads
            ):
                named = {**listen, "last-event-id": last.encode("latin-1")}
                answer = await http.get(proxy.url, headers=named)
                answers.append((answer.status_code, answer.content))
        assert answers == [answers[0]] * len(answers), answers
        assert answers[0][0] == 409
