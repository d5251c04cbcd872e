"""Hostile stdio upstreams through the real proxy process, for real SDK clients of both eras
(docs/security.md, "Hostile upstreams"): what the caller sees, and that the proxy serves the next
request. The link-level checks are in test_hostile_upstreams.py.

Policies give the hostile call a deadline far beyond the test's own bound: a call that ends inside
the bound ended because the proxy saw the upstream's failure, not because a timer ran out.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.fixtures.helpers import PYTHON
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

HOSTILE_STDIO = str(Path(__file__).resolve().parents[1] / "fixtures" / "hostile_stdio.py")
BOUND_S = 60.0
POLICY = "tools: [poke]\nattempts: 1\ndeadline: 300s\nattempt_timeout: 300s\nidle_timeout: null\n"
REPORT = "io.mcp-recovery-proxy/unresolved"


@pytest.fixture(scope="module")
def escaping(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProcess, Path]]:
    tmp = tmp_path_factory.mktemp("hostile-escape")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "poke.yaml").write_text(POLICY)
    pid_file = tmp / "grandchild.pid"
    command = [PYTHON, HOSTILE_STDIO, "--mode", "escape", "--pid-file", str(pid_file)]
    extra = ["--policies", str(tmp / "policies"), "--request-timeout-s", "300"]
    with ProxyProcess(upstream=command, extra=extra, log_path=tmp / "proxy.log") as proxy:
        yield proxy, pid_file


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_server_that_escapes_with_its_pipes_gets_an_unresolved_result_and_the_next_request_is_served(
    escaping: tuple[ProxyProcess, Path], mode: str
) -> None:
    proxy, pid_file = escaping
    pid_file.unlink(missing_ok=True)
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=mode) as client:
            await client.list_tools()
            result: Any = await client.call_tool("poke", {})
            # the next request of the same client: a new child answers it
            tools = await client.list_tools()
    assert result.is_error
    report = result.meta[REPORT]
    (step,) = report["attemptedSteps"]
    # what happened, said as it happened: the server's end (not a timeout), its effect unknown
    assert step["outcome"] == "transport_error" and step["dispatched"] == "unknown", report
    assert "exited" in step["detail"], report
    assert [tool.name for tool in tools.tools] == ["poke"]
    grandchild = int(pid_file.read_text())
    try:
        for _ in range(int(BOUND_S / 0.05)):  # the guard ends it before it exits itself
            if not _alive(grandchild):
                break
            await anyio.sleep(0.05)
        assert not _alive(grandchild), "the process that left the group outlived its server"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)
    assert proxy.proc is not None and proxy.proc.poll() is None
