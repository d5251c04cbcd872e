"""How long a 2026 call waits after the stdio child serving every 2026 request was killed: a cold
start (the baseline, `--stdio-spares 0`) against the warm spare the 2026 link now takes.

    .venv/bin/python bench/modern_respawn.py                 # 5 kills per leg
    .venv/bin/python bench/modern_respawn.py --rounds 10

Each leg starts `python -m proxy serve` in front of the scripted stdio server
(tests/fixtures/scripted_server.py, which journals each call's pid and revision) and opens one
Python SDK client in `mode="2026-07-28"`. Per round: wait until the leg's spare has booted (past its
imports, its `boot` line; the spare leg only), SIGKILL the process that ran the last 2026 call,
then time one `echo` call from just after the kill to its answer (what the next caller waits for:
the death noticed, a child found and readied with `server/discover`, the call). Between rounds it
waits until the new child has lived 6 s, so that the proxy's crash-loop backoff (for children that
die within 5 s) never enters the figure. Printed per leg: the waits (p50, max), and the load
average (`os.getloadavg`) at the leg's start and end; then the spare leg's p50 over the cold
leg's, both measured in the same run. Bounded: `--rounds` kills per leg, every call by
`--call-bound-s`, each leg by `--bound-s`; the proxy is stopped by its pid. Not a test, not in CI.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
from mcp import Client  # noqa: E402

from tests.fixtures.journal import Journal  # noqa: E402
from tests.proxy_process import ProxyProcess, scripted_stdio_command  # noqa: E402

LIVED_S = 6.0  # > the 5 s after which a child's death no longer counts as a quick one


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def pid_of(journal: Journal, call_id: str) -> int:
    return int(journal.events(tool="echo", event="started", call=call_id)[-1]["pid"])


def spare_ready(journal: Journal) -> list[int]:
    served = {e["pid"] for e in journal.events(event="started")}
    return [e["pid"] for e in journal.events(event="boot") if e["pid"] not in served]


async def leg(name: str, spares: int, args: argparse.Namespace, work: Path) -> list[float]:
    journal = Journal(work / f"{name}.jsonl")
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(journal.path),
        extra=["--stdio-spares", str(spares)],
        log_path=work / f"{name}.log",
    ).start(timeout_s=120)
    waits: list[float] = []
    print(f"{name}: load {load()} at start", flush=True)
    try:
        with anyio.fail_after(args.bound_s):
            async with Client(proxy.url, mode="2026-07-28") as client:
                with anyio.fail_after(args.call_bound_s):
                    await client.call_tool("echo", {"text": "warm", "call_id": "warm"})
                last = "warm"
                for n in range(args.rounds):
                    victim = pid_of(journal, last)
                    if spares:  # a spare past its imports: a process that booted and ran no call yet
                        await journal.await_for(spare_ready, 60, what="a spare")
                    os.kill(victim, signal.SIGKILL)
                    began = time.monotonic()
                    last = f"after-{n}"
                    with anyio.fail_after(args.call_bound_s):
                        await client.call_tool("echo", {"text": last, "call_id": last})
                    waits.append(time.monotonic() - began)
                    await anyio.sleep(LIVED_S)  # (not a test: a pause, so that the next kill is no quick death)
    finally:
        proxy.stop()
    print(
        f"{name}: {len(waits)} kills, wait after the kill p50 {statistics.median(waits) * 1000:.0f} ms,"
        f" max {max(waits) * 1000:.0f} ms; load {load()} at end",
        flush=True,
    )
    return waits


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="modern-respawn-") as tmp:
        cold = await leg("cold-start", 0, args, Path(tmp))
        warm = await leg("warm-spare", 1, args, Path(tmp))
    ratio = statistics.median(warm) / statistics.median(cold)
    print(f"warm spare p50 / cold start p50 = {ratio:.2f} (same run)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--call-bound-s", type=float, default=60.0)
    parser.add_argument("--bound-s", type=float, default=600.0)
    anyio.run(main_async, parser.parse_args(argv))


if __name__ == "__main__":
    main()
