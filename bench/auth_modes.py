"""The relay's CPU per call with each `--auth` mode beside `none`, in one run.

    .venv/bin/python bench/auth_modes.py                          # 8 s a leg, c=1 and c=16, 2 runs
    .venv/bin/python bench/auth_modes.py --duration 5 --runs 3 --concurrency 16

Not a test and not in CI. The method is bench/relay.py's (docs/benchmarks.md): `wrk` posts the
same stateless 2026-07-28 `tools/call echo` to a proxy in front of the lean stdio upstream
(`bench/lean_upstream.py`), after a warm-up; the proxy's CPU (utime+stime from /proc) before and
after, divided by the completed calls. The modes run interleaved within each run (none, tokens,
jwt), each in its own proxy process, so they share the machine's conditions:

- `none`: no Authorization header; the yardstick.
- `tokens`: `--auth tokens` with a one-entry tokens file; every request carries that token.
- `jwt`: `--auth jwt` against our test authorization server (tests/fixtures/authserver.py, in a
  thread of this process, over loopback); every request carries one RS256 access token issued
  for the proxy's URL, as a client reusing its token does. The proxy checks its signature once
  and then serves it from its cache, which is what the figure measures.

A mode the checkout does not know (its `serve` refuses the flag) is reported as skipped. After
the table, the verifier's own cost in this process: a signature check (a new token each time)
against a cached verdict (the same token), over N calls each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.relay import (  # noqa: E402
    BODY,
    HEADERS,
    PYTHON,
    UPSTREAMS,
    WRK_LUA,
    Processes,
    ensure_wrk,
    free_port,
    measure,
    ready,
    wait_until,
)
from tests.fixtures.authserver import AuthServer  # noqa: E402

MODES = ("none", "tokens", "jwt")
STATIC_TOKEN = "bench-" + "t" * 40


@dataclass
class Row:
    run: int
    mode: str
    concurrency: int
    calls: int
    bad: int
    calls_per_s: float
    p50_ms: float
    proxy_cpu_ms: float


def write_lua(path: Path, token: str | None) -> Path:
    hdrs = dict(HEADERS)
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in hdrs.items())
    path.write_text(WRK_LUA % {"body": BODY, "headers": headers})
    return path


def start_proxy(
    procs: Processes, mode: str, auth: AuthServer, workdir: Path
) -> tuple[subprocess.Popen[bytes], str, str | None] | None:
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    argv = [PYTHON, "-m", "proxy", "serve", "--listen", url, "--admin", f"127.0.0.1:{admin}"]
    token: str | None = None
    if mode == "tokens":
        tokens = workdir / "tokens"
        tokens.write_text(f"bench {STATIC_TOKEN}\n")
        argv += ["--auth", "tokens", "--auth-tokens-file", str(tokens)]
        token = STATIC_TOKEN
    elif mode == "jwt":
        argv += ["--auth", "jwt", "--public-url", url, "--auth-issuer", auth.issuer]
        token = auth.issue(aud=url, exp=int(time.time()) + 3600, scope="tools.read")
    argv += ["--", PYTHON, str(UPSTREAMS["lean"]), "--transport", "stdio", "--wait-ms", "0"]
    log = workdir / f"proxy-{mode}-{port}.log"
    proc = procs.start(argv, log)
    try:
        wait_until(lambda: ready(admin), f"proxy ({mode})", proc, log, timeout_s=60)
    except RuntimeError as exc:
        if "invalid choice" in log.read_text() or "not built" in log.read_text():
            print(f"  {mode}: this checkout does not have it; skipped", flush=True)
            return None
        raise exc
    return proc, url, token


def verifier_micro(auth: AuthServer, n: int) -> tuple[float, float]:
    """µs per call in this process: a new token each call (a signature check) and one token (cached)."""
    from proxy.auth.jwt import JwtAuthenticator

    audience = "http://127.0.0.1:1/mcp"

    async def go() -> tuple[float, float]:
        v = JwtAuthenticator(auth.issuer, audience, cache_size=n + 10)
        await v.start()
        try:
            fresh = [{"authorization": f"Bearer {auth.issue(aud=audience, sub=f'u{i}')}"} for i in range(n)]
            t0 = time.process_time()
            for h in fresh:
                await v.authenticate(h)
            t1 = time.process_time()
            same = fresh[0]
            for _ in range(n):
                await v.authenticate(same)
            t2 = time.process_time()
        finally:
            await v.aclose()
        return 1e6 * (t1 - t0) / n, 1e6 * (t2 - t1) / n

    return asyncio.run(go())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--max-requests", type=int, default=500_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--micro-n", type=int, default=2000, help="calls of the in-process verifier figures")
    args = parser.parse_args(argv)
    wrk = ensure_wrk()
    procs = Processes()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp, AuthServer() as auth:
        workdir = Path(tmp)
        print(f"bench/auth_modes.py: {args.duration:g} s legs, {os.cpu_count()} CPUs, load {os.getloadavg()}")
        try:
            for run in range(1, args.runs + 1):
                for mode in args.modes:
                    started = start_proxy(procs, mode, auth, workdir)
                    if started is None:
                        continue
                    proc, url, token = started
                    lua = write_lua(workdir / f"{mode}-{run}.lua", token)
                    try:
                        for conc in args.concurrency:
                            res, p_cpu, _, _ = measure(
                                wrk, lua, url=url, concurrency=conc, args=args, proxy_pid=proc.pid, upstream_pids=[]
                            )
                            row = Row(
                                run,
                                mode,
                                conc,
                                res.ok,
                                res.bad + res.errors,
                                res.ok / res.duration_s if res.duration_s else 0.0,
                                res.p50_ms,
                                1000 * (p_cpu or 0.0) / max(1, res.ok),
                            )
                            rows.append(row)
                            print(
                                f"  run {run} {mode:<7} c={conc:<3} {row.calls_per_s:8.0f} calls/s "
                                f"p50 {row.p50_ms:6.2f} ms  proxy CPU {row.proxy_cpu_ms:.3f} ms/call"
                                + (f"  {row.bad} FAILED" if row.bad else ""),
                                flush=True,
                            )
                    finally:
                        procs.stop(proc)
        finally:
            procs.stop_all()
        print()
        print(f"{'mode':<8}{'c':>4}{'calls/s':>10}{'p50 ms':>9}{'proxy ms/call':>15}{'vs none':>10}  (median of runs)")
        for conc in args.concurrency:
            base = [r.proxy_cpu_ms for r in rows if r.mode == "none" and r.concurrency == conc]
            base_ms = statistics.median(base) if base else None
            for mode in args.modes:
                mine = [r for r in rows if r.mode == mode and r.concurrency == conc]
                if not mine:
                    continue
                cpu = statistics.median(r.proxy_cpu_ms for r in mine)
                delta = f"{cpu - base_ms:+.3f}" if base_ms is not None and mode != "none" else "-"
                print(
                    f"{mode:<8}{conc:>4}{statistics.median(r.calls_per_s for r in mine):>10.0f}"
                    f"{statistics.median(r.p50_ms for r in mine):>9.2f}{cpu:>15.3f}{delta:>10}"
                )
        if "jwt" in args.modes:
            with contextlib.suppress(ImportError):
                signed, cached = verifier_micro(auth, args.micro_n)
                print()
                print(
                    f"verifier in-process, {args.micro_n} calls each: signature check {signed:.1f} µs/call, "
                    f"cached verdict {cached:.1f} µs/call"
                )
        print(f"load at the end {os.getloadavg()} (figures taken under load are rough: compare within this run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
