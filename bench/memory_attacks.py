"""The proxy's memory under the attacks of issue 13 item 3, against the idle proxy, in one run.

Each attack runs against a fresh proxy process (`python -m proxy serve`, HTTP on 127.0.0.1, a
stdio upstream this script writes to a temporary file); the proxy's resident set size is sampled
from /proc every 20 ms, and the script prints, per attack, the idle RSS, the peak during the
attack and the RSS left once it is over (what the proxy still holds), in MiB.

- `listen`: a 2025 session opens its listen stream (GET) and never reads it, while the upstream
  writes log notifications tied to no request (64 KiB each, as fast as it can) for `--seconds`.
- `resume`: `--calls` 2025 calls (8 at a time) whose answers are `--answer-mib` MiB event streams
  (a notification comes first, so each response is an SSE stream kept for resumption); the
  client reads every answer. The buffers are held 30 s after each response.

`--repo PATH` runs the proxy from another checkout (e.g. the code before a fix) for comparison.
Bounded: every wait has a timeout, the attack lengths are flags, and every process this script
starts is stopped by its pid.

    .venv/bin/python bench/memory_attacks.py [--seconds 10] [--calls 200] [--answer-mib 8]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024

UPSTREAM = textwrap.dedent(
    """
    import json, sys, threading, time
    lock = threading.Lock()
    def write(msg):
        data = json.dumps(msg) + "\\n"
        with lock:
            sys.stdout.write(data); sys.stdout.flush()
    def chatter(seconds):
        pad = "x" * 65536
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            write({"jsonrpc": "2.0", "method": "notifications/message",
                   "params": {"level": "info", "data": pad}})
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None or method is None:
            continue
        if method == "server/discover":
            write({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})
        elif method == "initialize":
            write({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": msg["params"]["protocolVersion"],
                   "capabilities": {"tools": {}, "logging": {}}, "serverInfo": {"name": "bench", "version": "1"}}})
        elif method == "tools/list":
            tools = [{"name": n, "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
                     for n in ("chatter", "big")]
            write({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
        elif method == "tools/call":
            args = msg["params"].get("arguments") or {}
            if msg["params"]["name"] == "chatter":
                write({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "ok"}]}})
                threading.Thread(target=chatter, args=(float(args.get("seconds", 5)),), daemon=True).start()
            else:
                write({"jsonrpc": "2.0", "method": "notifications/message",
                       "params": {"level": "info", "data": "starting"}})
                text = "y" * int(args.get("bytes", 1024))
                write({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})
        else:
            write({"jsonrpc": "2.0", "id": mid, "result": {}})
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """The peak RSS of one process, sampled every 20 ms on a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except OSError:
                return
            self._stop.wait(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class Proxy:
    def __init__(self, repo: Path, upstream: Path) -> None:
        self.repo = repo
        self.port = free_port()
        self.admin = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        argv = [sys.executable, "-m", "proxy", "serve", "--listen", self.url, "--admin", f"127.0.0.1:{self.admin}"]
        argv += ["--", sys.executable, str(upstream)]
        env = {**os.environ, "PYTHONPATH": str(repo)}
        self.proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.admin}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the proxy did not become ready")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


def open_session(client: httpx.Client, url: str) -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    response = client.post(url, json=init, headers=HEADERS)
    response.raise_for_status()
    headers = {**HEADERS, "mcp-session-id": response.headers["mcp-session-id"]}
    client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


def call(client: httpx.Client, url: str, headers: dict[str, str], i: int, name: str, args: dict) -> int:
    body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": args}}
    response = client.post(url, json=body, headers=headers, timeout=120)
    response.raise_for_status()
    return len(response.content)


def attack_listen(proxy: Proxy, seconds: float) -> None:
    with httpx.Client(timeout=30) as client:
        headers = open_session(client, proxy.url)
        # The listen stream, on a socket this script never reads from.
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k != "accept")
        sock.sendall(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nAccept: text/event-stream\r\n{head}\r\n".encode()
        )
        head_seen = b""
        while b"\r\n\r\n" not in head_seen:  # the stream is attached once its head arrives
            chunk = sock.recv(1024)
            if not chunk:
                raise RuntimeError("the proxy closed the listen stream")
            head_seen += chunk
        assert head_seen.startswith(b"HTTP/1.1 200"), head_seen[:100]
        call(client, proxy.url, headers, 1, "chatter", {"seconds": seconds})
        time.sleep(seconds + 1)
        sock.close()


def attack_resume(proxy: Proxy, calls: int, answer_mib: float) -> None:
    with httpx.Client(timeout=120) as client:
        headers = open_session(client, proxy.url)
        size = int(answer_mib * MIB)
        with ThreadPoolExecutor(8) as pool:
            got = list(
                pool.map(lambda i: call(client, proxy.url, headers, i, "big", {"bytes": size}), range(1, calls + 1))
            )
        assert all(n >= size for n in got), "every answer arrived whole"


def measure(repo: Path, upstream: Path, name: str, run) -> dict[str, float]:  # type: ignore[no-untyped-def]
    proxy = Proxy(repo, upstream)
    try:
        time.sleep(1.0)
        idle = rss_mib(proxy.proc.pid)
        started = time.monotonic()
        with Sampler(proxy.proc.pid) as sampler:
            run(proxy)
            time.sleep(0.5)
        after = rss_mib(proxy.proc.pid)
        return {"idle_mib": idle, "peak_mib": sampler.peak, "after_mib": after, "seconds": time.monotonic() - started}
    finally:
        proxy.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose proxy runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the upstream chatters")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--answer-mib", type=float, default=8.0)
    parser.add_argument("--only", choices=("listen", "resume"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        upstream = Path(tmp) / "chatty_upstream.py"
        upstream.write_text(UPSTREAM)
        results: dict[str, dict[str, float]] = {}
        if args.only in (None, "listen"):
            results["listen"] = measure(args.repo, upstream, "listen", lambda p: attack_listen(p, args.seconds))
        if args.only in (None, "resume"):
            results["resume"] = measure(
                args.repo, upstream, "resume", lambda p: attack_resume(p, args.calls, args.answer_mib)
            )
    if args.json:
        print(json.dumps(results))
        return
    print(f"proxy from {args.repo}")
    print(f"{'attack':<10} {'idle MiB':>9} {'peak MiB':>9} {'after MiB':>10} {'growth':>8} {'seconds':>8}")
    for name, r in results.items():
        growth = r["peak_mib"] - r["idle_mib"]
        print(
            f"{name:<10} {r['idle_mib']:>9.0f} {r['peak_mib']:>9.0f} {r['after_mib']:>10.0f} "
            f"{growth:>+8.0f} {r['seconds']:>8.1f}"
        )


if __name__ == "__main__":
    main()
