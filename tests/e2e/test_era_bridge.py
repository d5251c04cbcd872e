"""The era bridge: a 2026-07-28 client in front of an upstream that speaks only the 2025 handshake
revisions (the scripted server over legacy SSE, a transport of the 2025 era only).

Real SDK 2026 clients through the real proxy: the client's `server/discover` is answered from the
proxy's 2025 session, its tools, progress, log messages (by the level it asks for), resources and
prompts come through, a call the upstream fails once is recovered by the engine over the bridge
(the upstream sees each attempt in the 2025 revision), and what a 2025 server asks of its client
mid-call is answered with an error that names the bridge. With `--era-bridge off` the 2026 client is
refused as the server itself would refuse it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, MCPError
from mcp.types import (
    CallToolResult,
    CreateMessageResult,
    ElicitResult,
    InputRequiredResult,
    ListRootsResult,
    Root,
    TextContent,
)
from prometheus_client.parser import text_string_to_metric_families
from pydantic import FileUrl

from tests.fixtures.helpers import PYTHON, REPO_ROOT, ScriptedHTTP, scripted_args
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0
MODERN = "2026-07-28"
ONLY_2025_STDIO = REPO_ROOT / "tests/conformance/everything_stdio_2025_only.py"


class Bridged:
    def __init__(self, proxy: ProxyProcess, journal: Journal, log: Path) -> None:
        self.proxy = proxy
        self.journal = journal
        self.log = log


@pytest.fixture(scope="module")
def bridged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridged]:
    tmp = tmp_path_factory.mktemp("era-bridge")
    journal, state = tmp / "journal.jsonl", tmp / "state.json"
    with ScriptedHTTP(journal, state, transport="sse") as server:
        with ProxyProcess(upstream_url="sse+" + server.url, log_path=tmp / "proxy.log") as proxy:
            yield Bridged(proxy, Journal(journal), tmp / "proxy.log")


def wait_for_line(path: Path, text: str, timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"{text!r} not in {path}"
        time.sleep(0.05)


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_a_2026_client_is_served_by_a_2025_only_upstream_through_the_bridge(bridged: Bridged) -> None:
    progress: list[float] = []
    logged: list[Any] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async def on_log(params: Any) -> None:
        logged.append(params)

    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=MODERN, logging_callback=on_log) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["echo"].annotations is not None and tools["echo"].annotations.read_only_hint
            assert text_of(await client.call_tool("echo", {"text": "bridged", "call_id": "b-echo"})) == "bridged"
            steps = {"steps": 3, "delay_s": 0.01}
            result = await client.call_tool("slow_progress", steps, progress_callback=on_progress)
            assert not result.is_error and progress == [1, 2, 3]
            # no log level asked: a 2026 server sends no log message, and neither does the bridge
            assert text_of(await client.call_tool("log_then_answer", {"message": "quiet"})) == "answered: quiet"
            assert (await client.read_resource("journal://summary")).contents
            assert "Ada" in str((await client.get_prompt("greet", {"name": "Ada"})).messages[0].content)
            recovered = await client.call_tool("flaky_read", {"key": "bridge", "fail_times": 1, "call_id": "b-flaky"})
            assert not recovered.is_error and recovered.meta["io.mcp-recovery-proxy/attempts"] == 2
        assert logged == []
        async with Client(bridged.proxy.url, mode=MODERN, logging_callback=on_log, log_level="info") as client:
            assert text_of(await client.call_tool("log_then_answer", {"message": "shared"})) == "answered: shared"
        # Over legacy SSE (and stdio) a 2025 server's log message is tied to no request, and the
        # bridged session is shared by every 2026 caller: it goes to none of them.
        assert logged == []
        async with Client(bridged.proxy.url, mode="auto") as client:  # probes server/discover first
            assert client.protocol_version == MODERN
            assert client.server_info is not None and client.server_info.name == "scripted-upstream"
    # the upstream saw each call, and each attempt of the recovered one, in the 2025 revision
    for call_id, executions in (("b-echo", 1), ("b-flaky", 2)):
        started = bridged.journal.events(event="started", call=call_id)
        assert len(started) == executions
        assert {e["protocol_version"] for e in started} <= {"2025-11-25", "2025-06-18"}, started
        assert all("io.modelcontextprotocol/protocolVersion" not in e["attempt_key"]["meta"] for e in started)


def test_readiness_and_the_start_up_log_say_2026_clients_are_bridged(bridged: Bridged) -> None:
    ready = httpx.get(bridged.proxy.admin + "/readyz", timeout=10).json()
    assert ready["eras"] == {"legacy": True, "modern": False}
    assert ready["served"] == {"2025": "native", "2026-07-28": "bridged"}
    assert "clients served: 2025 native, 2026-07-28 bridged" in bridged.log.read_text()


async def test_what_a_2025_server_asks_mid_call_reaches_the_2026_client_as_input_required_rounds(
    bridged: Bridged,
) -> None:
    """A 2026 client that declares sampling, elicitation and roots is asked what the 2025 server
    asks of its client mid-call (over legacy SSE: requests that name no call), through
    input-required results its SDK answers by retrying; each tool runs once, whatever the rounds."""
    asked: list[str] = []

    async def sampling(context: Any, params: Any) -> CreateMessageResult:
        asked.append("sampling")
        prompt = params.messages[0].content.text
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text=f"model: {prompt}"), model="m"
        )

    async def elicitation(context: Any, params: Any) -> ElicitResult:
        asked.append("elicitation")
        return ElicitResult(action="accept", content={"answer": f"user: {params.message}"})

    async def roots(context: Any) -> ListRootsResult:
        asked.append("roots")
        return ListRootsResult(roots=[Root(uri=FileUrl("file:///srv/a")), Root(uri=FileUrl("file:///srv/b"))])

    callbacks = {"sampling_callback": sampling, "elicitation_callback": elicitation, "list_roots_callback": roots}
    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=MODERN, **callbacks) as client:
            sampled = await client.call_tool("ask_sampling", {"prompt": "q1", "call_id": "ir-sampling"})
            assert text_of(sampled) == "model: q1"
            answered = await client.call_tool("ask_elicitation", {"question": "name?", "call_id": "ir-elicit"})
            assert text_of(answered) == "user: name?"
            listed = await client.call_tool("ask_roots", {"call_id": "ir-roots"})
            assert text_of(listed).splitlines() == ["file:///srv/a", "file:///srv/b"]
            both = await client.call_tool("ask_then_sample", {"question": "who?", "call_id": "ir-two"})
            assert text_of(both) == "model: user: who?"
            assert text_of(await client.call_tool("echo", {"text": "plain"})) == "plain"
    assert asked == ["sampling", "elicitation", "roots", "elicitation", "sampling"]
    for call_id in ("ir-sampling", "ir-elicit", "ir-roots", "ir-two"):
        assert len(bridged.journal.events(event="started", call=call_id)) == 1, call_id


async def test_an_input_required_round_is_answered_by_key_and_a_wrong_request_state_starts_nothing(
    bridged: Bridged,
) -> None:
    async def never(context: Any, params: Any) -> ElicitResult:
        raise AssertionError("driven by hand here")

    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=MODERN, elicitation_callback=never) as client:
            session = client.session
            args = {"question": "colour?", "call_id": "ir-by-hand"}
            first = await session.call_tool("ask_elicitation", args, allow_input_required=True)
            assert isinstance(first, InputRequiredResult) and first.request_state
            ((key, request),) = first.input_requests.items()
            assert request.method == "elicitation/create" and request.params.message == "colour?"
            # a state this proxy never issued, or one used for another tool: refused, nothing runs
            for name, state in (("ask_elicitation", "forged"), ("ask_sampling", first.request_state)):
                with pytest.raises(MCPError) as refused:
                    await session.call_tool(
                        name, args, request_state=state, input_responses={}, allow_input_required=True
                    )
                assert refused.value.error.code == -32602
            # the retry that leaves the question unanswered is asked it again
            again = await session.call_tool(
                "ask_elicitation",
                args,
                request_state=first.request_state,
                input_responses={},
                allow_input_required=True,
            )
            assert isinstance(again, InputRequiredResult) and list(again.input_requests) == [key]
            reply = {key: ElicitResult(action="accept", content={"answer": "blue"})}
            done = await session.call_tool(
                "ask_elicitation",
                args,
                request_state=again.request_state,
                input_responses=reply,
                allow_input_required=True,
            )
            assert isinstance(done, CallToolResult) and text_of(done) == "blue"
            # its state is spent
            with pytest.raises(MCPError) as spent:
                await session.call_tool(
                    "ask_elicitation", args, request_state=again.request_state, input_responses=reply
                )
            assert spent.value.error.code == -32602
    assert len(bridged.journal.events(event="started", call="ir-by-hand")) == 1


async def test_a_2026_client_that_declares_no_capability_is_refused_by_the_server_as_it_came(
    bridged: Bridged,
) -> None:
    """Without the client's capability the bridge's shared session carries the call, and a server
    that honours capabilities (this SDK server does) refuses it with -32021 naming what it needed."""
    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=MODERN) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("ask_sampling", {"prompt": "q"})
    assert refused.value.error.code == -32021 and "sampling" in refused.value.error.message


async def test_a_parked_request_whose_client_never_answers_is_cancelled_upstream(tmp_path: Path) -> None:
    journal, state = tmp_path / "journal.jsonl", tmp_path / "state.json"
    with ScriptedHTTP(journal, state, transport="sse") as server:
        wait = ["--era-bridge-input-wait-s", "0.5"]
        with ProxyProcess(upstream_url="sse+" + server.url, extra=wait, log_path=tmp_path / "p.log") as proxy:

            async def never(context: Any, params: Any) -> ElicitResult:
                raise AssertionError("never answered")

            with anyio.fail_after(BOUND_S):
                async with Client(proxy.url, mode=MODERN, elicitation_callback=never) as client:
                    args = {"question": "still there?", "call_id": "ir-expired"}
                    first = await client.session.call_tool("ask_elicitation", args, allow_input_required=True)
                    assert isinstance(first, InputRequiredResult)
                    log = tmp_path / "p.log"
                    await anyio.to_thread.run_sync(wait_for_line, log, "was cancelled upstream: the client did not")
                    with pytest.raises(MCPError) as expired:
                        reply = {
                            k: ElicitResult(action="accept", content={"answer": "late"}) for k in first.input_requests
                        }
                        await client.session.call_tool(
                            "ask_elicitation", args, request_state=first.request_state, input_responses=reply
                        )
                    assert expired.value.error.code == -32602 and "expired" in expired.value.error.message


async def test_with_the_bridge_off_a_2026_client_is_refused_as_the_server_would_refuse_it(tmp_path: Path) -> None:
    journal, state = tmp_path / "journal.jsonl", tmp_path / "state.json"
    with ScriptedHTTP(journal, state, transport="sse") as server:
        off = ["--era-bridge", "off"]
        proxy = ProxyProcess(upstream_url="sse+" + server.url, extra=off, log_path=tmp_path / "p.log")
        with proxy:
            with anyio.fail_after(BOUND_S):
                with pytest.raises(Exception):  # noqa: B017 - the SDK's era negotiation error, whatever its class
                    async with Client(proxy.url, mode=MODERN) as client:
                        await client.list_tools()
                async with Client(proxy.url, mode="auto") as client:  # falls back to the handshake
                    assert text_of(await client.call_tool("echo", {"text": "handshake"})) == "handshake"


async def test_a_listen_streams_resource_is_subscribed_again_when_the_bridged_child_is_replaced(
    tmp_path: Path,
) -> None:
    """In front of a 2025-only stdio server that notifies only the resources its session subscribed
    to: after the bridged session's child is killed and respawned (the handshake replayed), the
    resource a listen stream names is subscribed on the new child, and its updates arrive again."""
    server = [PYTHON, str(REPO_ROOT / "tests/conformance/everything_stdio_2025_only.py")]
    server.append(str(REPO_ROOT / "tests/e2e/shared_server.py"))
    uri = "file:///shared/watched"
    proxy = ProxyProcess(upstream=server, env={"SHARED_SERVER_SUBSCRIBED_ONLY": "1"}, log_path=tmp_path / "p.log")
    with proxy, anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=MODERN) as client:
            async with client.listen(resource_subscriptions=[uri]) as stream:
                assert stream.honored.resource_subscriptions == [uri]
                updates = aiter(stream)

                async def touched_until_updated() -> None:
                    # the subscription is made on the session as the stream opens, and again after a
                    # respawn: touch until the server sees it (each touch is answered either way)
                    with anyio.fail_after(BOUND_S):
                        while True:
                            if text_of(await client.call_tool("touch", {"uri": uri})) == "touched":
                                break
                            await anyio.sleep(0.05)
                    event = await anext(updates)
                    assert getattr(event, "uri", None) == uri, event

                await touched_until_updated()
                wrapper = int(text_of(await client.call_tool("ppid", {})))
                os.kill(wrapper, signal.SIGKILL)  # the bridged session's child (the 2025-only wrapper)
                await touched_until_updated()
                assert int(text_of(await client.call_tool("ppid", {}))) != wrapper


async def test_over_streamable_http_a_log_message_of_the_call_reaches_it_at_the_level_it_asked(
    tmp_path: Path,
) -> None:
    """Over streamable HTTP a 2025 server's log message during a call comes on the call's own
    response stream, so the bridge knows whose it is: it reaches that call at or above the level
    the request asked for, and none without one (the server logs at info)."""
    journal, state = tmp_path / "journal.jsonl", tmp_path / "state.json"
    with ScriptedHTTP(journal, state, transport="http", extra=["--legacy-only"]) as server:
        with ProxyProcess(upstream_url=server.url, log_path=tmp_path / "p.log") as proxy:
            async with httpx.AsyncClient(timeout=10) as admin:
                ready = (await admin.get(proxy.admin + "/readyz")).json()
            assert ready["served"] == {"2025": "native", "2026-07-28": "bridged"}, ready
            heard: dict[str | None, list[Any]] = {}
            with anyio.fail_after(BOUND_S):
                for level in (None, "warning", "info", "debug"):
                    got = heard.setdefault(level, [])

                    async def on_log(params: Any, got: list[Any] = got) -> None:
                        got.append(params)

                    async with Client(proxy.url, mode=MODERN, logging_callback=on_log, log_level=level) as client:
                        answer = await client.call_tool("log_then_answer", {"message": f"at {level}"})
                        assert text_of(answer) == f"answered: at {level}"
    assert heard[None] == [] and heard["warning"] == []
    for level in ("info", "debug"):
        assert [(p.level, p.data) for p in heard[level]] == [("info", f"at {level}")], heard[level]


async def scrape(admin: httpx.AsyncClient, base: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = (await admin.get(base + "/metrics")).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return scraped.get(("mcp_recovery_" + name, frozenset(labels.items())), 0.0)


async def test_the_first_call_whose_server_asks_its_client_runs_on_a_process_started_before_any_2026_request(
    tmp_path: Path,
) -> None:
    """In front of a 2025-only stdio server, a process for the bridge's interactive sessions is
    started ahead (and has answered `ping`) before any 2026 client came: the first call declaring
    elicitation runs on it instead of waiting for a process start. While its client is asked, the
    request is counted as awaiting input, and the round is counted."""
    journal = tmp_path / "journal.jsonl"
    server = [PYTHON, str(ONLY_2025_STDIO), *scripted_args("stdio", journal)]
    seen: dict[str, float] = {}
    proxy = ProxyProcess(upstream=server, log_path=tmp_path / "p.log", shipped_defaults=True)  # the pool starts it
    with proxy, anyio.fail_after(BOUND_S):
        async with httpx.AsyncClient(timeout=10) as admin:
            # the started-ahead process answers its ping: the gauge says so (no event to wait on here)
            while metric(await scrape(admin, proxy.admin), "era_bridge_sessions", state="reserved") != 1:  # noqa: ASYNC110
                await anyio.sleep(0.05)
            before = time.time()

            async def elicitation(context: Any, params: Any) -> ElicitResult:
                seen["awaiting"] = metric(await scrape(admin, proxy.admin), "era_bridge_awaiting_input", client="2026")
                return ElicitResult(action="accept", content={"answer": "early"})

            async with Client(proxy.url, mode=MODERN, elicitation_callback=elicitation) as client:
                answered = await client.call_tool("ask_elicitation", {"question": "q?", "call_id": "first-ask"})
            assert text_of(answered) == "early"
            after = await scrape(admin, proxy.admin)
    events = Journal(journal)
    (started,) = events.events(event="started", call="first-ask")
    (boot,) = [e for e in events.events(event="boot") if e["pid"] == started["pid"]]
    assert boot["t"] < before, "the call's server process started after the 2026 client came"
    assert seen["awaiting"] == 1
    assert metric(after, "era_bridge_input_rounds_total", client="2026") == 1
    assert metric(after, "era_bridge_fallbacks_total", reason="busy") == 0


async def test_with_every_interactive_session_busy_a_request_goes_over_the_shared_session_and_is_counted(
    tmp_path: Path,
) -> None:
    """With one interactive session allowed and it holding a parked request, another client's request
    declaring elicitation is served over the bridge's shared session, and counted as a fallback."""
    journal, state = tmp_path / "journal.jsonl", tmp_path / "state.json"
    seen: dict[str, float] = {}
    with ScriptedHTTP(journal, state, transport="sse") as server:
        one = ["--era-bridge-sessions", "1"]
        with ProxyProcess(upstream_url="sse+" + server.url, extra=one, log_path=tmp_path / "p.log") as proxy:
            async with (
                httpx.AsyncClient(timeout=10) as admin,
                Client(proxy.url, mode=MODERN, elicitation_callback=lambda context, params: None) as other,
            ):

                async def elicitation(context: Any, params: Any) -> ElicitResult:
                    busy = await scrape(admin, proxy.admin)
                    seen["busy"] = metric(busy, "era_bridge_sessions", state="busy")
                    fallbacks = metric(busy, "era_bridge_fallbacks_total", reason="busy")
                    assert text_of(await other.call_tool("echo", {"text": "beside"})) == "beside"
                    # the call, and the listing its client may make first: each over the shared session
                    scraped = await scrape(admin, proxy.admin)
                    seen["fallbacks"] = metric(scraped, "era_bridge_fallbacks_total", reason="busy") > fallbacks
                    return ElicitResult(action="accept", content={"answer": "held"})

                with anyio.fail_after(BOUND_S):
                    async with Client(proxy.url, mode=MODERN, elicitation_callback=elicitation) as client:
                        answered = await client.call_tool("ask_elicitation", {"question": "q?"})
                assert text_of(answered) == "held"
    assert seen == {"busy": 1, "fallbacks": True}


