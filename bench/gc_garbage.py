"""The proxy's own garbage collection under load and faults (why it matters: GC pauses delay every call
in flight, deadlines included): cyclic garbage per call and the collections it causes, for this
checkout and a baseline checkout, measured in the same run.

    .venv/bin/python bench/gc_garbage.py --baseline /tmp/main-copy            # 2,000 HTTP calls each
    .venv/bin/python bench/gc_garbage.py --baseline /tmp/main-copy --census   # + garbage by type
    .venv/bin/python bench/gc_garbage.py --upstreams stdio --census           # the stdio load leg instead

Each leg is one `bench/load_faults.py` load leg (`--upstreams http --no-outage`: the scripted
upstream with its faults: transient errors, hangs, cut answers, 503s, SIGKILLs and restarts;
`--upstreams stdio`: the same server as the proxy's stdio children) with a
`sitecustomize` on PYTHONPATH that acts only in the proxy process (argv has `serve`): it registers a
`gc.callbacks` hook that records, per collection after the proxy's start-up (its `gc.freeze()`;
the start-up's own garbage, collected once before, is printed apart), its generation, the
collecting thread's CPU time, the wall time, and how many objects it freed; at exit (the proxy's
SIGTERM shutdown) one last `gc.collect()` and the figures go to a JSON file. Objects freed by the
collector are exactly the cyclic garbage (reference counting frees the rest), so "garbage per
call" is the sum of `collected` divided by the calls sent. `--threshold A,B,C` sets the
collector's thresholds in the proxy of every leg (an experiment: the proxy itself keeps the
interpreter's default). `--census` runs a second leg per checkout with `gc.DEBUG_SAVEALL` (from
the freeze) and prints the garbage by type and the functions of the garbage frames (that leg's
pauses are not representative: saved garbage stays tracked).

Printed per checkout: garbage objects per call, collections per generation per 10,000 calls, their
CPU and wall pause p50/p99/max, and the load average at the start and end of each leg (pauses are
CPU time of the collecting thread, so they are less sensitive to load than wall figures, but a
quiet re-run is still the reference). Calls per leg: `--calls` (the deadline probe beside the leg
adds a few per second; they are not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = textwrap.dedent(
    """
    import os as _os
    import sys as _sys

    _OUT = _os.environ.get("GC_GARBAGE_OUT")
    if _OUT and "serve" in _sys.argv:
        import atexit as _atexit
        import collections as _collections
        import gc as _gc
        import json as _json
        import time as _time

        _pauses = []  # (generation, cpu_s, wall_s, collected)
        _start = [0.0, 0.0]
        _census = _os.environ.get("GC_GARBAGE_CENSUS") == "1"
        if _os.environ.get("GC_GARBAGE_THRESHOLD"):
            _gc.set_threshold(*map(int, _os.environ["GC_GARBAGE_THRESHOLD"].split(",")))

        def _on_gc(phase, info):
            if phase == "start":
                _start[0] = _time.perf_counter()
                _start[1] = _time.thread_time()
            else:
                _pauses.append(
                    (
                        info["generation"],
                        _time.thread_time() - _start[1],
                        _time.perf_counter() - _start[0],
                        info["collected"],
                    )
                )

        _gc.callbacks.append(_on_gc)
        # Counted from the proxy's gc.freeze() (its start-up done): the start-up's own garbage,
        # ~1,570 objects collected once before it (argparse's formatters among them), is no
        # per-call figure. And DEBUG_SAVEALL only from then: garbage it saves before the freeze
        # would be frozen, not counted.
        _startup = []
        _freeze = _gc.freeze

        def _frozen():
            _startup.extend(_pauses)
            del _pauses[:]
            _freeze()
            if _census:
                _gc.set_debug(_gc.DEBUG_SAVEALL)

        _gc.freeze = _frozen

        def _dump():
            during = len(_pauses)
            _gc.collect()
            out = {
                "pauses": _pauses[:during],
                "startup_collected": sum(p[3] for p in _startup),
                "final_collected": sum(p[3] for p in _pauses[during:]),
                "threshold": _gc.get_threshold(),
                "frozen": _gc.get_freeze_count(),
            }
            if _census:
                garbage = _gc.garbage
                kinds = _collections.Counter(
                    type(o).__module__ + "." + type(o).__qualname__ for o in garbage
                )
                frames = _collections.Counter(
                    o.f_code.co_filename.rsplit("/", 2)[-1] + ":" + o.f_code.co_name
                    for o in garbage
                    if type(o).__name__ == "frame"
                )
                out["census_total"] = len(garbage)
                out["census"] = kinds.most_common(40)
                out["frames"] = frames.most_common(20)
                _gc.set_debug(0)
                garbage.clear()
            with open(_OUT, "w") as f:
                _json.dump(out, f)

        _atexit.register(_dump)
    """
)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_leg(repo: Path, args: argparse.Namespace, work: Path, tag: str, census: bool) -> dict[str, Any]:
    site = work / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = work / f"{tag}.json"
    out.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "GC_GARBAGE_OUT": str(out),
        "GC_GARBAGE_CENSUS": "1" if census else "0",
        "GC_GARBAGE_THRESHOLD": args.threshold or "",
    }
    argv = [
        sys.executable,
        str(REPO / "bench" / "load_faults.py"),
        "--upstreams",
        args.upstreams,
        "--no-outage",
        "--calls",
        str(args.calls),
        "--clients",
        str(args.clients),
        "--repo",
        str(repo),
        "--workdir",
        str(work / f"{tag}-work"),
        "--max-seconds",
        str(args.max_seconds),
        "--json",
        str(work / f"{tag}-load.json"),
    ]
    load_start = os.getloadavg()
    started = time.monotonic()
    with open(work / f"{tag}.log", "wb") as log:
        proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.max_seconds + 120)
    elapsed = time.monotonic() - started
    load_end = os.getloadavg()
    if not out.exists():
        raise SystemExit(f"{tag}: no figures from the proxy (load_faults exit {proc.returncode}; see {work / tag}.log)")
    result = json.loads(out.read_text())
    result.update(load_start=load_start, load_end=load_end, elapsed=elapsed, rc=proc.returncode)
    return result


def summary(name: str, r: dict[str, Any], calls: int) -> list[str]:
    pauses = r["pauses"]
    collected = sum(p[3] for p in pauses) + r["final_collected"]
    lines = [
        f"{name}: {collected / calls:.1f} garbage objects per call ({collected} in all after start-up, whose own "
        f"{r.get('startup_collected', '?')} are not counted; threshold {tuple(r['threshold'])}, frozen {r['frozen']}); "
        f"leg {r['elapsed']:.0f} s, load_faults exit {r['rc']}, load {r['load_start'][0]:.1f} -> {r['load_end'][0]:.1f}"
    ]
    for gen in (0, 1, 2):
        mine = [p for p in pauses if p[0] == gen]
        cpu = [p[1] * 1e3 for p in mine]
        wall = [p[2] * 1e3 for p in mine]
        freed = [p[3] for p in mine]
        lines.append(
            f"  gen{gen}: {len(mine) * 10_000 / calls:7.1f} per 10k calls ({len(mine)}); "
            f"CPU ms p50 {pct(cpu, 0.5):6.2f} "
            f"p99 {pct(cpu, 0.99):6.2f} max {max(cpu, default=0):6.2f}; wall ms p50 {pct(wall, 0.5):6.2f} "
            f"max {max(wall, default=0):7.2f}; freed p50 {pct(freed, 0.5):.0f} max {max(freed, default=0)}"
        )
    if "census" in r:
        lines.append(f"  census (DEBUG_SAVEALL leg): {r['census_total'] / calls:.1f} objects per call")
        lines += [f"    {n / calls:7.2f}/call {n:7d} {kind}" for kind, n in r["census"][:25]]
        lines += [f"    frame {n:6d} {where}" for where, n in r["frames"][:12]]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, default=None, help="a checkout to compare against (e.g. main)")
    p.add_argument("--calls", type=int, default=2000, help="calls per leg")
    p.add_argument("--upstreams", default="http", choices=["http", "stdio"], help="the load leg's upstream")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--census", action="store_true", help="also a DEBUG_SAVEALL leg per checkout: garbage by type")
    p.add_argument(
        "--threshold", default=None, help="gc.set_threshold(A,B,C) in the proxy of every leg, e.g. 10000,10,10"
    )
    p.add_argument("--max-seconds", type=float, default=900.0, help="bound of each load_faults leg")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="gc-garbage-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())} at start; work {work}", flush=True)
    checkouts = [("this", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    for name, repo in checkouts:
        for census in (False, True) if args.census else (False,):
            tag = name + ("-census" if census else "")
            result = run_leg(repo, args, work, tag, census)
            print("\n".join(summary(f"{tag} ({repo})", result, args.calls)), flush=True)
    print(f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())} at end", flush=True)


if __name__ == "__main__":
    main()
