"""The era bridge, second direction: a 2025 client in front of an upstream that speaks only
2026-07-28 (the scripted server over Streamable HTTP behind `--only-2026`, which refuses the 2025
handshake as a 2026-only server does).

Real SDK clients pinned to 2025-11-25 through the real proxy: `initialize` is answered from the
server's `server/discover`; tools, progress, log messages at the level the session set,
structured content (an array wrapped in an object for the 2025 client), resources, prompts and
completion come through; what the server asks of its client through an input-required result
(sampling, elicitation) reaches the 2025 client as a server-to-client request and the call is
re-sent with its answer; a client that did not declare the capability gets a clear error; a call
the upstream fails once is recovered by the engine over the bridge (the upstream sees each
attempt in 2026-07-28, the input-required round trip counts as no attempt); a cancelled call is
cancelled upstream. With `--era-bridge off` the 2025 client is refused as the server would refuse
it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, MCPError
from mcp.types import (
    CreateMessageResult,
    ElicitResult,
    ListRootsResult,
    PromptReference,
    Root,
    TextContent,
)

from tests.fixtures.helpers import REPO_ROOT, ScriptedHTTP, scripted_args
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0
LEGACY = "legacy"  # the SDK client's handshake mode: it negotiates 2025-11-25
MODERN = "2026-07-28"
ONLY_2026_STDIO = REPO_ROOT / "tests/conformance/everything_stdio_2026_only.py"


# ask_elicitation's attempts time out long before a person answers; its deadline does not.
SLOW_PERSON_POLICY = """
tools: [ask_elicitation]
attempts: 2
deadline: 15s
attempt_timeout: 500ms
min_attempt_time: 100ms
"""
PERSON_S = 1.5  # how long the person takes to answer: three attempt timeouts


class Bridged:
    def __init__(self, proxy: ProxyProcess, journal: Journal, log: Path) -> None:
        self.proxy = proxy
        self.journal = journal
        self.log = log


@pytest.fixture(scope="module")
def bridged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridged]:
    tmp = tmp_path_factory.mktemp("era-bridge-legacy")
    journal, state = tmp / "journal.jsonl", tmp / "state.json"
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "ask.yaml").write_text(SLOW_PERSON_POLICY)
    with ScriptedHTTP(journal, state, extra=["--only-2026"]) as server:
        extra = ["--policies", str(policies)]
        with ProxyProcess(upstream_url=server.url, extra=extra, log_path=tmp / "proxy.log") as proxy:
            yield Bridged(proxy, Journal(journal), tmp / "proxy.log")


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def appending_to(heard: dict[str, list[Any]], name: str) -> Any:
    """A client's logging callback that appends each log message's data to `heard[name]`."""

    async def on_log(params: Any) -> None:
        heard[name].append(params.data)

    return on_log


async def test_a_2025_client_is_served_by_a_2026_only_upstream_through_the_bridge(bridged: Bridged) -> None:
    progress: list[float] = []
    logged: list[Any] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async def on_log(params: Any) -> None:
        logged.append(params)

    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=LEGACY, logging_callback=on_log) as client:
            assert client.session.protocol_version == "2025-11-25"
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["echo"].annotations is not None and tools["echo"].annotations.read_only_hint
            echoed = await client.call_tool("echo", {"text": "bridged", "call_id": "l-echo"})
            assert text_of(echoed) == "bridged" and echoed.structured_content == {"text": "bridged"}
            # an array is no structuredContent in 2025: wrapped, and its output schema with it
            numbers = await client.call_tool("numbers", {"count": 3})
            assert numbers.structured_content == {"result": [1, 2, 3]}
            schema = tools["numbers"].output_schema
            assert schema is None or schema["type"] == "object"
            steps = {"steps": 3, "delay_s": 0.01}
            result = await client.call_tool("slow_progress", steps, progress_callback=on_progress)
            assert not result.is_error and progress == [1, 2, 3]
            # no level set: every level, as the SDKs' 2025 servers send until a client sets one
            assert text_of(await client.call_tool("log_then_answer", {"message": "unset"})) == "answered: unset"
            assert [entry.data for entry in logged] == ["unset"]
            await client.set_logging_level("warning")  # the line is at info: below it
            assert text_of(await client.call_tool("log_then_answer", {"message": "quiet"})) == "answered: quiet"
            assert [entry.data for entry in logged] == ["unset"]
            await client.set_logging_level("info")
            assert text_of(await client.call_tool("log_then_answer", {"message": "loud"})) == "answered: loud"
            assert [entry.data for entry in logged] == ["unset", "loud"]
            assert (await client.read_resource("journal://summary")).contents
            assert "Ada" in str((await client.get_prompt("greet", {"name": "Ada"})).messages[0].content)
            await client.send_ping()
    # every request reached the server in 2026-07-28: none in a 2025 revision
    versions = {e.get("protocol_version") for e in bridged.journal.events() if e.get("tool")}
    assert versions == {MODERN}


async def test_an_input_required_result_becomes_requests_to_the_2025_client_and_the_call_is_re_sent(
    bridged: Bridged,
) -> None:
    asked: list[str] = []
    awaiting: list[str] = []

    async def sampling(context: Any, params: Any) -> CreateMessageResult:
        asked.append("sampling")
        async with httpx.AsyncClient(timeout=10) as admin:  # the call is held while its client answers
            scraped = (await admin.get(bridged.proxy.admin + "/metrics")).text
        awaiting.extend(line for line in scraped.splitlines() if line.startswith("mcp_recovery_era_bridge_awaiting"))
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="Paris"), model="m")

    async def elicitation(context: Any, params: Any) -> ElicitResult:
        asked.append("elicitation")
        return ElicitResult(action="accept", content={"answer": "blue"})

    with anyio.fail_after(BOUND_S):
        async with Client(
            bridged.proxy.url, mode=LEGACY, sampling_callback=sampling, elicitation_callback=elicitation
        ) as client:
            sampled = await client.call_tool("ask_sampling", {"prompt": "capital?", "call_id": "l-sample"})
            assert text_of(sampled) == "Paris"
            elicited = await client.call_tool("ask_elicitation", {"question": "colour?", "call_id": "l-elicit"})
            assert text_of(elicited) == "blue"
    assert asked == ["sampling", "elicitation"]
    assert 'mcp_recovery_era_bridge_awaiting_input{client="2025"} 1.0' in awaiting, awaiting
    # the round trip (the call asked, then re-sent with the answer) is one attempt: the engine
    # reports attempts on a result only when it made more than one
    for result in (sampled, elicited):
        assert "io.mcp-recovery-proxy/attempts" not in (result.meta or {})


async def test_a_person_slower_than_the_attempt_timeout_is_waited_for_within_the_deadline_in_one_attempt(
    bridged: Bridged,
) -> None:
    """While the client is asked, only the call's deadline runs: the attempt timeout (500 ms) does
    not end the attempt, so the person is asked once and the call is answered in one attempt.
    The callback's sleep is the person's time to answer, the behaviour under test."""
    asked: list[str] = []

    async def elicitation(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        await anyio.sleep(PERSON_S)
        return ElicitResult(action="accept", content={"answer": "slowly"})

    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=LEGACY, elicitation_callback=elicitation) as client:
            answered = await client.call_tool("ask_elicitation", {"question": "take your time", "call_id": "l-slow"})
    assert text_of(answered) == "slowly" and asked == ["take your time"]
    assert "io.mcp-recovery-proxy/attempts" not in (answered.meta or {})
    assert bridged.journal.executions("ask_elicitation", "l-slow") == 1


async def test_a_client_without_the_capability_asked_for_gets_an_error_that_says_so(bridged: Bridged) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=LEGACY) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("ask_sampling", {"prompt": "q"})
    assert "sampling" in refused.value.error.message


async def test_a_call_failed_once_is_retried_over_the_bridge_in_2026_attempts(bridged: Bridged) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=LEGACY) as client:
            recovered = await client.call_tool("flaky_read", {"key": "l", "fail_times": 1, "call_id": "l-flaky"})
    assert not recovered.is_error and recovered.meta is not None
    assert recovered.meta["io.mcp-recovery-proxy/attempts"] == 2
    attempts = bridged.journal.events("flaky_read", "started", "l-flaky")
    assert len(attempts) == 2 and {e["protocol_version"] for e in attempts} == {MODERN}


async def test_a_cancelled_call_is_cancelled_upstream_through_the_bridge(bridged: Bridged) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=LEGACY) as client:
            with anyio.move_on_after(60) as scope:
                async with anyio.create_task_group() as tg:

                    async def call() -> None:
                        await client.call_tool("hang", {"seconds": 20, "call_id": "l-hang"})

                    tg.start_soon(call)
                    await bridged.journal.await_for(
                        lambda j: j.events("hang", "started", "l-hang"), timeout_s=10, what="the call upstream"
                    )
                    tg.cancel_scope.cancel()
            assert not scope.cancelled_caught
        await bridged.journal.await_for(
            lambda j: j.events("hang", "cancelled", "l-hang"), timeout_s=10, what="the cancellation upstream"
        )


def test_readiness_and_the_start_up_log_say_2025_clients_are_bridged(bridged: Bridged) -> None:
    ready = httpx.get(bridged.proxy.admin + "/readyz", timeout=10).json()
    assert ready["eras"] == {"legacy": False, "modern": True}
    assert ready["served"] == {"2025": "bridged", "2026-07-28": "native"}
    assert "clients served: 2025 bridged, 2026-07-28 native" in bridged.log.read_text()


async def test_with_the_bridge_off_a_2025_client_is_refused_as_the_server_would_refuse_it(tmp_path: Path) -> None:
    journal, state = tmp_path / "journal.jsonl", tmp_path / "state.json"
    with ScriptedHTTP(journal, state, extra=["--only-2026"]) as server:
        off = ["--era-bridge", "off"]
        with ProxyProcess(upstream_url=server.url, extra=off, log_path=tmp_path / "p.log") as proxy:
            with anyio.fail_after(BOUND_S):
                with pytest.raises(Exception):  # noqa: B017 - the SDK's handshake error, whatever its class
                    async with Client(proxy.url, mode=LEGACY) as client:
                        await client.list_tools()
                async with Client(proxy.url, mode=MODERN) as client:
                    assert text_of(await client.call_tool("echo", {"text": "modern"})) == "modern"


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """The proxy in front of the SDK's everything-server over stdio restricted to 2026-07-28
    (the conformance suite's wrapper). Its `server/discover` names only 2026-07-28, as a dual-era
    stdio server's does: the proxy learns it speaks no 2025 from the first session's `initialize`."""
    pytest.importorskip("mcp_everything_server", reason="scripts/setup-conformance.sh installs it")
    tmp = tmp_path_factory.mktemp("era-bridge-legacy-everything")
    command = [sys.executable, str(REPO_ROOT / "tests/conformance/everything_stdio_2026_only.py")]
    with ProxyProcess(upstream=command, log_path=tmp / "proxy.log") as proxy:
        yield proxy


async def test_over_stdio_the_first_session_finds_the_server_2026_only_and_everything_crosses_the_bridge(
    everything: ProxyProcess,
) -> None:
    asked: list[str] = []

    async def elicitation(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        if "color" in params.message:
            return ElicitResult(action="accept", content={"color": "green"})
        if "context" in params.message:
            return ElicitResult(action="accept", content={"context": "bridged"})
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def roots(context: Any) -> ListRootsResult:
        asked.append("roots")
        return ListRootsResult(roots=[Root(uri="file:///srv/a"), Root(uri="file:///srv/b")])

    tools_changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            tools_changed.set()

    with anyio.fail_after(BOUND_S):
        async with Client(
            everything.url,
            mode=LEGACY,
            elicitation_callback=elicitation,
            list_roots_callback=roots,
            message_handler=on_message,
        ) as client:
            assert client.session.protocol_version == "2025-11-25"
            rounds = await client.call_tool("test_input_required_result_multi_round", {})
            assert text_of(rounds) == "Ada likes green."
            counted = await client.call_tool("test_input_required_result_list_roots", {})
            assert text_of(counted) == "Client exposed 2 root(s)."
            prompt = await client.get_prompt("test_input_required_result_prompt")
            assert "Use the following context: bridged" in str(prompt.messages[0].content)
            # The client declared no sampling: the server asks only what it may (its capability
            # gate), and asks for ever (its conformance fixture never completes): the bridge stops
            # after 16 rounds with an error that says so, the client asked 16 times.
            before = len(asked)
            gated = await client.call_tool("test_input_required_result_capabilities", {})
            assert gated.is_error and "more than 16 times" in str(gated.meta)
            assert asked[before:] == ["What is your name?"] * 16
            ref = PromptReference(type="ref/prompt", name="test_prompt_with_arguments")
            completed = await client.complete(ref, {"name": "arg1", "value": "x"})
            assert completed.completion.values == []
            # a subscription opens the session's listen stream upstream, with the list changes
            # the server offers: its tools list_changed reaches the 2025 client
            await client.subscribe_resource("test://watched-resource")
            assert text_of(await client.call_tool("test_trigger_tool_change", {})) == "tool list changed"
            await tools_changed.wait()
            await client.unsubscribe_resource("test://watched-resource")
    # discover names only 2026-07-28, as a dual-era stdio server's does: the first session's
    # refused initialize told the proxy, which now says so
    async with httpx.AsyncClient(timeout=10) as http:
        ready = (await http.get(everything.admin + "/readyz")).json()
    assert ready["served"] == {"2025": "bridged", "2026-07-28": "native"}
    assert asked[:3] == ["Step 1: What is your name?", "Step 2: What is your favorite color?", "roots"]
    assert "What context should the prompt use?" in asked


async def test_over_stdio_a_log_message_reaches_the_one_call_in_flight_at_its_sessions_level_and_none_of_two(
    tmp_path: Path,
) -> None:
    """A 2026 server over stdio names no request in its log messages. While one bridged call is the
    only request in flight on the server's link, its log message is that call's: it reaches the
    2025 client at or above the level its session set (none below it). While two are in flight it
    could be either's, so it reaches neither (a log line may carry one caller's data)."""
    journal = tmp_path / "journal.jsonl"
    release = tmp_path / "release"
    server = [sys.executable, str(ONLY_2026_STDIO), *scripted_args("stdio", journal)]
    heard: dict[str, list[Any]] = {"info": [], "warning": [], "busy": []}

    with ProxyProcess(upstream=server, log_path=tmp_path / "p.log") as proxy, anyio.fail_after(BOUND_S):
        async with (
            Client(proxy.url, mode=LEGACY, logging_callback=appending_to(heard, "info")) as info,
            Client(proxy.url, mode=LEGACY, logging_callback=appending_to(heard, "warning")) as warning,
            Client(proxy.url, mode=LEGACY, logging_callback=appending_to(heard, "busy")) as busy,
        ):
            await info.set_logging_level("info")
            await warning.set_logging_level("warning")
            assert text_of(await info.call_tool("log_then_answer", {"message": "one"})) == "answered: one"
            assert text_of(await warning.call_tool("log_then_answer", {"message": "low"})) == "answered: low"
            assert heard == {"info": ["one"], "warning": [], "busy": []}
            async with anyio.create_task_group() as tg:
                tg.start_soon(busy.call_tool, "hang", {"seconds": BOUND_S, "release": str(release), "call_id": "held"})
                journal_ = Journal(journal)
                await journal_.await_for(lambda j: j.events(event="started", call="held"), timeout_s=BOUND_S)
                answered = await info.call_tool("log_then_answer", {"message": "two"})
                assert text_of(answered) == "answered: two"
                release.touch()
    assert heard == {"info": ["one"], "warning": [], "busy": []}


async def test_over_stdio_a_bridged_calls_log_message_never_reaches_a_native_2026_call_in_flight_beside_it(
    tmp_path: Path,
) -> None:
    """Bridged 2025 sessions and native 2026 callers share the server's process. While a native
    call that asked for log messages and a bridged call are both in flight, a log message that
    names no request could be either's (and carry its caller's data): it reaches neither, however
    many request streams the native side has open."""
    journal = tmp_path / "journal.jsonl"
    release = tmp_path / "release"
    server = [sys.executable, str(ONLY_2026_STDIO), *scripted_args("stdio", journal)]
    heard: dict[str, list[Any]] = {"native": [], "bridged": []}

    with ProxyProcess(upstream=server, log_path=tmp_path / "p.log") as proxy, anyio.fail_after(BOUND_S):
        async with (
            Client(proxy.url, mode=LEGACY, logging_callback=appending_to(heard, "bridged")) as bridged,
            Client(proxy.url, mode=MODERN, logging_callback=appending_to(heard, "native"), log_level="debug") as native,
        ):
            await bridged.set_logging_level("debug")
            async with anyio.create_task_group() as tg:
                hold = {"seconds": BOUND_S, "release": str(release), "call_id": "native-held"}
                tg.start_soon(native.call_tool, "hang", hold)
                await Journal(journal).await_for(
                    lambda j: j.events(event="started", call="native-held"), timeout_s=BOUND_S
                )
                answered = await bridged.call_tool("log_then_answer", {"message": "bridged's secret"})
                assert text_of(answered) == "answered: bridged's secret"
                release.touch()
            # alone on the link again, each side gets its own call's line
            await bridged.call_tool("log_then_answer", {"message": "bridged alone"})
            await native.call_tool("log_then_answer", {"message": "native alone"})
    assert heard == {"native": ["native alone"], "bridged": ["bridged alone"]}, heard


async def test_with_shared_stdio_children_a_2025_client_of_a_2026_only_server_is_bridged(tmp_path: Path) -> None:
    """`--stdio-sessions shared`: the proxy initializes the shared children itself, and a 2026-only
    server refuses that. The first 2025 client's session moves onto the bridge (not refused), and
    readiness says 2025 is bridged from then on."""
    journal = tmp_path / "journal.jsonl"
    server = [sys.executable, str(ONLY_2026_STDIO), *scripted_args("stdio", journal)]
    shared = ["--stdio-sessions", "shared"]
    with ProxyProcess(upstream=server, extra=shared, log_path=tmp_path / "p.log") as proxy, anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=LEGACY) as client:
            assert client.session.protocol_version == "2025-11-25"
            assert text_of(await client.call_tool("echo", {"text": "shared", "call_id": "s-echo"})) == "shared"
        async with httpx.AsyncClient(timeout=10) as admin:
            ready = (await admin.get(proxy.admin + "/readyz")).json()
    assert ready["served"] == {"2025": "bridged", "2026-07-28": "native"}, ready
    (started,) = Journal(journal).events(event="started", call="s-echo")
    assert started["protocol_version"] == MODERN


OTHER_REFUSAL = """
import sys
sys.path.insert(0, {folder!r})
import everything_stdio_2026_only as only_2026

