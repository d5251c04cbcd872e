"""bench/_plain_relay.py, the yardstick `bench/relay.py --relay` and bench/faults.py measure the
engine against, still starts and relays in each of its variants: the proxy without its engine
(`plain`), the engine without telemetry (`engine-quiet`) and the proxy as shipped (`engine`).

It imports the proxy's composition by name, so a move inside proxy/ breaks it without any other
test noticing (it did once: `build_upstream` left proxy.core.service)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.fixtures.helpers import REPO_ROOT, free_port, terminate, wait_port

pytestmark = pytest.mark.slow

PLAIN_RELAY = REPO_ROOT / "bench" / "_plain_relay.py"
LEAN = REPO_ROOT / "bench" / "lean_upstream.py"


def _metrics(admin: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.mark.parametrize("variant", ["plain", "engine-quiet", "engine"])
def test_each_variant_relays_a_call(variant: str, tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    argv = [sys.executable, str(PLAIN_RELAY), "serve", "--listen", f"http://127.0.0.1:{port}/mcp"]
    argv += ["--admin", f"127.0.0.1:{admin}", "--", sys.executable, str(LEAN), "--transport", "stdio"]
    log = (tmp_path / "proxy.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "BENCH_RELAY": variant})
    try:
        wait_port(admin, timeout_s=30)
        wait_port(port, timeout_s=30)

        async def call() -> list[str]:
            with anyio.fail_after(30):
                async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                    result = await client.call_tool("echo", {"text": f"through {variant}"})
            assert not result.is_error
            return [c.text for c in result.content]  # type: ignore[union-attr]

        assert anyio.run(call) == [f"through {variant}"]
        # The engine counts the call; without it (plain) or without its telemetry, nothing does.
        counted = 'mcp_recovery_calls_total{outcome="success",tool="echo"} 1.0' in _metrics(admin)
        assert counted == (variant == "engine"), (proc.poll(), (tmp_path / "proxy.log").read_text()[-2000:])
    finally:
        terminate(proc)
        log.close()
