"""How many warm spares the demand calls for (`SpareDemand`), and how many the memory allows
(`MemoryGate`).

The model: a session that finds no warm spare waits for a whole child start, and a spare taken now
is replaced only one start later. So the pool serves every session at once only if it holds as
many spares as sessions open within one child's start time. `SpareDemand` keeps, for each child
taken, how many were taken within the start time before it (the window), and answers the peak of
those counts over the last `decay_s` (the time after which unused spares are reaped): an agent
opening ten sessions at once makes it ten for that long; a client opening one session per run
(and never closing it) keeps it at one, however many it opens over the day. Exact, O(1) per open
(a sliding-window maximum): no timer, no task.

`MemoryGate`: spares are idle processes holding memory, so the pool grows beyond its base size
only while what the extra spares would hold stays within a share (`share`) of the memory
available to the proxy (the host's `MemAvailable`, or less when the proxy's cgroup, v1 or v2, has a limit),
at the memory of one child as measured on a live child of the command (the resident sets of every
process its guard leads). Both are read from procfs in a worker thread, never on the event loop,
at most once per `REFRESH_S`; until a first reading is there, the pool does not grow. Without
procfs (not Linux) nothing is measured and the pool keeps its base size.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable

from proxy.upstream.stdio.procfs import session_processes

REFRESH_S = 5.0  # a memory reading is reused for this long
MIN_CHILD_BYTES = 1 << 20  # a child is never counted below this (one that is still loading reads small)


class SpareDemand:
    """The peak number of children taken within one start time, over the last `decay_s`."""

    def __init__(self, decay_s: float) -> None:
        self.decay_s = decay_s
        self._opens: deque[float] = deque()  # the takes within the current window
        self._peaks: deque[tuple[float, int]] = deque()  # (when, count), counts decreasing

    def opened(self, now: float, window_s: float) -> None:
        """A child was taken at `now`; `window_s`: one child's start time."""
        opens = self._opens
        opens.append(now)
        while opens[0] <= now - window_s:
            opens.popleft()
        count = len(opens)
        peaks = self._peaks
        while peaks and peaks[-1][1] <= count:  # an older, smaller count can never be the peak again
            peaks.pop()
        peaks.append((now, count))

    def peak(self, now: float) -> int:
        """The largest count of takes within one start time seen in the last `decay_s` (0: none)."""
        peaks = self._peaks
        while peaks and peaks[0][0] < now - self.decay_s:
            peaks.popleft()
        return peaks[0][1] if peaks else 0


def spares_memory_allows(available: int, per_child: int, share: float) -> int:
    """How many more children fit in `share` of `available` bytes at `per_child` bytes each."""
    return max(0, int(available * share) // max(per_child, MIN_CHILD_BYTES))


def available_bytes() -> int | None:
    """The memory available to this process: the host's `MemAvailable`, or, when this process's
    cgroup has a limit, what is left under it, whichever is less; None without procfs."""
    try:
        with open("/proc/meminfo", "rb") as f:
            meminfo = f.read()
    except OSError:
        return None
    available: int | None = None
    for line in meminfo.splitlines():
        if line.startswith(b"MemAvailable:"):
            available = int(line.split()[1]) * 1024
            break
    if available is None:
        return None
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _cgroup_room() -> int | None:
    """What is left under this process's cgroup memory limit (v2 `memory.max`, or v1
    `memory.limit_in_bytes`), tried at its cgroup's path and at the mount's root (a container sees
    its own cgroup there); None without a limit or a readable one."""
    try:
        with open("/proc/self/cgroup", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(b":")
        controllers, _, path = rest.partition(b":")
        if hierarchy == b"0" and not controllers:
            mount, limit_file, used_file = b"/sys/fs/cgroup", b"memory.max", b"memory.current"
        elif b"memory" in controllers.split(b","):
            mount, limit_file, used_file = b"/sys/fs/cgroup/memory", b"memory.limit_in_bytes", b"memory.usage_in_bytes"
        else:
            continue
        for base in (mount + path.rstrip(b"/"), mount):
            try:
                with open(base + b"/" + limit_file, "rb") as f:
                    limit = f.read().strip()
                with open(base + b"/" + used_file, "rb") as f:
                    used = int(f.read())
            except (OSError, ValueError):
                continue
            if limit == b"max" or int(limit) >= 1 << 60:  # no limit (v1 says so with a huge number)
                break
            return max(0, int(limit) - used)
    return None


def session_rss_bytes(session: int) -> int:
    """The resident sets of every process of `session` (`procfs.session_processes`)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in session_processes(session):
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):  # exited meanwhile
            continue
    return total


class MemoryGate:
    """How many children the pool may hold beyond its base size, by memory (module docstring).
    `limit(held)` is the most spares allowed now, `held` being the spares held or starting;
    None until a reading is there (`refresh`)."""

    def __init__(self, share: float, sample_pid: Callable[[], int | None]) -> None:
        self.share = share
        self._sample_pid = sample_pid  # a live child of the command that has answered, if any
        self.per_child: int | None = None
        self._fits: int | None = None  # spares allowed: those held at the reading + what fits beyond
        self._read_at = -REFRESH_S
        self.reading: asyncio.Task[None] | None = None  # a reading under way (awaitable)

    def limit(self) -> int | None:
        return self._fits

    def refresh(self, held: int, then: Callable[[], None]) -> None:
        """Read again (in a worker thread) unless a reading is under way or recent; `then` runs
        once a new reading is there."""
        if self.reading is not None or time.monotonic() - self._read_at < REFRESH_S:
            return
        pid = self._sample_pid()
        if pid is None:
            return
        self.reading = asyncio.get_running_loop().create_task(self._read(pid, held, then))

    async def _read(self, pid: int, held: int, then: Callable[[], None]) -> None:
        try:
            per_child, available = await asyncio.to_thread(_reading, pid)
        finally:
            self.reading = None
            self._read_at = time.monotonic()
        if per_child is None or available is None:
            return
        self.per_child = max(per_child, MIN_CHILD_BYTES)
        self._fits = held + spares_memory_allows(available, per_child, self.share)
        then()

    def cancel(self) -> None:
        if self.reading is not None:
            self.reading.cancel()


def _reading(pid: int) -> tuple[int | None, int | None]:
    available = available_bytes()
    if available is None:
        return None, None
    per_child = session_rss_bytes(pid)
    return (per_child or None), available
