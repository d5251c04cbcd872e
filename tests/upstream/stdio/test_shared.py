"""`--stdio-sessions shared` over real children (a small stdio server over real pipes, its journal
of what each child read): sessions are spread over a bounded set of children, each initialized
once by the proxy; what a child sends without naming a request reaches the one session it is tied
to (server requests answered back to the child that asked, log lines filtered by that session's
level, resource updates by the per-child subscription table); the children run at the most
verbose level a session asked for; a crashed child is replaced with its state replayed; idle
children are reaped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.upstream.base import Era
from proxy.upstream.stdio import SessionLink, StdioUpstream

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0

# Holds a `tools/call` named "hold" until the same child reads one named "release"; "ask" sends a
# sampling request and answers with what came back; "log" writes a debug and an error line;
# "touch" notifies an update of its uri; "pid" answers the child's pid.
SERVER = textwrap.dedent(
    """
    import json, os, sys
    log = open(sys.argv[1], "a")
    held, asked = [], {}

    def send(msg):
        sys.stdout.write(json.dumps(msg) + "\\n"); sys.stdout.flush()

    def answer(id_, result):
        send({"jsonrpc": "2.0", "id": id_, "result": result})

    for line in sys.stdin:
        msg = json.loads(line)
        log.write(json.dumps({"pid": os.getpid(), "method": msg.get("method"), "params": msg.get("params")}) + "\\n")
        log.flush()
        if "method" not in msg:  # a response to our sampling request
            id_ = asked.pop(msg.get("id"), None)
            if id_ is not None:
                answer(id_, {"content": [{"type": "text", "text": json.dumps(msg.get("result") or msg.get("error"))}]})
            continue
        if "id" not in msg:
            continue
        method, id_ = msg["method"], msg["id"]
        if method == "initialize":
            caps = {"tools": {}, "logging": {}, "resources": {"subscribe": True, "listChanged": True}}
            answer(id_, {"protocolVersion": "2025-11-25", "serverInfo": {"name": "s", "version": "1"},
                         "capabilities": caps})
        elif method == "tools/call":
            name = msg["params"]["name"]
            args = msg["params"].get("arguments") or {}
            if name == "hold":
                held.append(id_)
            elif name == "release":
                for h in held:
                    answer(h, {"content": [], "released": True})
                held.clear()
                answer(id_, {"content": []})
            elif name == "ask":
                asked["q1"] = id_
                send({"jsonrpc": "2.0", "id": "q1", "method": "sampling/createMessage",
                      "params": {"messages": [], "maxTokens": 1}})
            elif name == "log":
                for level in ("debug", "error"):
                    send({"jsonrpc": "2.0", "method": "notifications/message",
                          "params": {"level": level, "data": level + " line"}})
                answer(id_, {"content": []})
            elif name == "touch":
                send({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                      "params": {"uri": args["uri"]}})
                answer(id_, {"content": []})
            else:
                answer(id_, {"content": [], "pid": os.getpid()})
        else:
            answer(id_, {})
    """
)


def journal(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def methods(path: Path, pid: int | None = None) -> list[str]:
    return [e["method"] for e in journal(path) if pid is None or e["pid"] == pid]


class Session:
    """A session link and what it was sent unasked."""

    def __init__(self, link: SessionLink) -> None:
        self.link = link
        self.got: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        link.set_unsolicited_handler(self._got)

    def _got(self, message: dict[str, Any]) -> None:
        self.got.append(message)
        self.arrived.set()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await (await self.send(method, params)).response

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        message = {"jsonrpc": "2.0", "id": self.link.new_id(), "method": method, "params": params or {}}
        return await self.link.send_request(message)

    async def call(self, name: str, **arguments: Any) -> Any:
        return await self.send("tools/call", {"name": name, "arguments": arguments})

    async def next_message(self) -> dict[str, Any]:
        while not self.got:
            self.arrived.clear()
            await self.arrived.wait()
        return self.got.pop(0)


async def open_sessions(upstream: StdioUpstream, n: int) -> list[Session]:
    sessions = []
    for _ in range(n):
        s = Session(await upstream.open(Era.LEGACY))  # type: ignore[arg-type]
        result = (await s.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}}))["result"]
        assert result["protocolVersion"] == "2025-06-18"
        sessions.append(s)
    return sessions


@pytest.fixture
def server(tmp_path: Path) -> tuple[list[str], Path]:
    script, seen = tmp_path / "server.py", tmp_path / "seen.jsonl"
    script.write_text(SERVER)
    return [sys.executable, str(script), str(seen)], seen


async def test_concurrent_sessions_go_to_different_children_and_get_their_own_server_requests(
    server: tuple[list[str], Path],
) -> None:
    command, seen = server
    upstream = StdioUpstream(command, shared_sessions=True, shared_children=2)
    try:
        async with asyncio.timeout(BOUND_S):
            await upstream.probe()  # as the service does at start: both shared children are started
            assert upstream.children == 2
            alice, bob = await open_sessions(upstream, 2)
            held = await alice.call("hold")
            # bob asks while alice holds the first child: his call goes to the second one, so the
            # sampling request it sends is his alone, and its answer goes back to that child
            asking = await bob.call("ask")
            sampling = await bob.next_message()
            assert sampling["method"] == "sampling/createMessage"
            await bob.link.send_response({"jsonrpc": "2.0", "id": sampling["id"], "result": {"text": "bob's"}})
            answer = await asking.response
            assert "bob's" in answer["result"]["content"][0]["text"]
            assert alice.got == [], "the server request reached only the session it is tied to"
            release = await alice.call("release")  # alice's requests stay on the child holding hers
            assert (await held.response)["result"]["released"] is True
            await release.response
        pids = {e["pid"] for e in journal(seen) if e["method"] != "server/discover"}
        assert len(pids) == 2 and upstream.children == 2
        for pid in pids:  # each child was initialized by the proxy before its first request
            assert methods(seen, pid)[:2] == ["initialize", "notifications/initialized"]
    finally:
        await upstream.aclose()


async def test_a_server_request_no_single_session_is_tied_to_reaches_none_and_is_refused(
    server: tuple[list[str], Path],
) -> None:
    command, _ = server
    upstream = StdioUpstream(command, shared_sessions=True, shared_children=1)
    try:
        async with asyncio.timeout(BOUND_S):
            alice, bob = await open_sessions(upstream, 2)
            held = await alice.call("hold")
            asking = await bob.call("ask")  # one child: alice and bob both in flight there
            answer = await asking.response  # the child got an error instead of an answer
            assert "cannot tie" in answer["result"]["content"][0]["text"]
            assert alice.got == [] and bob.got == []
            await (await alice.call("release")).response
            await held.response
    finally:
        await upstream.aclose()


async def test_log_levels_are_per_session_and_the_child_runs_at_the_most_verbose(
    server: tuple[list[str], Path],
) -> None:
    command, seen = server
    upstream = StdioUpstream(command, shared_sessions=True, shared_children=1)
    try:
        async with asyncio.timeout(BOUND_S):
            alice, bob = await open_sessions(upstream, 2)
            assert (await alice.request("logging/setLevel", {"level": "error"}))["result"] == {}
            assert (await bob.request("logging/setLevel", {"level": "debug"}))["result"] == {}
            await (await alice.call("log")).response
            await (await bob.call("log")).response
            assert [m["params"]["level"] for m in alice.got] == ["error"], "alice's own level, not bob's"
            assert [m["params"]["level"] for m in bob.got] == ["debug", "error"], "bob's level, not alice's"
            levels = [e["params"]["level"] for e in journal(seen) if e["method"] == "logging/setLevel"]
            assert levels == ["error", "debug"], "the child follows the most verbose level asked"
            await bob.link.aclose()  # the most verbose session leaves: the child goes back to alice's
            levels = [e["params"]["level"] for e in journal(seen) if e["method"] == "logging/setLevel"]
            assert levels[-1] == "error"
    finally:
        await upstream.aclose()


async def test_subscriptions_are_counted_per_uri_and_updates_reach_only_subscribers(
    server: tuple[list[str], Path],
) -> None:
    command, seen = server
    upstream = StdioUpstream(command, shared_sessions=True, shared_children=1)
    try:
        async with asyncio.timeout(BOUND_S):
            alice, bob, carol = await open_sessions(upstream, 3)
            for s in (alice, bob):
                assert (await s.request("resources/subscribe", {"uri": "file:///a"}))["result"] == {}
            assert (await carol.request("resources/subscribe", {"uri": "file:///c"}))["result"] == {}
            await (await carol.call("touch", uri="file:///a")).response
            # an update is not a request: delivered by the table, whoever's call caused it
            assert [m["params"]["uri"] for m in alice.got] == ["file:///a"]
            assert [m["params"]["uri"] for m in bob.got] == ["file:///a"]
            assert carol.got == []
            subscribes = [e["params"]["uri"] for e in journal(seen) if e["method"] == "resources/subscribe"]
            assert subscribes == ["file:///a", "file:///c"], "the child subscribed once per uri"
            assert (await alice.request("resources/unsubscribe", {"uri": "file:///a"}))["result"] == {}
            assert "resources/unsubscribe" not in methods(seen), "bob still subscribes to it"
            await bob.link.aclose()  # the last subscriber leaves: the child unsubscribes
            unsubscribes = [e["params"]["uri"] for e in journal(seen) if e["method"] == "resources/unsubscribe"]
            assert unsubscribes == ["file:///a"]
            await (await carol.call("touch", uri="file:///a")).response
            assert len(alice.got) == 1 and carol.got == []
    finally:
        await upstream.aclose()


async def test_a_killed_child_fails_its_calls_and_a_replacement_gets_the_state_replayed(
    server: tuple[list[str], Path],
) -> None:
    command, seen = server
    upstream = StdioUpstream(command, shared_sessions=True, shared_children=1)
    try:
        async with asyncio.timeout(BOUND_S):
            alice, bob = await open_sessions(upstream, 2)
            await alice.request("logging/setLevel", {"level": "warning"})
            await bob.request("resources/subscribe", {"uri": "file:///b"})
            held = await alice.call("hold")
            shared = upstream._shared
            assert shared is not None
            child = shared.children[0].link._child
            assert child is not None
            os.killpg(child.pid, signal.SIGKILL)
            with pytest.raises(Exception) as failed:
                await held.response
            assert "exited" in str(failed.value)
            answer = await (await bob.call("pid")).response  # the next request starts a replacement
            assert answer["result"]["pid"] != child.pid
            replacement = methods(seen, answer["result"]["pid"])
            assert replacement == [
                "initialize",
                "notifications/initialized",
                "logging/setLevel",
                "resources/subscribe",
                "tools/call",
            ]
            await (await alice.call("touch", uri="file:///b")).response
            assert [m["params"]["uri"] for m in bob.got] == ["file:///b"], "the subscription survived"
    finally:
        await upstream.aclose()


async def test_more_sessions_than_children_stay_within_the_bound_and_idle_children_are_reaped(
    server: tuple[list[str], Path],
) -> None:
    command, _ = server
    upstream = StdioUpstream(command, shared_sessions=True, shared_children=3, spare_idle_s=0.0)
    try:
        async with asyncio.timeout(BOUND_S):
            sessions = await open_sessions(upstream, 8)
            holds = [await s.call("hold") for s in sessions]  # eight sessions in flight at once
            # the first child runs: the others were started in the background, not waited for
            assert {hold.transport_state.index for hold in holds} == {0}
            shared = upstream._shared
            assert shared is not None
            await shared.start_all()  # (what contention started, awaited)
            assert upstream.children == 3
            holds += [await s.call("hold") for s in sessions]
            assert upstream.children == 3, "never more children than the setting"
            for s in sessions:
                await (await s.call("release")).response
            for hold in holds:
                await hold.response
            assert upstream.reap_idle_shared() == 0, "every child has sessions homed on it"
            for s in sessions:
                await s.link.aclose()
            assert upstream.reap_idle_shared() == 2, "idle and without sessions: all but one stopped"
            assert sum(c.running for c in shared.children) == 1
            assert upstream.spares == 0, "no warm pool beside the shared children"
    finally:
        await upstream.aclose()


async def test_a_dead_child_is_started_again_when_the_running_ones_are_busy(server: tuple[list[str], Path]) -> None:
    command, _ = server
    upstream = StdioUpstream(command, shared_sessions=True, shared_children=2)
    try:
        async with asyncio.timeout(BOUND_S):
            await upstream.probe()
            shared = upstream._shared
            assert shared is not None and upstream.children == 2
            dead = shared.children[1].link._child
            assert dead is not None
            os.killpg(dead.pid, signal.SIGKILL)
            await dead.exited.wait()
            alice, bob = await open_sessions(upstream, 2)
            held = await alice.call("hold")
            shared_call = await bob.call("pid")  # the one running child is alice's: bob shares it...
            assert shared_call.transport_state is shared.children[0]
            await shared.start_all()  # ...while the dead one is started again in the background
            assert shared.children[1].running
            replacement = shared.children[1].link._child
            assert replacement is not None and replacement.pid != dead.pid
            await (await alice.call("release")).response
            await held.response
            await shared_call.response
    finally:
        await upstream.aclose()
