"""How long the proxy waits for a stdio child's first answer (`--stdio-start-timeout-s`).

The rule: a child must answer the proxy's own first request within the start timeout of that
request; at that point, a child that is still busy starting gets more time, one `BUSY_WINDOW_S` at
a time, up to `STRETCH` times the timeout. "Busy" means its processes (every process of the session
its guard leads: the command, `npx` and what they started) spent at least `BUSY_SHARE` of the last
window running or waiting for a CPU (`/proc/PID/schedstat`: time on a CPU and time runnable on a
run queue). Why: on a busy host a Node or Python server spends most of its start waiting for a
CPU (a Node SDK server can take 8-17 s at a load of ~10 on two cores, 1 s on an idle one), which is not
a broken server; a server that waits for a request it will never answer, a start blocked on a lock
or on a host that never answers, sits idle and is reported at the timeout. Not busy by this
measure, so reported at the timeout too: a start that waits on the network (`npx` downloading a
package): raise the flag for those.

`StartTimedOut` says which it was, with the time waited, and names the flag. Without procfs (not
Linux) nothing is ever busy: the timeout alone rules.

The queue of starts (`StartQueue`): at most a few children start at once (`--stdio-max-starting`),
the others wait their turn, in the order they came. A wait is bounded by the queue's progress,
never by its length: a waiter is refused (`Refusal`, `session_starts`) only when no start ahead
of it completed for `stall_s`, which the service sets to the longest a start may take (every start
is bounded as above, and a start given up on ends with its child's exit). So a burst of sessions
each starting its own child is served in order however long the queue, while starts keep completing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from proxy.errors import Refusal
from proxy.upstream.stdio.procfs import session_processes

T = TypeVar("T")

STRETCH = 6  # a child still busy starting is given up to this many start timeouts
BUSY_WINDOW_S = 1.0
BUSY_SHARE = 0.1


class StartTimedOut(TimeoutError):
    """A child did not answer its first request in time; the message says why, naming the flag."""


def session_load_ns(session: int) -> dict[int, int]:
    """For each process of `session` (`procfs.session_processes`), the nanoseconds its main thread
    has spent on a CPU or runnable waiting for one. Made in a worker thread once per window, and
    only for a child past its timeout."""
    load: dict[int, int] = {}
    for pid in session_processes(session):
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                on_cpu, waiting = f.read().split()[:2]
            load[pid] = int(on_cpu) + int(waiting)
        except (OSError, ValueError, IndexError):  # exited meanwhile, or no schedstat
            continue
    return load


def busy_between(before: dict[int, int], after: dict[int, int]) -> int:
    """Nanoseconds of CPU use or CPU wait between two samples: what each process added (all of it
    for a process started since), never negative for one that exited."""
    return sum(max(0, ns - before.get(pid, 0)) for pid, ns in after.items())


async def first_answer(answer: asyncio.Future[T], *, pid: int, timeout_s: float) -> T:
    """`answer`, once it is there; `StartTimedOut` when the child `pid` (a guard, leading its
    session) has not answered within `timeout_s` and is not busy starting, or not within
    `STRETCH` times that though busy (module docstring)."""
    try:
        return await _first_answer(answer, pid, timeout_s)
    finally:
        if not answer.done():  # as `asyncio.wait_for` leaves it: nobody waits for it any more
            answer.cancel()


async def _first_answer(answer: asyncio.Future[T], pid: int, timeout_s: float) -> T:
    began = sampled_at = time.monotonic()
    # The first window compares with nothing: what the processes used since they were born, which
    # for a fresh child is since the request (a spare started earlier may look busy once, and get
    # one window more). So a child that answers in time costs no scan at all.
    sample: dict[int, int] = {}
    window_s = timeout_s
    cap_at = began + STRETCH * timeout_s
    while True:
        done, _ = await asyncio.wait([answer], timeout=window_s)
        if done:
            return answer.result()
        now = time.monotonic()
        later = await asyncio.to_thread(session_load_ns, pid)  # a /proc scan: not on the event loop
        busy_s = busy_between(sample, later) / 1e9
        if busy_s < BUSY_SHARE * (now - sampled_at):
            raise StartTimedOut(
                f"no answer within {timeout_s:g} s of its start (--stdio-start-timeout-s): waited {now - began:.1f} s,"
                " and its processes were idle, not starting"
            )
        if now >= cap_at:
            raise StartTimedOut(
                f"no answer within {STRETCH * timeout_s:g} s of its start though busy starting all along"
                f" ({STRETCH} times --stdio-start-timeout-s {timeout_s:g}): waited {now - began:.1f} s"
            )
        sample, sampled_at = later, now
        window_s = max(0.0, min(BUSY_WINDOW_S, cap_at - now))


class StartQueue:
    """At most `size` children starting at once; the others wait for a slot in the order they
    came, each refused only when the queue made no progress (no slot given back) for `stall_s`
    (module docstring). `take` returns the slot's `give_back`, to call once the child started (its
    first output), exited, or was given up on; calling it again does nothing."""

    def __init__(self, size: int, stall_s: float) -> None:
        self.size = size
        self.stall_s = stall_s
        self.waiting = 0
        self.progress_at = time.monotonic()  # the last slot given back
        self._slots: asyncio.Semaphore | None = None  # created in the loop, on the first start

    async def take(self) -> Callable[..., None]:
        slots = self._slots
        if slots is None:
            slots = self._slots = asyncio.Semaphore(self.size)
        arrived = time.monotonic()
        self.waiting += 1
        # One acquire, kept across the checks below: it keeps this waiter's place in the line.
        acquiring = asyncio.ensure_future(slots.acquire())
        try:
            while True:
                now = time.monotonic()
                left_s = self.stall_s - (now - max(arrived, self.progress_at))
                if left_s <= 0:
                    raise Refusal(
                        f"this session's stdio child waited {now - arrived:.0f} s to start, and no start ahead of it"
                        f" completed for {self.stall_s:g} s ({self.waiting} waiting, {self.size} starting at once);"
                        " --stdio-start-timeout-s raises this limit (--stdio-sessions shared starts no child per"
                        " session, --max-sessions bounds how many sessions hold one)",
                        limit="session_starts",
                        flag="--stdio-start-timeout-s",
                        http_status=503,
                    )
                # a start ahead may complete meanwhile: the bound then starts over from it
                done, _ = await asyncio.wait([acquiring], timeout=left_s)
                if done:
                    break
        except BaseException:
            if acquiring.done() and not acquiring.cancelled():
                slots.release()  # granted as this waiter gave up: the next one's
            else:
                acquiring.cancel()
            raise
        finally:
            self.waiting -= 1
        given_back = False

        def give_back(*_: object) -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self.progress_at = time.monotonic()
                slots.release()

        return give_back
