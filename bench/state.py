"""What the shared state store costs the relay: the memory store against Redis, healthy and down.

    .venv/bin/python bench/state.py                      # 3 interleaved rounds, 8 s a leg, c=16
    .venv/bin/python bench/state.py --rounds 5 --duration 10 --concurrency 1 16

Not a test and not in CI. The method is bench/relay.py's (docs/benchmarks.md), whose helpers it
uses: `wrk` posts the same stateless 2026-07-28 `tools/call` (`echo`) through a proxy in front of
the lean stdio upstream (HTTP→stdio), and CPU per call is the proxy process's utime+stime over the
leg divided by the completed calls. Three proxies run side by side, each with its own upstream:

- `memory`      `--state memory` (the default): the baseline, measured in the same run;
- `redis`       `--state redis://…` against a real redis-server started here (healthy);
- `redis-down`  `--state redis://…` against a redis-server started here and then SIGKILLed before
                the legs: the proxy runs on local state and its sync task keeps trying.

The legs are interleaved (memory, redis, redis-down, memory, …) so that the load of the other work
on this machine falls on all three alike; the medians over the rounds are printed, with the load
average before and after. Targets (issue 15): in the healthy case at most 10% more proxy CPU per
call and at most 0.2 ms added to p50. The redis-server's own CPU per call is printed apart (it is
not the proxy's). Every process started here is stopped by its pid.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay as R

LEGS = ("memory", "redis", "redis-down")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8, help="seconds per measured leg")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-requests", type=int, default=500_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
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
            }
            proxies = {leg: R.start_proxy(procs, stdio, workdir, [*states[leg], *args.proxy_arg]) for leg in LEGS}
            procs.stop(doomed)  # type: ignore[arg-type]  # SIGTERM, then SIGKILL: the store is gone
            print(f"legs: {args.duration} s after {args.warmup} s warm-up, wrk -t1, c={args.concurrency}, "
                  f"{args.rounds} interleaved rounds, HTTP→stdio (lean upstream)\n", flush=True)  # fmt: skip
            for rnd in range(1, args.rounds + 1):
                for conc in args.concurrency:
                    for leg in LEGS:
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
                    print(f"{conc:>3} {leg:<10} {med[0]:>13.3f} {med[1]:>7.2f} {med[2]:>7.2f} {med[3]:>13.3f}  {cmp_}")
        except KeyboardInterrupt:
            print("\nbench: interrupted; stopping what it started", file=sys.stderr)
            return 130
        finally:
            procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
