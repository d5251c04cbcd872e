"""The relay in front of each kind of upstream: stdio, Streamable HTTP and legacy SSE.

Real SDK clients through the real proxy to the scripted upstream, in every era the upstream
speaks; a 2026 client in front of a legacy SSE upstream is served through the proxy's era bridge
(tests/e2e/test_era_bridge.py has the rest).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CreateMessageResult, TextContent

from tests.fixtures.helpers import ScriptedHTTP
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0


@pytest.fixture(scope="module", params=["stdio", "http", "sse"])
def upstream(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp(f"relay-{request.param}")
    journal, state = tmp / "journal.jsonl", tmp / "state.json"
    if request.param == "stdio":
        with ProxyProcess(upstream=scripted_stdio_command(journal, state), log_path=tmp / "proxy.log") as proxy:
            yield request.param, proxy.url
        return
    with ScriptedHTTP(journal, state, transport=request.param) as server:
        url = server.url if request.param == "http" else "sse+" + server.url
        with ProxyProcess(upstream_url=url, log_path=tmp / "proxy.log") as proxy:
            yield request.param, proxy.url


def modes(kind: str) -> list[str]:
    return ["legacy"] if kind == "sse" else ["legacy", "2026-07-28"]


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_everything_relays_through_each_upstream(upstream: tuple[str, str]) -> None:
    kind, url = upstream
    for mode in modes(kind):
        progress: list[float] = []

        async def on_progress(
            p: float, total: float | None, message: str | None, progress: list[float] = progress
        ) -> None:
            progress.append(p)

        async def sampling(context: Any, params: Any) -> CreateMessageResult:
            return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled"), model="m")

        with anyio.fail_after(BOUND_S):
            async with Client(url, mode=mode, sampling_callback=sampling) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                assert tools["echo"].annotations is not None and tools["echo"].annotations.read_only_hint
                assert text_of(await client.call_tool("echo", {"text": f"{kind}-{mode}"})) == f"{kind}-{mode}"
                result = await client.call_tool(
                    "slow_progress", {"steps": 3, "delay_s": 0.01}, progress_callback=on_progress
                )
                assert not result.is_error and progress == [1, 2, 3]
                assert text_of(await client.call_tool("ask_sampling", {"prompt": "q"})) == "sampled"
                assert (await client.read_resource("journal://summary")).contents
                assert "Ada" in str((await client.get_prompt("greet", {"name": "Ada"})).messages[0].content)


async def test_a_2026_client_is_served_through_the_era_bridge_in_front_of_a_legacy_only_upstream(
    upstream: tuple[str, str],
) -> None:
    kind, url = upstream
    if kind != "sse":
        pytest.skip("only the legacy SSE upstream lacks the 2026 revision")
    with anyio.fail_after(BOUND_S):
        async with Client(url, mode="auto") as client:
            assert client.protocol_version == "2026-07-28"  # the proxy's bridge answered server/discover
            assert text_of(await client.call_tool("echo", {"text": "auto"})) == "auto"


@pytest.mark.parametrize("kind", ["http", "sse"])
async def test_the_stdio_frontend_in_front_of_network_upstreams(tmp_path: Path, kind: str) -> None:
    """stdio → HTTP and stdio → SSE: the proxy as the server a local client launches."""
    from mcp import StdioServerParameters

    from tests.fixtures.helpers import PYTHON, REPO_ROOT

    with ScriptedHTTP(tmp_path / "journal.jsonl", tmp_path / "state.json", transport=kind) as server:
        url = server.url if kind == "http" else "sse+" + server.url
        params = StdioServerParameters(
            command=PYTHON, args=["-m", "proxy", "serve", "--listen", "stdio", "--upstream", url], cwd=str(REPO_ROOT)
        )
        for mode in modes(kind):
            with anyio.fail_after(BOUND_S):
                async with Client(params, mode=mode) as client:
                    assert text_of(await client.call_tool("echo", {"text": f"stdio-{kind}"})) == f"stdio-{kind}"
                    result = await client.call_tool("flaky_read", {"key": f"{kind}-{mode}", "fail_times": 1})
                    assert not result.is_error and result.meta["io.mcp-recovery-proxy/attempts"] == 2


def test_readyz_follows_a_network_upstream_that_goes_away(tmp_path: Path) -> None:
    import time

    import httpx

    server = ScriptedHTTP(tmp_path / "journal.jsonl", tmp_path / "state.json").start()
    try:
        extra = ["--ready-check-interval-s", "0.2"]
        with ProxyProcess(upstream_url=server.url, extra=extra, log_path=tmp_path / "proxy.log") as proxy:
            assert httpx.get(proxy.admin + "/readyz", timeout=5).status_code == 200
            server.kill()
            deadline = time.monotonic() + 15
            while (r := httpx.get(proxy.admin + "/readyz", timeout=5)).status_code == 200:
                assert time.monotonic() < deadline, "readiness never noticed the upstream was gone"
                time.sleep(0.1)
            assert r.status_code == 503 and "upstream" in r.json()["reasons"][0]
            assert httpx.get(proxy.admin + "/healthz", timeout=5).status_code == 200, "alive all the same"
    finally:
        server.stop()
