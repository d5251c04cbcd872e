"""A log message on the shared 2026 link goes to the one request in flight that asked for log
messages, and to nobody when several did (relay.py, `deliver`). A stdio upstream never ties a log
message to a request, and the 2026 link is shared by every caller, so without this a 2026 client
of the usual sidecar (HTTP to the proxy, a stdio child) got none (seen with the TS SDK v2 client:
tests/interop/test_ts2_client.py). Real stdio child: it gathers `hold` calls, writes one untied
log message, then answers them all."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from proxy.jsonrpc import META_LOG_LEVEL, Message
from proxy.relay import Relay, ToolCatalog
from proxy.telemetry.shed import SHED
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream

pytestmark = pytest.mark.anyio
BOUND_S = 30.0

CHILD = r"""
import json, sys
pending = []
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    if m["method"] != "tools/call":
        result = {"supportedVersions": ["2026-07-28"], "capabilities": {}, "serverInfo": {"name": "c", "version": "1"}}
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}), flush=True)
        continue
    pending.append(m)
    if len(pending) >= m["params"]["arguments"]["hold"]:
        log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "the log"}}
        print(json.dumps(log), flush=True)
        for p in pending:
            print(json.dumps({"jsonrpc": "2.0", "id": p["id"], "result": {"content": []}}), flush=True)
        pending.clear()
"""


class Collected:
    closed = False

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, message: Message) -> None:
        self.messages.append(message)


def _call(i: int, hold: int, logs: bool) -> Message:
    params: dict[str, Any] = {"name": "t", "arguments": {"hold": hold}}
    if logs:
        params["_meta"] = {META_LOG_LEVEL: "info"}
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}


async def _run(*asks_logs: bool) -> tuple[list[Collected], int]:
    """One call per entry (True: it asks for log messages), all in flight at once; what each
    caller's stream got, and how many messages were dropped as untied meanwhile."""
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=0)
    try:
        relay = Relay(await upstream.open(Era.MODERN), catalog=ToolCatalog())
        assert relay.shared
        streams = [Collected() for _ in asks_logs]
        before = SHED.get("dropped_messages", "untied")
        async with asyncio.timeout(BOUND_S):
            answers = await asyncio.gather(
                *(
                    relay.forward(_call(i, len(asks_logs), logs), stream)
                    for i, (logs, stream) in enumerate(zip(asks_logs, streams, strict=True))
                )
            )
        assert all("result" in a for a in answers), answers
        assert relay._log_streams == {}  # nothing left once the requests ended
        return streams, SHED.get("dropped_messages", "untied") - before
    finally:
        await upstream.aclose()


def _logs(stream: Collected) -> list[Message]:
    return [m for m in stream.messages if m.get("method") == "notifications/message"]


async def test_the_one_request_that_asked_gets_the_log() -> None:
    (stream,), dropped = await _run(True)
    assert [m["params"]["data"] for m in _logs(stream)] == ["the log"]
    assert dropped == 0


async def test_a_request_that_did_not_ask_gets_none() -> None:
    asked, silent = (await _run(True, False))[0]
    assert len(_logs(asked)) == 1 and _logs(silent) == []
    (alone,), dropped = await _run(False)
    assert _logs(alone) == [] and dropped == 1


async def test_with_two_that_asked_nobody_gets_it() -> None:
    streams, dropped = await _run(True, True)
    assert [_logs(s) for s in streams] == [[], []]
    assert dropped == 1
