"""The processes of one stdio child's session, found in /proc.

Contract: `session_processes(session)` yields the pid of every process whose session id is
`session` (a guard's pid: the guard leads its session, so the set is the guard, the command and
whatever that started). It scans /proc, a few hundred small reads on a typical host: callers run
it in a worker thread, never on the event loop (kernels without CONFIG_PROC_CHILDREN, this one
among them, have no /proc/PID/task/TID/children to walk the tree instead). A process that exits
during the scan is left out; no /proc at all yields nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator


def session_processes(session: int) -> Iterator[int]:
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # the fields after the command name, which may itself hold spaces and parentheses
            fields = stat[stat.rfind(b")") + 2 :].split()
            if int(fields[3]) == session:
                yield int(entry)
        except (OSError, ValueError, IndexError):  # exited meanwhile
            continue
