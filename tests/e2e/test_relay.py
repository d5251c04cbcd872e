"""The relay end to end: real SDK clients -> the real proxy process -> the scripted upstream.

Both protocol eras, over real sockets and real stdio pipes. What the upstream did is read from
its own journal, never from the proxy's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import CreateMessageResult, TextContent

from tests.fixtures.helpers import PYTHON, REPO_ROOT
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, pid_alive, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
ERAS = ["legacy", "2026-07-28"]
BOUND_S = 20.0


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.jsonl")


@pytest.fixture
def proxy(tmp_path: Path, journal: Journal) -> Iterator[ProxyProcess]:
    """A proxy of the test's own, for a test that reads the upstream's journal or the proxy's log."""
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    with ProxyProcess(upstream=command, log_path=tmp_path / "proxy.log") as p:
        yield p


@pytest.fixture(scope="module")
def shared_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """One proxy for the module's tests that judge only what their own clients get back (no
    journal, log or process count): each opens sessions of its own, which the proxy keeps apart,
    so an earlier test's sessions change nothing such a test sees."""
    tmp = tmp_path_factory.mktemp("relay-shared")
    command = scripted_stdio_command(tmp / "journal.jsonl", tmp / "state.json")
    with ProxyProcess(upstream=command, log_path=tmp / "proxy.log") as p:
        yield p


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


@pytest.mark.parametrize("mode", ERAS)
async def test_tools_resources_prompts_pass_through_http_to_stdio(shared_proxy: ProxyProcess, mode: str) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(shared_proxy.url, mode=mode) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"echo", "flaky_read", "charge", "ask_sampling"} <= names
            assert text_of(await client.call_tool("echo", {"text": "héllo"})) == "héllo"
            resources = await client.list_resources()
            assert any(str(r.uri) == "journal://summary" for r in resources.resources)
            read = await client.read_resource("journal://summary")
            assert read.contents
            prompt = await client.get_prompt("greet", {"name": "Ada"})
            assert "Ada" in str(prompt.messages[0].content)


@pytest.mark.parametrize("mode", ERAS)
async def test_progress_is_relayed_with_the_callers_token(shared_proxy: ProxyProcess, mode: str) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    with anyio.fail_after(BOUND_S):
        async with Client(shared_proxy.url, mode=mode) as client:
            result = await client.call_tool(
                "slow_progress", {"steps": 4, "delay_s": 0.01}, progress_callback=on_progress
            )
    assert not result.is_error
    assert seen == [1, 2, 3, 4]


async def test_sampling_requests_reach_the_client_whose_call_caused_them(shared_proxy: ProxyProcess) -> None:
    """Two legacy clients ask for sampling at the same time; each answers only its own request."""

    def sampler(name: str) -> Any:
        async def callback(context: Any, params: Any) -> CreateMessageResult:
            asked = params.messages[0].content.text
            return CreateMessageResult(
                role="assistant", content=TextContent(type="text", text=f"{name} answers {asked}"), model="m"
            )

        return callback

    results: dict[str, str] = {}

    async def run(name: str) -> None:
        async with Client(shared_proxy.url, mode="legacy", sampling_callback=sampler(name)) as client:
            result = await client.call_tool("ask_sampling", {"prompt": f"question-{name}"})
            results[name] = text_of(result)

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "alice")
            tg.start_soon(run, "bob")
    assert results == {"alice": "alice answers question-alice", "bob": "bob answers question-bob"}


async def test_modern_input_required_results_pass_through(shared_proxy: ProxyProcess) -> None:
    """In 2026-07-28 a server asks through InputRequiredResult (MRTR); the client drives the rounds."""

    async def callback(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="mrtr ok"), model="m")

    with anyio.fail_after(BOUND_S):
        async with Client(shared_proxy.url, mode="2026-07-28", sampling_callback=callback) as client:
            result = await client.call_tool("ask_sampling", {"prompt": "q"})
    assert text_of(result) == "mrtr ok"


