"""Stdio children run below the proxy's CPU priority (`--stdio-nice`), once they have started.

Fifty busy 2025-session children on two cores kept the proxy's event loop waiting for the CPU for
tens of milliseconds at a time (measured as run-queue delay), and every deadline in flight was
answered that late (bench/load_faults.py's deadline probe, docs/reliability.md). A child is lowered
at its first output, not before: niced from its first instruction, a Python server's start on a
busy host outlasted its start timeout. The whole group is lowered (whatever the command started
meanwhile, and what it starts later inherits it), and on a host with autogroup scheduling, where
each session is weighed as one task whatever its processes' nice, the child's session group too.
Real children over real pipes report what the kernel says of them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from typing import Any

import pytest

from proxy.core.upstreams import build_upstream
from proxy.settings import Settings
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(60)]

# Answers any request with what the kernel says of its own priority and of a grandchild's.
REPORTING_CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys

    def autogroup_nice():
        try:
            with open("/proc/self/autogroup") as f:
                return int(f.read().split()[-1])
        except OSError:
            return None

    def facts():  # asked at the first request: an early child is lowered after it started
        grandchild = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        return {"nice": nice, "grandchild": int(grandchild), "autogroup": autogroup_nice()}

    for line in sys.stdin:
        message = json.loads(line)
        if "id" in message:
            print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": facts()}), flush=True)
    """
)


async def _facts(upstream: StdioUpstream) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the child says of itself at its first request (still starting) and at its second."""
    link = await upstream.open(Era.LEGACY)
    answers = []
    for method in ("initialize", "ping"):
        exchange = await link.send_request({"jsonrpc": "2.0", "id": link.new_id(), "method": method, "params": {}})
        async with asyncio.timeout(30):
            answers.append((await exchange.response)["result"])
    return answers[0], answers[1]


@pytest.mark.parametrize("nice", [0, 7])
async def test_the_child_and_what_it_starts_run_that_much_below_the_proxy(nice: int) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    upstream = StdioUpstream([sys.executable, "-c", REPORTING_CHILD], spares=0, nice=nice)
    try:
        starting, facts = await _facts(upstream)
    finally:
        await upstream.aclose()
    assert starting["nice"] == ours, "a child starts at the proxy's own priority"
    expected = min(19, ours + nice)
    assert facts["nice"] == expected
    assert facts["grandchild"] == expected, "inherited by whatever the command starts"
    if nice and facts["autogroup"] is not None:  # a host with autogroup scheduling (this one, often)
        assert facts["autogroup"] == expected, "the child's session group is lowered as well"


def _nice_of(settings: Settings) -> int:
    upstream = build_upstream(settings)
    assert isinstance(upstream, StdioUpstream)
    return upstream.nice


def test_the_default_favours_the_proxy_over_http_and_leaves_one_desktop_child_alone() -> None:
    command = f"{sys.executable} -c pass"
    assert _nice_of(Settings(upstream_command=command)) == 10
    assert _nice_of(Settings(upstream_command=command, listen="stdio")) == 0
    assert _nice_of(Settings(upstream_command=command, listen="stdio", stdio_nice=5)) == 5
    assert _nice_of(Settings(upstream_command=command, stdio_nice=0)) == 0


def test_a_nice_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="stdio_nice"):
        Settings(upstream_command="x", stdio_nice=20)


async def test_the_child_started_before_the_settings_were_read_is_lowered_when_taken() -> None:
    """`serve --listen stdio --stdio-nice 5 -- CMD`: `proxy.upstream.stdio.early` starts CMD's guard before the
    settings exist; the upstream that takes it lowers it once it has started, as any other."""
    from proxy.upstream.stdio import early

    command = [sys.executable, "-c", REPORTING_CHILD]
    early.start(["serve", "--listen", "stdio", "--", *command])
    assert early._early is not None, "the early start ran"
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    upstream = StdioUpstream(command, single_session=True, nice=5)
    try:
        _, facts = await _facts(upstream)
        assert upstream._spawned == 1 and early._early is None, "the early child was the one taken"
    finally:
        await upstream.aclose()
        early.discard()
    expected = min(19, ours + 5)
    assert facts["nice"] == expected and facts["grandchild"] == expected
    if facts["autogroup"] is not None:
        assert facts["autogroup"] == expected
