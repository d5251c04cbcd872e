"""A caller's view of the deadline: sends `hang` calls at a low steady rate through the proxy and
prints how late each answer came after the policy's deadline.

    .venv/bin/python bench/deadline_probe.py URL OUT.jsonl [--rate 3] [--seconds 60] [--mode 2026|legacy]

Used by bench/load_faults.py beside its load legs. Why a process of its own: the load generator
runs a hundred SDK clients in one Python process, and an answer that reached that process waits in
its busy event loop before the client sees it (tens to hundreds of ms on two cores), so its own
timings measure the load generator. This probe has one event loop with a few calls in flight: what
it measures is the proxy and the network between them.

Each call is a raw 2026-07-28 stateless `tools/call` of `hang` (the scripted upstream sleeps
longer than the policy's deadline), posted with httpx; `--mode legacy` opens one 2025 session
(initialize, notifications/initialized) and posts the calls on it. Timed from just before the
request is written until the whole answer was read. One JSON line per call: `t` (wall clock at its
start), `caller_ms`, the proxy's `elapsedMs` and `deadlineMs` and `stopReason` from the unresolved
result, or `error`.
Runs until `--seconds` pass or SIGTERM; bounded: at most `--max-in-flight` calls at once, each
bounded by `--call-bound-s`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

UNRESOLVED = "io.mcp-recovery-proxy/unresolved"
MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


def _answer(body: bytes, content_type: str) -> dict[str, Any] | None:
    """The JSON-RPC answer in a JSON body or in the last `data:` of an event stream."""
    if content_type.startswith("application/json"):
        return json.loads(body)
    found = None
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("data:"):
            message = json.loads(line[5:])
            if "id" in message and ("result" in message or "error" in message):
                found = message
    return found


class Probe:
    def __init__(self, url: str, mode: str, seconds: float, call_bound_s: float) -> None:
        self.url = url
        self.mode = mode
        self.seconds = seconds
        self.call_bound_s = call_bound_s
        self.headers: dict[str, str] = {"accept": ACCEPT, "content-type": "application/json"}
        self.next_id = 1

    async def open(self, http: httpx.AsyncClient) -> None:
        if self.mode == "2026":
            self.headers |= {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "hang"}
            return
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
        }
        r = await http.post(self.url, json=init, headers=self.headers)
        r.raise_for_status()
        self.headers["mcp-session-id"] = r.headers["mcp-session-id"]
        self.headers["mcp-protocol-version"] = LEGACY
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        (await http.post(self.url, json=note, headers=self.headers)).raise_for_status()

    async def call(self, http: httpx.AsyncClient, n: int, out: Any) -> None:
        params: dict[str, Any] = {"name": "hang", "arguments": {"seconds": 8.0, "call_id": f"probe-{n}"}}
        if self.mode == "2026":
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
        line: dict[str, Any] = {"n": n, "mode": self.mode, "t": time.time()}
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.call_bound_s):
                r = await http.post(self.url, json=body, headers=self.headers)
                raw = r.content
            line["caller_ms"] = round((time.perf_counter() - started) * 1000, 2)
            answer = _answer(raw, r.headers.get("content-type", ""))
            result = (answer or {}).get("result") or {}
            report = (result.get("_meta") or {}).get(UNRESOLVED) or {}
            line |= {k: report.get(k) for k in ("stopReason", "elapsedMs", "deadlineMs")}
            if not report:
                line["error"] = f"HTTP {r.status_code}: {raw[:160].decode(errors='replace')}"
        except Exception as exc:  # a probe reports what went wrong and goes on
            line["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        out.write(json.dumps(line) + "\n")
        out.flush()


async def main_async(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    probe = Probe(args.url, args.mode, args.seconds, args.call_bound_s)
    limits = httpx.Limits(max_connections=args.max_in_flight + 1)
    tasks: set[asyncio.Task[None]] = set()
    with args.out.open("a") as out:
        async with httpx.AsyncClient(timeout=args.call_bound_s, limits=limits) as http:
            await probe.open(http)
            end = time.monotonic() + args.seconds
            n = 0
            while not stop.is_set() and time.monotonic() < end:
                if len(tasks) < args.max_in_flight:
                    n += 1
                    task = asyncio.create_task(probe.call(http, n, out))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0 / args.rate)
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("out", type=Path)
    p.add_argument("--rate", type=float, default=3.0, help="calls started per second")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--mode", choices=["2026", "legacy"], default="2026")
    p.add_argument("--max-in-flight", type=int, default=8)
    p.add_argument("--call-bound-s", type=float, default=30.0)
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
