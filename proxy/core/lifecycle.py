"""Requests in flight across every relay, so that a graceful shutdown can wait for them and then
end them.

Contract (docs/reliability.md, "Shutdown"):
- Every relayed request (each relay's `handle_request`) is entered here with the task that runs it
  and left when it is answered. `wait_idle` returns once no request is in flight except the
  long-lived ones (`subscriptions/listen`, `tasks/result`: they would hold every shutdown for its
  whole grace period), or when its bound runs out.
- `end()` marks the end of the grace period and cancels every request still in flight. A cancelled
  `tools/call` then resolves as an unresolved result with stop reason `shutdown` (the engine reads
  `ending`); any other request is answered with a JSON-RPC error (`SHUTTING_DOWN`). The attempt in
  flight is cancelled upstream as its transport requires, as for any cancellation.
- Before `end()`, nothing here changes what a request does; it costs a dict entry per request.
"""

from __future__ import annotations

import asyncio


class InFlight:
    __slots__ = ("_waiter", "counted", "ending", "tasks")

    def __init__(self) -> None:
        self.tasks: dict[asyncio.Task[object], bool] = {}  # task -> counts toward the grace period
        self.counted = 0
        self.ending = False
        self._waiter: asyncio.Future[None] | None = None

    def enter(self, task: asyncio.Task[object], long_lived: bool) -> None:
        self.tasks[task] = not long_lived
        if not long_lived:
            self.counted += 1

    def leave(self, task: asyncio.Task[object]) -> None:
        counted = self.tasks.pop(task, None)
        if counted:
            self.counted -= 1
            waiter = self._waiter
            if self.counted == 0 and waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Whether every request that counts was answered within `timeout_s`."""
        if self.counted == 0:
            return True
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            return self.counted == 0
        finally:
            self._waiter = None
        return True

    def end(self) -> list[asyncio.Task[object]]:
        """The grace period is over: cancel every request still in flight; returns their tasks."""
        self.ending = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        return tasks
