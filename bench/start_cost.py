"""The CPU one proxy start costs, up to readiness.

    .venv/bin/python bench/start_cost.py                # 9 starts of each leg, then the top imports
    .venv/bin/python bench/start_cost.py --runs 15 --imports 30
    .venv/bin/python bench/start_cost.py --baseline /tmp/base   # also another checkout's proxy, interleaved

The test suite starts the proxy a few hundred times, and on a small machine its slow tier's wall
time follows the CPU it spends, so what one start costs matters. Legs, interleaved start by start:

- `http`   `python -m proxy serve` in front of an HTTP upstream that need not exist (a loopback port
           nobody listens on); ready when the admin `/healthz` answers 200.
- `stdio`  `python -m proxy serve -- <the scripted SDK server>` (tests/fixtures/scripted_server.py),
           the stdio upstream the tests start most; ready when `/readyz` answers 200 (the server
           answered the proxy).

For each start: the proxy process's own user + system CPU at readiness (`/proc/PID/stat`; the stdio
server's CPU is not in it), so the figure holds under the machine's other load; the wall time is
printed too, but under load it is not the proxy's. Prints each leg's median and spread. With
`--baseline DIR` (a checkout of another commit, e.g. `git archive COMMIT | tar -x -C DIR`) each leg
also runs that checkout's proxy (the same interpreter, started in DIR so its `proxy` package is
the one imported), start by start between this one's, and the difference is printed. Then one
start of the `http` leg under `python -X importtime` and the imports that cost the most, inclusive
of what they import. Not a test and not in CI; every process started here is stopped by its pid.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SCRIPTED_SERVER = REPO / "tests" / "fixtures" / "scripted_server.py"
BOUND_S = 60.0
POLL_S = 0.05
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_of(pid: int) -> float:
    """utime + stime of one process (not its children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def argv(leg: str, workdir: Path, extra_python: list[str], checkout: Path = REPO) -> tuple[list[str], str]:
    port, admin = free_port(), free_port()
    command = [PYTHON, *extra_python, "-m", "proxy", "serve", "--listen", f"http://127.0.0.1:{port}/mcp"]
    command += ["--admin", f"127.0.0.1:{admin}"]
    if leg == "http":
        command += ["--upstream", f"http://127.0.0.1:{free_port()}/mcp"]
        return command, f"http://127.0.0.1:{admin}/healthz"
    journal = workdir / f"journal-{port}.jsonl"
    server = checkout / "tests" / "fixtures" / "scripted_server.py"
    command += ["--", PYTHON, str(server), "--transport", "stdio", "--journal", str(journal)]
    return command, f"http://127.0.0.1:{admin}/readyz"


def start_once(leg: str, workdir: Path, checkout: Path = REPO) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one start of `leg` of the proxy in `checkout`, at readiness."""
    command, ready = argv(leg, workdir, [], checkout)
    began = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=checkout, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        while not answers(ready):
            if proc.poll() is not None:
                raise RuntimeError(f"{leg}: the proxy exited ({proc.returncode}): {proc.stderr.read()[-2000:]!r}")  # type: ignore[union-attr]
            if time.monotonic() - began > BOUND_S:
                raise TimeoutError(f"{leg}: not ready within {BOUND_S} s")
            time.sleep(POLL_S)
        wall = time.monotonic() - began
        return cpu_of(proc.pid), wall
    finally:
        stop(proc)


def top_imports(workdir: Path, count: int) -> list[tuple[int, int, str]]:
    """(inclusive µs, depth, module) of the costliest imports of one `http` start."""
    command, ready = argv("http", workdir, ["-X", "importtime"])
    log = workdir / "importtime.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink)
        try:
            began = time.monotonic()
            while not answers(ready) and time.monotonic() - began < BOUND_S and proc.poll() is None:
                time.sleep(POLL_S)
        finally:
            stop(proc)
    rows: list[tuple[int, int, str]] = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|", 2)
        depth = (len(name) - len(name.lstrip(" "))) // 2
        rows.append((int(cumulative), depth, name.strip()))
    return sorted(rows, key=lambda row: -row[0])[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--imports", type=int, default=25, help="how many of the costliest imports to list")
    parser.add_argument("--legs", default="http,stdio")
    parser.add_argument("--baseline", type=Path, help="another checkout whose proxy starts are measured alongside")
    args = parser.parse_args()
    legs = [leg for leg in args.legs.split(",") if leg]
    checkouts = {"this": REPO}
    if args.baseline is not None:
        checkouts["baseline"] = args.baseline.resolve()
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {(c, leg): [] for leg in legs for c in checkouts}
    with tempfile.TemporaryDirectory(prefix="start-cost-") as tmp:
        workdir = Path(tmp)
        for _ in range(args.runs):
            for leg in legs:
                for name, checkout in checkouts.items():
                    results[(name, leg)].append(start_once(leg, workdir, checkout))
        for leg in legs:
            medians = {}
            for name in checkouts:
                cpu = sorted(c for c, _ in results[(name, leg)])
                wall = sorted(w for _, w in results[(name, leg)])
                medians[name] = statistics.median(cpu)
                print(
                    f"{leg:6s} {name:8s} CPU at readiness: median {medians[name]:.3f} s "
                    f"(min {cpu[0]:.3f}, max {cpu[-1]:.3f}, {len(cpu)} starts); "
                    f"wall median {statistics.median(wall):.2f} s"
                )
            if "baseline" in medians:
                print(f"{leg:6s} this - baseline: {medians['this'] - medians['baseline']:+.3f} s CPU per start")
        if args.imports > 0:
            print("\ncostliest imports of one http start (inclusive of what each imports; -X importtime):")
            for micros, depth, name in top_imports(workdir, args.imports):
                print(f"  {micros / 1000:8.1f} ms  {'  ' * depth}{name}")
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
