"""`mcp_recovery_upstream_up`, the restarts counter and `/readyz` for a stdio upstream, with real
children under the proxy's guard: the upstream is up while a child answers, down only when no
child that answered is left (and nothing new answers), and every child that dies unasked counts
once, whether or not its session ever needs a new one."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.core.service import Service
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.upstream.stdio import StdioUpstream

from ..health import WAIT_S, Gauges

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


# Answers every request; exits at once, before reading anything, while the file BROKEN exists.
CHILD = textwrap.dedent(
    """
    import json, os, sys
    if os.path.exists(sys.argv[1]):
        sys.exit(3)
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" in msg and "method" in msg:
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"method": msg["method"]}}), flush=True)
    """
)


class Stack:
    """A `Service` over a real stdio upstream, with the metrics observer the proxy uses."""

    def __init__(self, service: Service, gauges: Gauges, broken: Path) -> None:
        self.service = service
        self.gauges = gauges
        self.up = gauges.up
        self.restarts = gauges.restarts
        self.wait_for = gauges.wait_for
        self.broken = broken

    async def session(self) -> tuple[str, Any]:
        session_id, relay = await self.service.new_session()
        link = relay.link
        init = {
            "jsonrpc": "2.0",
            "id": link.new_id(),
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        await call(link, init)
        return session_id, link


async def call(link: Any, message: Message | None = None) -> Message:
    if message is None:
        message = {"jsonrpc": "2.0", "id": link.new_id(), "method": "tools/list"}
    ex = await link.send_request(message)
    return await asyncio.wait_for(ex.response, WAIT_S)


async def kill_child(link: Any) -> None:
    """SIGKILL a session's child (its guard's whole process group) and wait until the link saw it go."""
    child = link._child
    assert child is not None and child.alive
    os.killpg(child.pid, signal.SIGKILL)
    await asyncio.wait_for(child.exited.wait(), WAIT_S)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    broken = tmp_path / "BROKEN"
    upstream = StdioUpstream([sys.executable, "-c", CHILD, str(broken)], spares=0)
    settings = Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x")
    gauges = Gauges(upstream.description)
    service = Service(settings, upstream, telemetry=gauges.telemetry)
    stack = Stack(service, gauges, broken)
    await service.start()
    try:
        yield stack
    finally:
        await service.aclose()


async def test_one_sessions_child_dying_leaves_the_upstream_up_while_the_others_answer(stack: Stack) -> None:
    """The auditor's case: A's child crashes and A's session ends; B and C go on working through
    their own children. The gauge must not sit at 0 (McpRecoveryUpstreamDown would page) and
    /readyz must stay ready, while the crash is counted although nobody restarts A's child."""
    assert stack.up() == 1, "the start-up probe got an answer"
    a_id, a = await stack.session()
    _, b = await stack.session()
    _, c = await stack.session()
    await kill_child(a)
    await stack.service.close_session(a_id)
    for link in (b, c, b):
        assert (await call(link))["result"] == {"method": "tools/list"}
        assert stack.up() == 1, "calls succeed: the upstream answers"
    assert await stack.service.readiness() == (True, None)
    assert stack.restarts() == 1, "the crash counts although the session never needed a new child"


async def test_a_crash_in_each_of_several_sessions_counts_each_one(stack: Stack) -> None:
    """McpRecoveryUpstreamCrashLooping watches the restarts counter: a command whose children each
    crash once (each in its own session, which then ends) is crash-looping all the same."""
    _, survivor = await stack.session()
    for _ in range(4):
        session_id, link = await stack.session()
        await kill_child(link)
        await stack.service.close_session(session_id)
    assert stack.restarts() == 4
    assert (await call(survivor))["result"] == {"method": "tools/list"}
    assert stack.up() == 1