def modern_post(url: str, request_id: int, arguments: dict[str, Any], extra: dict[str, Any]) -> httpx.Response:
    """A 2026-07-28 `tools/call` of `ask_elicitation` as a client sends it, with `extra` params."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    }
    params = {"name": "ask_elicitation", "arguments": arguments, "_meta": meta, **extra}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "ask_elicitation",
    }
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return httpx.post(url, json=body, headers=headers, timeout=BOUND_S)


def answer_of(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("application/json"):
        return response.json()
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    answers = [json.loads(d) for d in data if d and '"id"' in d]
    return answers[-1]


async def test_malformed_input_responses_start_nothing_and_leave_the_request_held(bridged: Bridged) -> None:
    """Retries of a held request with answers it cannot use: `inputResponses` that is not an object
    is refused (-32602), answers under keys it never asked and answers that are not objects leave
    its question asked again (a new round), a body over the proxy's bound is refused (413); none
    of them resumes or re-runs the call, and the proper answer still completes it, once. An answer
    of the wrong shape goes to the server, which refuses it as a tool error."""
    args = {"question": "size?", "call_id": "ir-malformed"}

    async def never(context: Any, params: Any) -> ElicitResult:
        raise AssertionError("driven by hand here")

    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=MODERN, elicitation_callback=never) as client:
            first = await client.session.call_tool("ask_elicitation", args, allow_input_required=True)
            assert isinstance(first, InputRequiredResult) and first.request_state
            (key,) = first.input_requests
            post = functools.partial(modern_post, bridged.proxy.url)
            state = first.request_state
            refused = answer_of(
                await anyio.to_thread.run_sync(post, 11, args, {"requestState": state, "inputResponses": "yes"})
            )
            assert refused["error"]["code"] == -32602, refused
            for n, responses in enumerate(({"unknown-9": {"action": "accept"}}, {key: "accept"})):
                extra = {"requestState": state, "inputResponses": responses}
                again = answer_of(await anyio.to_thread.run_sync(post, 12 + n, args, extra))
                assert again["result"]["resultType"] == "input_required", again
                assert list(again["result"]["inputRequests"]) == [key]
                state = again["result"]["requestState"]
            huge = {key: {"action": "accept", "content": {"answer": "x" * (4 * 1024 * 1024)}}}
            too_big = await anyio.to_thread.run_sync(post, 20, args, {"requestState": state, "inputResponses": huge})
            assert too_big.status_code == 413
            reply = {key: ElicitResult(action="accept", content={"answer": "medium"})}
            done = await client.session.call_tool(
                "ask_elicitation", args, request_state=state, input_responses=reply, allow_input_required=True
            )
            assert isinstance(done, CallToolResult) and text_of(done) == "medium"
            # an answer of the wrong shape reaches the server, whose own check refuses it: a tool
            # error the engine classifies (validation: not retried), not a second execution
            shape_args = {"question": "shape?", "call_id": "ir-shape"}
            asked = await client.session.call_tool("ask_elicitation", shape_args, allow_input_required=True)
            assert isinstance(asked, InputRequiredResult)
            wrong = {"requestState": asked.request_state, "inputResponses": {key: {"action": "maybe"}}}
            refused = answer_of(await anyio.to_thread.run_sync(post, 30, shape_args, wrong))
            assert refused["result"]["isError"] is True, refused
            assert refused["result"]["structuredContent"]["errorCategory"] == "validation"
    assert len(bridged.journal.events(event="started", call="ir-malformed")) == 1
    assert bridged.journal.events(event="started", call="ir-shape") == []


async def test_the_process_started_ahead_gives_its_place_to_a_2025_client_at_the_session_limit(
    tmp_path: Path,
) -> None:
    """`--max-sessions 1` in front of a 2025-only stdio server: the one upstream session the limit
    allows is the bridge's process started ahead until a 2025 client comes; that client's session
    gets it (the reserve is closed), rather than a refusal."""
    journal = tmp_path / "journal.jsonl"
    server = [PYTHON, str(ONLY_2025_STDIO), *scripted_args("stdio", journal)]
    one = ["--max-sessions", "1"]
    with (
        ProxyProcess(upstream=server, extra=one, log_path=tmp_path / "p.log", shipped_defaults=True) as proxy,
        anyio.fail_after(BOUND_S),
    ):
        async with httpx.AsyncClient(timeout=10) as admin:
            while metric(await scrape(admin, proxy.admin), "era_bridge_sessions", state="reserved") != 1:  # noqa: ASYNC110
                await anyio.sleep(0.05)
            async with Client(proxy.url, mode="legacy") as client:
                assert text_of(await client.call_tool("echo", {"text": "mine"})) == "mine"
            assert metric(await scrape(admin, proxy.admin), "era_bridge_sessions", state="reserved") == 0
