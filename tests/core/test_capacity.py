"""proxy/core/capacity.py: the session to close at the cap, the upstream pool's size that follows
from the session cap, and the open-files limit the caps need."""

from __future__ import annotations

import resource
import subprocess
from dataclasses import dataclass

import pytest

from proxy.core import capacity
from proxy.settings import Settings
from tests.fixtures.helpers import PYTHON, REPO_ROOT


@dataclass
class Session:
    busy: bool
    last_activity: float


def test_the_least_recently_used_idle_session_is_chosen_and_a_busy_one_never() -> None:
    sessions = {"a": Session(True, 1.0), "b": Session(False, 3.0), "c": Session(False, 2.0)}
    assert capacity.least_recently_used(sessions) == "c"
    assert capacity.least_recently_used(sessions, ["a", "b"]) == "b"
    assert capacity.least_recently_used(sessions, ["a"]) is None
    assert capacity.least_recently_used({"a": Session(True, 0.0)}) is None


def test_the_upstream_pool_gives_each_session_at_the_cap_a_connection_within_its_bounds() -> None:
    # The peak: every session at the cap with a call in flight, each on a connection of its own.
    http = Settings(listen="http://127.0.0.1:1/mcp", upstream="http://127.0.0.1:2/mcp")
    assert http.sessions_cap == capacity.CHEAP_SESSIONS
    assert http.upstream_pool == http.sessions_cap == 1024
    assert capacity.default_upstream_connections(400) == 400
    # 2026 requests hold no session: never fewer than 100; the upstream's sockets are bounded
    # whatever --max-sessions says: never more than 1024 unless set.
    assert Settings(upstream="http://127.0.0.1:2/mcp", max_sessions=8).upstream_pool == 100
    assert Settings(upstream="http://127.0.0.1:2/mcp", max_sessions=50_000).upstream_pool == 1024
    assert Settings(upstream="http://127.0.0.1:2/mcp", upstream_max_connections=4).upstream_pool == 4


@pytest.mark.slow
def test_a_shells_open_files_limit_is_raised_to_what_the_caps_hold() -> None:
    """A soft limit of 1024 (a shell's usual) refused connections with EMFILE far below the
    connection cap; the proxy raises it, within the hard limit, at start."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * 4096 + 3 * 1024 + 512
    code = (
        "import resource; from proxy.core import capacity; "
        "capacity.open_files_for(connections=4096, sessions=1024); "
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    out = subprocess.run(
        [PYTHON, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, preexec_fn=low, timeout=60
    )
    assert out.returncode == 0, out.stderr
    expected = want if hard == resource.RLIM_INFINITY else min(want, hard)
    assert int(out.stdout) == expected
