"""server-everything's long-running operation, with its own defaults (10 s, 5 progress steps),
succeeds through the proxy's shipped default policies and runs upstream exactly once
(docs/recovery.md, "Shipped defaults: do no harm": defaults sized for tools that run tens of
seconds, below the SDK clients' 60 s request timeout).

"Exactly once" is read from the proxy's own counters on its admin port (one finished upstream
attempt for the tool, no retry) and from the progress the client saw (each step once).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.types import TextContent
from prometheus_client.parser import text_string_to_metric_families

from tests.interop.harness import Prerequisites, started
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.interop]
TOOL = "trigger-long-running-operation"
BOUND_S = 58.0  # under the SDK clients' 60 s default request timeout, as a user's call would be


@pytest.fixture(scope="module")
def proxy(prereq: Prerequisites, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp: Path = tmp_path_factory.mktemp("interop-long-running")
    # No --policies: the shipped defaults are what is under test.
    proxy = ProxyProcess(
        upstream=[prereq.node, prereq.server_everything, "stdio"], log_path=tmp / "proxy.log", shipped_defaults=True
    )
    with started(proxy) as p:
        yield p


def samples(admin: str, metric: str, tool: str) -> float:
    text = httpx.get(admin + "/metrics", timeout=5.0).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric and sample.labels.get("tool") == tool:
                total += sample.value
    return total


async def test_the_long_running_operation_succeeds_once_through_the_shipped_defaults(proxy: ProxyProcess) -> None:
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode="auto") as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert TOOL in tools
            result = await client.call_tool(TOOL, {}, progress_callback=on_progress)

    text = "".join(c.text for c in result.content if isinstance(c, TextContent))
    meta: dict[str, Any] = dict(result.meta or {})
    assert not result.is_error, f"{text} {meta}"
    assert text == "Long running operation completed. Duration: 10 seconds, Steps: 5."
    assert progress == [1, 2, 3, 4, 5], "each step once: the operation ran once"
    assert samples(proxy.admin, "mcp_recovery_attempts_total", TOOL) == 1, proxy.log_tail()
    assert samples(proxy.admin, "mcp_recovery_retries_total", TOOL) == 0
