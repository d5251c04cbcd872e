"""New 2025 sessions per second through a stdio upstream, against a 2026 client making the same calls.

    .venv/bin/python bench/sessions.py                          # 40 clients x 10 calls, defaults
    .venv/bin/python bench/sessions.py --proxy-arg=--stdio-spares=4
    .venv/bin/python bench/sessions.py --proxy-arg=--stdio-sessions=shared
    .venv/bin/python bench/sessions.py --shared-children 1,2,4     # a proxy per N, both legs each
    .venv/bin/python bench/sessions.py --repo /work/main        # another checkout's proxy
    .venv/bin/python bench/sessions.py --hold 400               # sessions held at the defaults, memory per kind
    .venv/bin/python bench/sessions.py --burst 10 --baseline main   # ten sessions at once, cold and warm

The load run: `--clients` concurrent clients (40) each make `--calls` tool calls (10), one
session per call, through `python -m proxy serve` in front of a Python SDK stdio server
(`bench/upstream.py`, an `MCPServer` with one `echo` tool). Every call is a real Python SDK
`Client` over Streamable HTTP:

- `2025`: `Client(url, mode="legacy")`: initialize, notifications/initialized, tools/call, then
  DELETE of the session (each session gets its own upstream child unless `--stdio-sessions
  shared`).
- `2026`: `Client(url, mode="2026-07-28")`: the same tools/call as one stateless request, served
  by the proxy's one shared child.

Both legs run against the same proxy process, the 2026 leg first (its child is already warm from
the start-up probe, as it would be in service). Printed per leg: calls answered and failed,
wall time, sessions (calls) per second, and p50/p99 of the time from opening the client to the
call's answer (what an agent that opens a session per call waits for); then the 2025 leg's wall
time over the 2026 leg's (the target: within 2x with shared children), and the load
average (`os.getloadavg`) at the start and end of each leg. `--shared-children 1,2,4` runs the
whole comparison once per N, each against its own proxy with `--stdio-sessions shared
--stdio-shared-children N` (both legs in the same proxy run: the 2026 leg is that run's
baseline), then prints one summary line per N. Every leg is
bounded in count and time (`--bound-s`), every call by `--call-bound-s`; the proxy is started and
stopped by its pid. The session caps are the shipped defaults (every client here has the same
address, as a sidecar's agent has); `--session-init-timeout-s` is raised to 120 s and
`--head-timeout-s` to 60 s (on a loaded machine the clients' own CPU can delay
`notifications/initialized`, or the rest of a request head, past the default 10 s, and what is
measured is sessions, not those protections). Not a test and not in CI.

`--hold N` measures what sessions cost instead: for each session kind (`--kinds`, default
`http,shared,per-session`: the bench's echo server over Streamable HTTP; over stdio with
`--stdio-sessions shared`; over stdio with a child per session), a proxy at the shipped defaults
gets N concurrent 2025 sessions from 127.0.0.1 (opened 40 at a time), each calls `echo` once
while all are open, and, with all of them still open, the proxy's RSS and the RSS of the proxy
with every process below it are read from /proc. Printed per kind: the sessions the proxy held
(/readyz), answered and refused, and the memory per session of the proxy and of its tree.

`--burst N` measures how a burst of sessions is served instead: N 2025 clients (10) open a
session each at the same moment and call `echo` once, all held open until the last is answered;
printed per burst: each session's first answer from the burst's start, and their spread (the last
minus the first: the target is within 1 s of each other). Per proxy, a cold burst right after
`/readyz`, then, once the pool has settled (no upstream process started or using CPU for
`--settle-quiet-s`, bounded), a warm one. `--baseline REF` runs the same against the proxy of a git revision
(extracted with `git archive` into a temporary directory, run with its own `proxy` package), the
legs alternating, `--runs` times each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_proxy(
    repo: Path, extra: list[str], sessions: int, log: Path, upstream_url: str | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    port, admin = free_port(), free_port()
    argv = [
        PYTHON,
        "-m",
        "proxy",
        "serve",
        "--listen",
        f"http://127.0.0.1:{port}/mcp",
        "--admin",
        f"127.0.0.1:{admin}",
        # benign clients that a loaded machine can keep from sending notifications/initialized
        # within the default 10 s: what is measured is sessions, not that protection
        "--session-init-timeout-s",
        "120",
        # likewise a client starved of CPU can take longer than the default 10 s to finish a
        # request head on a connection it opened (answered 408, then closed: seen as ReadError)
        "--head-timeout-s",
        "60",
        *extra,
    ]
    if upstream_url is None:
        argv += ["--", PYTHON, str(REPO / "bench/upstream.py"), "--transport", "stdio"]
    else:
        argv += ["--upstream", upstream_url]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=repo, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    ready = f"http://127.0.0.1:{admin}/readyz"
    deadline = time.monotonic() + 120  # a loaded machine starts a Python server slowly
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the proxy exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(ready, timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            raise SystemExit(f"the proxy was not ready within 120 s: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/mcp", f"http://127.0.0.1:{admin}"


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


async def one_call(url: str, mode: str, text: str, bound_s: float) -> float:
    from mcp import Client

    began = time.perf_counter()
    async with asyncio.timeout(bound_s):
        async with Client(url, mode=mode) as client:  # type: ignore[arg-type]
            result = await client.call_tool("echo", {"text": text})
            took = time.perf_counter() - began
    if result.is_error:
        raise RuntimeError(f"isError: {result.content!r:.200}")
    return took


async def leg(url: str, mode: str, clients: int, calls: int, bound_s: float, call_bound_s: float) -> dict[str, object]:
    times: list[float] = []
    failures: list[str] = []

    async def client(n: int) -> None:
        for i in range(calls):
            try:
                times.append(await one_call(url, mode, f"c{n}-{i}", call_bound_s))
            except Exception as exc:  # counted and shown: a failed call is a result of the run
                while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]  # the SDK's task groups wrap the one failure that matters
                failures.append(f"{type(exc).__name__}: {exc}"[:200])

    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    try:
        async with asyncio.timeout(bound_s):
            await asyncio.gather(*(client(n) for n in range(clients)))
    except TimeoutError:
        failures.append(f"leg bound of {bound_s:g} s reached")
    wall = time.perf_counter() - began
    return {"mode": mode, "wall": wall, "times": times, "failures": failures, "load": load_before}


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(name: str, r: dict[str, object]) -> None:
    times: list[float] = r["times"]  # type: ignore[assignment]
    failures: list[str] = r["failures"]  # type: ignore[assignment]
    wall: float = r["wall"]  # type: ignore[assignment]
    print(
        f"  {name:5} answered {len(times):4d}  failed {len(failures):3d}  wall {wall:7.1f} s  "
        f"{len(times) / wall:7.1f} sessions/s  first answer p50 {quantile(times, 0.5) * 1000:7.0f} ms  "
        f"p99 {quantile(times, 0.99) * 1000:7.0f} ms  load {r['load']:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    for why in sorted(set(failures))[:5]:
        print(f"        {failures.count(why)}x {why}")


def process_parents() -> dict[int, int]:
    """Every process's parent pid, read from /proc (processes that end meanwhile are skipped)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def children_of(pid: int) -> int:
    """Upstream processes below the proxy now (the guard processes are not counted)."""
    parents = process_parents()
    below, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        below += kids
        todo += kids
    n = 0
    for p in below:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read()
        except OSError:
            continue
        if b"bench/upstream.py" in argv and b"_guard.py" not in argv:
            n += 1
    return n


