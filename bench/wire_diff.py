"""What the upstream receives: a real SDK client direct against the same client through the proxy.

    .venv/bin/python bench/wire_diff.py                    # every path and era, 20 calls each
    .venv/bin/python bench/wire_diff.py --calls 50 --path http-2025 stdio-2026
    .venv/bin/python bench/wire_diff.py --json out.json    # also every recorded message

Not a test and not a timing: it counts. For each path and era (`http-2025`, `http-2026`,
`stdio-2025`, `stdio-2026`) it runs the SDK's echo server (`bench/upstream.py`, the `MCPServer`
of bench/relay.py's `--upstream sdk`) behind a recorder, and drives it twice with the SDK's own
`Client` of that era (2025: the `initialize` handshake; 2026: `mode="auto"`, which settles on
2026-07-28): once direct, once through `mcp-recovery-proxy serve` (downstream HTTP). Each run
connects, makes N `tools/call echo` one after another, and closes. What the server received is
split in three phases, `connect` (everything before the first call, including the proxy's start),
`calls` and `close`, and printed side by side:

- HTTP: every request the server's ASGI app saw (method, JSON-RPC method, headers, `_meta` keys
  of the params), TCP connections opened (distinct client ports), GET streams, and per
  `tools/call` the request head and body shape; any header or `_meta` key only one side sends.
- stdio: every line the child read on its stdin (the recorder is a shim between the proxy, or
  the SDK client, and the server: `wire_diff.py tee-stdio FILE -- CMD...`), children started.

`--profile` adds the stdio child's own work: the recorded `calls`-phase lines of each era, sent
to a fresh `bench/upstream.py` under cProfile (after the era's own handshake), and the functions
whose call counts differ most between the eras per `tools/call` (counts, not times, so a shared
machine does not move them).

Every process started here is stopped by its pid; everything binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import pstats
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = REPO / "bench" / "upstream.py"
PYTHON = sys.executable
PATHS = ("http-2025", "http-2026", "stdio-2025", "stdio-2026")
MODERN = "2026-07-28"
# Headers whose values differ run to run by nature (ports, ids, lengths), compared by name only.
VOLATILE = {"host", "content-length", "mcp-session-id", "last-event-id", "traceparent", "tracestate"}


# --------------------------------------------------------------------------- recorders


def record_line(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line, appended and flushed at once (writers in several processes share the file)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, separators=(",", ":")) + "\n")


def serve_http(port: int, record: Path) -> None:
    """The SDK echo server over Streamable HTTP, every request recorded before the app sees it.
    POST /__mark {"mark": NAME} appends a phase marker instead (never reaches the app)."""
    import logging

    import uvicorn

    sys.path.insert(0, str(UPSTREAM.parent))
    from upstream import build  # type: ignore[import-not-found]

    logging.basicConfig(level=logging.WARNING)
    app = build(0.0).streamable_http_app(host="127.0.0.1")

    async def recorder(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if scope["path"] == "/__mark":
            record_line(record, json.loads(body))
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        record_line(
            record,
            {
                "conn": scope["client"][1] if scope.get("client") else None,
                "verb": scope["method"],
                "path": scope["path"],
                "headers": headers,
                "body": body.decode("utf-8", "replace"),
            },
        )
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    uvicorn.run(recorder, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")


def tee_stdio(record: Path, argv: Sequence[str]) -> int:
    """Run `argv` with its stdin fed from ours, every line recorded first; stdout and stderr are
    the child's own. SIGTERM is passed on; EOF on our stdin closes the child's."""
    child = subprocess.Popen(list(argv), stdin=subprocess.PIPE)
    assert child.stdin is not None
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    me = os.getpid()
    stdin = sys.stdin.buffer
    try:
        for line in iter(stdin.readline, b""):
            record_line(record, {"child": me, "line": line.decode("utf-8", "replace").rstrip("\n")})
            child.stdin.write(line)
            child.stdin.flush()
    except (BrokenPipeError, OSError):
        pass
    with contextlib.suppress(OSError):
        child.stdin.close()
    return child.wait()


# --------------------------------------------------------------------------- processes


class Processes:
    """What this run starts, stopped by pid (SIGTERM, then SIGKILL), in reverse order."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=REPO, start_new_session=True
            )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Any, what: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log {log}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if check():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout_s} s; log {log}")
        time.sleep(0.05)


def port_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


def ready(admin: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1.0) as r:
        return bool(r.status == 200)


