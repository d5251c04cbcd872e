"""`python -m proxy` under tracemalloc, for a debug run of bench/soak.py (`--tracemalloc DIR`).

Never part of the product: the proxy itself has no tracemalloc hook. On SIGUSR2 this wrapper
writes a snapshot to `$SOAK_TRACEMALLOC_DIR/snap-N.tm` (N = 0, 1, ...), which the soak compares
(`Snapshot.compare_to`). Tracing starts at the first signal (10 frames), not at start-up: traced,
the proxy's imports took 70 s instead of 2 s on a loaded machine. So snapshot 0 is (nearly) empty
and a later one holds exactly what was allocated since the first signal and is still alive: what
grew. The handler runs in the main thread between two of the proxy's callbacks.
"""

from __future__ import annotations

import itertools
import os
import runpy
import signal
import sys
import tracemalloc

_out = os.environ["SOAK_TRACEMALLOC_DIR"]
_n = itertools.count()


def _dump(_sig: int, _frame: object) -> None:
    path = os.path.join(_out, f"snap-{next(_n)}.tm")
    if not tracemalloc.is_tracing():
        tracemalloc.start(10)
    tracemalloc.take_snapshot().dump(path + ".part")
    os.replace(path + ".part", path)  # the soak waits for the whole file


signal.signal(signal.SIGUSR2, _dump)
sys.argv = ["proxy", *sys.argv[1:]]
runpy.run_module("proxy", run_name="__main__", alter_sys=True)
