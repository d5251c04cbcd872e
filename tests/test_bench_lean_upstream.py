"""bench/lean_upstream.py answers as each era requires: a 2026-07-28 request's result carries
`resultType` (and a listing its freshness hints: the SDK's 2026 client refuses a result without
them), a 2025 one's does not."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from bench.lean_upstream import Echo

LEAN = Path(__file__).resolve().parents[1] / "bench" / "lean_upstream.py"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _call(meta: dict[str, object] | None) -> dict[str, object]:
    params: dict[str, object] = {"name": "echo", "arguments": {"text": "hi"}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}


def test_a_2026_request_gets_result_type_and_a_2025_one_does_not() -> None:
    echo = Echo(0.0)
    modern = anyio.run(echo.handle, _call(MODERN_META))
    legacy = anyio.run(echo.handle, _call(None))
    assert modern is not None and legacy is not None
    assert modern["result"]["resultType"] == "complete"
    assert "resultType" not in legacy["result"]
    assert modern["result"]["content"] == legacy["result"]["content"] == [{"type": "text", "text": "hi"}]
    listed = anyio.run(echo.handle, {**_call(MODERN_META), "method": "tools/list"})
    assert listed is not None and listed["result"]["ttlMs"] == 0 and listed["result"]["cacheScope"] == "private"
    assert "ttlMs" not in modern["result"]  # a tool call's result is not cacheable


def test_errors_and_notifications_stay_as_they_were() -> None:
    echo = Echo(0.0)
    unknown = anyio.run(echo.handle, {**_call(MODERN_META), "method": "nope"})
    assert unknown is not None and unknown["error"]["code"] == -32601 and "result" not in unknown
    bad_params = anyio.run(echo.handle, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]})
    assert bad_params is not None and bad_params["error"]["code"] == -32602
    assert anyio.run(echo.handle, {"jsonrpc": "2.0", "method": "notifications/initialized"}) is None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_sdk_client_calls_it_over_stdio_in_either_era(mode: str) -> None:
    async def go() -> None:
        params = StdioServerParameters(command=sys.executable, args=[str(LEAN), "--transport", "stdio"])
        with anyio.fail_after(30):
            async with Client(params, mode=mode) as client:  # type: ignore[arg-type]
                result = await client.call_tool("echo", {"text": "over the pipe"})
        assert not result.is_error
        assert [c.text for c in result.content] == ["over the pipe"]  # type: ignore[union-attr]

    anyio.run(go)
