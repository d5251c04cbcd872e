"""Graceful shutdown, with real processes: the proxy (`python -m proxy serve`), the scripted SDK
server over stdio behind it, real SDK clients.

On SIGTERM (and, with `--listen stdio`, when stdin closes): `/readyz` turns 503 and a new request
is refused (HTTP 503 with JSON-RPC error -32000); a call that ends within `--shutdown-grace-s`
gets its answer; one that outlives it comes back as an unresolved result with stop reason
`shutdown` and the upstream saw its cancellation (the scripted server journals `cancelled` when its
handler is cancelled); the proxy exits 0 and leaves no upstream process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.fixtures.helpers import PYTHON, REPO_ROOT, free_port
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, pid_alive, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.anyio]
GRACE_S = 3.0
BOUND_S = 60.0
UNRESOLVED = "io.mcp-recovery-proxy/unresolved"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


def text_of(result: Any) -> str:
    return "".join(c.text for c in getattr(result, "content", []) if isinstance(c, TextContent))


def hang(request_id: int, seconds: float, call_id: str) -> bytes:
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "hang", "arguments": {"seconds": seconds, "call_id": call_id}},
    }
    return json.dumps(message).encode() + b"\n"


def started(journal: Journal, *calls: str) -> bool:
    return all(journal.events(tool="hang", event="started", call=c) for c in calls)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_sigterm_lets_a_short_call_finish_and_ends_a_long_one_as_shutdown(tmp_path: Path, mode: str) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json"),
        extra=["--shutdown-grace-s", str(GRACE_S)],
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=60)
    assert proxy.proc is not None
    results: dict[str, Any] = {}
    try:
        with anyio.fail_after(BOUND_S):

            async def call(name: str, seconds: float) -> None:
                async with Client(proxy.url, mode=mode) as client:  # type: ignore[arg-type]
                    # listed first, as real clients do (the SDK would list them after the result
                    # otherwise, a new request that the shutting-down proxy refuses)
                    await client.list_tools()
                    results[name] = await client.call_tool("hang", {"seconds": seconds, "call_id": name})

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "short", GRACE_S / 3)
                tg.start_soon(call, "long", 30.0)
                await journal.await_for(lambda j: started(j, "short", "long"), timeout_s=20, what="both calls running")
                children = journal.pids()
                os.kill(proxy.proc.pid, signal.SIGTERM)
                async with httpx.AsyncClient(timeout=5.0) as http:
                    # the proxy's own answer turns 503: asked again until it does (bounded by fail_after)
                    while (await http.get(proxy.admin + "/readyz")).status_code != 503:
                        pass
                    refused = await http.post(
                        proxy.url,
                        json=INITIALIZE,
                        headers={"accept": "application/json, text/event-stream"},
                    )
                    assert refused.status_code == 503, refused.text
                    assert refused.json()["error"]["code"] == -32000
        assert text_of(results["short"]) == f"slept {GRACE_S / 3}s"
        long = results["long"]
        assert long.is_error
        report = long.meta[UNRESOLVED]
        assert report["stopReason"] == "shutdown"
        assert report["attemptCount"] == 1 and report["isRetryable"] is False
        assert report["attemptedSteps"][0]["dispatched"] == "unknown"
        journal.wait_for(
            lambda j: bool(j.events(tool="hang", event="cancelled", call="long")), timeout_s=10, what="long cancelled"
        )
        assert not journal.events(tool="hang", event="cancelled", call="short")
        assert proxy.proc.wait(timeout=30) == 0, proxy.log_tail()
        journal.wait_for(lambda j: not any(pid_alive(p) for p in children), timeout_s=10, what="children gone")
    finally:
        proxy.stop()


def read_answers(stdout: Any, ids: set[int], into: dict[int, dict[str, Any]]) -> None:
    """Read the proxy's stdout until it ends, keeping the answers to `ids` (in a thread: the pipe
    blocks; the test bounds it through the process's own exit)."""
    for line in stdout:
        message = json.loads(line)
        if message.get("id") in ids:
            into[message["id"]] = message


