"""The stdio upstream: a server command the proxy spawns, supervises and restarts.

One module per job:
- `upstream`: `StdioUpstream`, the command: which child serves which link, the start-up probe,
  health, the bound on starts at once, and stopping every child at shutdown.
- `link`: `StdioLink`, one supervised child as a message-level link (respawn, handshake replay,
  crash backoff).
- `process`: one child process: its pipes, its bounded logging, stopping children.
- `spares`: the warm pool of children started ahead (`--stdio-spares`).
- `shared`, `shared_link`: `--stdio-sessions shared`, every 2025 session on a few shared children.
- `startwait`: how long a child's first answer is waited for (`--stdio-start-timeout-s`).
- `early`: `serve --listen stdio` starts its child before the proxy's own imports; `adopt`
  supervises that child as a spawned one.
- `_guard.py`: the script every child runs under (by path, `python -I -S`, never imported), so
  that nothing a child starts outlives the proxy.

Importing this package is cheap (`proxy.cli` imports `early` from it before anything heavy): the
names below are imported from their modules when first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.upstream.stdio.link import StdioLink
    from proxy.upstream.stdio.process import STOP_BOUND_S
    from proxy.upstream.stdio.shared import SharedSessions
    from proxy.upstream.stdio.shared_link import SessionLink
    from proxy.upstream.stdio.startwait import STRETCH, StartTimedOut
    from proxy.upstream.stdio.upstream import StdioUpstream

__all__ = ["STOP_BOUND_S", "STRETCH", "SessionLink", "SharedSessions", "StartTimedOut", "StdioLink", "StdioUpstream"]

_HOMES = {
    "STOP_BOUND_S": "process",
    "STRETCH": "startwait",
    "SessionLink": "shared_link",
    "SharedSessions": "shared",
    "StartTimedOut": "startwait",
    "StdioLink": "link",
    "StdioUpstream": "upstream",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
