"""The soak: a steady mixed load through the proxy for `--minutes`, then its memory and descriptors.

    .venv/bin/python bench/soak.py                      # 10 minutes, stdio upstream
    .venv/bin/python bench/soak.py --minutes 2 --rate 8 # a short look
    .venv/bin/python bench/soak.py --repo /work/main    # another checkout's proxy

The target: memory after a warm-up and at the end must grow by less than 10%, and the proxy must
hold the same number of file descriptors. What runs (loopback only, every part bounded):

- `python -m proxy serve` in front of the bundled flaky demo server over stdio
  (`proxy.demo.server`, `DEMO_REFUND_HANG_S=3`) with its policies (`proxy/demo/policies`), and
  `--session-idle-timeout-s 30` so that sessions a client abandoned are reaped within the run.
- Callers, real Python SDK clients over Streamable HTTP, at `--rate` calls a second in total:
  long-lived 2025 sessions (each closed with DELETE and replaced every `--session-calls` calls),
  2026-07-28 clients (stateless, the shared child), one-call 2025 sessions opened and closed
  (DELETE) every few seconds, and 2025 sessions that just go away: `initialize`, one call, the
  connection closed, no DELETE (the idle reaper must close them and stop their children).
- The tools, mixed: `echo`; `lookup_customer` (fails twice, recovered by retries); `search_archive`
  (down: an unresolved result and a ledger entry; the same query again is refused by the ledger);
  `refund` (state-changing, slower than its attempt timeout: unresolved, outcome unknown);
  `refund_status`; `slow_report` (progress). Argument values come from bounded sets except
  the archive queries, one in five of which is new (ledger entries expire after the policy's
  window, so the ledger reaches a steady size).

Figures are read from outside the proxy: its RSS, open descriptors and threads from /proc; its
stdio children (count, RSS and descriptors summed) from /proc; sessions and ledger entries from
the admin port's `/status.json`. Sampled every `--sample-s` during the load. The two figures that
are compared are taken in the same quiet state: after the warm-up (`--warmup-s`) and at the end
the load pauses, the long-lived sessions end with DELETE, and the run waits (bounded) until the
proxy holds no session (the abandoned ones reaped) and no call, then reads them. Prints the load
average at the start and at the end. Not a test and not in CI; the proxy is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sessions import free_port, stop
from stdio_startup import descendants

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
UNRESOLVED = "io.mcp-recovery-proxy/unresolved"
SETTLE_BOUND_S = 120.0


# -- the proxy, seen from outside ------------------------------------------------------------------


def _status_fields(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    return out


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid: int) -> Counter[str]:
    """The proxy's descriptors by kind (socket, pipe, anon_inode:[eventpoll], a file's path)."""
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":[", 1)[0] if ":[" in target and not target.startswith("anon_inode") else target] += 1
    return kinds


def _children(pid: int) -> list[int]:
    """The upstream server processes below the proxy (not their guard processes)."""
    found = []
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read()
        except OSError:
            continue
        if b"proxy.demo.server" in argv and b"_guard.py" not in argv:
            found.append(p)
    return found


@dataclass
class Figures:
    at_s: float
    rss_kib: int
    hwm_kib: int
    fds: int
    threads: int
    children: int
    children_rss_kib: int
    children_fds: int
    sessions: int
    ledger: int
    load: float

    @classmethod
    def read(cls, pid: int, admin: str, began: float) -> Figures:
        status = _status_fields(pid)
        fds = _fds(pid)  # before the admin request below: its connection is not the proxy's own
        kids = _children(pid)
        kid_rss = kid_fds = 0
        for k in kids:
            try:
                kid_rss += _status_fields(k).get("VmRSS", 0)
                kid_fds += _fds(k)
            except OSError:
                continue
        doc = httpx.get(f"{admin}/status.json", timeout=10.0).json()
        return cls(
            at_s=time.monotonic() - began,
            rss_kib=status["VmRSS"],
            hwm_kib=status["VmHWM"],
            fds=fds,
            threads=status["Threads"],
            children=len(kids),
            children_rss_kib=kid_rss,
            children_fds=kid_fds,
            sessions=int(doc["upstream"]["sessions"]),
            ledger=len(doc.get("ledger") or []),
            load=os.getloadavg()[0],
        )

    HEADER = (
        f"{'t (s)':>7} {'phase':<9} {'RSS MiB':>8} {'fds':>5} {'thr':>4} {'sess':>5} {'ledger':>6} "
        f"{'kids':>5} {'kids MiB':>9} {'kids fds':>8} {'calls':>7} {'load':>5}"
    )

    def row(self, phase: str, calls: int) -> str:
        return (
            f"{self.at_s:7.0f} {phase:<9} {self.rss_kib / 1024:8.1f} {self.fds:5d} {self.threads:4d} "
            f"{self.sessions:5d} {self.ledger:6d} {self.children:5d} {self.children_rss_kib / 1024:9.1f} "
            f"{self.children_fds:8d} {calls:7d} {self.load:5.1f}"
        )


def start_proxy(
    repo: Path, extra: list[str], log: Path, traced: Path | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    port, admin = free_port(), free_port()
    launcher = [str(REPO / "bench/_traced_proxy.py")] if traced is not None else ["-m", "proxy"]
    argv = [
        PYTHON, *launcher, "serve",
        "--listen", f"http://127.0.0.1:{port}/mcp",
        "--admin", f"127.0.0.1:{admin}",
        "--policies", str(REPO / "proxy/demo/policies"),
        # abandoned sessions must be reaped within the run, not after the default 10 minutes
        "--session-idle-timeout-s", "30",
        *extra,
        "--", PYTHON, "-m", "proxy.demo.server",
    ]  # fmt: skip
    env = {**os.environ, "DEMO_REFUND_HANG_S": "3", "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("DEMO_STATE_FILE", None)
    if traced is not None:
        env["SOAK_TRACEMALLOC_DIR"] = str(traced)
        env["PYTHONPATH"] = str(repo)  # the wrapper runs `proxy` from the checkout under test
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + 120  # a loaded machine starts a Python server slowly
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the proxy exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{admin}/readyz", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            raise SystemExit(f"the proxy was not ready within 120 s: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}/mcp", f"http://127.0.0.1:{admin}"


# -- the callers ---------------------------------------------------------------------------------


@dataclass
class Tally:
    calls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    sessions_opened: int = 0
    sessions_abandoned: int = 0
    notes: Counter[str] = field(default_factory=Counter)  # about the failures, not counted as more


class Pacer:
    """Hands out call slots at a steady `rate` a second, shared by every caller (no burst catch-up
    after a pause: a slot missed is gone)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next_at = time.monotonic()

    async def slot(self) -> None:
        now = time.monotonic()
        self.next_at = max(self.next_at + self.interval, now)
        await asyncio.sleep(self.next_at - now)


