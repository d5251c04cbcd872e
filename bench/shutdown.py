"""How long the proxy takes to exit after SIGTERM in front of a stdio upstream with many children,
against a baseline proxy measured in the same run.

    .venv/bin/python bench/shutdown.py                        # 40 sessions, 2 spares, grace 3 s
    .venv/bin/python bench/shutdown.py --sessions 40 --spares 4 --runs 3 --baseline main

Each run starts the real proxy (`python -m proxy serve`, from this checkout or from the baseline
revision extracted with `git archive`) in front of the scripted SDK server over stdio, opens
`--sessions` 2025 sessions (each its own child; the warm pool holds `--spares` more), makes a
2026 call (the 2026 requests' child), starts `--hangs` calls that outlive the grace period, then
sends SIGTERM and measures, from the signal: the exit, its code, and the upstream processes still
alive once the proxy has exited. Runs alternate baseline / this checkout, so the machine's load
falls on both alike; the load average is printed at the start and end of each run. The figure to
compare is exit time minus grace: docs/reliability.md promises at most grace + STOP bound.

Loopback only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
import httpx  # noqa: E402
from mcp import Client  # noqa: E402

from bench.faults import cmdline_has, descendants  # noqa: E402
from bench.load_faults import LoadProxy  # noqa: E402
from tests.fixtures.journal import Journal  # noqa: E402
from tests.proxy_process import pid_alive, scripted_stdio_command  # noqa: E402

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def initialize(n: int) -> dict[str, Any]:
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
    return {"jsonrpc": "2.0", "id": n, "method": "initialize", "params": params}


def extract(rev: str, into: Path) -> Path:
    """The `proxy` package of `rev`, extracted into `into` (run with cwd there)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "proxy"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


async def open_sessions(http: httpx.AsyncClient, url: str, sessions: int) -> list[str]:
    """`sessions` 2025 sessions left open (each holds its own child), and a 2026 call."""
    ids: list[str] = []

    async def open_one(n: int) -> None:
        r = await http.post(url, json=initialize(n), headers=HEADERS)
        r.raise_for_status()
        sid = r.headers["mcp-session-id"]
        h = {**HEADERS, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
        ids.append(sid)

    async with anyio.create_task_group() as tg:
        for n in range(sessions):
            tg.start_soon(open_one, n + 1)
    async with Client(url, mode="2026-07-28") as client:
        await client.call_tool("echo", {"text": "warm"})
    return ids


async def hang(http: httpx.AsyncClient, url: str, sid: str, n: int) -> None:
    """A call that outlives the grace period (answered `shutdown` by the proxy)."""
    h = {**HEADERS, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
    call = {"seconds": 60.0, "call_id": f"hang-{n}"}
    body = {"jsonrpc": "2.0", "id": 1000 + n, "method": "tools/call", "params": {"name": "hang", "arguments": call}}
    with contextlib.suppress(httpx.HTTPError):
        await http.post(url, json=body, headers=h)


def one_run(label: str, repo: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    journal = Journal(work / f"{label}-journal.jsonl")
    journal.path.unlink(missing_ok=True)
    flags = [
        "--shutdown-grace-s",
        str(args.grace),
        "--stdio-spares",
        str(args.spares),
        "--max-sessions",
        str(args.sessions + 16),
        "--session-init-timeout-s",
        "600",
    ]
    proxy = LoadProxy(
        upstream=scripted_stdio_command(journal.path, work / f"{label}-state.json"),
        extra=flags,
        log_path=work / f"{label}-proxy.log",
        repo=repo,
    ).start(timeout_s=args.bound)
    load_start = os.getloadavg()[0]
    result: dict[str, Any] = {"label": label}
    try:

        async def main() -> None:
            async with httpx.AsyncClient(timeout=args.bound) as http:
                with anyio.fail_after(args.bound):
                    ids = await open_sessions(http, proxy.url, args.sessions)
                async with anyio.create_task_group() as tg:
                    for n, sid in enumerate(ids[: args.hangs]):
                        tg.start_soon(hang, http, proxy.url, sid, n)
                    await journal.await_for(
                        lambda j: len(j.events(tool="hang", event="started")) >= args.hangs,
                        timeout_s=args.bound,
                        what="the hanging calls running",
                    )
                    kids = descendants(proxy.pid)
                    result["children"] = sum(
                        1 for p in kids if cmdline_has(p, b"scripted_server.py") and not cmdline_has(p, b"_guard.py")
                    )
                    result["processes"] = len(kids)
                    t0 = time.monotonic()
                    os.kill(proxy.pid, signal.SIGTERM)
                    assert proxy.proc is not None
                    code = await anyio.to_thread.run_sync(lambda: proxy.proc.wait(timeout=args.bound))  # type: ignore[union-attr]
                    result["exit_s"] = time.monotonic() - t0
                    result["code"] = code
                    result["left"] = sum(1 for p in kids if pid_alive(p))
                    tg.cancel_scope.cancel()

        anyio.run(main)
    finally:
        proxy.stop()
    result["load"] = (load_start, os.getloadavg()[0])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=40)
    p.add_argument("--spares", type=int, default=2)
    p.add_argument("--hangs", type=int, default=5, help="calls in flight beyond the grace period")
    p.add_argument("--grace", type=float, default=3.0)
    p.add_argument("--runs", type=int, default=2, help="runs per proxy, alternated")
    p.add_argument("--baseline", default="main", help="a git revision of the proxy to compare with ('' for none)")
    p.add_argument("--bound", type=float, default=300.0, help="bound of every wait (s)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-shutdown-"))
    try:
        proxies = [("this", REPO)]
        if args.baseline:
            rev = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            base = work / "baseline"
            base.mkdir()
            proxies.insert(0, (f"baseline {rev}", extract(rev, base)))
        print(
            f"SIGTERM with {args.sessions} 2025 sessions (a child each), {args.spares} spares, a 2026 child, "
            f"{args.hangs} calls beyond --shutdown-grace-s {args.grace:g}; load average {os.getloadavg()[0]:.1f}"
        )
        rows = []
        for run in range(args.runs):
            for label, repo in proxies:
                r = one_run(f"{label.split()[0]}-{run}", repo, args, work)
                r["label"] = label
                rows.append(r)
                print(
                    f"  {label:<18} exit {r['exit_s']:5.1f}s after SIGTERM (grace + {r['exit_s'] - args.grace:4.1f}s), "
                    f"code {r['code']}, upstream servers {r['children']} ({r['processes']} with guards), "
                    f"alive after the exit {r['left']}; load {r['load'][0]:.1f} -> {r['load'][1]:.1f}",
                    flush=True,
                )
        for label, _ in proxies:
            mine = [r["exit_s"] - args.grace for r in rows if r["label"] == label]
            print(f"{label:<18} exit minus grace: max {max(mine):.1f}s, min {min(mine):.1f}s over {len(mine)} runs")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
