"""Where the unresolved report travels, and what real servers' refusals become, end to end.

Real SDK clients (both eras, and a raw 2025-03-26 session) -> the real proxy (shipped default
policies) -> a real SDK `MCPServer` over stdio (tests/fixtures/shape_server.py) whose tools fail the
way the reference servers do. Checked: the report always in `_meta`, never in the
`structuredContent` of a tool with an output schema nor for a client whose revision predates
`structuredContent`; the upstream's own structuredContent kept as it came; the upstream's blocks
first when nothing was retried; refusals of a state-changing tool never "outcome unknown".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
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


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp = tmp_path_factory.mktemp("shape")
    with ProxyProcess(upstream=python_argv(SERVER), log_path=tmp / "proxy.log") as running:
        yield running


@pytest.fixture(params=["legacy", "2026-07-28"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def call(proxy: ProxyProcess, mode: str, tool: str, args: dict[str, Any]) -> Any:
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=mode) as client:
            await client.list_tools()  # like real clients: the SDK then knows every output schema
            return await client.call_tool(tool, args)


def report_of(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    report = result.meta[REPORT]
    jsonschema.validate(report, SCHEMA)
    return report


def texts(result: Any) -> list[str]:
    return [block.text for block in result.content]


async def test_a_tool_with_an_output_schema_gets_no_report_in_structured_content(proxy: ProxyProcess, mode: str):
    result = await call(proxy, mode, "lookup", {"key": "nosuch"})
    report = report_of(result)
    assert result.structured_content is None
    assert report["errorCategory"] == "validation"
    assert report["classification"] == {"source": "shipped", "code": None, "rule": "not-found", "defaulted": False}
    # nothing retried or stopped: the server's own words first, unchanged; the proxy's note after
    first, summary = texts(result)
    assert "Entity with name nosuch not found" in first and not first.startswith("Tool '")
    assert summary.startswith("Tool 'lookup' did not complete: validation failure")


async def test_the_upstreams_own_conforming_structured_content_stays_as_it_came(proxy: ProxyProcess, mode: str):
    result = await call(proxy, mode, "refuse_conforming", {})
    report = report_of(result)
    assert result.structured_content == {"name": "quota", "kind": "limit"}
    # no shipped rule knows "quota": unclassified, said plainly, never called temporary
    assert report["classification"]["defaulted"] is True and report["errorCategory"] == "business"
    summary = texts(result)[-1]
    assert "could not classify" in summary
    for guess in ("temporary", "try again later"):
        assert guess not in summary.lower()
    assert [a["action"] for a in report["suggestedActions"]] == ["inspect_error"]


async def test_without_an_output_schema_the_report_is_also_the_structured_content(proxy: ProxyProcess, mode: str):
    result = await call(proxy, mode, "frobnicate", {})
    report = report_of(result)
    assert {k: result.structured_content[k] for k in report} == report
    assert report["classification"]["defaulted"] is True and report["outcomeUnknown"] is False


@pytest.mark.parametrize(
    ("tool", "args", "category", "rule"),
    [
        ("delete_item", {"name": "/etc"}, "permission", "permission-denied"),
        ("delete_item", {}, "validation", "sdk-input-validation"),  # the SDK's own argument check
        ("no_such_tool", {}, "validation", None),  # unknown tool: the SDK's text or a -32602
    ],
)
async def test_a_refusal_of_a_state_changing_tool_is_not_an_unknown_outcome(
    proxy: ProxyProcess, mode: str, tool: str, args: dict[str, Any], category: str, rule: str | None
):
    result = await call(proxy, mode, tool, args)
    report = report_of(result)
    assert report["operation"]["sideEffect"] == "state_changing"
    assert (report["errorCategory"], report["outcomeUnknown"], report["stopReason"]) == (
        category,
        False,
        "not_retryable",
    )
    if rule is not None:
        assert report["classification"]["rule"] == rule
    assert [a["action"] for a in report["suggestedActions"]][:1] != ["check_status"]
    assert not any("may have been applied" in t for t in texts(result))


def _rpc(client: httpx.Client, message: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return client.post("", json=message, headers={"accept": "application/json, text/event-stream", **headers})


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("application/json"):
        return dict(response.json())
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return dict([m for m in (json.loads(d) for d in data if d) if "id" in m][-1])  # the response, not a notification


@pytest.mark.parametrize("version", ["2025-03-26", "2024-11-05"])
def test_a_client_whose_revision_predates_structured_content_gets_the_report_in_meta_only(
    proxy: ProxyProcess, version: str
):
    with httpx.Client(base_url=proxy.url, timeout=BOUND_S) as client:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "old", "version": "0"}},
        }
        opened = _rpc(client, init, {})
        assert _answer(opened)["result"]["protocolVersion"] == version
        headers = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": version}
        assert _rpc(client, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers).status_code == 202
        _answer(_rpc(client, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers))
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "delete_item", "arguments": {}}}
        result = _answer(_rpc(client, call, headers))["result"]
    assert result["isError"] is True and "structuredContent" not in result
    report = result["_meta"][REPORT]
    jsonschema.validate(report, SCHEMA)
    assert report["errorCategory"] == "validation" and report["outcomeUnknown"] is False


# The TypeScript SDK client's reading of such an error (it checks structuredContent against the
# output schema, errors included) is checked by the interop matrix: tests/interop/test_matrix.py.
