"""Memory of answers kept for re-sends under a flood of dropped calls: within its bound.

Method: a proxy at the shipped defaults except `--resend-total-bytes BOUND`, in front of the
scripted SDK server over stdio. A client sends CALLS calls of `charge` (state-changing) whose
answer is about ANSWER bytes, each on a connection of its own that it closes once the tool started (its journal
line; the tool waits `--hang-s` before answering): every answer is undelivered and offered to the
re-send table. Then, with every call ended, the proxy's RSS (from /proc) and what /status.json
says it keeps. The same flood with `--resend-window-s 0` (nothing kept) is the baseline, in the
same run. Printed: offered bytes, kept bytes and entries, RSS growth of both legs and the
difference.

    .venv/bin/python bench/resend.py                         # 200 x 128 KiB against 8 MiB
    .venv/bin/python bench/resend.py --calls 400 --answer-kib 64 --bound-mib 4

Bounded: each leg ends after --bound-s (then counted as failed); every process is stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sessions import PYTHON, REPO, free_port, rss_kib, stop

MODERN = "2026-07-28"
SCRIPTED = REPO / "tests" / "fixtures" / "scripted_server.py"


def call(id_: int, account: str, hang_s: float) -> tuple[dict[str, str], dict[str, Any]]:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    arguments = {"account": account, "amount": 1, "then": "hang", "hang_s": hang_s, "call_id": f"b{id_}"}
    body = {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": "charge", "arguments": arguments}}
    body["params"]["_meta"] = meta
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "charge",
    }
    return headers, body


async def dropped(url: str, journal: Path, n: int, size: int, hang_s: float) -> None:
    """One call on its own connection, closed once the tool started (its journal line), before
    its answer (bounded: 30 s)."""
    headers, body = call(n, f"{n:06d}" + "x" * (size // 2), hang_s)
    started = f'"event":"started","tool":"charge","call":"b{n}"'.encode()
    async with httpx.AsyncClient(timeout=30) as http:
        posting = asyncio.ensure_future(http.post(url, headers=headers, json=body))
        for _ in range(1500):
            # a small file another process appends to: read between short sleeps
            if posting.done() or (journal.exists() and started in journal.read_bytes()):  # noqa: ASYNC240
                break
            await asyncio.sleep(0.02)
        posting.cancel()
        try:
            await posting
        except (asyncio.CancelledError, httpx.HTTPError):
            pass


async def flood(
    url: str, admin: str, journal: Path, calls: int, size: int, hang_s: float, bound_s: float
) -> dict[str, Any]:
    began = time.monotonic()
    sem = asyncio.Semaphore(20)

    async def one(n: int) -> None:
        async with sem:
            await dropped(url, journal, n, size, hang_s)

    await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(calls))), bound_s)
    # every call runs to its answer after its client left: wait until none is running
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() - began < bound_s:
            doc = (await http.get(admin + "/status.json")).json()
            if not doc.get("resends") or doc["resends"]["running"] == 0:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(hang_s + 0.5)  # the last answers land
        doc = (await http.get(admin + "/status.json")).json()
    return doc.get("resends") or {"kept": 0, "keptBytes": 0, "running": 0}


def start(repo: Path, extra: list[str], tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """The proxy in front of the scripted server over stdio, ready (bounded)."""
    port, admin = free_port(), free_port()
    argv = [PYTHON, "-m", "proxy", "serve", "--listen", f"http://127.0.0.1:{port}/mcp"]
    argv += ["--admin", f"127.0.0.1:{admin}", *extra]
    argv += ["--", PYTHON, str(SCRIPTED), "--transport", "stdio", "--journal", str(tmp / f"{name}.jsonl")]
    with open(tmp / f"{name}.log", "wb") as out:
        proc = subprocess.Popen(argv, cwd=repo, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the proxy exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{admin}/readyz", timeout=1.0).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/mcp", f"http://127.0.0.1:{admin}"
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            raise SystemExit("the proxy was not ready within 120 s")
        time.sleep(0.05)


def leg(repo: Path, extra: list[str], args: argparse.Namespace, tmp: Path, name: str) -> tuple[dict[str, Any], int]:
    proc, url, admin = start(repo, extra, tmp, name)
    try:
        before = rss_kib(proc.pid)
        size = args.answer_kib * 1024
        held = asyncio.run(flood(url, admin, tmp / f"{name}.jsonl", args.calls, size, args.hang_s, args.bound_s))
        after = rss_kib(proc.pid)
        return held, after - before
    finally:
        stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--answer-kib", type=int, default=128, help="about this many KiB per answer")
    ap.add_argument("--bound-mib", type=int, default=8, help="--resend-total-bytes of the measured leg")
    ap.add_argument("--hang-s", type=float, default=1.0, help="the tool answers this long after it started")
    ap.add_argument("--bound-s", type=float, default=300.0, help="each leg ends after this")
    ap.add_argument("--repo", type=Path, default=REPO)
    args = ap.parse_args()
    bound = args.bound_mib * 1024 * 1024
    offered = args.calls * args.answer_kib * 1024
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base, base_rss = leg(args.repo, ["--resend-window-s", "0"], args, tmp, "baseline")
        kept, kept_rss = leg(args.repo, ["--resend-total-bytes", str(bound)], args, tmp, "kept")
    print(f"flood: {args.calls} dropped calls x ~{args.answer_kib} KiB answers = ~{offered / 2**20:.1f} MiB offered")
    print(f"{'leg':<28} {'kept':>6} {'kept MiB':>9} {'RSS growth MiB':>15}")
    print(f"{'baseline (window 0)':<28} {base.get('kept', 0):>6} {0:>9.1f} {base_rss / 1024:>15.1f}")
    print(
        f"{f'kept (bound {args.bound_mib} MiB)':<28} {kept['kept']:>6} {kept['keptBytes'] / 2**20:>9.1f} "
        f"{kept_rss / 1024:>15.1f}"
    )
    print(f"RSS growth above the baseline: {(kept_rss - base_rss) / 1024:.1f} MiB (bound {args.bound_mib} MiB)")
    within = kept["keptBytes"] <= bound
    print("kept bytes within the bound:", "yes" if within else "NO")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
