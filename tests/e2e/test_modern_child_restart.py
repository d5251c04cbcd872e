"""A 2026 client's listing on the stdio child that serves every 2026 request, as that child is
SIGKILLed, is answered by the replacement; the replacement is the warm spare when one is ready, and
the recovery rules hold for the calls the kill cut.

In a repro of the load run, 2026 `tools/call`s came back to their callers as JSON-RPC -32603
("upstream unavailable: upstream process exited with code 137") while the child was being
replaced. The calls themselves had gone through the engine; what failed was the `tools/list` the
Python SDK's `Client.call_tool` sends by itself, to check the result against the tool's output
schema, when the tool was not listed in that client yet: a relayed request, not a tools/call, on
the child as it died. A protocol read that fails because the upstream went away under it is now
sent once more (proxy/core/relay.py `RESENT_READS`).

Real processes: the proxy, the scripted SDK server over stdio, a Python SDK client in
`mode="2026-07-28"`. The server holds every `tools/list` while a file exists
(`--hold-lists-while`) and journals its arrival, so the listing is surely in flight on the child
when the test SIGKILLs it: deterministic, no timing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import TextContent

from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, pid_alive, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 60.0


def modern_pid(journal: Journal) -> int:
    """The process that executed the 2026 calls."""
    pids = {e["pid"] for e in journal.events(event="started") if e.get("protocol_version") == "2026-07-28"}
    assert len(pids) == 1, pids
    return pids.pop()


async def killed_and_gone(pid: int) -> None:
    """SIGKILL `pid` and wait (bounded) until it has been reaped. Until then it may still run: on
    this VM, under load, a killed child answered a held call 0.5 ms after `kill` returned, and
    once even after `/proc` showed it a zombie; only its reaping says it runs no more. So what the
    test then does to release the child's held work waits for this, or the child may still
    answer it itself. Its parent, the proxy's stdio guard, reaps it at once."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await anyio.sleep(0.005)
    raise AssertionError(f"process {pid} not reaped 10 s after SIGKILL")


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
                    await killed_and_gone(pid)
                    hold.unlink()  # (the replacement answers at once)
                after = await client.call_tool("echo", {"text": "after", "call_id": "after"})
        assert "error" not in outcome, outcome
        assert "echo" in outcome["tools"]
        assert [c.text for c in after.content if isinstance(c, TextContent)] == ["after"]
        # the held listing was sent again, to the replacement (the killed child ended holding it;
        # the SDK client listed the tools once before, for `echo`'s output schema)
        listed_on = [e["pid"] for e in journal.events(event="listing")]
        assert listed_on[-2:] == [pid, listed_on[-1]] and listed_on[-1] != pid, listed_on
    finally:
        if pid and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proxy.stop()


def evidence(tmp_path: Path, results: dict[str, Any]) -> str:
    """What a failed assertion shows: the calls' results, the proxy's log and the server's journal."""
    log, journal = ((tmp_path / name).read_text(errors="replace")[-4000:] for name in ("proxy.log", "journal.jsonl"))
    return f"\nresults: {results!r:.3000}\nproxy log (tail):\n{log}\njournal (tail):\n{journal}"


def others(journal: Journal, *known: int) -> list[int]:
    """The server processes past their imports (a `boot` line each), in order, but `known`."""
    return [e["pid"] for e in journal.events(event="boot") if e["pid"] not in known]


def running_on(journal: Journal, pid: int) -> set[str]:
    """The calls that started executing in process `pid`."""
    return {e["call"] for e in journal.events(event="started") if e["pid"] == pid}


async def test_a_killed_2026_child_is_replaced_by_the_warm_spare_and_the_recovery_rules_hold(tmp_path: Path) -> None:
    """The 2026 link's child is SIGKILLed with a read-only call and a state-changing one in flight
    on it. The link takes the warm spare that had booted before the kill (a 2026 call no longer
    waits for a cold start), a new spare starts behind it, the read is retried there and answered,
    the charge is reported unresolved and never executed again."""
    journal = Journal(tmp_path / "journal.jsonl")
    release = tmp_path / "release"
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json"),
        extra=["--stdio-spares", "1", "--stdio-spares-max", "1"],  # one spare, no growth
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=60)
    killed = 0
    try:
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode="2026-07-28") as client:
                await client.list_tools()
                await client.call_tool("echo", {"text": "before", "call_id": "before"})
                killed = modern_pid(journal)
                # The spare: the one other process, booted (past its imports) before the kill.
                spare = (await journal.await_for(lambda j: others(j, killed), 30, what="a spare"))[0]
                results: dict[str, Any] = {}

                async def run(name: str, tool: str, args: dict[str, Any]) -> None:
                    results[name] = await client.call_tool(tool, args)

                async with anyio.create_task_group() as tg:
                    # the read runs until `release` exists: on the killed child, never
                    tg.start_soon(run, "read", "hang", {"seconds": 60, "call_id": "read", "release": str(release)})
                    charging = {"account": "a", "amount": 1, "then": "hang", "call_id": "charge"}
                    tg.start_soon(run, "charge", "charge", charging)
                    await journal.await_for(
                        lambda j: running_on(j, killed) >= {"read", "charge"}, 30, what="both calls"
                    )
                    await killed_and_gone(killed)
                    release.touch()
                after = await client.call_tool("echo", {"text": "after", "call_id": "after"})
        read_pids = [e["pid"] for e in journal.events(tool="hang", event="started", call="read")]
        assert read_pids == [killed, spare], (
            f"the read was retried once, on the spare that was warm before the kill{evidence(tmp_path, results)}"
        )
        assert not results["read"].is_error, evidence(tmp_path, results)
        assert [e["pid"] for e in journal.events(tool="echo", event="started", call="after")] == [spare]
        assert [c.text for c in after.content if isinstance(c, TextContent)] == ["after"]
        charge = results["charge"]
        assert charge.is_error and "io.mcp-recovery-proxy/unresolved" in (charge.meta or {}), charge
        assert len(journal.effects("charge", "charge")) == 1, "a state-changing call is never repeated"
        assert journal.executions("charge", "charge") == 1
        # A new spare was started behind the one taken.
        await journal.await_for(lambda j: others(j, killed, spare), 30, what="the next spare's boot")
    finally:
        if killed and pid_alive(killed):
            with contextlib.suppress(ProcessLookupError):
                os.kill(killed, signal.SIGKILL)
        proxy.stop()
