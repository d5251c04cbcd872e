"""The proxy's own garbage-collection pauses, for operators: a collection stops every call in flight
(deadlines included), so its length is part of every latency the proxy adds.

Contract:
- `GcPauseCollector()` installs (once per process, idempotent) a `gc.callbacks` hook that reads
  `time.perf_counter()` when a collection starts and when it stops, and exports, on the registry
  it is registered on, the histogram `mcp_recovery_gc_pause_seconds{generation}` ("0", "1", "2":
  the oldest generation the collection examined). Wall time: what the calls in flight wait.
- The hook runs on whatever thread triggered the collection; collections never overlap (the
  interpreter runs one at a time), so one start time is enough. It does two clock reads and a
  bisect per collection and never raises. Pauses are counted from the first collector made (the
  proxy makes it at start-up) and are process-wide, whichever registry exports them.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

NAME = "mcp_recovery_gc_pause_seconds"
DOC = "Garbage-collection pauses of the proxy process (wall time), by the generation collected."
# A young collection takes tens of microseconds to a few ms, a full one tens to hundreds of ms.
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_LES = [floatToGoString(b) for b in BUCKETS_S] + ["+Inf"]


class _Pauses:
    """Per generation, `[bucket counts..., +Inf, sum]` (what `_Series` in metrics.py keeps)."""

    __slots__ = ("cells", "started")

    def __init__(self) -> None:
        self.cells = [[0.0] * (len(BUCKETS_S) + 2) for _ in range(3)]
        self.started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        generation = info.get("generation")
        cell = self.cells[generation if generation in (0, 1, 2) else 2]
        cell[bisect_left(BUCKETS_S, took)] += 1
        cell[-1] += took


_PAUSES = _Pauses()


def _install() -> None:
    if _PAUSES not in gc.callbacks:
        gc.callbacks.append(_PAUSES)


class GcPauseCollector:
    """Exports the process's collection pauses (see the module docstring)."""

    def __init__(self) -> None:
        _install()

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(NAME, DOC, labels=("generation",))

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(NAME, DOC, labels=("generation",))
        for generation, cell in enumerate(_PAUSES.cells):
            cell = list(cell)  # a collection on another thread may add to it meanwhile
            total, buckets = 0.0, []
            for le, count in zip(_LES, cell, strict=False):
                total += count
                buckets.append((le, total))
            family.add_metric((str(generation),), buckets, cell[-1])
        yield family
