"""`--stdio-modern-children N`: 2026-07-28 requests spread over up to N stdio children, started as
the load asks for them; one at a time they all go to one child, a cancellation reaches the child
that runs the call, a killed child is passed over and replaced, one left idle is stopped, and the
proxy's stop ends every child.

Real processes: the proxy, the scripted SDK server over stdio (its journal names the process that
ran each call), Python SDK clients in `mode="2026-07-28"`. No timing: the test waits on the
journal's events, each wait bounded.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, pid_alive, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 90.0


def pids_of(journal: Journal, tool: str) -> set[int]:
    return {e["pid"] for e in journal.events(event="started") if e.get("tool") == tool}


def texts(result: object) -> list[str]:
    return [c.text for c in getattr(result, "content", []) if isinstance(c, TextContent)]


def start_proxy(tmp_path: Path, journal: Journal, *extra: str) -> ProxyProcess:
    return ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json"),
        extra=["--stdio-modern-children", "2", *extra],
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=60)


async def second_child(client: Client, journal: Journal, tg: anyio.abc.TaskGroup, hang: str) -> tuple[int, int]:
    """A call on the first child, then `hang` left in flight on it, then calls until a second child
    (started for the load) answers one: the two pids."""
    await client.call_tool("echo", {"text": "first", "call_id": f"{hang}-first"})
    (first,) = pids_of(journal, "echo")
    tg.start_soon(client.call_tool, "hang", {"seconds": 60, "call_id": hang})
    await journal.await_for(lambda j: j.events(event="started", call=hang), timeout_s=30, what=f"{hang} started")
    n = 0
    while len(pids_of(journal, "echo")) < 2:  # bounded by the caller's fail_after
        n += 1
        await client.call_tool("echo", {"text": "x", "call_id": f"{hang}-spread-{n}"})
    (second,) = pids_of(journal, "echo") - {first}
    return first, second


async def test_calls_spread_over_the_children_the_load_starts_and_a_cancellation_finds_its_child(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = start_proxy(tmp_path, journal)
    pids: set[int] = set()
    try:
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode="2026-07-28") as client:
                # One call at a time: all on one child, and no second one started for them.
                for n in range(5):
                    assert texts(await client.call_tool("echo", {"text": f"one {n}", "call_id": f"one-{n}"})) == [
                        f"one {n}"
                    ]
                first = pids_of(journal, "echo")
                assert len(first) == 1, first

                # A call that stays in flight on that child: the next ones start a second child,
                # and once it is ready they go to it (the less busy one).
                async with anyio.create_task_group() as tg:
                    cancel_hang = anyio.CancelScope()

                    async def hanging() -> None:
                        with cancel_hang:
                            await client.call_tool("hang", {"seconds": 60, "call_id": "hang"})

                    tg.start_soon(hanging)
                    await journal.await_for(
                        lambda j: j.events(event="started", call="hang"), timeout_s=30, what="the hang started"
                    )
                    (hang_pid,) = pids_of(journal, "hang")
                    assert {hang_pid} == first
                    deadline = time.monotonic() + 60
                    n = 0
                    while len(pids_of(journal, "echo")) < 2:
                        assert time.monotonic() < deadline, "no second child served a call within 60 s"
                        n += 1
                        assert texts(await client.call_tool("echo", {"text": f"two {n}", "call_id": f"two-{n}"})) == [
                            f"two {n}"
                        ]
                    pids = pids_of(journal, "echo")
                    assert len(pids) == 2, pids

                    # The client cancels the hanging call: the child that runs it is told.
                    cancel_hang.cancel()
                    await journal.await_for(
                        lambda j: j.events(event="cancelled", call="hang"), timeout_s=30, what="the hang cancelled"
                    )
                (cancelled,) = [e["pid"] for e in journal.events(event="cancelled", call="hang")]
                assert cancelled == hang_pid

                # Never more than N children, however many calls run at once.
                async with anyio.create_task_group() as tg:
                    for k in range(8):
                        tg.start_soon(client.call_tool, "echo", {"text": f"many {k}", "call_id": f"many-{k}"})
        assert len(pids_of(journal, "echo")) == 2
        assert all(pid_alive(pid) for pid in pids)
    finally:
        proxy.stop()
    deadline = time.monotonic() + 15
    # processes of another parent: nothing to wait on but /proc
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.05)
    assert not any(pid_alive(pid) for pid in pids), "a 2026 child outlived the proxy's stop"


async def test_by_default_one_child_serves_every_2026_call(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json"), log_path=tmp_path / "proxy.log"
    ).start(timeout_s=60)
    try:
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode="2026-07-28") as client:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "hang", {"seconds": 3, "call_id": "hang"})
                    await journal.await_for(
                        lambda j: j.events(event="started", call="hang"), timeout_s=30, what="the hang started"
                    )
                    for k in range(8):
                        tg.start_soon(client.call_tool, "echo", {"text": f"many {k}", "call_id": f"many-{k}"})
        assert len(pids_of(journal, "echo") | pids_of(journal, "hang")) == 1
    finally:
        proxy.stop()


async def test_a_killed_child_is_passed_over_and_replaced_when_the_load_asks_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = start_proxy(tmp_path, journal)
    try:
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode="2026-07-28") as client:
                async with anyio.create_task_group() as tg:
                    first, second = await second_child(client, journal, tg, "hang-1")
                    # The second child dies: the calls after it go to the first, which still runs hang-1.
                    os.kill(second, signal.SIGKILL)
                    while pid_alive(second):  # noqa: ASYNC110  (another parent's process: /proc only)
                        await anyio.sleep(0.02)
                    for k in range(5):
                        after = await client.call_tool("echo", {"text": f"after {k}", "call_id": f"after-{k}"})
                        assert texts(after) == [f"after {k}"]
                    after_pids = {
                        e["pid"] for e in journal.events(event="started") if str(e["call"]).startswith("after")
                    }
                    assert after_pids and second not in after_pids  # the first's, or the replacement's once it answers
                    # With the first still busy, the load starts a replacement for the second.
                    n = 0
                    while not pids_of(journal, "echo") - {first, second}:
                        n += 1
                        await client.call_tool("echo", {"text": "y", "call_id": f"again-{n}"})
                    tg.cancel_scope.cancel()
        third = pids_of(journal, "echo") - {first, second}
        assert len(third) == 1 and pid_alive(third.pop())
    finally:
        proxy.stop()


async def test_a_child_beyond_the_first_left_idle_is_stopped_and_the_first_serves_on(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = start_proxy(tmp_path, journal, "--session-idle-timeout-s", "2")
    try:
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode="2026-07-28") as client:
                async with anyio.create_task_group() as tg:
                    first, second = await second_child(client, journal, tg, "hang")
                    tg.cancel_scope.cancel()
                # Idle for the idle time (2 s; the reaper looks every second): the second child goes.
                deadline = time.monotonic() + 30
                while pid_alive(second):  # (another parent's process: /proc only)
                    assert time.monotonic() < deadline, "the idle second child still runs after 30 s"
                    await anyio.sleep(0.1)
                assert pid_alive(first)
                later = await client.call_tool("echo", {"text": "later", "call_id": "later"})
                assert texts(later) == ["later"]
        assert [e["pid"] for e in journal.events(event="started", call="later")] == [first]
        assert "stopped 1 2026 upstream children unused for 2 s" in proxy.log_tail(20000)
    finally:
        proxy.stop()
