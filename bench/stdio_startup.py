"""Start-up of a stdio server launched directly against launched through `--listen stdio`.

    .venv/bin/python bench/stdio_startup.py                 # 7 runs of each, the Python SDK server
    .venv/bin/python bench/stdio_startup.py --runs 11 --everything

What a local client (Claude Code, an `.mcp.json` entry) waits for before it can use a server: the
time from spawning the command to the answer of its first `tools/list` (spawn, `initialize`,
`notifications/initialized`, `tools/list`). Legs, interleaved run by run so that the machine's
other load falls on both alike:

- `direct`   the server command itself (`bench/upstream.py --transport stdio`, an SDK MCPServer).
- `proxied`  `python -m proxy serve --listen stdio -- <the same command>`.
- with `--everything`, the same pair for npm server-everything (`node dist/index.js stdio`, from
  .cache/interop, installed by scripts/setup-interop.sh).

Prints each leg's median and spread and the proxied median minus the direct one, against the target
(within 0.3 s of direct), and how many server processes the proxied runs started (the
`boot` lines the server's stderr does not give, so: the children of the proxy's process tree seen
while the client is connected). Not a test and not in CI. Every process started here is stopped by
its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TARGET_S = 0.3
BOUND_S = 30.0
EVERYTHING = REPO / ".cache/interop/npm/node_modules/@modelcontextprotocol/server-everything/dist"

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), for counting the servers a proxy started."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def one_run(argv: list[str], server_marker: str) -> tuple[float, int]:
    """(seconds from spawn to the tools/list answer, server processes below the spawned one)."""
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        async with asyncio.timeout(BOUND_S):
            proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
            await proc.stdin.drain()
            while json.loads(await proc.stdout.readline()).get("id") != 1:
                pass
            proc.stdin.write(json.dumps(INITIALIZED).encode() + b"\n" + json.dumps(LIST).encode() + b"\n")
            await proc.stdin.drain()
            while True:
                answer = json.loads(await proc.stdout.readline())
                if answer.get("id") == 2:
                    break
        took = time.perf_counter() - began
        assert answer.get("result", {}).get("tools"), answer
        servers = sum(
            1 for p in descendants(proc.pid) if server_marker in command_line(p) and "_guard.py" not in command_line(p)
        )
        return took, servers
    finally:
        if proc.returncode is None:
            proc.stdin.close()  # a stdio server ends with its input
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def summary(times: list[float]) -> str:
    return (
        f"median {statistics.median(times) * 1000:7.1f} ms  (min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})"
    )


async def compare(name: str, server: list[str], marker: str, runs: int) -> bool:
    proxied_argv = [PYTHON, "-m", "proxy", "serve", "--listen", "stdio", "--", *server]
    direct: list[float] = []
    proxied: list[float] = []
    counts: list[int] = []
    await one_run(server, marker)  # warm the file cache for both
    await one_run(proxied_argv, marker)
    for _ in range(runs):
        took, _n = await one_run(server, marker)
        direct.append(took)
        took, n = await one_run(proxied_argv, marker)
        proxied.append(took)
        counts.append(n)
    extra = statistics.median(proxied) - statistics.median(direct)
    ok = extra <= TARGET_S and set(counts) == {1}
    print(f"{name}")
    print(f"  direct   {summary(direct)}")
    print(f"  proxied  {summary(proxied)}")
    print(f"  proxied - direct: {extra * 1000:+.1f} ms (target: at most +{TARGET_S * 1000:.0f} ms)")
    print(f"  server processes under the proxy per run: {counts} (target: 1)")
    print(f"  {'OK' if ok else 'MISSED'}")
    return ok


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--everything", action="store_true", help="also npm server-everything (node)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"{args.runs} runs per leg, interleaved; load average {load:.1f} on {os.cpu_count()} cores")
    ok = await compare(
        "Python SDK MCPServer (bench/upstream.py)",
        [PYTHON, str(REPO / "bench/upstream.py"), "--transport", "stdio"],
        "bench/upstream.py",
        args.runs,
    )
    if args.everything:
        node = "node"
        if not (EVERYTHING / "index.js").exists():
            print("server-everything is not installed: run scripts/setup-interop.sh")
            return 1
        ok = (
            await compare("npm server-everything", [node, str(EVERYTHING / "index.js"), "stdio"], "index.js", args.runs)
            and ok
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
