"""How late the proxy's event loop runs, for operators: every deadline, attempt timeout and answer
waits for the loop, so a late loop is late everything.

Contract:
- `LoopLag.start()` (on the running loop; idempotent) schedules a tick every `interval_s` (0.1 s)
  and records how much later than due each tick ran: `mcp_recovery_event_loop_lag_seconds`, a
  histogram. A loop kept busy by its own work and a loop waiting for a CPU both show here.
- `mcp_recovery_event_loop_cpu_wait_seconds_total`: how long the loop's thread has waited, runnable,
  for a CPU (the kernel's run-queue delay, `/proc/thread-self/schedstat`, read at each scrape).
  Its rate near the lag says the host or the container's CPU limit starves the proxy (other
  processes, the stdio children: `--stdio-nice`), not the proxy's own work. Absent where the
  kernel does not keep it (not Linux, or schedstats off).
- `stop()` cancels the tick. A tick costs two clock reads and a bisect; it never raises.
- `MetricsObserver` makes and registers one; `server.run` starts it on the proxy's loop. Not
  started, it exports an empty histogram.
"""

from __future__ import annotations

import asyncio
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

LAG = "mcp_recovery_event_loop_lag_seconds"
LAG_DOC = "How much later than due a periodic timer of the proxy's event loop ran."
WAIT = "mcp_recovery_event_loop_cpu_wait_seconds"
WAIT_DOC = "Time the event loop's thread spent runnable, waiting for a CPU (kernel run-queue delay)."
# A healthy loop runs a timer within a millisecond; a starved one tens to hundreds of ms late.
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_LES = [floatToGoString(b) for b in BUCKETS_S] + ["+Inf"]


def _schedstat_path() -> str | None:
    """The loop thread's own schedstat file (read later from any thread), or None without one."""
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    try:
        with open(path, "rb") as f:
            int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return path


class LoopLag:
    """The loop's tick and its two metrics (see the module docstring)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.cells = [0.0] * (len(BUCKETS_S) + 2)  # bucket counts..., +Inf, sum
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._schedstat = _schedstat_path()  # this thread's until `start` names the loop's

    def start(self) -> None:
        if self._handle is not None:
            return
        self._schedstat = _schedstat_path()
        self._schedule(asyncio.get_running_loop())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = time.perf_counter() + self.interval_s
        self._handle = loop.call_later(self.interval_s, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        late = max(0.0, time.perf_counter() - self._due)
        cells = self.cells
        cells[bisect_left(BUCKETS_S, late)] += 1
        cells[-1] += late
        self._schedule(loop)

    def cpu_wait_s(self) -> float | None:
        if self._schedstat is None:
            return None
        try:
            with open(self._schedstat, "rb") as f:  # procfs: no disk behind it
                return int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    # -- prometheus_client collector ------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(LAG, LAG_DOC)
        yield CounterMetricFamily(WAIT, WAIT_DOC)

    def collect(self) -> Iterator[Metric]:
        cells = list(self.cells)
        total, buckets = 0.0, []
        for le, count in zip(_LES, cells, strict=False):
            total += count
            buckets.append((le, total))
        yield HistogramMetricFamily(LAG, LAG_DOC, buckets=buckets, sum_value=cells[-1])
        waited = self.cpu_wait_s()
        if waited is not None:
            yield CounterMetricFamily(WAIT, WAIT_DOC, value=waited)
