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

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, MCPError
from mcp.types import CreateMessageResult, TextContent

from tests.fixtures.helpers import ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0
MODERN = "2026-07-28"


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


async def test_what_a_2025_server_asks_mid_call_is_refused_upstream_and_never_reaches_a_2026_client(
    bridged: Bridged,
) -> None:
    """The bridge's session declares no client capability, so a server that honours capabilities
    (this SDK server does) refuses the call with -32021 naming what it needed, which reaches the
    caller as it came; the 2026 client is never sent a server-to-client request."""
    asked: list[Any] = []

    async def sampling(context: Any, params: Any) -> CreateMessageResult:
        asked.append(params)
        raise AssertionError("a 2026 client is never sent a server request")

    with anyio.fail_after(BOUND_S):
        async with Client(bridged.proxy.url, mode=MODERN, sampling_callback=sampling) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("ask_sampling", {"prompt": "q"})
    assert refused.value.error.code == -32021 and "sampling" in refused.value.error.message
    assert asked == []


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