async def run(args: argparse.Namespace, proxy_args: list[str]) -> dict[str, dict[str, object]]:
    """Both legs (or the one asked) against one proxy started with `proxy_args`."""
    total = args.clients * args.calls
    log = Path(f"/tmp/bench-sessions-{os.getpid()}.log")
    proc, url, _admin = start_proxy(args.repo, proxy_args, args.clients, log)
    print(
        f"{args.clients} clients x {args.calls} calls, one session per call ({total} calls a leg); "
        f"proxy {args.repo} {' '.join(proxy_args) or '(defaults)'}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    results: dict[str, dict[str, object]] = {}
    try:
        if args.only in (None, "2026"):
            results["2026"] = await leg(url, "2026-07-28", args.clients, args.calls, args.bound_s, args.call_bound_s)
            show("2026", results["2026"])
        if args.only in (None, "2025"):
            results["2025"] = await leg(url, "legacy", args.clients, args.calls, args.bound_s, args.call_bound_s)
            show("2025", results["2025"])
        print(f"  upstream processes under the proxy at the end: {children_of(proc.pid)}")
    finally:
        code = stop(proc)
        print(f"  proxy exit status after SIGTERM: {code}")
    ratio = rate_ratio(results)
    if ratio is not None:
        print(f"  2026 rate / 2025 rate: {ratio:.2f}x (target with shared children: at most 2x)")
    return results


def rate_ratio(results: dict[str, dict[str, object]]) -> float | None:
    """The 2026 leg's calls per second over the 2025 leg's (by rate, not wall time: a leg cut short
    by its bound answered fewer calls)."""
    if "2025" not in results or "2026" not in results:
        return None
    rates = {k: len(r["times"]) / float(r["wall"]) for k, r in results.items()}  # type: ignore[arg-type]
    return rates["2026"] / rates["2025"] if rates["2025"] else float("inf")


def rss_kib(pid: int) -> int:
    """A process's resident set (VmRSS), in KiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return 0


def tree_rss_kib(pid: int) -> int:
    """The resident sets of `pid` and every process below it (its stdio children), summed."""
    parents = process_parents()
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss_kib(p)
        todo += [c for c, pp in parents.items() if pp == p]
    return total


def hold(args: argparse.Namespace) -> int:
    """`--hold N`: N concurrent 2025 sessions per session kind at the shipped defaults (opened
    `OPENING` at a time, each answered once, all held until the last is answered): how many the
    proxy held, how many were refused, and the memory per session, of the proxy and of its tree."""
    kinds = {"http": [], "shared": ["--stdio-sessions", "shared"], "per-session": []}
    failed = 0
    for kind in args.kinds.split(","):
        upstream = None
        url_up = None
        if kind == "http":
            port = free_port()
            upstream = subprocess.Popen(
                [PYTHON, str(REPO / "bench/upstream.py"), "--transport", "http", "--port", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            url_up = f"http://127.0.0.1:{port}/mcp"
            for _ in range(600):  # bounded: until it listens
                try:
                    httpx.get(url_up, timeout=1.0)
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
        log = Path(f"/tmp/bench-sessions-hold-{os.getpid()}-{kind}.log")
        proc, url, admin = start_proxy(args.repo, [*kinds[kind], *args.proxy_arg], args.hold, log, url_up)
        try:
            idle = rss_kib(proc.pid), tree_rss_kib(proc.pid)
            answered, errors, held, busy = asyncio.run(hold_sessions(url, admin, proc.pid, args.hold, args.bound_s))
            n = max(1, answered)
            print(
                f"  {kind:11} held {held:5d}  answered {answered:5d}  refused/failed {len(errors):4d}  "
                f"proxy {idle[0] / 1024:6.0f} -> {busy[0] / 1024:6.0f} MiB ({(busy[0] - idle[0]) / n:6.0f} KiB/session)"
                f"  tree {idle[1] / 1024:6.0f} -> {busy[1] / 1024:6.0f} MiB ({(busy[1] - idle[1]) / n / 1024:6.1f} "
                "MiB/session)"
            )
            for why in sorted(set(errors))[:3]:
                print(f"        {errors.count(why)}x {why}")
            failed += len(errors)
        finally:
            stop(proc)
            if upstream is not None:
                upstream.terminate()
                upstream.wait(timeout=10)
    return 1 if failed else 0


async def hold_sessions(
    url: str, admin: str, pid: int, n: int, bound_s: float
) -> tuple[int, list[str], int, tuple[int, int]]:
    """Open `n` sessions, call once on each while all are open, measure, then close them all.
    Returns (answered, errors, sessions the proxy held, (proxy RSS, tree RSS) in KiB)."""
    from mcp import Client

    gate = asyncio.Semaphore(OPENING)
    all_open, all_served, measured_all = asyncio.Event(), asyncio.Event(), asyncio.Event()
    counts = {"opened": 0, "answered": 0}
    errors: list[str] = []
    measured: dict[str, int] = {}

    def mark(what: str) -> None:
        counts[what] += 1
        if counts["opened"] == n:
            all_open.set()
        if counts["answered"] + len(errors) >= n:
            all_served.set()

    async def one(i: int) -> None:
        try:
            async with gate:
                client = await Client(url, mode="legacy").__aenter__()
        except Exception as exc:  # a refused session is a result of the run
            leaf: BaseException = exc
            while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
                leaf = leaf.exceptions[0]  # the SDK client's task group wraps the refusal
            errors.append(f"{type(leaf).__name__}: {leaf}"[:160])
            mark("opened")
            return
        try:
            mark("opened")
            await all_open.wait()
            await client.call_tool("echo", {"text": str(i)})
            mark("answered")
            await measured_all.wait()
        finally:
            await client.__aexit__(None, None, None)

    async def measure() -> None:
        await all_served.wait()
        measured["proxy"], measured["tree"] = rss_kib(pid), tree_rss_kib(pid)
        async with httpx.AsyncClient(timeout=10) as http:
            measured["held"] = (await http.get(admin + "/readyz")).json().get("sessions", 0)
        measured_all.set()

    async with asyncio.timeout(bound_s):
        await asyncio.gather(measure(), *(one(i) for i in range(n)))
    return counts["answered"], errors, measured["held"], (measured["proxy"], measured["tree"])


OPENING = 40  # sessions opened at once in `--hold`, as an agent opens them over a moment


async def burst(url: str, n: int, bound_s: float) -> tuple[list[float], list[str]]:
    """`n` 2025 sessions opened at one moment, each calling `echo` once and held open until every
    one is answered: each one's first answer, in seconds from the moment, and the failures."""
    from mcp import Client

    began = time.perf_counter()
    answers: list[float] = []
    errors: list[str] = []
    all_done = asyncio.Event()

    async def one(i: int) -> None:
        try:
            async with Client(url, mode="legacy") as client:
                await client.call_tool("echo", {"text": str(i)})
                answers.append(time.perf_counter() - began)
                if len(answers) + len(errors) >= n:
                    all_done.set()
                await all_done.wait()
        except Exception as exc:  # a failed session is a result of the run
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]
            errors.append(f"{type(exc).__name__}: {exc}"[:160])
            if len(answers) + len(errors) >= n:
                all_done.set()

    try:
        async with asyncio.timeout(bound_s):
            await asyncio.gather(*(one(i) for i in range(n)))
    except TimeoutError:
        errors.append(f"burst bound of {bound_s:g} s reached")
    return sorted(answers), errors


