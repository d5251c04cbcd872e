"""`session_processes` finds the processes of a session in /proc (this test's own session: no
process is started)."""

from __future__ import annotations

import os

from proxy.upstream.stdio.demand import session_rss_bytes
from proxy.upstream.stdio.procfs import session_processes
from proxy.upstream.stdio.startwait import session_load_ns


def test_the_processes_of_a_session_include_its_members_and_no_other_sessions() -> None:
    mine = os.getsid(0)
    found = set(session_processes(mine))
    assert os.getpid() in found
    assert all(os.getsid(pid) == mine for pid in found if os.path.exists(f"/proc/{pid}"))
    assert list(session_processes(-1)) == []  # no process has that session


def test_memory_and_cpu_readings_of_a_session_cover_its_processes() -> None:
    mine = os.getsid(0)
    assert session_rss_bytes(mine) > 0
    load = session_load_ns(mine)
    assert os.getpid() in load and load[os.getpid()] > 0
