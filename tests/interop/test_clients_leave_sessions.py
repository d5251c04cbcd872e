"""Clients people use that leave their sessions open, through the real proxy at its shipped defaults.

- The MCP Inspector CLI opens a session per command and never closes it: run 100 times in a row
  against the proxy in front of the demo server (over HTTP), every run is answered.
- mcp-remote (the stdio bridge of desktop apps) opens two sessions per launch and closes neither:
  launched 30 times, every launch lists the tools and calls one.
- In front of a stdio server with a child per session, a machine that affords few children
  (`--max-sessions` set small, as the derived default is on a small machine): the Inspector run
  past that cap is still answered every time, because the least recently used idle session is
  closed and its child stopped; the children never outnumber the cap.

Every client run is bounded (`RUN_BOUND_S`); the servers are stopped by their pids.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.demo_http import demo_over_http
from tests.fixtures.helpers import PYTHON, REPO_ROOT, terminate
from tests.interop.harness import skip_or_fail, started
from tests.proxy_process import ProxyProcess

# Not serial (but the child-cap test): the assertions are answers and counts. The runs are
# sequential whatever the load; the one clock that matters is the shipped 600 s idle timeout,
# which the first session must outlast until the count (100 runs: about 2 minutes alone, 5 at
# load 6 on two cores).
pytestmark = [pytest.mark.slow, pytest.mark.interop, pytest.mark.timeout(900)]
RUN_BOUND_S = 60.0
APP = {"name": "app", "version": "1"}


@dataclass(frozen=True)
class Clients:
    node22: str
    inspector_cli: str
    mcp_remote: str


@pytest.fixture(scope="module")
def clients() -> Clients:
    cache = Path(os.environ.get("MCP_INTEROP_CACHE", REPO_ROOT / ".cache" / "interop"))
    try:
        found = json.loads((cache / "manifest.json").read_text())
        parts = Clients(**{k: found[k] for k in Clients.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        skip_or_fail(f"no Inspector CLI / mcp-remote in {cache}/manifest.json: {exc}")
        raise
    for name, path in vars(parts).items():
        if not Path(path).exists():
            skip_or_fail(f"{name}: {path} does not exist")
    return parts


def sessions(proxy: ProxyProcess) -> int:
    """The 2025 sessions the proxy holds (its /readyz says)."""
    return int(httpx.get(proxy.admin + "/readyz", timeout=10).json()["sessions"])


def metric(proxy: ProxyProcess, name: str) -> float:
    """The sum of a metric's series (every label set)."""
    lines = httpx.get(proxy.admin + "/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((name + " ", name + "{")))


def inspector(clients: Clients, url: str, text: str) -> subprocess.CompletedProcess[str]:
    argv = [clients.node22, clients.inspector_cli, "--cli", url, "--transport", "http"]
    argv += ["--method", "tools/call", "--tool-name", "echo", "--tool-arg", f"text={text}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_BOUND_S, stdin=subprocess.DEVNULL)


def test_the_inspector_cli_run_100_times_in_a_row_is_answered_every_time(clients: Clients, tmp_path: Path) -> None:
    with (
        demo_over_http() as upstream,
        started(ProxyProcess(upstream_url=upstream, log_path=tmp_path / "p.log", shipped_defaults=True)) as p,
    ):
        for run in range(100):
            done = inspector(clients, p.url, f"run {run}")
            assert done.returncode == 0 and f"run {run}" in done.stdout, (run, done.stdout, done.stderr[-2000:])
        # Each run left its session open (the reason this test exists) and none was refused.
        assert sessions(p) >= 100
        assert metric(p, "mcp_recovery_http_refused_total") == 0


def mcp_remote_launch(clients: Clients, url: str, home: Path, launch: int) -> list[dict[str, Any]]:
    """One launch as a desktop app makes it: initialize, list the tools, call one, then close
    its stdin (the app quits). Returns the answers it wrote; the process is gone afterwards."""
    env = {**os.environ, "HOME": str(home), "MCP_REMOTE_CONFIG_DIR": str(home / ".mcp-auth")}
    proc = subprocess.Popen(
        [clients.node22, clients.mcp_remote, url, "--transport", "http-only"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    text = f"launch {launch}"
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "app", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": text}},
        },
    ]
    answers: list[dict[str, Any]] = []
    try:
        assert proc.stdin is not None and proc.stdout is not None
        for message in messages:
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
            if "id" not in message:
                continue
            while True:  # bounded by the test's timeout and the process: EOF ends it
                line = proc.stdout.readline()
                if not line:
                    stderr = proc.stderr.read() if proc.stderr is not None and proc.poll() is not None else ""
                    raise AssertionError(f"launch {launch}: mcp-remote ended early: {stderr[-2000:]}")
                answer = json.loads(line)
                if answer.get("id") == message["id"]:
                    answers.append(answer)
                    break
        proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    finally:
        terminate(proc)
    return answers


def test_mcp_remote_launched_30_times_is_served_every_time(clients: Clients, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with (
        demo_over_http() as upstream,
        started(ProxyProcess(upstream_url=upstream, log_path=tmp_path / "p.log", shipped_defaults=True)) as p,
    ):
        for launch in range(30):
            answers = mcp_remote_launch(clients, p.url, home, launch)
            assert [a.get("id") for a in answers] == [1, 2, 3], answers
            assert all("result" in a for a in answers), answers
            assert any(t["name"] == "echo" for t in answers[1]["result"]["tools"])
            assert f"launch {launch}" in json.dumps(answers[2]["result"])
        assert sessions(p) >= 30  # none of them closed its sessions
        assert metric(p, "mcp_recovery_http_refused_total") == 0


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is `pid` (read from /proc)."""
    out: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


# Serial: the bound on live children counts one child still stopping, which a loaded machine
# can make two (a child's exit outlasting the next run).
@pytest.mark.serial
def test_the_inspector_past_a_small_child_cap_is_answered_and_idle_children_are_reclaimed(
    clients: Clients, tmp_path: Path
) -> None:
    cap = 4
    proxy = ProxyProcess(
        upstream=[PYTHON, "-m", "proxy.demo.server"],
        extra=["--max-sessions", str(cap)],
        log_path=tmp_path / "p.log",
        shipped_defaults=True,
    )
    with started(proxy) as p:
        assert p.proc is not None
        for run in range(3 * cap):
            done = inspector(clients, p.url, f"run {run}")
            assert done.returncode == 0 and f"run {run}" in done.stdout, (run, done.stdout, done.stderr[-2000:])
            # The sessions' children, the warm spare and a child still stopping: never beyond that.
            assert len(children_of(p.proc.pid)) <= cap + 2
        assert sessions(p) == cap
        assert metric(p, "mcp_recovery_sessions_evicted_total") >= 2 * cap
        assert metric(p, "mcp_recovery_http_refused_total") == 0


def test_the_inspector_cli_runs_the_proxy_as_its_stdio_server_in_the_documented_form(clients: Clients) -> None:
    # The Inspector strips `--` from its own arguments, so the proxy's command comes after an
    # extra `--` (README, docs/interop.md); the demo's lookup fails twice and is recovered.
    argv = [clients.node22, clients.inspector_cli, "--cli", "--method", "tools/call"]
    argv += ["--tool-name", "lookup_customer", "--tool-arg", "customer_id=c-1"]
    argv += ["--", PYTHON, "-m", "proxy", "serve", "--listen", "stdio", "--", PYTHON, "-m", "proxy.demo.server"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=RUN_BOUND_S, stdin=subprocess.DEVNULL, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    start = done.stdout.index("{")
    result = json.loads(done.stdout[start : done.stdout.rindex("}") + 1])
    assert result["isError"] is False and result["structuredContent"]["customer_id"] == "c-1", result
    assert result["_meta"]["io.mcp-recovery-proxy/attempts"] >= 2, "recovered within the one call"
