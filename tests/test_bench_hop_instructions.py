"""bench/hop_instructions.py: its load generator against the real proxy in both eras (every
answer checked, chunked and sized bodies read), and, where valgrind is installed, one short run
of the whole script; bench/frontend_floor.py's servers answering that generator."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.helpers import REPO_ROOT

pytestmark = pytest.mark.slow

sys.path.insert(0, str(REPO_ROOT / "bench"))

import hop_instructions as H  # noqa: E402
import relay as R  # noqa: E402


@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_the_load_generator_gets_a_result_for_every_call(era: str) -> None:
    procs = R.Processes()
    with tempfile.TemporaryDirectory(prefix="hop-test-") as tmp:
        try:
            R.UPSTREAM = R.UPSTREAMS["lean"]
            _, up_port = R.start_upstream_http(procs, 0, Path(tmp))
            _, port = R.start_proxy(procs, f"http://127.0.0.1:{up_port}/mcp", Path(tmp), ["--log-level", "warning"])
            session = R.open_session(f"http://127.0.0.1:{port}/mcp") if era == "legacy" else None
            asyncio.run(asyncio.wait_for(H.drive(port, era, session, 40, 4, 1), 60))
            # A call the proxy refuses is not counted as done: the generator says so.
            with pytest.raises(RuntimeError, match="answered"):
                asyncio.run(asyncio.wait_for(H.drive(port, "legacy", "no-such-session", 1, 1, 1), 60))
        finally:
            procs.stop_all()


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (apt-get install valgrind)")
def test_a_short_run_prints_instructions_per_call() -> None:
    argv = [sys.executable, str(REPO_ROOT / "bench" / "hop_instructions.py"), "--paths", "http"]
    argv += ["--calls", "20", "--warmup", "10", "--concurrency", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r"http→http\s+this checkout\s+([\d,]+) instructions/call", done.stdout)
    assert found, done.stdout
    assert 50_000 < int(found.group(1).replace(",", "")) < 50_000_000, done.stdout


@pytest.mark.parametrize("kind", ["asgi", "asgi-plain", "raw"])
def test_each_frontend_floor_server_answers_every_call(kind: str) -> None:
    """bench/frontend_floor.py's servers (natively here; the script counts them under callgrind)."""
    procs = R.Processes()
    with tempfile.TemporaryDirectory(prefix="floor-test-") as tmp:
        try:
            port = R.free_port()
            argv = [
                sys.executable,
                str(REPO_ROOT / "bench" / "frontend_floor.py"),
                "--serve",
                kind,
                "--port",
                str(port),
            ]
            server = procs.start(argv, Path(tmp) / "server.log")
            R.wait_until(lambda: R.port_open(port), kind, server, Path(tmp) / "server.log", timeout_s=60)
            asyncio.run(asyncio.wait_for(H.drive(port, "modern", None, 40, 4, 1), 60))
        finally:
            procs.stop_all()
