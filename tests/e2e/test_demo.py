"""`mcp-recovery-proxy demo` shows, through a real client, a call recovered by retries, one reported
unresolved, the same call refused by the ledger, and a fresh budget approved."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from tests.fixtures.helpers import PYTHON, REPO_ROOT, free_port, terminate

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.anyio]
APPROVE = "io.mcp-recovery-proxy/approveBudget"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, admin = free_port(), free_port()
    log = tmp_path_factory.mktemp("demo") / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "proxy",
                "demo",
                "--listen",
                f"http://127.0.0.1:{port}/mcp",
                "--admin",
                f"127.0.0.1:{admin}",
            ],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{admin}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, Path(log).read_text()
            assert time.monotonic() < deadline, "demo not ready"
            time.sleep(0.05)
        assert "lookup_customer" in Path(log).read_text(), "the banner says what to try"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        terminate(proc)


async def call(url: str, tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None) -> Any:
    with anyio.fail_after(30):
        async with Client(url, mode="legacy") as client:
            await client.list_tools()
            return await client.call_tool(tool, args, meta=meta)


async def test_the_demo_recovers_reports_refuses_and_approves(demo: str) -> None:
    recovered = await call(demo, "lookup_customer", {"customer_id": "c-7"})
    assert not recovered.is_error and recovered.meta["io.mcp-recovery-proxy/attempts"] == 3

    exhausted = await call(demo, "search_archive", {"query": "invoices 2019"})
    report = exhausted.meta["io.mcp-recovery-proxy/unresolved"]
    assert exhausted.is_error and report["stopReason"] == "attempts_exhausted" and report["attemptCount"] == 3
    assert report["suggestedActions"]
    # what the archive search obtained before it failed, as the server said it, once for 3 attempts
    assert report["partialResults"] == [
        {"source": "upstream", "attempt": 3, "content": {"searched": "recent orders only", "matches": 0}}
    ]
    assert "accept_partial" in [action["action"] for action in report["suggestedActions"]]

    refused = await call(demo, "search_archive", {"query": "invoices 2019"})
    assert refused.meta["io.mcp-recovery-proxy/unresolved"]["stopReason"] == "ledger_exhausted"

    budget = report["operation"]["budgetId"]
    approved = await call(demo, "search_archive", {"query": "invoices 2019"}, meta={APPROVE: budget})
    assert approved.meta["io.mcp-recovery-proxy/unresolved"]["operation"]["approvedBudgetId"] == budget
    assert approved.meta["io.mcp-recovery-proxy/unresolved"]["attemptCount"] == 3

    unknown = await call(demo, "refund", {"order_id": "o-9", "amount": 12.5})
    assert unknown.meta["io.mcp-recovery-proxy/unresolved"]["stopReason"] == "outcome_unknown"
    assert unknown.meta["io.mcp-recovery-proxy/unresolved"]["outcomeUnknown"] is True
    status = await call(demo, "refund_status", {"order_id": "o-9"})
    assert not status.is_error and status.structured_content["refunded"] is True