# --------------------------------------------------------------------------- one run


def stdio_command(record: Path) -> list[str]:
    return [PYTHON, str(Path(__file__).resolve()), "tee-stdio", str(record), "--", PYTHON, str(UPSTREAM)]


def mark(record: Path, http_port: int | None, name: str) -> None:
    """A phase marker, in order with what the server recorded (everything before it was received)."""
    if http_port is None:
        record_line(record, {"mark": name})
        return
    req = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/__mark", data=json.dumps({"mark": name}).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10):
        pass


async def drive(target: Any, era: str, calls: int, on_phase: Any) -> str:
    """Connect with the SDK's Client of `era`, make `calls` echo calls in a row, close."""
    from mcp import Client

    mode = "legacy" if era == "2025" else "auto"
    async with Client(target, mode=mode) as client:
        await asyncio.to_thread(on_phase, "calls")
        for i in range(calls):
            result = await client.call_tool("echo", {"text": f"hello {i}"})
            if result.is_error:
                raise RuntimeError(f"call {i} failed: {result}")
        await asyncio.to_thread(on_phase, "close")
        version = client.protocol_version
    await asyncio.sleep(0.3)  # the close's own requests (DELETE, stdin EOF) reach the recorder
    return str(version)


def run_one(path: str, via_proxy: bool, calls: int, procs: Processes, work: Path) -> tuple[str, list[dict[str, Any]]]:
    """One run; returns the negotiated version and every record with its phase."""
    transport, era = path.split("-")
    side = "proxy" if via_proxy else "direct"
    record = work / f"{path}-{side}.jsonl"
    record.write_text("")
    started: list[subprocess.Popen[bytes]] = []
    http_port: int | None = None
    try:
        if transport == "http":
            http_port = free_port()
            log = work / f"server-{path}-{side}.log"
            server = procs.start([PYTHON, __file__, "serve-http", str(http_port), str(record)], log)
            started.append(server)
            wait_for(lambda: port_open(http_port), "recording server", server, log)
        target: Any
        if via_proxy:
            port, admin = free_port(), free_port()
            log = work / f"proxy-{path}.log"
            argv = [PYTHON, "-m", "proxy", "serve", "--listen", f"http://127.0.0.1:{port}/mcp"]
            argv += ["--admin", f"127.0.0.1:{admin}", "--log-level", "warning"]
            if transport == "http":
                argv += ["--upstream", f"http://127.0.0.1:{http_port}/mcp"]
            else:
                argv += ["--", *stdio_command(record)]
            proxy = procs.start(argv, log)
            started.append(proxy)
            wait_for(lambda: ready(admin), "proxy", proxy, log)
            target = f"http://127.0.0.1:{port}/mcp"
        elif transport == "http":
            target = f"http://127.0.0.1:{http_port}/mcp"
        else:
            from mcp.client.stdio import StdioServerParameters

            cmd = stdio_command(record)
            target = StdioServerParameters(command=cmd[0], args=cmd[1:], cwd=str(REPO))
        version = asyncio.run(asyncio.wait_for(drive(target, era, calls, lambda m: mark(record, http_port, m)), 120))
    finally:
        for proc in reversed(started):
            procs.stop(proc)
    phase = "connect"
    out = []
    for line in record.read_text().splitlines():
        entry = json.loads(line)
        if "mark" in entry:
            phase = entry["mark"]
            continue
        entry["phase"] = phase
        out.append(entry)
    return version, out


# --------------------------------------------------------------------------- summaries


def message_of(entry: dict[str, Any]) -> Any:
    text = entry.get("body", entry.get("line", ""))
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def describe(msg: Any) -> str:
    """A message's kind: its method (requests, notifications), 'response' or 'batch'."""
    if isinstance(msg, list):
        return "batch"
    if not isinstance(msg, dict):
        return "-"
    return str(msg.get("method") or ("response" if "id" in msg else "?"))


def meta_keys(msg: Any) -> list[str]:
    params = msg.get("params") if isinstance(msg, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return sorted(meta) if isinstance(meta, dict) else []


def shape(value: Any, depth: int = 0) -> Any:
    """A message with its volatile values (ids, texts) replaced by their types, keys kept."""
    if isinstance(value, dict):
        return {k: shape(v, depth + 1) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v, depth + 1) for v in value]
    return type(value).__name__


