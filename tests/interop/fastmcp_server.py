"""A FastMCP (PyPI `fastmcp`, pinned by scripts/setup-fastmcp.sh) server for the "do no harm"
tests: run with the python of that venv, never imported by pytest.

Usage: fastmcp_server.py JOURNAL stdio | fastmcp_server.py JOURNAL http PORT [--on-stdin-line]
With --on-stdin-line an HTTP server is a warm spare: loaded and its socket bound to PORT (beside
the server it is to replace: every server of the port sets SO_REUSEPORT), it prints "ready" and
listens only when a line arrives on stdin. Until then a connection to PORT is refused, as to a port
nobody holds (a bound socket that does not listen takes no connection); from then on connections
queue while its server starts. So the restart happens when the test writes that line, not after
this machine's import and start-up time.
JOURNAL: a file each tool appends one line to when it starts ("start TOOL TAG ...") and when it
returns ("end TOOL TAG ..."): how many times the upstream executed a call. Each line goes on with
the process id and the JSON-RPC id of the request that ran it ("pid=P request=R"): which process
ran which request, so that an execution more than a test expects shows where it came from (the
same request read twice, another request, another process). `exit_once` creates
JOURNAL.marker before it ends its process (the next run answers).

Tools (all read-only by their annotations, as a search or a lookup would be):
- `slow_read(seconds, tag)`: silent (no progress) for `seconds`, then "read {tag} after {seconds}s".
- `flaky_db(tag)`: fails with the tool's own message "database timed out after 5s".
- `exit_once(tag)`: the first call ends the server process with the call in flight; later runs
  answer "back {tag}".
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_context

READ_ONLY = {"readOnlyHint": True}
mcp = FastMCP("do-no-harm")


def journal(line: str) -> None:
    try:
        request = get_context().request_id
    except RuntimeError:
        request = "?"
    with open(sys.argv[1], "a") as f:
        f.write(f"{line} pid={os.getpid()} request={request}\n")


@mcp.tool(annotations=READ_ONLY)
async def slow_read(seconds: float, tag: str) -> str:
    journal(f"start slow_read {tag}")
    await asyncio.sleep(seconds)
    journal(f"end slow_read {tag}")
    return f"read {tag} after {seconds:g}s"


@mcp.tool(annotations=READ_ONLY)
async def flaky_db(tag: str) -> str:
    journal(f"start flaky_db {tag}")
    raise ToolError("database timed out after 5s")


@mcp.tool(annotations=READ_ONLY)
def exit_once(tag: str) -> str:
    journal(f"start exit_once {tag}")
    marker = Path(sys.argv[1] + ".marker")
    if not marker.exists():
        marker.write_text("exited once\n")
        os._exit(3)  # the process ends with the call in flight, as a crash would
    journal(f"end exit_once {tag}")
    return f"back {tag}"


def bound_socket(port: int) -> socket.socket:
    """PORT's socket, bound and not listening yet (SO_REUSEPORT: a spare binds it beside the live server)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    return sock


if __name__ == "__main__":
    if sys.argv[2] == "http":
        port = int(sys.argv[3])
        sock = bound_socket(port)
        if "--on-stdin-line" in sys.argv:
            print("ready", flush=True)
            sys.stdin.readline()
        sock.listen(128)  # connections are accepted (and queue) from here, while the server starts
        mcp.run(transport="http", host="127.0.0.1", port=port, sockets=[sock], show_banner=False, log_level="warning")
    else:
        mcp.run(transport="stdio", show_banner=False)
