"""The warm pool (`--stdio-spares`, `--stdio-spares-max`): children of the command started ahead
of the links that will take them.

- Once a child of the command has answered (`replenish`; so a broken command never spawns in a
  loop), children are kept started ahead, so that a new 2025 session (or a session whose child
  died, or the 2026 link whose shared child died) gets a running process at once. A spare has been
  asked nothing, so its era is not fixed yet: the link that takes it fixes it with its first request.
- How many (`target`): `size` (the base), or more when the demand calls for it: the recent peak of
  children taken within one child start time (demand.py `SpareDemand`: what a burst of sessions
  needs ready for none of them to wait for a start), up to `ceiling`, never more than the sessions
  the owner may still open (`room`), nor more than a share of the available memory holds at the
  measured memory of a child (demand.py `MemoryGate`). The peak decays after `idle_s`.
- They are started in the background, at most `starts` at a time (a burst of sessions does not
  start a process per session at once on top of their own), and only while the owner has room for
  another session. They are handed out oldest first, refilled as they are taken, and reaped
  (`reap_idle`) when unused for `idle_s`, or beyond the target once the demand has decayed, down
  to one (refilled again by demand).
- A spare that exits before it is used (the command stopped working) stops the refilling until a
  child of the command answers again: the pool never starts children in a loop.
- A spare is no session: it counts against neither the upstream's session limit nor the proxy's
  `--max-sessions`; the pool's growth beyond `size` does, through `room`.
- `child_for`: a link that finds the pool empty while spares are starting waits for one of them
  (one not already promised to another link); with none starting it spawns its own child.
- After `close`, no spare is started or pooled; the children already started are the owner's to
  stop (it stops every child it spawned).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine

from proxy.errors import UpstreamFailure
from proxy.upstream.stdio.demand import MemoryGate, SpareDemand
from proxy.upstream.stdio.process import Child, OnExit, OnLine

log = logging.getLogger("proxy.upstream.stdio")
stderr_log = logging.getLogger("proxy.upstream.stderr")

Spawn = Callable[[OnLine, OnExit], Awaitable[Child]]


MEMORY_SHARE = 0.5  # of the memory available, the most the spares beyond the base size may hold
MIN_WINDOW_S = 1.0  # the demand's window: one child's start time, never counted as less


class SparePool:
    """The spares of one stdio upstream: `ready` (started, oldest first) and `starting`."""

    def __init__(
        self,
        spawn: Spawn,
        *,
        size: int,
        starts: int,
        idle_s: float,
        room: Callable[[], int],
        in_background: Callable[[Coroutine[object, None, object]], None],
        ceiling: int = 0,
        start_s: Callable[[], float | None] = lambda: None,
        sample_pid: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._spawn = spawn
        self.size = size
        self.ceiling = max(size, ceiling) if size > 0 else 0  # no pool: no growth either
        self.starts = starts
        self.idle_s = idle_s
        self._room = room  # sessions the owner may still open
        self._start_s = start_s  # how long a child of the command took to start, once known
        self.min_window_s = MIN_WINDOW_S
        self.demand = SpareDemand(idle_s)
        self.memory = MemoryGate(MEMORY_SHARE, sample_pid)
        self._works = False  # a child of the command answered, and no spare died unused since
        self._in_background = in_background  # runs a spare's stop, which the owner awaits when it closes
        self.ready: deque[Child] = deque()  # started, oldest first
        self._unclaimed: deque[asyncio.Task[Child | None]] = deque()  # starting, promised to no link
        self.starting: set[asyncio.Task[Child | None]] = set()
        self.closed = False

    def prestart(self) -> None:
        """Start the child the first request will take (`single_session`: the only one), so that
        the process starts while the client is still starting too."""
        if not self.ready and not self.starting and not self.closed:
            self._start_spare()

    async def child_for(self, on_line: OnLine, on_exit: OnExit) -> Child:
        """A child for a new legacy session, the 2026 link (its first, or one replacing a child that
        died), or, `single_session`, the one link of either era: a warm one from the pool, else one
        being started for the pool and promised to no session yet (it started earlier than a new
        one would), else a fresh one. A spare taken from the pool starts the next one. Every call
        counts in the demand the pool is sized to."""
        self.demand.opened(time.monotonic(), max(self.min_window_s, self._start_s() or 0.0))
        while self.ready:
            spare = self.ready.popleft()
            if spare.alive and not spare.protocol.overflow:
                self._fill()  # the next spare starts booting now
                return _bind(spare, on_line, on_exit)
            await spare.terminate()
        self._fill()  # (a burst beyond the pool: the spares it now calls for start behind it)
        while self._unclaimed:
            starting = self._unclaimed.popleft()
            promised: Child | None
            try:
                promised = await asyncio.shield(starting)
            except asyncio.CancelledError:
                if not starting.done():  # our caller gave up: the child goes to the pool after all
                    starting.add_done_callback(self._unwanted)
                raise
            except Exception:
                promised = None
            if promised is not None and promised.alive and not promised.protocol.overflow:
                return _bind(promised, on_line, on_exit)
            if promised is not None:
                await promised.terminate()
        return await self._spawn(on_line, on_exit)

    def replenish(self) -> None:
        """A child of this command answered, so the command works: fill the pool (`_fill`)."""
        self._works = True
        self._fill()

    def target(self) -> int:
        """How many spares to hold now: `size`, or the recent demand's peak, capped (module docstring)."""
        if self.size <= 0 or self.closed:
            return 0
        want = min(self.demand.peak(time.monotonic()), self.ceiling, self._room())
        if want <= self.size:
            return self.size
        held = len(self.ready) + len(self.starting)
        if want > held:
            self.memory.refresh(held, self._fill)  # (at most one reading per REFRESH_S, in a thread)
        fits = self.memory.limit()
        return self.size if fits is None else max(self.size, min(want, fits))

    def _fill(self) -> None:
        """Start spares up to `target`, at most `starts` at once, while the command works."""
        if not self._works or self.size <= 0 or self.closed:
            return
        target = self.target()
        while len(self.ready) + len(self.starting) < target and len(self.starting) < self.starts and self._room() > 0:
            self._start_spare()

    def _start_spare(self) -> None:
        task = asyncio.create_task(self._make_spare())
        self.starting.add(task)
        self._unclaimed.append(task)
        task.add_done_callback(self._spare_started)

    async def _make_spare(self) -> Child | None:
        try:
            child = await self._spawn(_spare_line, self._spare_exited)
        except UpstreamFailure as failure:
            log.info("could not start a spare upstream child: %s", failure.detail)
            return None
        child.pooled_at = time.monotonic()
        return child

    def _spare_started(self, task: asyncio.Task[Child | None]) -> None:
        self.starting.discard(task)
        if task in self._unclaimed:  # nobody is waiting for this one: it joins the pool
            self._unclaimed.remove(task)
            self._unwanted(task)
        if not task.cancelled() and task.exception() is None and task.result() is not None:
            self._fill()  # (a start that failed does not start the next one at once)

    def _unwanted(self, task: asyncio.Task[Child | None]) -> None:
        child = None if task.cancelled() or task.exception() is not None else task.result()
        if child is None:
            return
        if self.closed:
            return  # among the children the owner stops
        child.on_line, child.on_exit = _spare_line, self._spare_exited
        self.ready.append(child)

    def _spare_exited(self, child: Child, code: int | None) -> None:
        if child in self.ready:
            self.ready.remove(child)
            self._works = False  # no refill until a child of the command answers again
            log.info("%s: the spare upstream child exited with code %s before it was used", child.name, code)

    def reap_idle(self) -> int:
        """Stop the spares unused for `idle_s`, and those beyond the target once the demand that
        grew the pool has decayed, oldest first, keeping one (the pool refills as sessions take
        them again); returns how many were stopped."""
        now = time.monotonic()
        target = self.target()
        reaped = 0
        while len(self.ready) > 1 and (
            now - self.ready[0].pooled_at > self.idle_s or len(self.ready) + len(self.starting) > target
        ):
            spare = self.ready.popleft()
            self._in_background(spare.terminate())
            reaped += 1
        if reaped:
            log.info("stopped %d spare upstream children unused for %g s", reaped, self.idle_s)
        return reaped

    async def close(self) -> None:
        """Start no spare again: the starts under way are cancelled (and awaited), the pool emptied."""
        self.closed = True
        self.memory.cancel()
        starting = list(self.starting)
        for task in starting:
            task.cancel()
        if starting:
            await asyncio.gather(*starting, return_exceptions=True)
        self.ready.clear()


def _bind(spare: Child, on_line: OnLine, on_exit: OnExit) -> Child:
    spare.on_line = on_line
    spare.on_exit = on_exit
    return spare


def _spare_line(child: Child, line: bytes) -> None:
    if child.protocol.log_budget.take(child.name):
        stderr_log.info("%s (spare) wrote before any request: %s", child.name, line[:200].decode("utf-8", "replace"))