def summarize(records: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    by_phase: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    conns: dict[str, set[Any]] = collections.defaultdict(set)
    call_heads: list[dict[str, str]] = []
    call_bodies: list[Any] = []
    children: set[Any] = set()
    for e in records:
        msg = message_of(e)
        if "verb" in e:
            kind = f"{e['verb']} {describe(msg) if e['verb'] == 'POST' else e['path']}"
            conns[e["phase"]].add(e["conn"])
        else:
            kind = describe(msg)
            children.add(e["child"])
        by_phase[e["phase"]][kind] += 1
        if isinstance(msg, dict) and msg.get("method") == "tools/call" and e["phase"] == "calls":
            call_bodies.append(shape(msg))
            if "headers" in e:
                call_heads.append({k: (v if k not in VOLATILE else "*") for k, v in e["headers"]})
    all_conns = set().union(*conns.values()) if conns else set()
    return {
        "requests": {p: dict(c) for p, c in by_phase.items()},
        "connections": {p: len(c) for p, c in conns.items()} | ({"all": len(all_conns)} if conns else {}),
        "children": len(children),
        "call_heads": call_heads,
        "call_bodies": call_bodies,
        "calls": calls,
    }


def common(items: list[Any]) -> tuple[Any, int]:
    """The most frequent item and how many of the list are it (JSON-compared)."""
    if not items:
        return None, 0
    counts = collections.Counter(json.dumps(x, sort_keys=True) for x in items)
    best, n = counts.most_common(1)[0]
    return json.loads(best), n


def print_diff(path: str, versions: dict[str, str], sums: dict[str, dict[str, Any]]) -> list[str]:
    """Side by side; returns the differences found, one line each."""
    d, p = sums["direct"], sums["proxy"]
    n = d["calls"]
    diffs: list[str] = []
    print(f"\n== {path}: negotiated direct {versions['direct']}, through the proxy {versions['proxy']}; {n} calls")
    for phase in ("connect", "calls", "close"):
        kinds = sorted(set(d["requests"].get(phase, {})) | set(p["requests"].get(phase, {})))
        if not kinds:
            continue
        print(f"  {phase}:")
        for k in kinds:
            a, b = d["requests"].get(phase, {}).get(k, 0), p["requests"].get(phase, {}).get(k, 0)
            flag = "" if a == b else "   <-- differs"
            print(f"    {k:<40} direct {a:>4}   proxy {b:>4}{flag}")
            if a != b and phase == "calls":
                diffs.append(f"{path}: {k} during {n} calls: direct {a}, proxy {b}")
    if d["connections"] or p["connections"]:
        print(f"  TCP connections: direct {d['connections']}  proxy {p['connections']}")
        if d["connections"].get("calls", 0) < p["connections"].get("calls", 0):
            diffs.append(f"{path}: connections during calls: direct {d['connections']}, proxy {p['connections']}")
    if d["children"] or p["children"]:
        print(f"  stdio children that read anything: direct {d['children']}  proxy {p['children']}")
    dh, dn = common(d["call_heads"])
    ph, pn = common(p["call_heads"])
    if dh is not None or ph is not None:
        print(f"  tools/call head (most common; direct {dn}/{n}, proxy {pn}/{n}):")
        dh, ph = dh or {}, ph or {}
        for k in sorted(set(dh) | set(ph)):
            a, b = dh.get(k, "(absent)"), ph.get(k, "(absent)")
            flag = "" if a == b else "   <-- differs"
            print(f"    {k:<24} direct {a!s:<44.44} proxy {b!s:.44}{flag}")
            if a != b:
                diffs.append(f"{path}: tools/call header {k}: direct {a!r}, proxy {b!r}")
    db, dbn = common(d["call_bodies"])
    pb, pbn = common(p["call_bodies"])
    print(f"  tools/call body shape (direct {dbn}/{n}, proxy {pbn}/{n} alike):")
    print(f"    direct {json.dumps(db, separators=(',', ':'))}")
    print(f"    proxy  {json.dumps(pb, separators=(',', ':'))}")
    if db != pb:
        diffs.append(f"{path}: tools/call body: direct {json.dumps(db)}, proxy {json.dumps(pb)}")
    return diffs


# --------------------------------------------------------------------------- the child's work


def child_counts(handshake: list[str], lines: list[str], out: Path) -> dict[str, int]:
    """Function call counts of a fresh stdio server under cProfile that was sent `handshake`, then
    `lines`, one request at a time (each awaited, as the runs sent them), then EOF."""
    child = subprocess.Popen(
        [PYTHON, "-m", "cProfile", "-o", str(out), str(UPSTREAM)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert child.stdin is not None and child.stdout is not None
    answered = threading.Semaphore(0)

    def read(stdout: Any = child.stdout) -> None:
        for _ in iter(stdout.readline, b""):
            answered.release()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for line in handshake + lines:
            child.stdin.write(line.encode() + b"\n")
            child.stdin.flush()
            if "id" in json.loads(line) and not answered.acquire(timeout=10):
                raise TimeoutError(f"the child did not answer {line[:200]}")
        child.stdin.close()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.join(timeout=5)
    raw = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    # Built-ins are keyed by their repr, which holds an address: keep the name only.
    return {f"{Path(f).name}:{ln}({re.sub(r' at 0x[0-9a-f]+', '', fn)})": v[1] for (f, ln, fn), v in raw.items()}


def profile_child(era_lines: dict[str, list[str]], handshakes: dict[str, list[str]], work: Path, top: int) -> None:
    """Each era's recorded call lines into a fresh stdio server under cProfile, once and three
    times over: the difference is the calls' own work (start-up and handshake cancel out)."""
    per_call: dict[str, dict[str, float]] = {}
    for era, lines in era_lines.items():
        n = sum(1 for x in lines if '"tools/call"' in x)
        once = child_counts(handshakes[era], lines, work / f"child-{era}-1.prof")
        thrice = child_counts(handshakes[era], lines * 3, work / f"child-{era}-3.prof")
        per_call[era] = {k: (thrice.get(k, 0) - once.get(k, 0)) / (2 * n) for k in set(once) | set(thrice)}
        print(f"  {era}: {len(lines)} lines ({n} tools/call) after {len(handshakes[era])} handshake lines")
    a, b = list(per_call)
    total = {era: sum(c.values()) for era, c in per_call.items()}
    print(f"  function calls per tools/call: {a} {total[a]:.0f}, {b} {total[b]:.0f}")
    keys = set(per_call[a]) | set(per_call[b])
    worst = sorted(keys, key=lambda k: abs(per_call[b].get(k, 0) - per_call[a].get(k, 0)), reverse=True)[:top]
    print(f"  the {top} functions whose calls per tools/call differ most ({a} -> {b}):")
    for k in worst:
        print(f"    {per_call[a].get(k, 0):8.1f} -> {per_call[b].get(k, 0):8.1f}  {k}")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve-http"]:
        serve_http(int(argv[1]), Path(argv[2]))
        return 0
    if argv[:1] == ["tee-stdio"]:
        return tee_stdio(Path(argv[1]), argv[3:] if argv[2] == "--" else argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--path", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--profile", action="store_true", help="also the stdio child's call counts per era")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", type=Path, help="write every record here")
    args = parser.parse_args(argv)
    procs = Processes()
    dump: dict[str, Any] = {}
    diffs: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="wire-diff-") as tmp:
            work = Path(tmp)
            stdio_calls: dict[str, list[str]] = {}
            stdio_handshake: dict[str, list[str]] = {}
            for path in args.path:
                versions, sums = {}, {}
                for side in ("direct", "proxy"):
                    version, records = run_one(path, side == "proxy", args.calls, procs, work)
                    versions[side] = version
                    sums[side] = summarize(records, args.calls)
                    dump[f"{path}-{side}"] = records
                    if side == "proxy" and path.startswith("stdio"):
                        # The calls alone are repeated; what set the child up (the handshake, and
                        # the initialized notification and tools/list sent among the calls) once.
                        is_call = ['"tools/call"' in e["line"] and e["phase"] == "calls" for e in records]
                        stdio_calls[path] = [e["line"] for e, c in zip(records, is_call, strict=True) if c]
                        stdio_handshake[path] = [
                            e["line"] for e, c in zip(records, is_call, strict=True) if not c and e["phase"] != "close"
                        ]
                diffs += print_diff(path, versions, sums)
            if args.profile and len(stdio_calls) == 2:
                print("\n== the stdio child's work per era (cProfile call counts, the proxy's recorded lines)")
                profile_child(stdio_calls, stdio_handshake, work, args.top)
    finally:
        procs.stop_all()
    if args.json:
        args.json.write_text(json.dumps(dump, indent=1))
    print("\ndifferences during the calls:" if diffs else "\nno difference during the calls")
    for line in diffs:
        print(f"  - {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