@pytest.mark.parametrize("mode", ERAS)
async def test_a_crashed_stdio_child_fails_the_call_promptly_and_the_next_call_gets_a_fresh_one(
    proxy: ProxyProcess, journal: Journal, mode: str
) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=mode) as client:
            assert text_of(await client.call_tool("echo", {"text": "before"})) == "before"
            # A state-changing call whose process died mid-call: answered at once, never repeated.
            crashed = await client.call_tool("charge", {"account": "a", "amount": 1, "then": "crash"})
            assert crashed.is_error and crashed.structured_content["stopReason"] == "outcome_unknown"
            # The same session goes on: a fresh child (handshake replayed for legacy) answers.
            result = await client.call_tool("echo", {"text": "after"})
            assert text_of(result) == "after"
    pids = journal.pids()
    assert len(pids) >= 2, "the upstream was respawned"


@pytest.mark.parametrize("mode", ERAS)
async def test_a_caller_timeout_cancels_the_upstream_attempt(proxy: ProxyProcess, journal: Journal, mode: str) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=mode) as client:
            with pytest.raises(MCPError):
                await client.call_tool("hang", {"seconds": 30, "call_id": f"c-{mode}"}, read_timeout_seconds=0.5)
            # Still inside the session: the cancellation, not the session's end, stopped the handler.
            await journal.await_for(lambda j: j.events(tool="hang", event="cancelled", call=f"c-{mode}"), timeout_s=10)
            # The cancelled request's own HTTP task ended quietly, and the session goes on serving.
            assert text_of(await client.call_tool("echo", {"text": "still here"})) == "still here"
    log = proxy.log_tail(100_000)
    assert "Exception in ASGI application" not in log
    assert "unexpected error" not in log
    assert "Traceback" not in log


async def test_malformed_input_gets_json_rpc_errors_and_the_proxy_keeps_serving(shared_proxy: ProxyProcess) -> None:
    url = shared_proxy.url
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(url, content=b"{not json", headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        r = await http.post(url, content=b'{"jsonrpc":"1.0","id":1,"method":"x"}', headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600
        r = await http.post(url, content=b"[]", headers=headers)
        assert r.status_code == 400
        r = await http.post(url, content=b"x" * (5 * 1024 * 1024), headers=headers)
        assert r.status_code == 413
        r = await http.post(url, content=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', headers=headers)
        assert r.status_code == 400 and "session" in r.json()["error"]["message"].lower()
        r = await http.post(url, content=b"{}", headers={**headers, "mcp-session-id": "nope"})
        assert r.status_code == 400
        r = await http.post(
            url,
            content=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
            headers={**headers, "mcp-session-id": "nope"},
        )
        assert r.status_code == 404
        r = await http.post(url, content=b"{}", headers={**headers, "origin": "http://evil.example"})
        assert r.status_code == 403
        r = await http.post(url, content=b"{}", headers={**headers, "host": "evil.example"})
        assert r.status_code == 421
    with anyio.fail_after(BOUND_S):
        async with Client(url, mode="legacy") as client:
            assert text_of(await client.call_tool("echo", {"text": "still here"})) == "still here"


async def test_stdio_frontend_relays_both_eras(tmp_path: Path, journal: Journal) -> None:
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    params = StdioServerParameters(
        command=PYTHON, args=["-m", "proxy", "serve", "--listen", "stdio", "--", *command], cwd=str(REPO_ROOT)
    )
    for mode in ERAS:
        with anyio.fail_after(BOUND_S):
            async with Client(params, mode=mode) as client:
                assert text_of(await client.call_tool("echo", {"text": mode})) == mode
                seen: list[float] = []

                async def on_progress(p: float, t: float | None, m: str | None, seen: list[float] = seen) -> None:
                    seen.append(p)

                await client.call_tool("slow_progress", {"steps": 2, "delay_s": 0.01}, progress_callback=on_progress)
                assert seen == [1, 2]


def test_no_upstream_process_outlives_a_killed_proxy(tmp_path: Path, journal: Journal) -> None:
    import os
    import signal

    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    proxy = ProxyProcess(upstream=command, log_path=tmp_path / "proxy.log").start()
    try:
        pids = journal.pids()
        assert pids and all(pid_alive(p) for p in pids)
        assert proxy.proc is not None
        os.kill(proxy.proc.pid, signal.SIGKILL)
        proxy.proc.wait(timeout=5)
        journal.wait_for(lambda j: not any(pid_alive(p) for p in j.pids()), timeout_s=10)
    finally:
        proxy.stop()
