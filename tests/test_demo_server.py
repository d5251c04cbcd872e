"""The bundled demo upstream (`python -m proxy.demo.server`), driven over stdio by the real SDK client."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import REQUEST_TIMEOUT

from proxy.demo.server import BUSY_TEXT

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
REPO_ROOT = Path(__file__).resolve().parents[1]
BOUND_S = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def demo_params(**env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "proxy.demo.server"],
        cwd=str(REPO_ROOT),
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
    )


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
async def test_tools_and_annotations(era: str) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(demo_params(), mode=era) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"lookup_customer", "search_archive", "refund", "refund_status", "slow_report", "echo"}
    for name in ("lookup_customer", "search_archive", "refund_status", "slow_report", "echo"):
        annotations = tools[name].annotations
        assert annotations is not None and annotations.read_only_hint is True, name
    assert tools["refund"].annotations is None  # state-changing by the spec's defaults
    assert all(t.description for t in tools.values())
    assert tools["lookup_customer"].output_schema is not None


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
async def test_lookup_customer_fails_twice_then_succeeds(era: str) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(demo_params(), mode=era) as client:
            results = [await client.call_tool("lookup_customer", {"customer_id": "c-42"}) for _ in range(4)]
            other = await client.call_tool("lookup_customer", {"customer_id": "c-7"})
    assert [r.is_error for r in results] == [True, True, False, True]
    failure = results[0].structured_content
    assert failure == {
        "errorCategory": "transient",
        "isRetryable": True,
        "message": "customer database briefly unavailable",
    }
    record = results[2].structured_content
    assert record is not None and record["customer_id"] == "c-42" and record["name"]
    assert other.is_error  # counters are per customer id


@pytest.mark.parametrize("how", ["--chaos", "DEMO_CHAOS=1"])
async def test_chaos_mode_lookup_failures_are_plain_texts_without_an_error_category(how: str) -> None:
    params = demo_params(DEMO_CHAOS="1") if how == "DEMO_CHAOS=1" else demo_params()
    if how == "--chaos":
        params.args.append("--chaos")
    with anyio.fail_after(BOUND_S):
        async with Client(params, mode="legacy") as client:
            results = [await client.call_tool("lookup_customer", {"customer_id": "c-42"}) for _ in range(3)]
    assert [r.is_error for r in results] == [True, True, False]
    for failed in results[:2]:
        assert failed.structured_content is None  # no errorCategory, no isRetryable: nothing to classify by
        assert [getattr(b, "text", None) for b in failed.content] == [BUSY_TEXT]
    assert results[2].structured_content is not None and results[2].structured_content["customer_id"] == "c-42"


async def test_search_archive_always_transient_with_partial_note() -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(demo_params(), mode="2026-07-28") as client:
            results = [await client.call_tool("search_archive", {"query": "boots"}) for _ in range(3)]
    for result in results:
        assert result.is_error and result.structured_content is not None
        assert result.structured_content["errorCategory"] == "transient"
        assert any("partial result" in getattr(block, "text", "") for block in result.content)
        assert result.structured_content["partialResults"] == {"searched": "recent orders only", "matches": 0}


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
async def test_refund_status_after_refund(era: str) -> None:
    with anyio.fail_after(BOUND_S):
        async with Client(demo_params(DEMO_REFUND_HANG_S="0.2"), mode=era) as client:
            before = await client.call_tool("refund_status", {"order_id": "o-1"})
            refunded = await client.call_tool("refund", {"order_id": "o-1", "amount": 12.5})
            after = await client.call_tool("refund_status", {"order_id": "o-1"})
    assert before.structured_content == {"order_id": "o-1", "refunded": False, "amount": 0.0}
    assert not refunded.is_error
    assert after.structured_content == {"order_id": "o-1", "refunded": True, "amount": 12.5}


async def test_refund_effect_survives_a_timed_out_call() -> None:
    """The outcome-unknown case: the caller gives up, the refund happened anyway."""
    with anyio.fail_after(BOUND_S):
        async with Client(demo_params(DEMO_REFUND_HANG_S="30"), mode="2026-07-28") as client:
            with pytest.raises(MCPError) as info:
                await client.call_tool("refund", {"order_id": "o-2", "amount": 3}, read_timeout_seconds=0.5)
            assert info.value.code == REQUEST_TIMEOUT
            status = await client.call_tool("refund_status", {"order_id": "o-2"})
    assert status.structured_content == {"order_id": "o-2", "refunded": True, "amount": 3.0}


async def test_slow_report_progress_and_echo() -> None:
    seen: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    with anyio.fail_after(BOUND_S):
        async with Client(demo_params(), mode="2026-07-28") as client:
            report = await client.call_tool("slow_report", {"steps": 3}, progress_callback=on_progress)
            echoed = await client.call_tool("echo", {"text": "hello"})
    assert not report.is_error and seen == [(1, 3), (2, 3), (3, 3)]
    assert getattr(echoed.content[0], "text", None) == "hello"