def tree_cpu_ticks(pid: int) -> int:
    """The CPU time (user + system, in clock ticks) of every process below `pid`."""
    parents = process_parents()
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        todo += kids
        for c in kids:
            try:
                with open(f"/proc/{c}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            except (OSError, ValueError, IndexError):
                continue
    return total


async def settle(pid: int, quiet_s: float, bound_s: float) -> tuple[int, float]:
    """Until the proxy's upstream processes neither change in number nor use CPU (under a tenth of a
    core) for `quiet_s`, at most `bound_s`: (upstream processes then, seconds waited). The quiet
    time must outlast a spare's hold on its start slot (up to the start timeout, 10 s), during
    which the next spare waits its turn and nothing changes."""
    began = time.monotonic()
    quiet = 0
    count, ticks = children_of(pid), tree_cpu_ticks(pid)
    hz = os.sysconf("SC_CLK_TCK")
    while quiet < quiet_s / 0.5 and time.monotonic() - began < bound_s:
        await asyncio.sleep(0.5)  # (a bench polling /proc; not a test)
        now_count, now_ticks = children_of(pid), tree_cpu_ticks(pid)
        quiet = quiet + 1 if now_count == count and now_ticks - ticks < 0.05 * hz else 0
        count, ticks = now_count, now_ticks
    return count, time.monotonic() - began


def extract(rev: str, into: Path) -> str:
    """The `proxy` package of `rev` extracted into `into` (a proxy run there uses it); its short hash."""
    short = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "proxy"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return short


def spread_line(name: str, answers: list[float], errors: list[str]) -> str:
    if not answers:
        return f"    {name:5} no session answered ({len(errors)} failed)"
    spread = answers[-1] - answers[0]
    firsts = " ".join(f"{t:.2f}" for t in answers)
    return (
        f"    {name:5} answered {len(answers):3d}  failed {len(errors):2d}  first {answers[0]:6.2f} s  "
        f"last {answers[-1]:6.2f} s  spread {spread:6.2f} s {'(within 1 s)' if spread <= 1.0 else '(over 1 s)'}"
        f"  [{firsts}]"
    )


async def bursts(args: argparse.Namespace) -> int:
    """`--burst N`: a cold and a warm burst per proxy, this checkout's and, with `--baseline`, a
    revision's, alternating."""
    proxies: list[tuple[str, Path]] = [("this checkout", args.repo)]
    work = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    failed = 0
    try:
        if args.baseline:
            base = work / "baseline"
            base.mkdir()
            proxies.insert(0, (f"baseline {extract(args.baseline, base)}", base))
        print(
            f"{args.burst} 2025 sessions at once, cold then warm, {args.runs} run(s) per proxy; "
            f"flags: {' '.join(args.proxy_arg) or '(defaults)'}; load average {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} cores"
        )
        for run_no in range(args.runs):
            for name, repo in proxies:
                log = work / f"proxy-{run_no}-{len(name)}.log"
                proc, url, _admin = start_proxy(repo, args.proxy_arg, args.burst, log)
                try:
                    print(f"  {name} (run {run_no + 1}; load {os.getloadavg()[0]:.1f})")
                    answers, errors = await burst(url, args.burst, args.call_bound_s)
                    print(spread_line("cold", answers, errors))
                    failed += len(errors)
                    count, waited = await settle(proc.pid, args.settle_quiet_s, 180.0)
                    print(f"          settled in {waited:.1f} s: {count} upstream processes (2026 child, spares)")
                    answers, errors = await burst(url, args.burst, args.call_bound_s)
                    print(spread_line("warm", answers, errors))
                    failed += len(errors)
                finally:
                    stop(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--calls", type=int, default=10, help="calls per client, one session each")
    parser.add_argument("--proxy-arg", action="append", default=[], help="a flag for `serve` (repeatable)")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose proxy runs")
    parser.add_argument("--bound-s", type=float, default=400.0, help="each leg ends after this, counted as failed")
    parser.add_argument("--call-bound-s", type=float, default=120.0)
    parser.add_argument("--only", choices=["2025", "2026"], help="run one leg only")
    parser.add_argument(
        "--shared-children",
        help="comma-separated N: one run per N with --stdio-sessions shared --stdio-shared-children N",
    )
    parser.add_argument(
        "--hold",
        type=int,
        help="hold this many concurrent 2025 sessions per session kind at the shipped defaults and print "
        "the memory per session (instead of the sessions-per-second legs)",
    )
    parser.add_argument("--kinds", default="http,shared,per-session", help="with --hold: which session kinds")
    parser.add_argument("--burst", type=int, help="open this many 2025 sessions at once, cold and warm (module doc)")
    parser.add_argument("--baseline", help="with --burst: also a git revision's proxy, in the same run")
    parser.add_argument("--runs", type=int, default=1, help="with --burst: runs per proxy")
    parser.add_argument(
        "--settle-quiet-s",
        type=float,
        default=12.0,
        help="with --burst: the quiet time that ends the wait for the pool",
    )
    return parser


async def main() -> int:
    args = parser().parse_args()
    runs: list[tuple[str, list[str]]] = [("", args.proxy_arg)]
    if args.shared_children:
        runs = [
            (f"N={n}", [*args.proxy_arg, "--stdio-sessions=shared", f"--stdio-shared-children={n}"])
            for n in (int(x) for x in args.shared_children.split(","))
        ]
    outcomes: list[tuple[str, dict[str, dict[str, object]]]] = []
    for name, proxy_args in runs:
        outcomes.append((name, await run(args, proxy_args)))
    if len(outcomes) > 1:
        print("summary (2025 leg with shared children against the 2026 leg of the same proxy run):")
        for name, results in outcomes:
            r25 = results.get("2025", {})
            times: list[float] = r25.get("times", [])  # type: ignore[assignment]
            ratio = rate_ratio(results)
            print(
                f"  {name:5} 2025 answered {len(times):4d}  {len(times) / float(r25.get('wall', 1) or 1):5.1f} "  # type: ignore[arg-type]
                f"sessions/s  p50 {quantile(times, 0.5) * 1000:6.0f} ms  p99 {quantile(times, 0.99) * 1000:6.0f} ms  "
                f"2026/2025 {ratio if ratio is not None else float('nan'):.2f}x"
            )
    failed = sum(len(r["failures"]) for _, results in outcomes for r in results.values())  # type: ignore[arg-type]
    return 1 if failed else 0


if __name__ == "__main__":
    if "--hold" in " ".join(sys.argv):
        sys.exit(hold(parser().parse_args()))
    if "--burst" in " ".join(sys.argv):
        sys.exit(asyncio.run(bursts(parser().parse_args())))
    sys.exit(asyncio.run(main()))
