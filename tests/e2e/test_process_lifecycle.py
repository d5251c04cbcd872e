"""The proxy's own process: one upstream child for one stdio client, and a graceful SIGTERM.

- `--listen stdio` serves exactly one session, so it runs exactly one server process: the start-up
  probe copy and the warm spare of the HTTP frontend would be two more (a server that holds a lock,
  a browser or a database connection breaks with a second copy). Counted from the scripted
  server's journal, where every server process writes its `boot` with its pid.
- SIGTERM stops the proxy gracefully and the process exits 0 (it exited 143: uvicorn re-raised the
  signal into the default handler after its own graceful shutdown), in both listen modes.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import TextContent

from tests.fixtures.helpers import PYTHON, REPO_ROOT
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, pid_alive, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0


def text_of(result: object) -> str:
    return "".join(c.text for c in getattr(result, "content", []) if isinstance(c, TextContent))


def boots(journal: Journal) -> list[int]:
    return [e["pid"] for e in journal.events(event="boot")]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28", "auto"])
async def test_one_stdio_client_runs_exactly_one_server_process(tmp_path: Path, mode: str) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    params = StdioServerParameters(
        command=PYTHON, args=["-m", "proxy", "serve", "--listen", "stdio", "--", *command], cwd=str(REPO_ROOT)
    )
    with anyio.fail_after(BOUND_S):
        async with Client(params, mode=mode) as client:
            assert "echo" in {t.name for t in (await client.list_tools()).tools}
            assert text_of(await client.call_tool("echo", {"text": mode})) == mode
            assert text_of(await client.call_tool("echo", {"text": "again"})) == "again"
            started = boots(journal)
            assert len(started) == 1, f"server processes started for one stdio client: {started}"
            assert pid_alive(started[0])
    # and nothing was started on the way out either
    assert len(boots(journal)) == 1


def test_sigterm_stops_an_http_proxy_with_status_0(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json"), log_path=tmp_path / "proxy.log"
    ).start()
    try:
        assert proxy.proc is not None
        children = journal.pids()
        os.kill(proxy.proc.pid, signal.SIGTERM)
        assert proxy.proc.wait(timeout=20) == 0, proxy.log_tail()
        journal.wait_for(lambda j: not any(pid_alive(p) for p in children), timeout_s=10, what="children gone")
    finally:
        proxy.stop()


INITIALIZE_LINE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
)


@contextmanager
def initialized_stdio_proxy(tmp_path: Path, journal: Journal) -> Iterator[subprocess.Popen[bytes]]:
    """`serve --listen stdio` in front of the scripted server, its client's initialize answered;
    the proxy is killed on the way out if the test left it running."""
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    with open(tmp_path / "proxy.log", "wb") as log:
        proc = subprocess.Popen(
            [PYTHON, "-m", "proxy", "serve", "--listen", "stdio", "--", *command],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(INITIALIZE_LINE)
        proc.stdin.flush()
        assert b'"protocolVersion"' in proc.stdout.readline()  # bounded by the test's timeout if it hangs
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_sigterm_stops_a_stdio_proxy_with_status_0(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    with initialized_stdio_proxy(tmp_path, journal) as proc:
        children = journal.pids()
        assert children
        proc.send_signal(signal.SIGTERM)  # the client still holds stdin open
        assert proc.wait(timeout=20) == 0, (tmp_path / "proxy.log").read_text()[-3000:]
        journal.wait_for(lambda j: not any(pid_alive(p) for p in children), timeout_s=10, what="children gone")


def test_no_upstream_process_outlives_a_killed_stdio_proxy(tmp_path: Path) -> None:
    """The child `--listen stdio` starts before its imports (`proxy.upstream.stdio.early`) and then adopts is
    still guarded: a SIGKILLed proxy takes it (and what it started) with it."""
    journal = Journal(tmp_path / "journal.jsonl")
    with initialized_stdio_proxy(tmp_path, journal) as proc:
        children = journal.pids()
        assert len(boots(journal)) == 1 and children and all(pid_alive(p) for p in children)
        proc.kill()
        proc.wait(timeout=5)
        journal.wait_for(lambda j: not any(pid_alive(p) for p in children), timeout_s=10, what="children gone")
