"""`Service.drain` against a real stdio child (the scripted SDK server): the shutdown grace period
ends a call still running as an unresolved `shutdown` result, and the cancellation reaches the
child while it still runs (its handler journals `cancelled` before the proxy stops it: so it was
the proxy's `notifications/cancelled`, not the child's own end). A call that ends within the
grace period gets its own answer; a new session during the drain is refused."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path
from typing import Any

import pytest

from proxy.core.engine import Engine
from proxy.core.relay import Relay
from proxy.core.service import Service
from proxy.errors import UpstreamFailure
from proxy.jsonrpc import META_UNRESOLVED, Message
from proxy.policy.compiled import PolicySet
from proxy.settings import Settings
from proxy.upstream.stdio import StdioUpstream
from tests.fixtures.journal import Journal
from tests.proxy_process import pid_alive, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


class Answers:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def closed(self) -> bool:
        return False


def hang(request_id: int, seconds: float, call_id: str) -> Message:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "hang", "arguments": {"seconds": seconds, "call_id": call_id}},
    }


async def test_drain_ends_what_outlives_the_grace_period_and_cancels_it_in_the_running_child(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    # The command first: it starts this process's fork server when none runs yet, whose pipes stay
    # open for the session (tests/fixtures/forkserver.py), and are not the child's.
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    gc.collect()  # an earlier test's garbage (and its descriptors) goes first
    fds_before = len(os.listdir("/proc/self/fd"))
    settings = Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x")
    upstream = StdioUpstream(command, spares=0)
    service = Service(settings, upstream, tool_calls=Engine(policies=lambda: PolicySet(version="t")))
    try:
        _, relay = await service.new_session()
        assert isinstance(relay, Relay)
        init: Message = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        await relay.handle_request(init, Answers())
        await relay.handle_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await relay.handle_request({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, Answers())
        short, long = Answers(), Answers()
        calls: list[asyncio.Task[Any]] = [
            asyncio.create_task(relay.handle_request(hang(2, 0.5, "short"), short)),
            asyncio.create_task(relay.handle_request(hang(3, 30.0, "long"), long)),
        ]
        await journal.await_for(
            lambda j: j.events(event="started", call="short") and j.events(event="started", call="long"),
            timeout_s=20,
            what="both calls running",
        )
        (child_pid,) = {e["pid"] for e in journal.events(event="started")}
        ended = await service.drain(2.0)
        await asyncio.wait_for(asyncio.gather(*calls), 5)
        assert ended == 1
        assert short.messages[0]["result"]["content"][0]["text"] == "slept 0.5s"
        result = long.messages[0]["result"]
        assert result["isError"] is True and result["_meta"][META_UNRESOLVED]["stopReason"] == "shutdown"
        # the child still runs (the service is not closed yet) and its handler was cancelled
        await journal.await_for(lambda j: j.events(event="cancelled", call="long"), timeout_s=10, what="cancelled")
        assert pid_alive(child_pid)
        with pytest.raises(UpstreamFailure) as refused:
            await service.new_session()
        assert refused.value.http_status == 503
        assert (await service.readiness()) == (False, "shutting down")
    finally:
        await service.aclose()
    assert not pid_alive(child_pid), "no process left"
    # <=: an earlier test's descriptor may be collected meanwhile; none of this one's is left
    assert len(os.listdir("/proc/self/fd")) <= fds_before, "no file descriptor left (the child's pipes)"
