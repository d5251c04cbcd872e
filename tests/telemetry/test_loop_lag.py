"""`mcp_recovery_event_loop_lag_seconds` and `mcp_recovery_event_loop_cpu_wait_seconds_total`.

In process: a loop blocked for 300 ms runs its tick at least 200 ms late, and the histogram says
so; a thread that must share the CPUs with more busy processes than there are CPUs waits in the
run queue, and the counter grows. End to end: the real proxy's admin `/metrics` carries both, and
the lag histogram counts ticks while the proxy runs. Bounded waits only; nothing asserts a
duration of the machine's own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy.telemetry.loop_lag import LAG, WAIT, LoopLag
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
HAS_SCHEDSTAT = Path(f"/proc/self/task/{os.getpid()}/schedstat").exists()


def _value(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    return registry.get_sample_value(name, labels or {}) or 0.0


def test_a_blocked_loop_shows_as_a_late_tick() -> None:
    lag = LoopLag(interval_s=0.01)
    registry = CollectorRegistry()
    registry.register(lag)

    async def main() -> None:
        lag.start()
        await asyncio.sleep(0.05)  # a few ticks on time
        ticks = _value(registry, LAG + "_count")
        asyncio.get_running_loop().call_soon(time.sleep, 0.3)  # blocks the loop: the tick due waits
        for _ in range(3000):  # bounded: until two more ticks ran (the late one first)
            if _value(registry, LAG + "_count") >= ticks + 2:
                break
            await asyncio.sleep(0.01)
        lag.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
    count = _value(registry, LAG + "_count")
    late = count - _value(registry, LAG + "_bucket", {"le": "0.1"})
    assert late >= 1, "the tick that waited for the blocked loop is in a bucket above 100 ms"
    assert _value(registry, LAG + "_sum") >= 0.2
    assert _value(registry, LAG + "_bucket", {"le": "+Inf"}) == count


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no schedstat here")
def test_a_thread_competing_for_the_cpus_accumulates_run_queue_wait() -> None:
    lag = LoopLag()
    registry = CollectorRegistry()
    registry.register(lag)
    before = _value(registry, WAIT + "_total")
    spin = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1) + 1)]
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # this thread is runnable throughout, among more than the CPUs
            pass
    finally:
        for hog in hogs:
            hog.wait(timeout=30)
    assert _value(registry, WAIT + "_total") > before


def test_the_running_proxy_exports_both_on_a_real_scrape(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    with ProxyProcess(upstream=command, log_path=tmp_path / "proxy.log") as proxy:
        deadline = time.monotonic() + 30
        while True:
            text = httpx.get(proxy.admin + "/metrics", timeout=10).text
            counts = [line for line in text.splitlines() if line.startswith(LAG + "_count ")]
            if counts and float(counts[0].split()[1]) >= 3:
                break  # the tick runs in the proxy: at least three counted
            assert time.monotonic() < deadline, f"the lag histogram counts no ticks: {counts}"
            time.sleep(0.1)  # polling a scrape (bounded above)
        assert f"# TYPE {LAG} histogram" in text
        if HAS_SCHEDSTAT:
            assert any(line.startswith(WAIT + "_total ") for line in text.splitlines())
