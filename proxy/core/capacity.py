"""Session capacity: what a 2025 session costs, the default cap that follows from it, and what
happens when the cap is reached.

Contract:
- `default_max_sessions(...)` is `--max-sessions` when it is not given, derived from what one
  session holds (docs/security.md "Limits"):
  - its own stdio child (`--stdio-sessions per-session`, the default for a command): a process
    of the server, about `CHILD_BYTES` resident for a Python (FastMCP) or Node server. The cap is
    what half of the memory the proxy may use affords (the cgroup's limit when there is one, else
    the machine's), between `MIN_CHILD_SESSIONS` and `MAX_CHILD_SESSIONS`;
  - a place on shared stdio children, or an upstream HTTP/SSE session: the proxy's own bookkeeping
    (a relay, tens of KiB) and, for an HTTP/SSE upstream, one upstream connection for its listen
    stream (outside the pool its requests share). `CHEAP_SESSIONS`: one local agent holds hundreds
    of concurrent sessions.
  The cap is the one per-process bound; who connects from where plays no part in it.
- `default_upstream_connections(sessions)` is `--upstream-max-connections` when it is not given:
  HTTP/1.1 carries one request at a time per connection, so the pool's size is the upstream
  requests that run at once. The legitimate peak is every session at the cap with a call in flight
  (one agent's hundreds of sessions calling a tool that takes seconds): one connection per session,
  no fewer than `MIN_UPSTREAM_CONNECTIONS` (2026 requests hold no session) and no more than
  `CHEAP_SESSIONS` (the upstream's sockets are bounded whatever `--max-sessions` says). Beyond it
  requests wait their turn within their own timeouts; they never fail for the wait alone.
- `least_recently_used(sessions, among)`: the session to close to make room for a new one: of those
  with nothing in flight (no request running, no response stream open; a listen stream alone is
  not in flight), the one whose last request came longest ago. None when every one is busy: a
  session with a call or request in flight is never closed to make room.
- `Refusal` (proxy/errors.py) is the `UpstreamFailure` a new session is refused with: an HTTP
  status (503 at the proxy's cap, 429 at a client's share), `Retry-After`, and a message naming the
  limit and the flag that raises it. `refusal(...)` builds one for the caps here; `refused(...)`
  counts any (`mcp_recovery_http_refused_total{reason}`: also the stdio upstream's refused child
  starts, `session_starts`) and logs it, one line per limit per `LOG_EVERY_S` with how many were
  refused since.
- `open_files_for(...)` raises the process's soft limit of open files (never past the hard one)
  to what the caps can hold at once: both ports' connections, and per session a stdio child's
  three pipes or an upstream listen stream, plus the upstream's request pool. A shell's usual 1024 would
  otherwise refuse connections (EMFILE) well before `--max-connections`. Logged when it cannot.
No I/O beyond reading the memory limit once and that limit; everything else runs on the event
loop's thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from proxy.errors import REFUSAL_RETRY_AFTER_S, Refusal
from proxy.telemetry.shed import SHED

log = logging.getLogger("proxy.capacity")

CHILD_BYTES = 96 * 1024 * 1024  # a stdio server process: ~90 MB resident for FastMCP, ~50 MB for Node's
MIN_CHILD_SESSIONS = 16
MAX_CHILD_SESSIONS = 256
CHEAP_SESSIONS = 1024
MIN_UPSTREAM_CONNECTIONS = 100
RETRY_AFTER_S = REFUSAL_RETRY_AFTER_S
LOG_EVERY_S = 10.0


class _Session(Protocol):
    @property
    def busy(self) -> bool: ...

    last_activity: float


def memory_bytes() -> int | None:
    """The memory this process may use: its cgroup's limit (v2, then v1), else the machine's."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max", or v1's "unlimited" as a huge number
            return int(text)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def default_max_sessions(*, child_per_session: bool, memory: int | None = None) -> int:
    """`--max-sessions` when not given (see the module contract)."""
    if not child_per_session:
        return CHEAP_SESSIONS
    memory = memory_bytes() if memory is None else memory
    if memory is None:
        return MIN_CHILD_SESSIONS
    return max(MIN_CHILD_SESSIONS, min(MAX_CHILD_SESSIONS, memory // 2 // CHILD_BYTES))


def default_upstream_connections(sessions: int) -> int:
    """`--upstream-max-connections` when not given (see the module contract)."""
    return max(MIN_UPSTREAM_CONNECTIONS, min(CHEAP_SESSIONS, sessions))


def least_recently_used(sessions: Mapping[str, _Session], among: Iterable[str] | None = None) -> str | None:
    """The id of the idle session used longest ago (of `among`, else of all); None if all are busy."""
    best: str | None = None
    best_at = 0.0
    for sid in sessions if among is None else among:
        session = sessions.get(sid)
        if session is None or session.busy:
            continue
        if best is None or session.last_activity < best_at:
            best, best_at = sid, session.last_activity
    return best


_logged: dict[str, tuple[float, int]] = {}  # limit -> (when last logged, refused since)


def refusal(limit: str, flag: str, detail: str, *, http_status: int) -> Refusal:
    """A counted, logged (rate-limited) refusal at `limit` (see the module contract)."""
    return refused(Refusal(f"{detail}; {flag} raises this limit", limit=limit, flag=flag, http_status=http_status))


def refused(refusal: Refusal) -> Refusal:
    """Count `refusal` (`mcp_recovery_http_refused_total{reason=limit}`) and log it: one line per
    limit per `LOG_EVERY_S`, saying how many more were refused since the last one."""
    limit = refusal.limit
    SHED.count("http_refused", limit)
    now = time.monotonic()
    at, since = _logged.get(limit, (float("-inf"), 0))
    if now - at >= LOG_EVERY_S:
        more = f" ({since} more refused since the last such line)" if since else ""
        log.warning("new session refused: %s%s", refusal.detail, more)
        _logged[limit] = (now, 0)
    else:
        _logged[limit] = (at, since + 1)
    return refusal


def open_files_for(*, connections: int, sessions: int, upstream: int = 0) -> None:
    """Raise the soft RLIMIT_NOFILE to what the caps need (see the module contract); `upstream`:
    the request pool's connections to an HTTP/SSE upstream."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    want = 2 * connections + 3 * sessions + upstream + 512  # two ports; a child's pipes; the pool; files, logs
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < want:
        log.warning(
            "open files limited to %d (ulimit -n), below the %d the caps may hold at once: lower --max-connections "
            "or --max-sessions, or raise the limit",
            target,
            want,
        )
