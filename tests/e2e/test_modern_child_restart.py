"""A 2026 client's listing on the stdio child that serves every 2026 request, as that child is
SIGKILLed, is answered by the replacement (issue 16).

In a repro of the load run, 2026 `tools/call`s came back to their callers as JSON-RPC -32603
("upstream unavailable: upstream process exited with code 137") while the child was being
replaced. The calls themselves had gone through the engine; what failed was the `tools/list` the
Python SDK's `Client.call_tool` sends by itself, to check the result against the tool's output
schema, when the tool was not listed in that client yet: a relayed request, not a tools/call, on
the child as it died. A protocol read that fails because the upstream went away under it is now
sent once more (proxy/relay.py `RESENT_READS`).

Real processes: the proxy, the scripted SDK server over stdio, a Python SDK client in
`mode="2026-07-28"`. The server holds every `tools/list` while a file exists
(`--hold-lists-while`) and journals its arrival, so the listing is surely in flight on the child
when the test SIGKILLs it: deterministic, no timing.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import TextContent

from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, pid_alive, scripted_stdio_command

pytestmark = pytest.mark.anyio
BOUND_S = 60.0


def modern_pid(journal: Journal) -> int:
    """The process that executed the 2026 calls."""
    pids = {e["pid"] for e in journal.events(event="started") if e.get("protocol_version") == "2026-07-28"}
    assert len(pids) == 1, pids
    return pids.pop()


async def test_a_listing_on_the_2026_child_as_it_is_killed_is_answered_by_its_replacement(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    hold = tmp_path / "hold-lists"
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json", ["--hold-lists-while", str(hold)]),
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=60)
    outcome: dict[str, Any] = {}
    pid = 0
    try:
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode="2026-07-28") as client:
                await client.call_tool("echo", {"text": "before", "call_id": "before"})
                pid = modern_pid(journal)
                hold.touch()  # the listing below waits in the child

                async def listing() -> None:
                    try:
                        outcome["tools"] = [t.name for t in (await client.list_tools()).tools]
                    except MCPError as error:
                        outcome["error"] = f"{error.error.code}: {error.error.message}"

                async with anyio.create_task_group() as tg:
                    tg.start_soon(listing)
                    await journal.await_for(lambda j: j.events(event="listing"), timeout_s=30, what="the listing held")
                    hold.unlink()  # (the replacement answers at once)
                    os.kill(pid, signal.SIGKILL)
                after = await client.call_tool("echo", {"text": "after", "call_id": "after"})
        assert "error" not in outcome, outcome
        assert "echo" in outcome["tools"]
        assert [c.text for c in after.content if isinstance(c, TextContent)] == ["after"]
        assert not pid_alive(pid)
    finally:
        if pid and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proxy.stop()
