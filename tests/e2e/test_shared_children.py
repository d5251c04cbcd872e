"""`--stdio-sessions shared` with a set of shared children, end to end: real Python SDK clients over
Streamable HTTP -> the real proxy process -> real SDK stdio servers (tests/e2e/shared_server.py)
over real pipes.

- Two sessions on one child (`--stdio-shared-children 1`) get only their own progress, their own
  log lines at their own level (the child runs at the most verbose one), and only the resource
  updates of the uris they subscribed to.
- Two sessions calling at once with two children each answer only their own sampling request.
- A child killed mid-call: both sessions' calls on it end as the engine resolves a crash (an
  unresolved result, never repeated: the tool is not read-only), and both sessions go on, on a
  replacement.
- More sessions than children: every call answered, never more children than the setting.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CreateMessageResult, LoggingMessageNotificationParams, ResourceUpdatedNotification, TextContent

from tests.e2e.test_shared_sessions import servers_under
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 60.0
SERVER = Path(__file__).with_name("shared_server.py")


def shared_proxy(tmp_path: Path, children: int) -> ProxyProcess:
    return ProxyProcess(
        upstream=[sys.executable, str(SERVER)],
        extra=["--stdio-sessions", "shared", "--stdio-shared-children", str(children)],
        log_path=tmp_path / "proxy.log",
    )


@pytest.fixture
def one_child(tmp_path: Path) -> Iterator[ProxyProcess]:
    p = shared_proxy(tmp_path, 1).start(timeout_s=60)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def two_children(tmp_path: Path) -> Iterator[ProxyProcess]:
    p = shared_proxy(tmp_path, 2).start(timeout_s=60)
    try:
        yield p
    finally:
        p.stop()


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


class Seen:
    """What one client was sent besides answers: log lines, resource updates, progress."""

    def __init__(self) -> None:
        self.logs: list[str] = []
        self.updates: list[str] = []
        self.progress: list[str] = []
        self.updated = anyio.Event()

    async def log(self, params: LoggingMessageNotificationParams) -> None:
        self.logs.append(str(params.data))

    async def message(self, message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            self.updates.append(str(message.params.uri))
            self.updated.set()

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append(message or "")

    async def next_update(self) -> None:
        await self.updated.wait()
        self.updated = anyio.Event()


async def test_two_sessions_on_one_child_get_only_their_own_progress_logs_and_updates(one_child: ProxyProcess) -> None:
    alice, bob = Seen(), Seen()
    url = one_child.url
    with anyio.fail_after(BOUND_S):
        async with (
            Client(url, mode="legacy", logging_callback=alice.log, message_handler=alice.message) as a,
            Client(url, mode="legacy", logging_callback=bob.log, message_handler=bob.message) as b,
        ):
            await a.set_logging_level("error")
            await b.set_logging_level("debug")
            await a.subscribe_resource("file:///shared/a")
            await b.subscribe_resource("file:///shared/b")
            results: dict[str, str] = {}

            async def progress(client: Client, who: str, seen: Seen) -> None:
                arguments = {"who": who, "steps": 4}
                answer = await client.call_tool("progress", arguments, progress_callback=seen.on_progress)
                results[who] = text_of(answer)

            async with anyio.create_task_group() as tg:  # both in flight on the one child
                tg.start_soon(progress, a, "alice", alice)
                tg.start_soon(progress, b, "bob", bob)
            assert results == {"alice": "done for alice", "bob": "done for bob"}
            assert alice.progress == ["progress of alice"] * 4
            assert bob.progress == ["progress of bob"] * 4

            assert text_of(await a.call_tool("say", {"text": "alice"})) == "said"
            assert text_of(await b.call_tool("say", {"text": "bob"})) == "said"

            await b.call_tool("touch", {"uri": "file:///shared/a"})  # bob's call, alice's subscription
            await alice.next_update()
            await a.call_tool("touch", {"uri": "file:///shared/b"})
            await bob.next_update()
    assert alice.logs == ["error: alice"], "alice's own lines at her own level, though the child runs at debug"
    assert bob.logs == ["debug: bob", "error: bob"], "bob's own lines at his level"
    assert alice.updates == ["file:///shared/a"] and bob.updates == ["file:///shared/b"]


def sampler(name: str) -> Any:
    async def callback(context: Any, params: Any) -> CreateMessageResult:
        asked = params.messages[0].content.text
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text=f"{name} answers {asked}"), model="m"
        )

    return callback


async def test_sampling_requests_reach_the_session_whose_call_caused_them(two_children: ProxyProcess) -> None:
    results: dict[str, str] = {}

    async def run(name: str) -> None:
        async with Client(two_children.url, mode="legacy", sampling_callback=sampler(name)) as client:
            for n in range(3):
                result = await client.call_tool("ask", {"prompt": f"question {n} of {name}"})
                results[f"{name}{n}"] = text_of(result)

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "alice")
            tg.start_soon(run, "bob")
    assert results == {
        f"{name}{n}": f"llm said: {name} answers question {n} of {name}" for name in ("alice", "bob") for n in range(3)
    }


async def test_a_child_killed_mid_call_resolves_its_calls_and_the_sessions_go_on(one_child: ProxyProcess) -> None:
    assert one_child.proc is not None
    url = one_child.url
    with anyio.fail_after(BOUND_S):
        async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:
            pid = int(text_of(await a.call_tool("pid", {})))
            started = {"a": anyio.Event(), "b": anyio.Event()}
            answers: dict[str, Any] = {}

            async def hang(client: Client, who: str) -> None:
                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    started[who].set()

                answers[who] = await client.call_tool("hang", {"seconds": 300}, progress_callback=on_progress)

            async with anyio.create_task_group() as tg:
                tg.start_soon(hang, a, "a")
                tg.start_soon(hang, b, "b")
                await started["a"].wait()
                await started["b"].wait()
                os.kill(pid, signal.SIGKILL)
            for who in ("a", "b"):
                result = answers[who]
                assert result.is_error, f"{who}: {result}"
                report = (result.meta or {})["io.mcp-recovery-proxy/unresolved"]  # (the tool has an output schema)
                assert report["stopReason"] == "outcome_unknown", f"never repeated: {report}"
            after_a = int(text_of(await a.call_tool("pid", {})))
            after_b = int(text_of(await b.call_tool("pid", {})))
    assert after_a == after_b != pid, "both sessions go on, on the one replacement"


async def test_more_sessions_than_children_are_all_answered_within_the_bound(two_children: ProxyProcess) -> None:
    assert two_children.proc is not None
    answered: list[str] = []

    async def run(n: int) -> None:
        async with Client(two_children.url, mode="legacy") as client:
            for i in range(3):
                result = await client.call_tool("progress", {"who": f"s{n}-{i}", "steps": 2})
                answered.append(text_of(result))

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(run, n)
        servers = servers_under(two_children.proc.pid, "shared_server.py")
    assert sorted(answered) == sorted(f"done for s{n}-{i}" for n in range(8) for i in range(3))
    # two shared children and the 2026 child of the start-up probe, however many sessions
    assert servers <= 3, f"{servers} server processes for eight sessions on two shared children"