_query = itertools.count()


def pick_call(rng: random.Random) -> tuple[str, dict[str, object]]:
    r = rng.random()
    if r < 0.40:
        return "echo", {"text": f"soak {rng.randrange(1000)}"}
    if r < 0.58:
        return "lookup_customer", {"customer_id": f"c{rng.randrange(20)}"}
    if r < 0.66:
        if rng.random() < 0.2:
            return "search_archive", {"query": f"new query {next(_query)}"}
        return "search_archive", {"query": f"q{rng.randrange(10)}"}  # mostly refused by the ledger
    if r < 0.70:
        return "refund", {"order_id": f"o{rng.randrange(50)}", "amount": 1.0}
    if r < 0.82:
        return "refund_status", {"order_id": f"o{rng.randrange(50)}"}
    return "slow_report", {"steps": 2}


def outcome_of(result) -> str:  # type: ignore[no-untyped-def]
    if not result.is_error:
        return "success"
    meta = result.meta or {}
    report = meta.get(UNRESOLVED) if isinstance(meta, dict) else None
    if isinstance(report, dict):
        return f"unresolved:{report.get('stopReason') or report.get('stop_reason') or '?'}"
    return "isError"


class Load:
    """The callers; `paused` stops them between calls (sessions then end as their client does)."""

    def __init__(self, url: str, rate: float, session_calls: int, tally: Tally, seed: int) -> None:
        self.url = url
        self.pacer = Pacer(rate)
        self.session_calls = session_calls
        self.tally = tally
        self.rng = random.Random(seed)
        self.running = asyncio.Event()
        self.stopped = False

    async def _call(self, client, bound_s: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
        """One call of the mix; False when it failed (counted in the tally)."""
        name, args = pick_call(self.rng)
        progress = name == "slow_report"

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            return None

        try:
            async with asyncio.timeout(bound_s):
                result = await client.call_tool(name, args, progress_callback=on_progress if progress else None)
            self.tally.outcomes[f"{name} {outcome_of(result)}"] += 1
            return True
        except Exception as exc:  # counted: a failed call is a result of the run
            self.tally.failures[f"{name}: {type(exc).__name__}: {exc}"[:160]] += 1
            return False
        finally:
            self.tally.calls += 1

    async def _wait_turn(self) -> bool:
        """False when the run is over; waits while paused; then takes a slot of the steady rate."""
        if self.stopped:
            return False
        if not self.running.is_set():
            return False  # paused: the caller ends its session like a client going quiet
        await self.pacer.slot()
        return not self.stopped and self.running.is_set()

    async def long_lived(self, mode: str) -> None:
        from mcp import Client

        while not self.stopped:
            await self.running.wait()
            if self.stopped:
                return
            try:
                async with Client(self.url, mode=mode) as client:  # type: ignore[arg-type]
                    self.tally.sessions_opened += mode == "legacy"
                    opened_at = last_at = time.monotonic()
                    for _ in range(self.session_calls):
                        if not await self._wait_turn():
                            break
                        began_at = time.monotonic()
                        if not await self._call(client):
                            now = time.monotonic()
                            self.tally.notes[
                                f"failed in a {mode} session {now - opened_at:.0f} s old, its previous call ended "
                                f"{began_at - last_at:.0f} s before this one began, which took {now - began_at:.0f} s"
                            ] += 1
                        last_at = time.monotonic()
            except Exception as exc:
                self.tally.failures[f"{mode} session: {type(exc).__name__}: {exc}"[:160]] += 1

    async def short_sessions(self, every_s: float) -> None:
        from mcp import Client

        while not self.stopped:
            await self.running.wait()
            if not await self._wait_turn():
                continue
            try:
                async with asyncio.timeout(60), Client(self.url, mode="legacy") as client:
                    self.tally.sessions_opened += 1
                    await self._call(client)
            except Exception as exc:
                self.tally.failures[f"short session: {type(exc).__name__}: {exc}"[:160]] += 1
            await asyncio.sleep(every_s)

    async def abandoned_sessions(self, every_s: float) -> None:
        """A 2025 client that goes away: initialize, initialized, one call, then its connection
        closes without a DELETE."""
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        while not self.stopped:
            await self.running.wait()
            if not await self._wait_turn():
                continue
            try:
                async with httpx.AsyncClient(timeout=60.0, trust_env=False) as http:
                    init = {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {
                            "protocolVersion": "2025-06-18",
                            "capabilities": {},
                            "clientInfo": {"name": "soak-abandoned", "version": "1"},
                        },
                    }
                    r = await http.post(self.url, json=init, headers=headers)
                    sid = r.headers["mcp-session-id"]
                    h = {**headers, "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-06-18"}
                    await http.post(self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
                    call = {
                        "jsonrpc": "2.0",
                        "id": 2,
                        "method": "tools/call",
                        "params": {"name": "echo", "arguments": {"text": "bye"}},
                    }
                    r = await http.post(self.url, json=call, headers=h)
                    r.raise_for_status()
                self.tally.calls += 1
                self.tally.outcomes["echo (abandoned session)"] += 1
                self.tally.sessions_opened += 1
                self.tally.sessions_abandoned += 1
            except Exception as exc:
                self.tally.failures[f"abandoned session: {type(exc).__name__}: {exc}"[:160]] += 1
            await asyncio.sleep(every_s)


async def settle(pid: int, admin: str, began: float) -> Figures:
    """Wait (bounded) until the proxy holds no session, then read the figures."""
    deadline = time.monotonic() + SETTLE_BOUND_S
    while True:
        figures = await asyncio.to_thread(Figures.read, pid, admin, began)
        if figures.sessions == 0 or time.monotonic() > deadline:
            if figures.sessions:
                print(f"  (still {figures.sessions} sessions after {SETTLE_BOUND_S:g} s)")
            await asyncio.sleep(2.0)  # let the last sessions' children finish stopping
            # and their pipes and the closing connections go: until the count holds still for a
            # second (bounded), on a busy machine that takes longer than the pause above
            settled, count = time.monotonic() + SETTLE_BOUND_S, _fds(pid)
            while time.monotonic() < settled:
                await asyncio.sleep(1.0)
                count, before = _fds(pid), count
                if count == before:
                    break
            return await asyncio.to_thread(Figures.read, pid, admin, began)
        await asyncio.sleep(1.0)


async def snapshot(proc: subprocess.Popen[bytes], traced: Path, n: int) -> Path:
    """Ask the traced proxy for tracemalloc snapshot `n` and wait (bounded) for its file."""
    path = traced / f"snap-{n}.tm"
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no tracemalloc snapshot at {path} within 120 s")
        await asyncio.sleep(0.5)
    return path


def show_growth(first: Path, last: Path, top: int = 25) -> None:
    import tracemalloc

    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap*")]
    a = tracemalloc.Snapshot.load(str(first)).filter_traces(keep)
    b = tracemalloc.Snapshot.load(str(last)).filter_traces(keep)
    total = sum(s.size_diff for s in b.compare_to(a, "filename"))
    print(f"tracemalloc: {total / 1024:+.1f} KiB allocated after the warm-up and still held at the end; by place:")
    for stat in b.compare_to(a, "traceback")[:top]:
        if stat.size_diff <= 0:
            continue
        print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
        for line in stat.traceback.format(limit=6, most_recent_first=True):
            print(f"      {line}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load time, warm-up included")
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=12.0, help="calls a second, all callers together")
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--session-calls", type=int, default=40, help="calls of a long-lived session")
    parser.add_argument("--legacy-clients", type=int, default=4)
    parser.add_argument("--modern-clients", type=int, default=3)
    parser.add_argument("--short-every-s", type=float, default=5.0)
    parser.add_argument("--abandon-every-s", type=float, default=12.0)
    parser.add_argument("--proxy-arg", action="append", default=[], help="a flag for `serve` (repeatable)")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose proxy runs")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        metavar="DIR",
        help="debug run: the proxy under tracemalloc (bench/_traced_proxy.py) from the quiet point after the "
        "warm-up; what it allocated since then and still holds at the end, by place (slower: its figures are "
        "not the soak's)",
    )
    args = parser.parse_args()
    if args.tracemalloc is not None:
        args.tracemalloc.mkdir(parents=True, exist_ok=True)
    log = Path(f"/tmp/bench-soak-{os.getpid()}.log")
    load_at_start = os.getloadavg()
    proc, url, admin = start_proxy(args.repo, args.proxy_arg, log, args.tracemalloc)
    print(
        f"soak: {args.minutes:g} min at {args.rate:g} calls/s (warm-up {args.warmup_s:g} s), proxy {args.repo} "
        f"{' '.join(args.proxy_arg) or '(defaults)'}, pid {proc.pid}, log {log}; load average at start "
        f"{load_at_start[0]:.1f} {load_at_start[1]:.1f} {load_at_start[2]:.1f} on {os.cpu_count()} cores"
    )
    tally = Tally()
    load = Load(url, args.rate, args.session_calls, tally, args.seed)
    began = time.monotonic()
    end_at = began + args.minutes * 60
    print(Figures.HEADER)
    warm: Figures | None = None
    warm_fds: Counter[str] = Counter()
    end_fds: Counter[str] = Counter()
    snaps: list[Path] = []
    workers: list[asyncio.Task[None]] = []
    try:
        print((await asyncio.to_thread(Figures.read, proc.pid, admin, began)).row("start", 0), flush=True)
        load.running.set()
        workers = [
            *(asyncio.create_task(load.long_lived("legacy")) for _ in range(args.legacy_clients)),
            *(asyncio.create_task(load.long_lived("2026-07-28")) for _ in range(args.modern_clients)),
            asyncio.create_task(load.short_sessions(args.short_every_s)),
            asyncio.create_task(load.abandoned_sessions(args.abandon_every_s)),
        ]
        next_sample = began + args.sample_s
        warm_at = began + args.warmup_s
        while time.monotonic() < end_at:
            await asyncio.sleep(
                max(0.0, min(next_sample, warm_at if warm is None else end_at, end_at) - time.monotonic())
            )
            now = time.monotonic()
            if warm is None and now >= warm_at:
                load.running.clear()
                print(f"{'':7} pausing: sessions end, waiting for the abandoned ones to be reaped", flush=True)
                warm = await settle(proc.pid, admin, began)
                print(warm.row("warm", tally.calls), flush=True)
                warm_fds = fd_kinds(proc.pid)
                if args.tracemalloc is not None:
                    snaps.append(await snapshot(proc, args.tracemalloc, 0))
                # the pause is not load time: the run still has its full minutes of load
                paused_s = time.monotonic() - now
                end_at += paused_s
                next_sample += paused_s
                load.pacer.next_at = time.monotonic()
                load.running.set()
            elif now >= next_sample:
                figures = await asyncio.to_thread(Figures.read, proc.pid, admin, began)
                print(figures.row("load", tally.calls), flush=True)
                next_sample += args.sample_s
        load.running.clear()
        print(f"{'':7} pausing: sessions end, waiting for the abandoned ones to be reaped", flush=True)
        end = await settle(proc.pid, admin, began)
        print(end.row("end", tally.calls), flush=True)
        end_fds = fd_kinds(proc.pid)
        if args.tracemalloc is not None and snaps:
            snaps.append(await snapshot(proc, args.tracemalloc, 1))
    finally:
        load.stopped = True
        load.running.set()  # wake the waiters so that they see `stopped`
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        code = stop(proc)
    load_at_end = os.getloadavg()
    ends = " ".join(f"{x:.1f}" for x in load_at_end)
    print(f"proxy exit status after SIGTERM: {code}; load average at end {ends}")
    print(
        f"calls {tally.calls}, 2025 sessions opened {tally.sessions_opened} "
        f"(abandoned without DELETE {tally.sessions_abandoned}), failures {sum(tally.failures.values())}"
    )
    for what, n in sorted(tally.outcomes.items()):
        print(f"  {n:6d}  {what}")
    for what, n in tally.failures.most_common(8):
        print(f"  {n:6d}  FAILED {what}")
    for what, n in tally.notes.most_common(5):
        print(f"  {n:6d}  {what}")
    if warm is None:
        print("the run ended before its warm-up: no comparison")
        return 1
    growth = (end.rss_kib - warm.rss_kib) / warm.rss_kib
    ok_rss = growth < 0.10
    ok_fds = end.fds == warm.fds
    print(
        f"RSS after warm-up {warm.rss_kib / 1024:.1f} MiB, at the end {end.rss_kib / 1024:.1f} MiB: "
        f"{growth * 100:+.1f}% (target under +10%): {'OK' if ok_rss else 'MISSED'}"
    )
    print(f"open fds after warm-up {warm.fds}, at the end {end.fds} (target: the same): {'OK' if ok_fds else 'MISSED'}")
    print(
        f"threads {warm.threads} -> {end.threads}; stdio children {warm.children} -> {end.children} "
        f"(their fds {warm.children_fds} -> {end.children_fds})"
    )
    if warm_fds != end_fds:
        changed = {k: end_fds[k] - warm_fds[k] for k in set(warm_fds) | set(end_fds) if end_fds[k] != warm_fds[k]}
        print(f"  descriptors that differ (end - warm-up): {changed}")
    if len(snaps) == 2:
        show_growth(*snaps)
    return 0 if ok_rss and ok_fds else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
