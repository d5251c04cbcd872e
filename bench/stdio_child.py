"""Does a stdio server work harder behind the proxy than behind a direct client? Both eras.

    .venv/bin/python bench/stdio_child.py                      # 2 runs, 1,500 calls a leg, 8 at a time
    .venv/bin/python bench/stdio_child.py --calls 3000 --runs 3 --concurrency 16

The yardstick for a stdio server is the SDK's own stdio client (`mcp.Client` on
`StdioServerParameters`): what an agent runs when it spawns the server itself. Legs, per era
(`legacy`: a 2025-11-25 session; `2026-07-28`: stateless requests carrying the era's `_meta`):

- `direct`    the SDK client spawns the server (`bench/upstream.py`, the SDK's MCPServer) and
              calls `echo` over its stdio;
- `proxied`   the SDK client calls the proxy over Streamable HTTP; the proxy (`python -m proxy
              serve`, warm pool off) relays to the same server, its stdio child.

Measured on the server process alone: its CPU (utime+stime from /proc/PID/stat) over the leg's
calls, per call, after 200 warm-up calls; also the proxy's own CPU per call and the leg's calls/s.
The calls/s are the driving client's (one Python process, which also spends CPU): read them
against each other, not as the proxy's capacity (bench/relay.py measures that with wrk). Every
process started here is stopped by its pid.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench.relay as relay  # the benchmark's /proc helpers

ERAS = ("legacy", "2026-07-28")
WARM_UP = 200


@dataclass
class Leg:
    run: int
    era: str
    leg: str
    server_ms: float
    proxy_ms: float | None
    calls_per_s: float


async def drive(client: Client, calls: int, concurrency: int) -> None:
    async def worker(n: int) -> None:
        for _ in range(n):
            result = await client.call_tool("echo", {"text": "x"})
            if result.is_error:
                raise RuntimeError(f"echo failed: {result}")

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker, calls // concurrency)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


async def direct(era: str, calls: int, concurrency: int) -> tuple[float, float]:
    params = StdioServerParameters(command=sys.executable, args=[str(relay.UPSTREAM), "--transport", "stdio"])
    async with Client(params, mode=era) as client:
        await drive(client, WARM_UP, concurrency)
        mine = [p for p in relay.stdio_servers(relay.descendants(os.getpid())) if parent_of(p) == os.getpid()]
        (server,) = mine
        before, t0 = relay.cpu_s(server), time.monotonic()
        await drive(client, calls, concurrency)
        spent, wall = relay.cpu_s(server) - before, time.monotonic() - t0
    done = calls // concurrency * concurrency
    return spent / done * 1000, done / wall


async def proxied(era: str, url: str, proxy: int, calls: int, concurrency: int) -> tuple[float, float, float]:
    async with Client(url, mode=era) as client:
        await drive(client, WARM_UP, concurrency)
        servers = relay.stdio_servers(relay.descendants(proxy))
        before = {pid: relay.cpu_s(pid) for pid in servers}
        proxy_before, t0 = relay.cpu_s(proxy), time.monotonic()
        await drive(client, calls, concurrency)
        wall = time.monotonic() - t0
        spent = sum(relay.cpu_s(pid) - cpu for pid, cpu in before.items())
        proxy_spent = relay.cpu_s(proxy) - proxy_before
    done = calls // concurrency * concurrency
    return spent / done * 1000, proxy_spent / done * 1000, done / wall


def start_proxy(procs: relay.Processes, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port, admin = relay.free_port(), relay.free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--listen", f"http://127.0.0.1:{port}/mcp"]
    argv += ["--admin", f"127.0.0.1:{admin}", "--", sys.executable, str(relay.UPSTREAM), "--transport", "stdio"]
    env = {**os.environ, "MCP_RECOVERY_STDIO_SPARES": "0"}  # no spare: the session's child is the server measured
    proc = procs.start(argv, workdir / "proxy.log", env=env)
    relay.wait_until(lambda: relay.ready(admin), "the proxy", proc, workdir / "proxy.log", timeout_s=60)
    return proc, f"http://127.0.0.1:{port}/mcp"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    relay.UPSTREAM = relay.UPSTREAMS["sdk"]  # the yardstick is a real SDK server, not the hand-written lean echo
    print(f"# {relay.cpu_model()}, {os.cpu_count()} cores, load {relay._loadavg()}; upstream {relay.UPSTREAM.name}")
    print(f"# {args.calls} calls a leg, {args.concurrency} at a time, {args.runs} run(s)")
    procs = relay.Processes()
    legs: list[Leg] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stdio-child-") as tmp:
            proxy, url = start_proxy(procs, Path(tmp))
            for run in range(1, args.runs + 1):
                for era in ERAS:
                    server_ms, rate = anyio.run(direct, era, args.calls, args.concurrency)
                    legs.append(Leg(run, era, "direct", server_ms, None, rate))
                    server_ms, proxy_ms, rate = anyio.run(proxied, era, url, proxy.pid, args.calls, args.concurrency)
                    legs.append(Leg(run, era, "proxied", server_ms, proxy_ms, rate))
                    print(f"# run {run} {era}: done", flush=True)
    finally:
        procs.stop_all()
    print("\n| run | era | leg | server ms/call | proxy ms/call | calls/s (driver-bound) |")
    print("|---|---|---|---|---|---|")
    for x in legs:
        proxy_ms = "-" if x.proxy_ms is None else f"{x.proxy_ms:.3f}"
        print(f"| {x.run} | {x.era} | {x.leg} | {x.server_ms:.3f} | {proxy_ms} | {x.calls_per_s:.0f} |")
    print("\nserver CPU per call, proxied against direct (same run and era):")
    for run in range(1, args.runs + 1):
        for era in ERAS:
            d, p = (next(x for x in legs if (x.run, x.era, x.leg) == (run, era, leg)) for leg in ("direct", "proxied"))
            change = p.server_ms / d.server_ms - 1
            print(f"  run {run} {era}: {p.server_ms:.3f} vs {d.server_ms:.3f} ms ({change:+.1%})")
    print(f"# load after: {relay._loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
