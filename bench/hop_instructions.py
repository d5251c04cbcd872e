"""Instructions per relayed call of the proxy's hop, this checkout against another, per path and era.

    .venv/bin/python bench/hop_instructions.py                                 # this checkout alone
    git worktree add /tmp/base main
    .venv/bin/python bench/hop_instructions.py --baseline-tree /tmp/base       # a change against its base
    .venv/bin/python bench/hop_instructions.py --era legacy --upstream sdk --paths http

CPU time per call on this VM moves 10-30% between legs and runs (bench/relay.py interleaves legs and
takes medians for that reason); the instructions a process executes do not depend on how busy the
machine is. Each leg runs the proxy (`python -m proxy serve`, as shipped) under valgrind's callgrind
with instrumentation off, sends warm-up calls, then counts the proxy's instructions over N calls
and over 3N calls (`callgrind_control -i on/off`, a dump per section) and prints the difference
divided by the 2N calls between them: what switching the count on and off costs cancels out.
The upstream runs natively (bench/lean_upstream.py or, `--upstream sdk`, the SDK's MCPServer,
bench/upstream.py), over HTTP (`http`: HTTP→HTTP) or as the proxy's stdio child (`stdio`:
HTTP→stdio; its instructions are not counted, being another process). The calls are the echo
`tools/call` of bench/relay.py, 2026-07-28 requests or (`--era legacy`) calls in one 2025 session,
sent by a small asyncio client over `--concurrency` keep-alive connections, every answer checked.

What it does not measure: the kernel's work (callgrind counts user space only: the socket reads
and writes of a call cost about a fifth of the proxy's CPU, bench/relay.py's perf figures) and
anything about time (a callgrind run is ~50x slower). So it compares proxies with each other, not
the proxy with nginx (whose work is mostly the kernel's). Under callgrind the proxy answers in a
different rhythm, so what a loop iteration batches differs slightly from a native run: repeated
runs of one checkout agree within about 2%.

Every process is started in its own session and stopped by its pid; every leg is bounded in calls
and in time (`--timeout`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay as R  # bench/relay.py: its processes, upstreams and requests


@dataclass
class Leg:
    tree: Path
    path: str  # "http" or "stdio"
    instructions_per_call: float
    calls: int


def request_bytes(port: int, era: str, session_id: str | None, id_: int) -> bytes:
    if era == "legacy":
        body = R.LEGACY_BODY.replace('"id":1', f'"id":{id_}', 1).encode()
        headers = {**R.LEGACY_HEADERS, "Mcp-Session-Id": session_id or ""}
    else:
        body = R.BODY.encode()
        headers = dict(R.HEADERS)
    head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (head + "\r\n").encode() + body


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """One response off a keep-alive connection: its body (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    fields = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"answered {head[:40]!r}")
    if b"content-length" in fields:
        return await reader.readexactly(int(fields[b"content-length"]))
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return body
        body += chunk[:-2]


async def drive(port: int, era: str, session_id: str | None, calls: int, concurrency: int, first_id: int) -> None:
    """`calls` echo calls over `concurrency` connections, each answer checked."""
    ids = iter(range(first_id, first_id + calls))

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for id_ in ids:
                writer.write(request_bytes(port, era, session_id, id_))
                body = await read_answer(reader)
                if b'"result"' not in body or b'"isError":true' in body:
                    raise RuntimeError(f"not a result: {body[:200]!r}")
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))


def callgrind(pid: int, *switch: str) -> None:
    subprocess.run(["callgrind_control", *switch, str(pid)], check=True, capture_output=True, timeout=300)


def section_total(pid: int, workdir: Path) -> float:
    """Instructions since the last zeroing, from a dump of the section."""
    callgrind(pid, "-i", "off")
    callgrind(pid, "-d")
    dumps = sorted(workdir.glob(f"cg.{pid}.*"), key=lambda f: f.stat().st_mtime)
    for line in dumps[-1].read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return float(line.split()[1])
    raise RuntimeError(f"no total in {dumps[-1]}")