@pytest.mark.parametrize("how", ["stdin_closed", "sigterm", "sigint"])
def test_stdio_proxy_shuts_down_gracefully(tmp_path: Path, how: str) -> None:
    """`sigint`: a Ctrl-C, and without `--admin`, so that no uvicorn (whose handlers would take
    the signal) runs in the process: the proxy's own handler makes it the same graceful stop."""
    journal = Journal(tmp_path / "journal.jsonl")
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    admin = f"127.0.0.1:{free_port()}"
    flags = ["--listen", "stdio", "--shutdown-grace-s", str(GRACE_S)]
    if how != "sigint":
        flags += ["--admin", admin]
    with open(tmp_path / "proxy.log", "wb") as log:
        proc = subprocess.Popen(
            [PYTHON, "-m", "proxy", "serve", *flags, "--", *command],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    answers: dict[int, dict[str, Any]] = {}
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        proc.stdin.flush()
        assert b'"protocolVersion"' in proc.stdout.readline()
        proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        proc.stdin.write(hang(2, GRACE_S / 3, "short") + hang(3, 30.0, "long"))
        proc.stdin.flush()
        reader = threading.Thread(target=read_answers, args=(proc.stdout, {2, 3, 4}, answers), daemon=True)
        reader.start()
        journal.wait_for(lambda j: started(j, "short", "long"), timeout_s=20, what="both calls running")
        children = journal.pids()
        if how == "stdin_closed":
            proc.stdin.close()
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
            # Refused while the grace period runs (stdin is still read), which /readyz shows.
            deadline = time.monotonic() + 10
            while httpx.get(f"http://{admin}/readyz", timeout=5).status_code != 503:
                assert time.monotonic() < deadline, "/readyz still 200 10 s after SIGTERM"
            proc.stdin.write(b'{"jsonrpc":"2.0","id":4,"method":"tools/list"}\n')
            proc.stdin.flush()
        assert proc.wait(timeout=30) == 0, (tmp_path / "proxy.log").read_text()[-3000:]
        reader.join(timeout=10)
        assert answers[2]["result"]["content"][0]["text"] == f"slept {GRACE_S / 3}s"
        long = answers[3]["result"]
        assert long["isError"] is True and long["_meta"][UNRESOLVED]["stopReason"] == "shutdown"
        if how == "sigterm":
            assert answers[4]["error"]["code"] == -32000
        journal.wait_for(
            lambda j: bool(j.events(tool="hang", event="cancelled", call="long")), timeout_s=10, what="long cancelled"
        )
        journal.wait_for(lambda j: not any(pid_alive(p) for p in children), timeout_s=10, what="children gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


async def test_a_second_sigterm_ends_the_grace_period_at_once(tmp_path: Path) -> None:
    """With a 120 s grace period, a call still running after a second SIGTERM is ended at once:
    the test's 60 s bound would fail otherwise."""
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json"),
        extra=["--shutdown-grace-s", "120"],
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=60)
    assert proxy.proc is not None
    results: dict[str, Any] = {}
    try:
        with anyio.fail_after(BOUND_S):

            async def call() -> None:
                async with Client(proxy.url, mode="2026-07-28") as client:
                    await client.list_tools()
                    results["long"] = await client.call_tool("hang", {"seconds": 110.0, "call_id": "long"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await journal.await_for(lambda j: started(j, "long"), timeout_s=20, what="the call running")
                os.kill(proxy.proc.pid, signal.SIGTERM)
                async with httpx.AsyncClient(timeout=5.0) as http:
                    # the proxy's own answer turns 503: asked again until it does (bounded by fail_after)
                    while (await http.get(proxy.admin + "/readyz")).status_code != 503:
                        pass
                os.kill(proxy.proc.pid, signal.SIGTERM)
            assert results["long"].meta[UNRESOLVED]["stopReason"] == "shutdown"
            assert await anyio.to_thread.run_sync(proxy.proc.wait) == 0
    finally:
        proxy.stop()


SESSIONS = 4
SPARES = 2


async def test_sigterm_stops_every_stdio_child_at_once_even_ones_only_sigkill_stops(tmp_path: Path) -> None:
    """Every stdio child (each 2025 session's, the warm spares, the 2026 one) is stopped together,
    one bound for all of them. The children here ignore stdin's end and SIGTERM, so each is
    stopped only by the last stage (SIGKILL). Stopped one group after another (the sessions', then
    the spares, then the 2026 child, each group 2 s for stdin, 2 s for SIGTERM) the stop outlasted
    the 10 s the proxy gives its servers to end and was cut (a CancelledError traceback from the
    lifespan shutdown); the last children died only because the event loop's teardown cancelled
    the tasks that watch them, which signal their groups on the way out. No duration is asserted:
    what counts is the children still alive once the proxy has exited (none), its exit code (0),
    a stop that ran to its end (no traceback) and the proxy's own count of children stopped."""
    journal = Journal(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path, tmp_path / "state.json", extra=["--stubborn"]),
        # a fixed pool of SPARES: the count of children stopped is the claim, not the pool's growth
        extra=["--shutdown-grace-s", "1", "--stdio-spares", str(SPARES), "--stdio-spares-max", str(SPARES)],
        log_path=tmp_path / "proxy.log",
    ).start(timeout_s=60)
    assert proxy.proc is not None
    headers = {"accept": "application/json, text/event-stream"}
    children = SESSIONS + SPARES + 1  # and the 2026 requests' one, which answered the start-up probe
    try:
        with anyio.fail_after(BOUND_S):
            async with httpx.AsyncClient(timeout=30.0) as http:
                for n in range(SESSIONS):  # 2025 sessions left open: each holds its own child
                    opened = await http.post(proxy.url, json={**INITIALIZE, "id": n + 1}, headers=headers)
                    assert opened.status_code == 200, opened.text
                    session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"]}
                    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                    assert (await http.post(proxy.url, json=initialized, headers=session)).status_code == 202
            async with Client(proxy.url, mode="2026-07-28") as client:
                assert text_of(await client.call_tool("echo", {"text": "hi"})) == "hi"
            await journal.await_for(
                lambda j: len(j.pids()) >= children, timeout_s=30, what=f"{children} children started"
            )
        pids = journal.pids()
        assert len(pids) == children, pids
        os.kill(proxy.proc.pid, signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: proxy.proc.wait(timeout=BOUND_S))  # type: ignore[union-attr]
        left = [pid for pid in pids if pid_alive(pid)]
        assert left == [], f"children alive after the proxy exited: {left}; {proxy.log_tail()}"
        assert code == 0, proxy.log_tail()
        log = proxy.log_tail(50000)
        assert "Traceback" not in log, log
        assert f"stopped {children} upstream children" in log, log
    finally:
        proxy.stop()
