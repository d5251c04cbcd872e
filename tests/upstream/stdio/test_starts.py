"""Children of a stdio upstream start a bounded few at a time (`--stdio-max-starting`), and one
whose start is under way when the upstream closes does not outlive the close.

Fifty 2025 sessions opened together started fifty Python interpreters at once on two cores: each
took 45 s to start instead of one, and the proxy's event loop, one process among fifty, stalled for
seconds (bench/load_faults.py's deadline probe saw calls answered 6 s after their deadline). Real
child processes over real pipes; each child writes down when it began and when it was ready (after
a pause standing for an interpreter's imports), before it answers anything, so the overlap of
those intervals is what the proxy allowed, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import UpstreamFailure
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(60)]

BOOTING_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    began = time.time()
    time.sleep(0.3)  # a real server's imports
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "began": began, "ready": time.time()}) + "\\n")
    for line in sys.stdin:
        message = json.loads(line)
        if "id" in message:
            print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {}}), flush=True)
    """
)


async def _initialize(upstream: StdioUpstream) -> dict[str, Any]:
    link = await upstream.open(Era.LEGACY)
    request = {"jsonrpc": "2.0", "id": link.new_id(), "method": "initialize", "params": {}}
    exchange = await link.send_request(request)
    async with asyncio.timeout(30):
        return await exchange.response


def _most_at_once(starts: list[dict[str, float]]) -> int:
    edges = sorted([(s["began"], 1) for s in starts] + [(s["ready"], -1) for s in starts])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("limit", [1, 2])
async def test_sessions_opened_together_start_their_children_a_bounded_few_at_a_time(
    tmp_path: Path, limit: int
) -> None:
    journal = tmp_path / "starts.jsonl"
    upstream = StdioUpstream(
        [sys.executable, "-c", BOOTING_CHILD, str(journal)], spares=0, max_starting=limit, max_children=16
    )
    try:
        answers = await asyncio.gather(*(_initialize(upstream) for _ in range(6)))
        assert all(a.get("result") == {} for a in answers)
    finally:
        await upstream.aclose()
    starts = [json.loads(line) for line in journal.read_text().splitlines()]
    assert len(starts) == 6, "every session got its own child"
    assert _most_at_once(starts) == limit, "never more than the limit starting at once, and the limit is used"


async def test_a_child_that_exits_without_a_word_gives_its_start_slot_back(tmp_path: Path) -> None:
    # (a handshake timeout beyond the test's bound: the slot's own fallback, that long, cannot
    # hide a slot kept after the exit)
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    upstream = StdioUpstream(command, spares=0, max_starting=1, handshake_timeout_s=120)
    try:
        for _ in range(3):  # with the slot kept, the second start would wait for good
            with pytest.raises(UpstreamFailure):
                await _initialize(upstream)
    finally:
        await upstream.aclose()


SILENT_CHILD = "import time; time.sleep(30)"  # starts, reads nothing, answers nothing


@pytest.mark.parametrize("asked", [True, False], ids=["asked", "spare"])
async def test_only_a_child_asked_nothing_gives_its_start_slot_back_before_it_answers(asked: bool) -> None:
    """A child that was sent a request (a session's `initialize`) holds its start slot until its
    first output or its exit; one asked nothing (a warm spare, which may never write a byte until
    asked) gives it back after twice the command's first start. With every child relaxed alike, six
    silent sessions were all starting at once under a limit of two."""
    upstream = StdioUpstream([sys.executable, "-c", SILENT_CHILD], spares=0, max_starting=1, handshake_timeout_s=60)
    upstream.start_s = 0.1  # the command's first child answered in 0.1 s
    spawned: list[Any] = []

    async def start() -> None:
        child = await upstream.spawn(lambda child, line: None, lambda child, code: None)
        if asked:
            child.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n')
        spawned.append(child)

    try:
        first = asyncio.ensure_future(start())
        await first
        second = asyncio.ensure_future(start())
        await asyncio.sleep(1.5)  # far past 2 x 0.1 s
        if asked:
            assert not second.done(), "the second start waited: the first, asked and silent, keeps the slot"
            await spawned[0].terminate()  # its exit gives the slot back
        async with asyncio.timeout(10):
            await second
        assert len(spawned) == 2
    finally:
        await upstream.aclose()


def _group_alive(pgid: int) -> list[int]:
    """The processes of group `pgid` that still run (zombies excluded), read from /proc."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] != b"Z":
            alive.append(int(entry))
    return alive


async def test_a_child_whose_start_was_under_way_when_the_upstream_closed_is_gone_when_close_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process exists before `subprocess_exec` returns (the loop connects its pipes meanwhile).
    A close in that window returned at once, and the child, seeing the upstream closed as its start
    returned, was stopped by a task nobody kept or awaited: it outlived the close (and a proxy's
    shutdown), or was never stopped if the task was collected. The window is held open here by
    wrapping the loop's `subprocess_exec` (the only stand-in: on a loaded machine the window is
    milliseconds wide); the child and its pipes are real."""
    loop = asyncio.get_running_loop()
    real_exec = loop.subprocess_exec
    created: list[asyncio.SubprocessTransport] = []
    process_exists = asyncio.Event()
    let_it_return = asyncio.Event()

    async def held_exec(*args: Any, **kwargs: Any) -> Any:
        transport, protocol = await real_exec(*args, **kwargs)
        created.append(transport)
        process_exists.set()
        await let_it_return.wait()
        return transport, protocol

    monkeypatch.setattr(loop, "subprocess_exec", held_exec)
    upstream = StdioUpstream([sys.executable, "-c", "import sys\nfor line in sys.stdin: pass"], spares=0)
    link = await upstream.open(Era.LEGACY)
    request = {"jsonrpc": "2.0", "id": link.new_id(), "method": "initialize", "params": {}}
    call = asyncio.create_task(link.send_request(request))
    try:
        async with asyncio.timeout(30):
            await process_exists.wait()
        (transport,) = created
        pid = transport.get_pid()  # the guard's: it leads the child's process group
        assert _group_alive(pid), "the child runs"
        closing = asyncio.create_task(upstream.aclose())
        await asyncio.sleep(0)  # one turn of the loop: the close begins while the start is under way
        assert upstream._closed and not call.done()
        let_it_return.set()
        async with asyncio.timeout(30):
            await closing
        assert transport.get_returncode() is not None, "close() returned before the child was reaped"
        assert not _group_alive(pid), "a process of the child's group outlived close()"
        with pytest.raises(UpstreamFailure):
            async with asyncio.timeout(30):
                await call
    finally:
        let_it_return.set()
        call.cancel()
        async with asyncio.timeout(30):
            await asyncio.gather(call, upstream.aclose(), return_exceptions=True)
