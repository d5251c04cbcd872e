"""Which principal a task belongs to (`--auth jwt|tokens`).

The upstream sees only the proxy's credential, so to it every caller is one client: a task id one
caller created worked for any other caller (`tasks/get`, `tasks/result`, `tasks/cancel`), and
`tasks/list` listed everyone's. The proxy, which verified each caller, keeps the owner.

Contract:
- `observed(request, response, principal)`: a response that creates a task (its `result.task`
  carries a `taskId`: the CreateTaskResult of a task-augmented request) records the task as the
  principal's; a `tasks/list` answer keeps only the caller's own tasks. Returns what to send.
- `refused(request, principal)`: for `tasks/get`, `tasks/result` and `tasks/cancel` naming a task
  that is not the caller's (another principal's, or one the proxy did not see created), the
  JSON-RPC error to answer instead of relaying it (-32602, "task not found": the same answer for
  another's task as for none, so a task id cannot be probed); None to relay it.
- Bounded: at most `MAX_TASKS` ids are remembered, the oldest forgotten first (a forgotten task
  is then nobody's, and refused).
No I/O; runs on the event loop's thread.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from proxy.jsonrpc import INVALID_PARAMS, Message, error

if TYPE_CHECKING:
    from proxy.auth.base import Principal

MAX_TASKS = 65536
NAMING_A_TASK = frozenset({"tasks/get", "tasks/result", "tasks/cancel"})
METHODS = NAMING_A_TASK | {"tasks/list"}


def _task_id(value: Any) -> str | None:
    task_id = value.get("taskId") if isinstance(value, dict) else None
    return task_id if isinstance(task_id, str) else None


class TaskOwners:
    __slots__ = ("_owners",)

    def __init__(self) -> None:
        self._owners: OrderedDict[str, str] = OrderedDict()

    def refused(self, request: Message, principal: Principal | None) -> Message | None:
        if request.get("method") not in NAMING_A_TASK:
            return None
        task_id = _task_id(request.get("params"))
        if task_id is not None and principal is not None and self._owners.get(task_id) == principal.id:
            return None
        return error(request.get("id"), INVALID_PARAMS, "task not found")

    def observed(self, request: Message, response: Message, principal: Principal | None) -> Message:
        result = response.get("result")
        if not isinstance(result, dict) or principal is None:
            return response
        if request.get("method") == "tasks/list":
            tasks = result.get("tasks")
            if isinstance(tasks, list):
                own = [t for t in tasks if self._owners.get(_task_id(t) or "") == principal.id]
                return {**response, "result": {**result, "tasks": own}}
            return response
        task_id = _task_id(result.get("task"))
        if task_id is not None and task_id not in self._owners:
            self._owners[task_id] = principal.id
            if len(self._owners) > MAX_TASKS:
                self._owners.popitem(last=False)
        return response