def refusal(message):
    answer = only_2026.refusal(message)
    if answer is not None and message.get("method") == "initialize":  # not "not this revision"
        answer["error"] = {{"code": -32603, "message": "warming up, try again"}}
    return answer

sys.exit(only_2026.relay(refusal, sys.argv[1:]))
"""


async def test_shared_stdio_children_refusing_initialize_for_another_reason_are_not_taken_for_2026_only(
    tmp_path: Path,
) -> None:
    """A refusal of the shared children's `initialize` moves 2025 sessions onto the bridge only when
    it means "not this revision" (-32022, -32601). Another refusal (here -32603 while the server
    warms up) reaches the client as an error naming it, and settles nothing: 2025 is not
    reported as bridged."""
    journal = tmp_path / "journal.jsonl"
    wrapper = tmp_path / "refuses_otherwise.py"
    wrapper.write_text(OTHER_REFUSAL.format(folder=str(ONLY_2026_STDIO.parent)))
    server = [sys.executable, str(wrapper), *scripted_args("stdio", journal)]
    shared = ["--stdio-sessions", "shared"]
    with ProxyProcess(upstream=server, extra=shared, log_path=tmp_path / "p.log") as proxy, anyio.fail_after(BOUND_S):
        with pytest.raises(Exception) as refused:  # the SDK client raises its own error type
            async with Client(proxy.url, mode=LEGACY) as client:
                await client.call_tool("echo", {"text": "x", "call_id": "never"})
        async with httpx.AsyncClient(timeout=10) as admin:
            ready = (await admin.get(proxy.admin + "/readyz")).json()
    assert "warming up, try again" in repr(refused.value), repr(refused.value)
    assert ready["served"].get("2025") != "bridged", ready
    assert not Journal(journal).events(call="never")


async def test_a_2025_client_cancelling_a_call_while_it_is_asked_ends_the_rounds_and_the_session_goes_on(
    bridged: Bridged,
) -> None:
    """The 2025 client cancels its call while the bridge asks it for the server's input: the call is
    not sent again with answers (the tool's body never runs), the bridge holds nothing for it any
    longer, and the session serves the next call."""
    asked = anyio.Event()

    async def elicitation(context: Any, params: Any) -> ElicitResult:
        asked.set()
        await anyio.sleep_forever()  # the person never answers: the client cancels instead
        raise AssertionError("unreachable")

    async def awaiting(admin: httpx.AsyncClient) -> str:
        scraped = (await admin.get(bridged.proxy.admin + "/metrics")).text
        (line,) = [
            x for x in scraped.splitlines() if x.startswith('mcp_recovery_era_bridge_awaiting_input{client="2025"}')
        ]
        return line.split()[-1]

    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=LEGACY, elicitation_callback=elicitation) as client:
            async with httpx.AsyncClient(timeout=10) as admin, anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "ask_elicitation", {"question": "stay?", "call_id": "l-cancelled"})
                await asked.wait()
                assert await awaiting(admin) == "1.0"
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled for the call
            async with httpx.AsyncClient(timeout=10) as admin:
                while await awaiting(admin) != "0.0":  # noqa: ASYNC110 - a gauge: nothing to wait on
                    await anyio.sleep(0.05)
            assert text_of(await client.call_tool("echo", {"text": "after"})) == "after"
    # the tool's body runs only once it has its answer (the server asked before it): never here
    assert bridged.journal.events(call="l-cancelled") == []
