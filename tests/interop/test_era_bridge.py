"""A 2026-07-28 client in front of the npm reference server-everything, which speaks only the 2025
handshake revisions: the proxy's era bridge serves it (docs/deploy.md, "Eras").

The Python SDK's 2026 client (auto mode: it probes `server/discover`, which the bridge answers)
through the real proxy to the real server over stdio: the era, the server's identity and its
capabilities as 2026 has them (no 2025-11-25 tasks), tools with structured content, prompts,
completion, and `subscriptions/listen`: the server's `resources/updated` for a resource the stream
names (the server sends one every 5 s once `toggle-subscriber-updates` is called) reaches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import PromptReference, TextContent

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
