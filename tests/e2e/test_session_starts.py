"""2025 sessions opened all at once in front of a stdio server with a child per session (the
default `--stdio-sessions per-session`): the children start a few at a time, and every session is
served in turn however long the queue of starts takes, since it keeps progressing; a child that
does not start refuses its session in a form a client and a person can act on.

Real processes: the proxy (`python -m proxy serve`), real Python SDK clients (`Client(url,
mode="legacy")`) and raw HTTP, in front of real stdio servers: the demo server, and the scripted
SDK server made slow to start (`--start-delay-s`, before it reads anything). Each proxy and its
children are stopped by their pids; every wait is bounded.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.fixtures.helpers import PYTHON
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(600)]

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

# Starts of the command go on at once until the marker file exists (the test creates it once the
# proxy is ready, its probe answered); every later one sleeps, idle, for longer than any test
# waits: a server that never starts, met only by sessions. (Keyed on the first start alone, a
# probe slower than its start budget on a loaded machine left the proxy never ready.)
STARTS_UNTIL_MARKER = """
import os, sys, time
marker, argv = sys.argv[1], sys.argv[2:]
if os.path.exists(marker):
    time.sleep(600)
os.execv(argv[0], argv)
"""


# A server that answers every request with an error, `initialize` included.
REFUSES_EVERYTHING = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message and "method" in message:
        error = {"code": -32602, "message": "unsupported protocol version"}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}), flush=True)
"""


def refused(admin: str, reason: str | None = None) -> float:
    label = "mcp_recovery_http_refused_total{" + (f'reason="{reason}"' if reason else "")
    lines = httpx.get(admin + "/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(label))


async def open_and_call(proxy: ProxyProcess, n: int, bound_s: float) -> list[str]:
    """`n` SDK sessions opened at once, each calling `echo` once it is open; their answers."""
    answers: list[str] = []

    async def one(i: int) -> None:
        async with Client(proxy.url, mode="legacy") as client:
            result = await client.call_tool("echo", {"text": f"session {i}"})
        answers.extend(c.text for c in result.content if isinstance(c, TextContent))

    with anyio.fail_after(bound_s):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    return answers


async def test_sessions_whose_children_queue_to_start_are_all_served_though_the_queue_outlasts_the_request_timeout(
    tmp_path: Path,
) -> None:
    # Six children, two starting at once, each 1.5 s before it answers: the last two wait two
    # starts ahead of theirs, which with their own is more than the 3 s request timeout. The start
    # queue progresses all along, so none is refused for the time it waited.
    journal = Journal(tmp_path / "journal.jsonl")
    command = scripted_stdio_command(journal.path, extra=["--start-delay-s", "1.5"])
    flags = ["--request-timeout-s", "3", "--stdio-max-starting", "2", "--stdio-spares", "0"]
    proxy = ProxyProcess(upstream=command, extra=flags, log_path=tmp_path / "proxy.log").start(timeout_s=120)
    try:
        answers = await open_and_call(proxy, 6, bound_s=120)
        assert sorted(answers) == sorted(f"session {i}" for i in range(6)), proxy.log_tail()
        assert refused(proxy.admin) == 0
    finally:
        proxy.stop()


@pytest.mark.serial  # forty Python interpreters starting: the bound needs the machine alone
async def test_one_agent_opening_40_sessions_at_once_each_with_its_own_child_gets_every_one_served(
    tmp_path: Path,
) -> None:
    # The legitimate peak (docs/deploy.md "Sessions over a stdio server"): one local agent, forty
    # sessions at once, a child each, on a small machine. Starts queue (at most the CPU count at
    # once); each session is served when its child has started, in the order they came.
    demo = [PYTHON, "-m", "proxy.demo.server"]
    proxy = ProxyProcess(upstream=demo, log_path=tmp_path / "proxy.log", shipped_defaults=True).start(timeout_s=120)
    try:
        answers = await open_and_call(proxy, 40, bound_s=480)
        assert sorted(answers) == sorted(f"session {i}" for i in range(40)), proxy.log_tail()
        assert refused(proxy.admin) == 0
    finally:
        proxy.stop()


async def test_sessions_whose_children_do_not_start_are_refused_with_503_the_flag_named_and_one_log_line(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    marker = tmp_path / "no-more-starts"
    command = [sys.executable, "-c", STARTS_UNTIL_MARKER, str(marker), *scripted_stdio_command(journal.path)]
    flags = ["--stdio-start-timeout-s", "1", "--stdio-max-starting", "6", "--stdio-spares", "0"]
    log = tmp_path / "proxy.log"
    proxy = ProxyProcess(upstream=command, extra=flags, log_path=log).start(timeout_s=120)
    marker.touch()
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            with anyio.fail_after(60):
                answers = await _gather([http.post(proxy.url, json=INITIALIZE, headers=HEADERS) for _ in range(6)])
        for r in answers:
            assert r.status_code == 503, r.text
            assert int(r.headers["retry-after"]) > 0
            assert "mcp-session-id" not in r.headers, "no session came of it: a client must not be given its id"
            error = r.json()["error"]
            assert error["data"]["limit"] == "session_starts"
            assert error["data"]["flag"] == "--stdio-start-timeout-s"
            assert "--stdio-start-timeout-s" in error["message"] and "did not start" in error["message"]
        assert refused(proxy.admin, "session_starts") == 6
    finally:
        proxy.stop()
    lines = [line for line in log.read_text(errors="replace").splitlines() if "new session refused" in line]
    assert len(lines) == 1, lines
    assert "--stdio-start-timeout-s" in lines[0]


async def test_an_initialize_the_server_answers_with_an_error_gives_the_client_no_session_id(tmp_path: Path) -> None:
    # The session is closed as its initialize fails: a session id in that answer would be one the
    # client then uses or DELETEs, getting 404 ("Session termination failed: 404" in the SDK).
    command = [sys.executable, "-c", REFUSES_EVERYTHING]
    proxy = ProxyProcess(upstream=command, log_path=tmp_path / "proxy.log").start(timeout_s=120)
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(proxy.url, json=INITIALIZE, headers=HEADERS)
        assert r.json()["error"]["message"] == "unsupported protocol version", r.text
        assert "mcp-session-id" not in r.headers
    finally:
        proxy.stop()


async def _gather(requests: list[Awaitable[httpx.Response]]) -> list[httpx.Response]:
    results: list[httpx.Response] = []

    async def one(request: Awaitable[httpx.Response]) -> None:
        results.append(await request)

    async with anyio.create_task_group() as tg:
        for request in requests:
            tg.start_soon(one, request)
    return results
