"""Do no harm: a call that works directly works through the shipped defaults, and a failure keeps
its cause. Real parts only: a FastMCP server (PyPI `fastmcp`, its own venv: scripts/setup-fastmcp.sh)
as the upstream, the Python SDK client, the TypeScript SDK clients (v1: 2025; v2: 2026-07-28) and
FastMCP's own Client; the proxy runs with no --policies (the shipped defaults are under test).

- A read-only tool silent for 35 s (no progress) succeeds with ONE upstream execution, through
  HTTP and stdio on both sides and in both eras (four legs at once, so the file pays 35 s once).
- FastMCP's Client, whose ToolError shows only the first content block, sees the tool's own
  words; the refused repeat of that exhausted call names the cause and when the refusal ends.
- An HTTP upstream killed during a read and restarted 2 s later, and a stdio server whose process
  exits during a read: the read succeeds, and says how long the upstream was unreachable.
Upstream executions are counted from the server's journal (one line per start and per end).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.helpers import REPO_ROOT, free_port, terminate, wait_port
from tests.interop.harness import (
    Call,
    Prerequisites,
    Reply,
    Target,
    TsClient,
    proxy_stdio_argv,
    run_py,
    skip_or_fail,
    started,
)
from tests.interop.test_ts2_client import Ts2Client
from tests.proxy_process import ProxyProcess

# Not serial: every assertion is an answer, a text or a count from the journal; the one figure
# (unreachableMs >= 1500) is a lower bound a loaded machine only raises, and the 35 s read is
# waited for, not timed. BOUND_S and the test timeouts leave room for slow starts.
pytestmark = [pytest.mark.slow, pytest.mark.interop]

HERE = Path(__file__).resolve().parent
SERVER = HERE / "fastmcp_server.py"
CLIENT = HERE / "fastmcp_client.py"
SILENT_S = 35.0  # longer than the 30 s idle timer the defaults shipped with before
UNREACHABLE_KEY = "io.mcp-recovery-proxy/unreachableMs"
BOUND_S = 90.0  # a leg: start, a 35 s call, stop, on a loaded two-core machine


@pytest.fixture(scope="module")
def fastmcp_python() -> str:
    cache = Path(os.environ.get("MCP_FASTMCP_CACHE", REPO_ROOT / ".cache" / "fastmcp"))
    python = cache / "venv" / "bin" / "python"
    if not python.exists():
        skip_or_fail(f"no FastMCP venv at {python} (scripts/setup-fastmcp.sh)")
    return str(python)


def starts(journal: Path, tool: str, tag: str) -> int:
    if not journal.exists():
        return 0
    return sum(1 for line in journal.read_text().splitlines() if line.split()[:3] == ["start", tool, tag])


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait (bounded) until `predicate()`: polling a file another process writes."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen within {timeout_s}s")
        time.sleep(0.05)


class FastMcpHttp:
    """tests/interop/fastmcp_server.py over HTTP on a fixed port: started, killed, restarted by pid.

    A restart is a warm spare loaded and bound to the port beforehand that listens when told
    (`restart`): FastMCP takes seconds to import and start on a loaded machine, and the restart's
    timing is the test's to set (tests/interop/fastmcp_server.py)."""

    def __init__(self, python: str, journal: Path) -> None:
        self.python = python
        self.journal = journal
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.spare: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _spawn(self, spare: bool) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                self.python,
                str(SERVER),
                str(self.journal),
                "http",
                str(self.port),
                *(["--on-stdin-line"] if spare else []),
            ],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE if spare else subprocess.DEVNULL,
            stdout=subprocess.PIPE if spare else None,
        )

    def start(self) -> FastMcpHttp:
        self.proc = self._spawn(spare=False)
        wait_port(self.port, timeout_s=60.0)
        return self

    def prepare_restart(self, timeout_s: float = 60.0) -> None:
        """Start the spare and wait (bounded) for its "ready": loaded, its socket bound."""
        self.spare = self._spawn(spare=True)
        assert self.spare.stdout is not None
        ready, _, _ = select.select([self.spare.stdout], [], [], timeout_s)
        line = self.spare.stdout.readline() if ready else b""
        assert line == b"ready\n", f"the spare server did not get ready within {timeout_s}s: {line!r}"

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def restart(self) -> None:
        assert self.spare is not None and self.spare.stdin is not None
        self.proc, self.spare = self.spare, None
        self.proc.stdin.write(b"go\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def stop(self) -> None:
        for proc in (self.proc, self.spare):
            if proc is not None:
                terminate(proc)


@contextlib.contextmanager
def fastmcp_http(python: str, journal: Path) -> Iterator[FastMcpHttp]:
    server = FastMcpHttp(python, journal).start()
    try:
        yield server
    finally:
        server.stop()


def stdio_upstream(python: str, journal: Path) -> list[str]:
    return [python, str(SERVER), str(journal), "stdio"]


def _leg_result(reply: Reply) -> tuple[bool, str]:
    return reply.ok and not (reply.result or {}).get("isError"), reply.texts


@pytest.mark.timeout(300)  # four legs at once: FastMCP and proxy starts (seconds each on a loaded host) and 35 s
def test_a_read_silent_for_35s_succeeds_once_through_the_shipped_defaults_over_http_and_stdio_in_both_eras(
    prereq: Prerequisites, fastmcp_python: str, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(fastmcp_http(fastmcp_python, journal))
        http_to_http = stack.enter_context(
            started(ProxyProcess(upstream_url=upstream.url, log_path=tmp_path / "http-http.log", shipped_defaults=True))
        )
        http_to_stdio = stack.enter_context(
            started(
                ProxyProcess(
                    upstream=stdio_upstream(fastmcp_python, journal),
                    log_path=tmp_path / "http-stdio.log",
                    shipped_defaults=True,
                )
            )
        )

        def call(tag: str) -> Call:
            return Call("slow_read", {"seconds": SILENT_S, "tag": tag})

        def py_legacy_http_http() -> tuple[bool, str]:
            return _leg_result(run_py(Target(url=http_to_http.url), [call("py-legacy")], "legacy")[0])

        def py_2026_stdio_stdio() -> tuple[bool, str]:
            target = Target(argv=proxy_stdio_argv(upstream=stdio_upstream(fastmcp_python, journal)))
            return _leg_result(run_py(target, [call("py-2026")], "2026-07-28")[0])

        def ts_2025_stdio_http() -> tuple[bool, str]:
            # the TS SDK's own 60 s request timeout, as its users get it (no timeoutMs)
            with TsClient(prereq, Target(argv=proxy_stdio_argv(upstream_url=upstream.url))) as client:
                return _leg_result(client.call(call("ts-2025"), timeout_s=BOUND_S))

        def ts_2026_http_stdio() -> tuple[bool, str]:
            with Ts2Client(prereq, "pin", Target(url=http_to_stdio.url)) as client:
                assert client.connected.get("ok"), client.connected
                raw = client.command({"op": "callTool", "name": "slow_read", "arguments": call("ts-2026").arguments})
                return _leg_result(Reply(ok=bool(raw["ok"]), result=raw.get("result"), error=raw.get("error")))

        legs = {
            "py-legacy": py_legacy_http_http,
            "py-2026": py_2026_stdio_stdio,
            "ts-2025": ts_2025_stdio_http,
            "ts-2026": ts_2026_http_stdio,
        }
        with ThreadPoolExecutor(len(legs)) as pool:
            futures = {tag: pool.submit(leg) for tag, leg in legs.items()}
            outcomes = {tag: future.result(timeout=BOUND_S) for tag, future in futures.items()}

    for tag, (ok, text) in outcomes.items():
        assert ok, f"{tag}: {text}"
        assert text == f"read {tag} after {SILENT_S:g}s", tag
        assert starts(journal, "slow_read", tag) == 1, f"{tag}: ran upstream more than once"


def _fastmcp_client(
    python: str, url: str, tool: str, arguments: dict[str, Any], count: int = 1
) -> tuple[list[dict[str, Any]], str]:
    """FastMCP's client making `count` identical calls: one line per call, and the tail of its log
    (each HTTP request it made, its reconnections: tests/interop/fastmcp_client.py)."""
    try:
        done = subprocess.run(
            [python, str(CLIENT), url, tool, json.dumps(arguments), str(count)],
            cwd=REPO_ROOT,
            capture_output=True,
            timeout=BOUND_S,
            check=False,
        )
    except subprocess.TimeoutExpired as late:  # what the client had done by then (its log)
        log = (late.stderr or b"")[-4000:].decode(errors="replace")
        raise AssertionError(f"FastMCP client not done within {BOUND_S}s: {late.stdout!r} {log}") from None
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    log = done.stderr[-4000:].decode(errors="replace")
    assert len(lines) == count, f"FastMCP client: {done.stdout!r} {log}"
    return lines, log


def test_fastmcp_client_sees_the_tools_own_message_in_tool_error_and_the_refused_repeat_names_the_cause(
    fastmcp_python: str, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    with started(
        ProxyProcess(
            upstream=stdio_upstream(fastmcp_python, journal), log_path=tmp_path / "proxy.log", shipped_defaults=True
        )
    ) as proxy:
        (first, repeat), client_log = _fastmcp_client(fastmcp_python, proxy.url, "flaky_db", {"tag": "t"}, count=2)
        seen = f"journal: {journal.read_text()!r}\nproxy log: {proxy.log_tail()}\nclient log: {client_log}"

    # The failure is transient ("timed out") and the tool read-only: retried to the end of its
    # attempts, then given up. What FastMCP's user sees is the first block: the tool's own words.
    # "Read-only" is the proxy's knowledge from a listing: the client lists the tools before it
    # calls (fastmcp_client.py). A call that comes before any listing is through waits for the
    # proxy's own one only so long (a few seconds), and on a loaded machine that wait can end
    # first: the call then runs as one whose side effects are unknown (one attempt, no budget
    # spent, nothing for the ledger to refuse), which is not what this test is about.
    assert first["ok"] is False and first["type"] == "ToolError", first
    assert first["message"] == "database timed out after 5s"
    assert starts(journal, "flaky_db", "t") == 3, seen
    # The identical call is refused without reaching the upstream, and the refusal names the cause
    # (the category and the upstream's last message) and when it ends.
    assert repeat["ok"] is False, repeat
    assert "database timed out after 5s" in repeat["message"], repeat
    assert "transient" in repeat["message"] and "refusal ends in" in repeat["message"], repeat
    assert "already retried" in repeat["message"], repeat
    assert starts(journal, "flaky_db", "t") == 3, seen


def _restart_later(server: FastMcpHttp, after_s: float) -> threading.Thread:
    """Kill the server now and start it again `after_s` later (the fault's own schedule)."""
    server.kill()

    def restart() -> None:
        time.sleep(after_s)
        server.restart()

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    return thread


def test_an_http_upstream_killed_during_a_read_and_restarted_2s_later_is_bridged(
    fastmcp_python: str, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    with (
        fastmcp_http(fastmcp_python, journal) as upstream,
        started(
            ProxyProcess(upstream_url=upstream.url, log_path=tmp_path / "proxy.log", shipped_defaults=True)
        ) as proxy,
        ThreadPoolExecutor(1) as pool,
    ):
        upstream.prepare_restart()
        reply = pool.submit(run_py, Target(url=proxy.url), [Call("slow_read", {"seconds": 1.0, "tag": "r"})], "legacy")
        wait_for(lambda: starts(journal, "slow_read", "r") == 1, 30.0, "the read reaching the upstream")
        restarted = _restart_later(upstream, 2.0)
        (result,) = reply.result(timeout=BOUND_S)
        restarted.join(timeout=60.0)

    assert result.ok and not (result.result or {}).get("isError"), f"{result.texts} {proxy.log_tail()}"
    assert result.texts == "read r after 1s"
    assert starts(journal, "slow_read", "r") == 2  # the killed one, and the one that answered
    meta = (result.result or {}).get("_meta") or {}
    assert meta.get(UNREACHABLE_KEY, 0) >= 1500, meta  # the restart's 2 s, as the retries saw it


def test_a_stdio_upstream_whose_process_exits_during_a_read_is_bridged(fastmcp_python: str, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    target = Target(argv=proxy_stdio_argv(upstream=stdio_upstream(fastmcp_python, journal)))
    (result,) = run_py(target, [Call("exit_once", {"tag": "x"})], "legacy")

    assert result.ok and not (result.result or {}).get("isError"), result.texts
    assert result.texts == "back x"
    assert starts(journal, "exit_once", "x") == 2  # the one that ended the process, the one that answered
    meta = (result.result or {}).get("_meta") or {}
    assert UNREACHABLE_KEY in meta, meta
