"""The shipped defaults against a real tool that runs tens of seconds (docs/recovery.md,
"Shipped defaults: do no harm").

The real proxy, with no policy folder (the built-in defaults), in front of npm server-everything
over stdio; Python SDK clients call its `trigger-long-running-operation` (read-only, idempotent:
the proxy may retry it), which sleeps `duration` seconds in `steps` and reports progress after
each step when the request carries a progress token. The three calls run at once, each in its own
session, so the test takes as long as the longest (about 50 s):

- its default arguments (10 s, 5 steps) succeed, executed once;
- 40 s with progress every 5 s succeed (the client asked for no progress; no timer of the
  shipped defaults cuts an attempt the deadline still allows);
- 150 s in one step (silent past the deadline) is answered with the structured unresolved result
  before the SDK clients' 60 s default request timeout.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.e2e.interop_env import server_everything_argv
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
TOOL = "trigger-long-running-operation"
CLIENT_TIMEOUT_S = 60.0  # the SDK clients' default request timeout
UNRESOLVED = "io.mcp-recovery-proxy/unresolved"


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def report_of(result: Any) -> dict[str, Any]:
    meta = result.meta or {}
    if isinstance(meta.get(UNRESOLVED), dict):
        return meta[UNRESOLVED]
    return result.structured_content or {}


async def test_long_tools_succeed_and_a_silent_one_is_answered_before_the_client_gives_up(tmp_path: Path) -> None:
    argv = server_everything_argv()
    log = tmp_path / "proxy.log"
    outcomes: dict[str, tuple[Any, float]] = {}

    async def call(label: str, url: str, arguments: dict[str, Any]) -> None:
        async with Client(url, mode="legacy") as client:
            assert TOOL in {t.name for t in (await client.list_tools()).tools}
            began = time.monotonic()
            result = await client.call_tool(TOOL, arguments)
            outcomes[label] = (result, time.monotonic() - began)

    with ProxyProcess(upstream=argv, extra=["--call-log", "all"], log_path=log, shipped_defaults=True) as proxy:
        with anyio.fail_after(CLIENT_TIMEOUT_S + 15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "defaults", proxy.url, {})
                tg.start_soon(call, "forty-seconds", proxy.url, {"duration": 40, "steps": 8})
                tg.start_soon(call, "silent", proxy.url, {"duration": 150, "steps": 1})

    result, _ = outcomes["defaults"]
    assert not result.is_error, text_of(result)
    assert "Duration: 10 seconds, Steps: 5" in text_of(result)
    assert not (result.meta or {}).get("io.mcp-recovery-proxy/attempts"), "answered by its first attempt"

    result, took = outcomes["forty-seconds"]
    assert not result.is_error, text_of(result)
    assert "Duration: 40 seconds" in text_of(result) and took >= 40

    result, took = outcomes["silent"]
    assert result.is_error
    report = report_of(result)
    assert report.get("errorCategory") == "transient" and report.get("stopReason") == "deadline_exhausted", report
    assert took < CLIENT_TIMEOUT_S, f"the structured answer came after {took:.1f}s: the client would have given up"

    # executed once: the call log has one line per call, each success with a single attempt
    lines = [line for line in log.read_text().splitlines() if f"tools/call {TOOL}" in line]
    successes = [line for line in lines if "outcome=success" in line]
    assert len(successes) == 2 and all(re.search(r"\battempts=1\b", line) for line in successes), lines
