"""More calls at once than the proxy's connection pool to an HTTP upstream holds: every one is
served, in turns, and the upstream never runs more requests at once than the pool's size.

Real Python SDK clients (one 2025 session each, as one agent's sessions are) against
`python -m proxy serve --upstream-max-connections 4` in front of the scripted server over
Streamable HTTP, whose `hang` tool takes `TOOL_S`. `CALLS` sessions call it at once: the calls
that find the four connections busy wait their turn (two rounds, each longer than the connect
timeout of 1 s), and so does the `tools/list` the SDK sends around each call. Waiting for a
connection is not a failed attempt: every call is served on its first (the proxy's
`mcp_recovery_calls_total{outcome="success"}`), none retried after a refusal of its own pool. The
upstream's journal says how many ran at once. Bounded by `BOUND_S`; both processes are stopped by their pids.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from tests.fixtures.helpers import ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(180)]
BOUND_S = 120.0
POOL = 4
CALLS = 12
TOOL_S = 3.0


def first_attempt_successes(admin: str, tool: str) -> float:
    """The calls of `tool` the proxy answered with its first attempt's success."""
    wanted = f'mcp_recovery_calls_total{{outcome="success",tool="{tool}"}}'
    for line in httpx.get(admin + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == wanted:
            return float(value)
    return 0.0


def most_at_once(journal: Journal, tool: str) -> int:
    """The most executions of `tool` the upstream ran at once (journal order: each `started`
    before its end is written, each end before its answer leaves)."""
    running = most = 0
    for event in journal.events(tool=tool):
        if event["event"] == "started":
            running += 1
            most = max(most, running)
        elif event["event"] in ("completed", "failed", "cancelled"):
            running -= 1
    return most


async def test_calls_beyond_the_upstream_pool_wait_their_turn_and_all_succeed(tmp_path: Path) -> None:
    journal_path = tmp_path / "journal.jsonl"
    extra = ["--upstream-max-connections", str(POOL), "--upstream-connect-timeout-s", "1"]
    with (
        ScriptedHTTP(journal_path) as server,
        ProxyProcess(upstream_url=server.url, extra=extra, log_path=tmp_path / "proxy.log") as proxy,
    ):
        answers: dict[int, str] = {}
        errors: list[str] = []
        all_open = anyio.Event()
        opened = 0

        async def one(i: int) -> None:
            nonlocal opened
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(Client(proxy.url, mode="legacy"))
                opened += 1
                if opened == CALLS:
                    all_open.set()
                await all_open.wait()  # every call starts while all sessions are open
                try:
                    result = await client.call_tool("hang", {"seconds": TOOL_S, "call_id": f"c{i}"})
                except Exception as exc:  # what the test reports, not a reason to stop the others
                    errors.append(f"call {i}: {type(exc).__name__}: {exc}"[:300])
                    return
                assert not result.is_error, result
                answers[i] = result.content[0].text  # type: ignore[union-attr]

        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                for i in range(CALLS):
                    tg.start_soon(one, i)

        assert errors == [], f"{errors}; proxy log: {proxy.log_tail(2000)}"
        assert answers == {i: f"slept {TOOL_S}s" for i in range(CALLS)}
        assert first_attempt_successes(proxy.admin, "hang") == CALLS, proxy.log_tail(2000)
        journal = Journal(journal_path)
        assert len(journal.events(tool="hang", event="completed")) == CALLS  # each ran once
        assert most_at_once(journal, "hang") <= POOL  # the upstream was never asked for more at once
