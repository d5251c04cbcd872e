"""The attempt timers of a relay: a response timeout, a send deadline and an idle timer per
attempt, all on one event-loop timer per relay.

Contract:
- `Deadlines.start` gives an attempt its `AttemptTimer`, entered at the earliest moment it could
  end; when it is really due it cancels the attempt's task (`fired`), which `Relay.attempt` turns
  into `AttemptTimedOut`. `end` retires it; dead entries never wake the loop and are compacted
  away, so the heap stays bounded.
- Before the request is handed to the transport the timer stands for the send deadline; after,
  for the response timeout (never past the deadline), and with `idle_s` also for the idle timer,
  which any message related to the attempt restarts (`alive_at`).
- `AttemptTimer.waiting` (an exchange's `on_input`): while the link waits for the client's
  answers to a server's input requests (the era bridge's input-required round trip), only the
  deadline runs; once they are sent on, the response timeout and the idle timer start again.
- `AttemptTimer.wrote` (the link's `on_write`) records that the request may have reached the
  upstream even when the hand-over never returned: a timer firing then says sent (dispatch
  unknown), never "not sent".
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from typing import Any


class AttemptTimedOut(TimeoutError):
    """`Relay.attempt`'s timer ran out. `sent` says whether the request may have reached the
    upstream by then (handed to the transport, or written while the hand-over was still running)
    or not (cut by the send deadline before anything went out): the timer knows, so no flag object
    is built per attempt to tell."""

    def __init__(self, sent: bool, idle_s: float | None = None) -> None:
        super().__init__()
        self.sent = sent
        self.idle_s = idle_s  # set when the idle timer ended it: nothing came for that long


class Deadlines:
    """The attempt timers of one relay on ONE event-loop timer: a heap of (due, seq, timer), the
    loop timer armed for the earliest live one. An attempt pushes its due time (a third of the
    cost of setting up and cancelling an event-loop timer on uvloop); an attempt that ends in time
    only marks its entry dead, dropped when its time comes or when the loop timer is re-armed (no
    wake-up for it), or when dead entries are most of a large heap (so it stays bounded).

    Each attempt's timer (`AttemptTimer`) stands, until the request is handed over, for the send
    deadline, afterwards for the response timeout (capped by the send deadline). It is entered
    once, at the earliest moment either could end, and re-entered when it comes early. When it is
    really due it cancels the attempt's task. The relay calls `start` before sending, sets the
    timer's `sent_at` once the request is handed over (and calls `enter` if its `when` is None),
    and calls `end` when the attempt is over."""

    __slots__ = ("armed_at", "dead", "handle", "heap", "loop", "seq")

    # Compact early: dead entries kept long would carry their objects into the collector's old
    # generation, whose full collections are pauses in the tail latency.
    COMPACT_AT = 64

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, AttemptTimer]] = []
        self.seq = itertools.count()
        self.handle: asyncio.TimerHandle | None = None
        self.armed_at = math.inf
        self.dead = 0

    def start(
        self,
        task: asyncio.Task[Any] | None,
        response_s: float,
        deadline_at: float,
        now: float,
        idle_s: float | None = None,
    ) -> AttemptTimer:
        """The timer of an attempt starting `now`, entered: it cancels `task` when due."""
        when = now + (response_s if idle_s is None or response_s < idle_s else idle_s)
        if deadline_at < when:
            when = deadline_at
        timer = AttemptTimer(task, response_s, deadline_at, when, idle_s)
        heapq.heappush(self.heap, (when, next(self.seq), timer))  # add(), inline
        if when < self.armed_at:
            self.arm(when)
        return timer

    def enter(self, timer: AttemptTimer) -> None:
        """Sent after it came early with no send deadline to wait for: enter it for the answer."""
        if timer.active:
            timer.when = timer.due()
            self.add(timer.when, timer)

    def end(self, timer: AttemptTimer) -> None:
        """The attempt is over: its entry is dead."""
        timer.task = None  # nothing to cancel any more; the entry must not keep the task alive
        if timer.active:
            timer.active = False
            if timer.when is not None:
                self.dead += 1
                if self.dead > len(self.heap) // 2 and len(self.heap) >= self.COMPACT_AT:
                    self.compact()

    def add(self, due: float, timer: AttemptTimer) -> None:
        heapq.heappush(self.heap, (due, next(self.seq), timer))
        if due < self.armed_at:
            self.arm(due)

    def arm(self, due: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = due
        self.handle = self.loop.call_at(due, self._sweep)

    def compact(self) -> None:
        self.heap = [entry for entry in self.heap if entry[2].active]
        heapq.heapify(self.heap)
        self.dead = 0

    def _sweep(self) -> None:
        self.handle, self.armed_at = None, math.inf
        horizon = self.loop.time() + 0.001  # loop timers are millisecond-grained: fire what is due
        heap = self.heap
        while heap and heap[0][0] <= horizon:
            timer = heapq.heappop(heap)[2]
            if timer.active:
                self.fire(timer)
            elif self.dead:
                self.dead -= 1
        while heap and not heap[0][2].active:  # no wake-up for attempts that already ended
            heapq.heappop(heap)
            if self.dead:
                self.dead -= 1
        if heap:
            self.arm(heap[0][0])

    def fire(self, timer: AttemptTimer) -> None:
        """`timer`'s entry came due (the loop timer's sweep calls this): cancel its attempt's task,
        or enter it again if it stands for a later moment now (sent since, or kept alive)."""
        due = timer.due()
        if timer.when is None or due > timer.when:  # entered for an earlier moment than it stands for
            timer.when = None
            if due != math.inf:  # else the relay's `enter()` once sent
                timer.when = due
                self.add(due, timer)
            return
        timer.active = False
        task = timer.task
        if task is not None and not task.done():
            timer.fired = True
            task.cancel()


class AttemptTimer:
    """One attempt's timer (see `Deadlines`, which builds and runs it): `when` it is entered for
    (None while it waits to be sent with no send deadline), `active` until it fired or the attempt
    ended, `fired` once it cancelled `task`.

    With `idle_s`, the attempt also ends when nothing related to it (progress, a log message, a
    request to the client) came for that long since it was sent or since the last such message
    (`alive_at`); never later than the response timeout or the deadline. A message only moves
    `alive_at`: the entry fires at its old time, finds itself early and is entered again.

    `written` turns true when the link wrote the request (`wrote`, its `on_write`): from then on
    the attempt counts as sent even if the hand-over is cut before it returned (a stdio child not
    reading its stdin, an HTTP request whose answer's head has not come)."""

    __slots__ = (
        "active",
        "alive_at",
        "deadline_at",
        "fired",
        "idle_s",
        "paused",
        "response_s",
        "sent_at",
        "task",
        "when",
        "written",
    )

    def __init__(
        self, task: asyncio.Task[Any] | None, response_s: float, deadline_at: float, when: float, idle_s: float | None
    ) -> None:
        self.task = task
        self.active = True
        self.fired = False
        self.response_s = response_s
        self.deadline_at = deadline_at
        self.sent_at: float | None = None
        self.when: float | None = when
        self.idle_s = idle_s
        self.alive_at: float | None = None
        self.written = False
        self.paused = False

    def waiting(self, on: bool) -> None:
        """The link waits for the client's input (on: only the deadline runs), or sent its answers
        on (off: the response timeout and the idle timer start again from now). The entry in the
        heap finds itself early when it comes and is entered again (`Deadlines.fire`)."""
        self.paused = on
        if not on and self.sent_at is not None:
            self.sent_at = asyncio.get_running_loop().time()
            self.alive_at = None

    def wrote(self) -> None:
        """The link wrote the request (its `on_write`): it may have reached the upstream."""
        self.written = True

    @property
    def sent(self) -> bool:
        """Whether the request may have reached the upstream: handed over, or written."""
        return self.written or self.sent_at is not None

    def due(self) -> float:
        sent_at = self.sent_at
        if sent_at is None or self.paused:
            return self.deadline_at
        due = sent_at + self.response_s
        if self.idle_s is not None:
            idle_at = (self.alive_at if self.alive_at is not None else sent_at) + self.idle_s
            if idle_at < due:
                due = idle_at
        return due if due < self.deadline_at else self.deadline_at

    def idled(self) -> bool:
        """Whether the idle timer (not the response timeout or the deadline) is what ended it."""
        if self.idle_s is None or self.sent_at is None:
            return False
        idle_at = (self.alive_at if self.alive_at is not None else self.sent_at) + self.idle_s
        return idle_at < self.sent_at + self.response_s and idle_at < self.deadline_at
