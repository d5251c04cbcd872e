"""A 2026-07-28 client in front of the npm reference server-everything, which speaks only the 2025
handshake revisions: the proxy's era bridge serves it (docs/deploy.md, "Eras").

The Python SDK's 2026 client (auto mode: it probes `server/discover`, which the bridge answers)
through the real proxy to the real server over stdio: the era, the server's identity and its
capabilities as 2026 has them (no 2025-11-25 tasks), tools with structured content, prompts,
completion, and `subscriptions/listen`: the server's `resources/updated` for a resource the stream
names (the server sends one every 5 s once `toggle-subscriber-updates` is called) reaches it. And
with the client's sampling, elicitation and roots callbacks, the server's questions reach it through
input-required rounds, in front of the server over stdio and over streamable HTTP.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CreateMessageResult, ElicitResult, ListRootsResult, PromptReference, Root, TextContent
from pydantic import FileUrl

from tests.fixtures.helpers import terminate
from tests.fixtures.ports import free_port
from tests.interop.harness import Prerequisites, started
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.interop, pytest.mark.anyio]
BOUND_S = 60.0
MODERN = "2026-07-28"


@pytest.fixture(scope="module")
def proxy(prereq: Prerequisites, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp: Path = tmp_path_factory.mktemp("era-bridge-everything")
    upstream = [prereq.node, prereq.server_everything, "stdio"]
    with started(ProxyProcess(upstream=upstream, log_path=tmp / "proxy.log")) as running:
        yield running


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_a_2026_client_uses_server_everything_through_the_bridge(proxy: ProxyProcess) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode="auto") as client:
            assert client.protocol_version == MODERN
            assert client.server_info is not None and client.server_info.name == "mcp-servers/everything"
            caps = client.server_capabilities
            assert caps.tools is not None and caps.tools.list_changed
            assert caps.tasks is None, "2025-11-25 tasks are not bridged"
            assert text_of(await client.call_tool("echo", {"message": "bridged"})) == "Echo: bridged"
            structured = await client.call_tool("get-structured-content", {"location": "Chicago"})
            assert not structured.is_error and isinstance(structured.structured_content, dict)
            prompt = await client.get_prompt("args-prompt", {"city": "Paris"})
            assert "Paris" in str(prompt.messages[0].content)
            completion = await client.complete(
                PromptReference(type="ref/prompt", name="completable-prompt"),
                {"name": "department", "value": "E"},
            )
            assert completion.completion.values, completion


async def test_a_2026_listen_stream_gets_the_servers_resource_updates_through_the_bridge(
    proxy: ProxyProcess,
) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode="auto") as client:
            uri = str((await client.list_resources()).resources[0].uri)
            assert not (await client.call_tool("toggle-subscriber-updates", {})).is_error
            async with client.listen(tools_list_changed=True, resource_subscriptions=[uri]) as stream:
                assert stream.honored.tools_list_changed and stream.honored.resource_subscriptions == [uri]
                async for event in stream:
                    assert getattr(event, "uri", None) == uri, event
                    break


@contextlib.contextmanager
def everything_over_streamable_http(prereq: Prerequisites) -> Iterator[str]:
    """server-everything in its streamable HTTP mode on a free loopback port, stopped by its pid."""
    port = free_port()
    env = {**prereq.node_env(), "PORT": str(port)}
    proc = subprocess.Popen(
        [prereq.node, prereq.server_everything, "streamableHttp"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server-everything did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        terminate(proc)


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
async def test_server_everything_asks_a_2026_client_for_sampling_elicitation_and_roots_through_the_bridge(
    prereq: Prerequisites, tmp_path: Path, transport: str
) -> None:
    """Its three asking tools, which it registers only for a client that declared the capability,
    are listed to and run for a 2026 client with the callbacks: each question reaches the client
    through input-required rounds, over stdio (requests that name no call) and over streamable
    HTTP (requests on the call's own response stream)."""
    asked: list[str] = []

    async def sampling(context: Any, params: Any) -> CreateMessageResult:
        asked.append("sampling")
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled"), model="m")

    async def elicitation(context: Any, params: Any) -> ElicitResult:
        asked.append("elicitation")
        return ElicitResult(action="decline")

    async def roots(context: Any) -> ListRootsResult:
        asked.append("roots")
        return ListRootsResult(roots=[Root(uri=FileUrl("file:///srv/bridged"), name="bridged")])

    callbacks = {"sampling_callback": sampling, "elicitation_callback": elicitation, "list_roots_callback": roots}
    with contextlib.ExitStack() as stack:
        if transport == "stdio":
            proxy = ProxyProcess(upstream=[prereq.node, prereq.server_everything, "stdio"], log_path=tmp_path / "p.log")
        else:
            url = stack.enter_context(everything_over_streamable_http(prereq))
            proxy = ProxyProcess(upstream_url=url, log_path=tmp_path / "p.log")
        stack.enter_context(started(proxy))
        with anyio.fail_after(BOUND_S):
            async with Client(proxy.url, mode=MODERN, **callbacks) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert {"trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"} <= names
                sampled = await client.call_tool("trigger-sampling-request", {"prompt": "hello"})
                assert "sampled" in text_of(sampled), sampled
                declined = await client.call_tool("trigger-elicitation-request", {})
                assert "decline" in text_of(declined).lower(), declined
                listed = await client.call_tool("get-roots-list", {})
                assert "file:///srv/bridged" in text_of(listed), listed
            async with Client(proxy.url, mode=MODERN) as plain:  # declares nothing: not listed to it
                names = {t.name for t in (await plain.list_tools()).tools}
                assert "trigger-sampling-request" not in names
    # server-everything also asks for roots when a session that declared them opens (the bridge
    # opens one per question asked), which reaches the caller whose request holds the session then
    assert [a for a in asked if a != "roots"] == ["sampling", "elicitation"] and "roots" in asked