def per_call(pid: int, workdir: Path, run: Callable[[int, int], None], calls: int) -> float:
    """Instructions per call of process `pid` between a section of `calls` calls and one of three
    times as many (`run(n, first_id)` sends them); what the two share cancels out."""
    totals = []
    for n, first in ((calls, 10**6), (3 * calls, 2 * 10**6)):
        callgrind(pid, "-z")
        callgrind(pid, "-i", "on")
        run(n, first)
        totals.append(section_total(pid, workdir))
    return (totals[1] - totals[0]) / (2 * calls)


def leg(tree: Path, path: str, args: argparse.Namespace, workdir: Path) -> Leg:
    procs = R.Processes()
    try:
        if path == "http":
            _, up_port = R.start_upstream_http(procs, 0, workdir)
            tail = ["--upstream", f"http://127.0.0.1:{up_port}/mcp"]
        else:
            tail = ["--", R.PYTHON, str(R.UPSTREAM), "--transport", "stdio", "--wait-ms", "0"]
        port, admin = R.free_port(), R.free_port()
        out = workdir / "cg.%p"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", R.PYTHON]
        argv += ["-m", "proxy", "serve", "--listen", f"http://127.0.0.1:{port}/mcp", "--admin", f"127.0.0.1:{admin}"]
        argv += ["--log-level", "warning", *tail]
        log = workdir / f"proxy-{port}.log"
        proxy = procs.start(argv, log, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
        R.wait_until(lambda: R.ready(admin), "proxy under callgrind", proxy, log, timeout_s=300)
        url = f"http://127.0.0.1:{port}/mcp"
        session_id = R.open_session(url) if args.era == "legacy" else None

        def run(calls: int, first_id: int) -> None:
            asyncio.run(
                asyncio.wait_for(
                    drive(port, args.era, session_id, calls, args.concurrency, first_id), timeout=args.timeout
                )
            )

        run(args.warmup, 1)
        return Leg(tree, path, per_call(proxy.pid, workdir, run, args.calls), 2 * args.calls)
    finally:
        procs.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", choices=["http", "stdio"], default=["http", "stdio"])
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    parser.add_argument("--upstream", choices=sorted(R.UPSTREAMS), default="lean")
    parser.add_argument("--calls", type=int, default=300, help="N: the sections are N and 3N calls")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1, help="legs per checkout and path, interleaved")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound of each section, seconds")
    parser.add_argument("--baseline-tree", type=Path, help="another checkout, measured the same way")
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep each leg's callgrind files in a folder under this one (`callgrind_annotate` reads the last dump)",
    )
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            sys.exit(f"hop_instructions: needs {tool} (Debian package valgrind)")
    R.UPSTREAM = R.UPSTREAMS[args.upstream]
    trees = [R.REPO] + ([args.baseline_tree.resolve()] if args.baseline_tree else [])
    print(f"era {args.era}, upstream {args.upstream}, {args.calls} and {3 * args.calls} calls, c={args.concurrency}")
    legs: list[Leg] = []
    started = time.monotonic()
    for run in range(args.runs):
        for path in args.paths:
            order = trees if run % 2 == 0 else trees[::-1]
            for tree in order:
                if args.keep is not None:
                    kept = args.keep / f"run{run + 1}-{path}-{'this' if tree == R.REPO else 'base'}"
                    kept.mkdir(parents=True, exist_ok=True)
                    one = leg(tree, path, args, kept)
                else:
                    with tempfile.TemporaryDirectory(prefix="hop-instructions-") as tmp:
                        one = leg(tree, path, args, Path(tmp))
                legs.append(one)
                name = "this checkout" if tree == R.REPO else str(tree)
                per_call = f"{one.instructions_per_call:>11,.0f}"
                print(f"  run {run + 1}  http→{path:<5}  {name:<24} {per_call} instructions/call")
    if args.baseline_tree:
        print("\nchange against the baseline (mean of the runs):")
        for path in args.paths:
            mine = [g.instructions_per_call for g in legs if g.path == path and g.tree == R.REPO]
            base = [g.instructions_per_call for g in legs if g.path == path and g.tree != R.REPO]
            a, b = sum(mine) / len(mine), sum(base) / len(base)
            print(f"  http→{path:<5}  {a:>11,.0f} against {b:>11,.0f}  ({100 * (a - b) / b:+.1f}%)")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
