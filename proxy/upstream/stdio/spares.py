"""The warm pool (`--stdio-spares`): children of the command started ahead of the links that will
take them.

- Once a child of the command has answered (`replenish` is only called then, so a broken command
  never spawns in a loop), up to `size` children are kept started ahead, so that a new 2025 session
  (or a session whose child died, or the 2026 link whose shared child died) gets a running process
  at once. A spare has been asked nothing, so its era is not fixed yet: the link that takes it fixes
  it with its first request.
- They are started in the background, at most `starts` at a time (a burst of sessions does not
  start a process per session at once on top of their own), and only while the owner has room for
  another session (`has_room`). They are handed out oldest first, refilled as they are taken, and
  reaped when unused for `idle_s` (down to one, refilled again by demand: `reap_idle`).
- A spare is no session: it counts against neither the upstream's session limit nor the proxy's
  `--max-sessions`.
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
from proxy.upstream.stdio.process import Child, OnExit, OnLine

log = logging.getLogger("proxy.upstream.stdio")
stderr_log = logging.getLogger("proxy.upstream.stderr")

Spawn = Callable[[OnLine, OnExit], Awaitable[Child]]


class SparePool:
    """The spares of one stdio upstream: `ready` (started, oldest first) and `starting`."""

    def __init__(
        self,
        spawn: Spawn,
        *,
        size: int,
        starts: int,
        idle_s: float,
        has_room: Callable[[], bool],
        in_background: Callable[[Coroutine[object, None, object]], None],
    ) -> None:
        self._spawn = spawn
        self.size = size
        self.starts = starts
        self.idle_s = idle_s
        self._has_room = has_room
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
        one would), else a fresh one. A spare taken from the pool starts the next one."""
        while self.ready:
            spare = self.ready.popleft()
            if spare.alive and not spare.protocol.overflow:
                self.replenish()  # the command is known to work: the next spare starts booting now
                return _bind(spare, on_line, on_exit)
            await spare.terminate()
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
        """Fill the pool up to `size`, at most `starts` starting at once (only once a child
        of this command has answered, so a broken command never spawns in a loop)."""
        if self.size <= 0 or self.closed:
            return
        while (
            len(self.ready) + len(self.starting) < self.size and len(self.starting) < self.starts and self._has_room()
        ):
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
            self.replenish()  # (a start that failed does not start the next one at once)

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
            log.info("%s: the spare upstream child exited with code %s before it was used", child.name, code)

    def reap_idle(self) -> int:
        """Stop the spares unused for `idle_s`, keeping one (the pool refills as sessions take
        them again); returns how many were stopped."""
        now = time.monotonic()
        reaped = 0
        while len(self.ready) > 1 and now - self.ready[0].pooled_at > self.idle_s:
            spare = self.ready.popleft()
            self._in_background(spare.terminate())
            reaped += 1
        if reaped:
            log.info("stopped %d spare upstream children unused for %g s", reaped, self.idle_s)
        return reaped

    async def close(self) -> None:
        """Start no spare again: the starts under way are cancelled (and awaited), the pool emptied."""
        self.closed = True
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
