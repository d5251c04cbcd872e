"""One local agent's sessions, as a sidecar carries them: every session from 127.0.0.1.

Real Python SDK clients (`Client(url, mode="legacy")`) against `python -m proxy serve` at its
shipped defaults, in front of the demo server over Streamable HTTP, and in front of the demo
server over stdio with `--stdio-sessions shared`. 40, then 400 sessions are held open at once
(opened 40 at a time, as an agent opens them over a moment), each calls `echo` while all are
open, and none is released before every one was answered: every one is served, none refused.
Bounded by `BOUND_S` per round; the processes are stopped by their pids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from tests.fixtures.demo_http import demo_over_http
from tests.fixtures.helpers import PYTHON
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.anyio, pytest.mark.timeout(600)]
BOUND_S = 240.0
OPENING_AT_ONCE = 40


@contextlib.contextmanager
def proxy_in_front(kind: str, tmp: Path) -> Iterator[ProxyProcess]:
    log = tmp / "proxy.log"
    if kind == "http":
        with (
            demo_over_http() as upstream,
            ProxyProcess(upstream_url=upstream, log_path=log, shipped_defaults=True) as proxy,
        ):
            yield proxy
        return
    demo = [PYTHON, "-m", "proxy.demo.server"]
    with ProxyProcess(
        upstream=demo, extra=["--stdio-sessions", "shared"], log_path=log, shipped_defaults=True
    ) as proxy:
        yield proxy


def refused(admin: str) -> float:
    lines = httpx.get(admin + "/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("mcp_recovery_http_refused_total{"))


async def hold_sessions(proxy: ProxyProcess, n: int) -> tuple[list[str], int]:
    """`n` sessions open at once, each answered once; returns the answers and the sessions the
    proxy held while all were open."""
    gate = anyio.Semaphore(OPENING_AT_ONCE)
    all_open, all_served = anyio.Event(), anyio.Event()
    opened: list[int] = []
    answers: list[str] = []
    held = 0

    async def one(i: int) -> None:
        async with contextlib.AsyncExitStack() as stack:
            async with gate:
                client = await stack.enter_async_context(Client(proxy.url, mode="legacy"))
            opened.append(i)
            if len(opened) == n:
                all_open.set()
            await all_open.wait()
            result = await client.call_tool("echo", {"text": f"session {i}"})
            answers.append(result.content[0].text)  # type: ignore[union-attr]
            if len(answers) == n:
                all_served.set()
            await all_served.wait()

    async def count_held() -> None:
        nonlocal held
        await all_open.wait()
        async with httpx.AsyncClient(timeout=30) as http:
            held = (await http.get(proxy.admin + "/readyz")).json()["sessions"]

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(count_held)
            for i in range(n):
                tg.start_soon(one, i)
    return answers, held


@pytest.mark.parametrize("kind", ["http", "shared"])
async def test_one_agent_holds_40_then_400_sessions_from_one_address_and_every_one_is_served(
    kind: str, tmp_path: Path
) -> None:
    with proxy_in_front(kind, tmp_path) as proxy:
        for n in (40, 400):
            answers, held = await hold_sessions(proxy, n)
            assert sorted(answers) == sorted(f"session {i}" for i in range(n))
            assert held >= n, f"{held} sessions held while {n} were open"
            assert refused(proxy.admin) == 0
