"""What the shared state store costs the relay: the memory store against Redis, healthy and down.

    .venv/bin/python bench/state.py                      # 3 interleaved rounds, 8 s a leg, c=16
    .venv/bin/python bench/state.py --rounds 5 --duration 10 --concurrency 1 16

Not a test and not in CI. The method is bench/relay.py's (docs/benchmarks.md), whose helpers it
uses: `wrk` posts the same stateless 2026-07-28 `tools/call` (`echo`) through a proxy in front of
the lean stdio upstream (HTTP→stdio), and CPU per call is the proxy process's utime+stime over the
leg divided by the completed calls. Four proxies run side by side, each with its own upstream:

- `memory`      `--state memory` (the default): the baseline, measured in the same run;
- `redis`       `--state redis://…` against a real redis-server started here (healthy);
- `redis-down`  `--state redis://…` against a redis-server started here and then SIGKILLed before
                the legs: the proxy runs on local state and its sync task keeps trying.

- `memory-b`    a second `--state memory` proxy: the A/A control. What it differs from `memory` by
                is the noise floor of one comparison (two proxy processes of the same code differ
                by several percent in CPU per call, whichever machine: placement on the cores,
                memory layout); a difference of `redis` from `memory` smaller than that is not one.

Each round starts fresh proxies (and upstreams) and runs the legs in a rotated order, so that
neither a process's luck nor the position in the round falls on one leg every time; the medians
over the rounds are printed, with the load average before and after.

Then the fault run (`--fault-rounds`, 0 to skip): the same wrk leg through the `memory` proxy
(the baseline) and through a proxy whose redis-server is SIGKILLed halfway through the leg
(restarted, and awaited until the proxy is connected again, before each round), alternating;
printed side by side: calls/s, p50, p99, and the calls that failed or timed out (wrk's timeout is
10 s; the bar is that every call is still answered within its deadline).

Targets: in the healthy case at most 10% more proxy CPU per call and at most 0.2 ms
added to p50. The redis-server's own CPU per call is printed apart (it is not the proxy's). Every
process started here is stopped by its pid.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay as R

LEGS = ("memory", "redis", "redis-down", "memory-b")
CPU_TARGET = 0.10
P50_TARGET_MS = 0.2


def start_redis(procs: R.Processes, workdir: Path) -> tuple[object, int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (scripts/setup-redis.sh)")
    port = R.free_port()
    log = workdir / f"redis-{port}.log"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = procs.start(argv, log)
    R.wait_until(lambda: R.port_open(port), "redis-server", proc, log)
    return proc, port


def restart_redis(procs: R.Processes, workdir: Path, port: int) -> object:
    """A redis-server on `port` (the proxy's URL names it), awaited until the proxy has connected
    to it again (its named client connections appear), bounded."""
    import redis

    binary = shutil.which("redis-server")
    assert binary is not None
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = procs.start(argv, workdir / f"redis-{port}.log")
    R.wait_until(lambda: R.port_open(port), "redis-server", proc, workdir / f"redis-{port}.log")
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def proxy_connected() -> bool:
        return sum(c.get("name") == "mcp-recovery-proxy" for c in client.client_list()) >= 2

    R.wait_until(proxy_connected, "the proxy's reconnection", proc, workdir / f"redis-{port}.log")
    return proc


def fault_run(
    procs: R.Processes, workdir: Path, wrk: str, lua: Path, args: argparse.Namespace, memory_port: int
) -> None:
    """Memory against a store SIGKILLed mid-leg, alternating rounds (see the module docstring)."""
    import threading

    conc = max(args.concurrency)
    port = R.free_port()
    stdio = [R.PYTHON, str(R.UPSTREAMS["lean"]), "--transport", "stdio", "--wait-ms", "0"]
    _, proxy_port = R.start_proxy(procs, stdio, workdir, ["--state", f"redis://127.0.0.1:{port}/0", *args.proxy_arg])
    print(f"\nfault run: {args.fault_rounds} rounds of {args.duration} s, c={conc}; the store is SIGKILLed "
          f"{args.duration / 2:.1f} s into each redis-killed leg (load average {R._loadavg()})",
          flush=True)  # fmt: skip
    rows: dict[str, list[tuple[float, float, float, int]]] = {"memory": [], "redis-killed": []}

    def kill(proc: object) -> None:  # SIGKILL: the store vanishes (connections reset, nothing flushed)
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        procs.stop(proc)  # type: ignore[arg-type]  # reaped, and forgotten

    for rnd in range(1, args.fault_rounds + 1):
        for leg in rows:
            killer = None
            if leg == "redis-killed":
                store = restart_redis(procs, workdir, port)
                killer = threading.Timer(args.duration / 2, kill, args=(store,))
                killer.start()
            url = f"http://127.0.0.1:{memory_port if leg == 'memory' else proxy_port}/mcp"
            res = R.run_wrk(wrk, lua, url, conc, args.duration, args.max_requests)
            if killer is not None:
                killer.join()
            failed = res.bad + res.errors
            rows[leg].append((res.ok / res.duration_s, res.p50_ms, res.p99_ms, failed))
            print(f"  round {rnd} {leg:<13} {res.ok / res.duration_s:7.0f} calls/s  p50 {res.p50_ms:6.2f} ms  "
                  f"p99 {res.p99_ms:7.2f} ms  failed or timed out {failed}", flush=True)  # fmt: skip
    print(f"medians (load average now {R._loadavg()}):")
    for leg, values in rows.items():
        rate, p50, p99 = (statistics.median(v[i] for v in values) for i in range(3))
        failed = sum(v[3] for v in values)
        print(f"  {leg:<13} {rate:7.0f} calls/s  p50 {p50:6.2f} ms  p99 {p99:7.2f} ms  failed or timed out {failed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8, help="seconds per measured leg")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-requests", type=int, default=500_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    parser.add_argument("--fault-rounds", type=int, default=3, help="memory vs a store killed mid-leg (0: skip)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    wrk = R.ensure_wrk()
    procs = R.Processes()
    rows: dict[tuple[str, int], list[tuple[float, float, float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="state-bench-") as tmp:
        workdir = Path(tmp)
        lua = R.write_lua(workdir / "tools_call.lua")
        try:
            print(f"machine: {R.os.cpu_count()} CPUs, {R.cpu_model()}; load average {R._loadavg()}")
            healthy, healthy_port = start_redis(procs, workdir)
            doomed, doomed_port = start_redis(procs, workdir)
            stdio = [R.PYTHON, str(R.UPSTREAMS["lean"]), "--transport", "stdio", "--wait-ms", "0"]
            states = {
                "memory": ["--state", "memory"],
                "redis": ["--state", f"redis://127.0.0.1:{healthy_port}/0"],
                "redis-down": ["--state", f"redis://127.0.0.1:{doomed_port}/0"],
                "memory-b": ["--state", "memory"],
            }
            procs.stop(doomed)  # type: ignore[arg-type]  # SIGTERM, then SIGKILL: the store is gone
            print(f"legs: {args.duration} s after {args.warmup} s warm-up, wrk -t1, c={args.concurrency}, "
                  f"{args.rounds} rounds (fresh proxies, rotated order), HTTP→stdio (lean upstream)\n",
                  flush=True)  # fmt: skip
            proxies: dict[str, tuple[Any, int]] = {}
            for rnd in range(1, args.rounds + 1):
                for proc, _ in proxies.values():
                    procs.stop(proc)
                proxies = {leg: R.start_proxy(procs, stdio, workdir, [*states[leg], *args.proxy_arg]) for leg in LEGS}
                order = LEGS[(rnd - 1) % len(LEGS) :] + LEGS[: (rnd - 1) % len(LEGS)]
                for conc in args.concurrency:
                    for leg in order:
                        proc, port = proxies[leg]
                        url = f"http://127.0.0.1:{port}/mcp"
                        r0 = R.cpu_s(healthy.pid) if leg == "redis" else 0.0  # type: ignore[attr-defined]
                        res, p_cpu, _, busy = R.measure(
                            wrk, lua, url=url, concurrency=conc, args=args, proxy_pid=proc.pid, upstream_pids=[]
                        )
                        r1 = R.cpu_s(healthy.pid) if leg == "redis" else 0.0  # type: ignore[attr-defined]
                        calls = max(1, res.ok)
                        cpu_ms = 1000 * (p_cpu or 0.0) / calls
                        store_ms = 1000 * (r1 - r0) / calls
                        rows.setdefault((leg, conc), []).append((cpu_ms, res.p50_ms, res.p99_ms, store_ms, busy))
                        bad = res.bad + res.errors
                        print(
                            f"  round {rnd} c={conc:<3} {leg:<10} {res.ok / res.duration_s:7.0f} calls/s  "
                            f"p50 {res.p50_ms:6.2f} ms  p99 {res.p99_ms:6.2f} ms  proxy CPU {cpu_ms:.3f} ms/call  "
                            f"redis CPU {store_ms:.3f} ms/call  busy {busy:3.0f}%" + (f"  {bad} FAILED" if bad else ""),
                            flush=True,
                        )
            print(f"\nmedians over {args.rounds} rounds (load average now {R._loadavg()}):")
            head = f"{'c':>3} {'leg':<10} {'proxy ms/call':>13} {'p50 ms':>7} {'p99 ms':>7} {'redis ms/call':>13}"
            head += "  vs memory"
            print(head)
            print("-" * (len(head) + 30))
            for conc in args.concurrency:
                base = [statistics.median(v) for v in zip(*rows[("memory", conc)], strict=True)]
                for leg in LEGS:
                    med = [statistics.median(v) for v in zip(*rows[(leg, conc)], strict=True)]
                    cmp_ = ""
                    if leg != "memory":
                        cpu_change = med[0] / base[0] - 1 if base[0] else 0.0
                        p50_added = med[1] - base[1]
                        cmp_ = f"CPU {100 * cpu_change:+.1f}%, p50 {p50_added:+.3f} ms, p99 {med[2] - base[2]:+.3f} ms"
                        if leg == "redis":
                            ok = cpu_change <= CPU_TARGET and p50_added <= P50_TARGET_MS
                            cmp_ += f"  targets (CPU≤+10%, p50≤+0.2 ms): {'PASS' if ok else 'FAIL'}"
                        elif leg == "memory-b":
                            cmp_ += "  (A/A: the noise floor)"
                    print(f"{conc:>3} {leg:<10} {med[0]:>13.3f} {med[1]:>7.2f} {med[2]:>7.2f} {med[3]:>13.3f}  {cmp_}")
            if args.fault_rounds > 0:
                fault_run(procs, workdir, wrk, lua, args, proxies["memory"][1])
        except KeyboardInterrupt:
            print("\nbench: interrupted; stopping what it started", file=sys.stderr)
            return 130
        finally:
            procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