async def test_losing_the_last_child_that_answered_is_down_until_a_child_answers_again(stack: Stack) -> None:
    """With no child left that answered, the upstream is down (gauge 0, /readyz 503) while a fresh
    child cannot answer either, and up again as soon as one does, with no session traffic needed:
    the proxy re-checks a down upstream by itself."""
    _, link = await stack.session()
    stack.broken.touch()  # from now on every new child exits before answering
    await kill_child(link)
    await stack.wait_for(lambda: stack.up() == 0)
    ready, why = await stack.service.readiness()
    assert not ready and why is not None and "exited" in why
    crashes = stack.restarts() or 0
    await stack.wait_for(lambda: (stack.restarts() or 0) >= crashes + 2)  # the re-checks' children crash too
    assert stack.up() == 0, "re-checks that get no answer leave it down"
    stack.broken.unlink()
    await stack.wait_for(lambda: stack.up() == 1)  # a re-check's child answered
    assert await stack.service.readiness() == (True, None)
    assert (await call(link))["result"] == {"method": "tools/list"}, "the session gets a fresh child"


async def test_a_session_ending_normally_is_neither_a_crash_nor_down(stack: Stack) -> None:
    session_id, link = await stack.session()
    child = link._child
    await stack.service.close_session(session_id)
    await asyncio.wait_for(child.exited.wait(), WAIT_S)
    await asyncio.sleep(0.1)
    assert stack.up() == 1
    assert stack.restarts() == 0
    assert await stack.service.readiness() == (True, None)


# A 2025-only server that exits when its first request is not `initialize` (as some do on an
# unknown method): the start-up `server/discover` kills it, a fresh child answers `initialize`.
LEGACY_ONLY = textwrap.dedent(
    """
    import json, sys
    first = True
    for line in sys.stdin:
        msg = json.loads(line)
        if first and msg.get("method") != "initialize":
            sys.exit(4)
        first = False
        if "id" in msg and "method" in msg:
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}), flush=True)
    """
)


async def test_a_command_that_crashes_at_once_fails_the_start_up_probe_and_is_not_ready(tmp_path: Path) -> None:
    broken = tmp_path / "BROKEN"
    broken.touch()
    upstream = StdioUpstream([sys.executable, "-c", CHILD, str(broken)], spares=0)
    settings = Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x")
    gauges = Gauges(upstream.description)
    service = Service(settings, upstream, telemetry=gauges.telemetry)
    await service.start()
    try:
        ready, why = await service.readiness()
        assert not ready and why is not None and "probe failed" in why, why
        assert gauges.up() == 0
        broken.unlink()  # the command is mended: the start-up probe's retries find it
        retrying = service._tasks[0]  # the start-up probe's retry loop: it ends once a probe succeeds
        await asyncio.wait_for(asyncio.shield(retrying), WAIT_S)
        assert service.ready
        assert gauges.up() == 1
        assert (await service.readiness())[0]
    finally:
        await service.aclose()


async def test_a_legacy_server_that_exits_on_discover_is_still_legacy_only_and_ready(tmp_path: Path) -> None:
    upstream = StdioUpstream([sys.executable, "-c", LEGACY_ONLY], spares=0)
    try:
        caps = await upstream.probe()
        assert caps.legacy and not caps.modern
        assert upstream.health.up is True
    finally:
        await upstream.aclose()


async def test_a_start_up_probe_that_times_out_says_so() -> None:
    """A probe the upstream never answers ended as `upstream probe failed: ` and nothing more (the
    TimeoutError's text is empty): /readyz and the log now say how long it waited, and in which
    step of the probe."""
    silent = [sys.executable, "-c", "import sys\nfor _ in sys.stdin: pass"]
    upstream = StdioUpstream(silent, spares=0, handshake_timeout_s=60)  # the probe's own bound fires first
    service = Service(Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x"), upstream)
    service._probe_timeout_s = 0.5
    try:
        assert await service.ensure_probed(raise_on_failure=False) is None
        assert service.probe_error == (
            "upstream probe failed: no answer within 0.5 s (during server/discover on a new process)"
        )
    finally:
        await service.aclose()
