"""A tool's definition is known before its first attempt, whatever the caller's deadline.

Real SDK clients (both eras) -> a fresh real proxy (shipped default policies) -> a real SDK
`MCPServer` over stdio (tests/fixtures/shape_server.py). The client calls at once, without listing
tools, with a caller deadline (2 s) far shorter than the shipped policy's minimum useful attempt
time (a quarter of 45 s): the proxy's own catalog, listed when the upstream was reached, gives the
tool's class (read-only) and its output schema (so the report stays out of `structuredContent`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import jsonschema
import pytest
from mcp import Client

from tests.fixtures.forkserver import python_argv
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "proxy" / "schemas" / "unresolved-result.schema.json").read_text()
)
SERVER = Path(__file__).resolve().parents[1] / "fixtures" / "shape_server.py"
REPORT = "io.mcp-recovery-proxy/unresolved"
BOUND_S = 30.0


@pytest.fixture
def fresh_proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    """A proxy of its own per test: nothing listed the upstream's tools before the call."""
    with ProxyProcess(upstream=python_argv(SERVER), log_path=tmp_path / "proxy.log") as running:
        yield running


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_read_only_tool_called_with_a_short_deadline_on_a_fresh_session_keeps_its_class(
    fresh_proxy: ProxyProcess, mode: str
) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(fresh_proxy.url, mode=mode) as client:
            # no list_tools first: the SDK validates only successes, so it does not list either
            result = await client.call_tool(
                "query", {"sql": "select 1"}, meta={"io.mcp-recovery-proxy/deadlineMs": 2000}
            )
    assert result.is_error
    report = result.meta[REPORT]
    jsonschema.validate(report, SCHEMA)
    assert report["operation"]["sideEffect"] == "read_only"
    assert report["errorCategory"] == "transient"
    assert report["outcomeUnknown"] is False
    assert report["stopReason"] != "outcome_unknown"
    assert report["deadlineMs"] == 2000
    # the tool declares an output schema: a strict client would reject the report there
    assert result.structured_content is None
    assert any("database timed out after 5s" in block.text for block in result.content)
