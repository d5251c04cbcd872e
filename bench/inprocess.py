"""In-process benchmark of the proxy's own request path: the HTTP app, the relay, the engine and
its telemetry, with no sockets, no uvicorn and no upstream process.

    .venv/bin/python bench/inprocess.py [--calls 20000] [--concurrency 16] [--profile out.prof]

It drives the real `McpHttpApp` (the ASGI app uvicorn runs) with the 2026-07-28 `tools/call` the
relay benchmark's wrk sends, over a `Service` whose upstream is an in-memory link that answers
each request on the next loop iteration. Three configurations, same requests, one process, on
uvloop like the proxy:
  - `plain`: `Service(tool_calls=None)`, tools/call relayed as one attempt (bench/_plain_relay.py);
  - `engine`: the recovery engine with no observers (its own work only);
  - `engine+telemetry`: the engine with the shipped telemetry (`build_telemetry`: metrics and the
    call log at the default level; no tracing unless OTEL_* is set).
It prints CPU microseconds per call (process time, best of `--repeat`, each configuration in a
process of its own) and the engine's added CPU over `plain`. These are the proxy's own
microseconds only: the real relay benchmark (bench/relay.py) adds uvicorn, sockets, pipes and the
load generator. Expect +-20-30% between runs on a shared two-core VM. `--profile` writes a cProfile of the
engine+telemetry configuration. Not a test and not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from relay import BODY as _WRK_BODY
from relay import PROTOCOL

from proxy.core.engine import Engine
from proxy.core.service import Service
from proxy.frontend.http.app import McpHttpApp
from proxy.policy.store import PolicyStore
from proxy.settings import Settings
from proxy.telemetry.setup import build_telemetry
from proxy.upstream.base import Capabilities, Era, Exchange, LinkBase, OnMessage, PendingTable, UpstreamHealth

BODY = _WRK_BODY.encode()
HEADERS = [
    (b"host", b"127.0.0.1:8080"),
    (b"content-type", b"application/json"),
    (b"accept", b"application/json, text/event-stream"),
    (b"mcp-protocol-version", PROTOCOL.encode()),
    (b"mcp-method", b"tools/call"),
    (b"mcp-name", b"echo"),
    (b"content-length", str(len(BODY)).encode()),
]
TOOL = {
    "name": "echo",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "annotations": {"readOnlyHint": True},
}


class EchoLink(LinkBase):
    """Answers every request on the next loop iteration, as a fast upstream would."""

    era = Era.MODERN

    def __init__(self) -> None:
        self._pending = PendingTable()
        self._loop = asyncio.get_running_loop()

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        ex = self._pending.add(message, on_message)
        ex.written = True
        if on_write is not None:
            on_write()
        if message["method"] == "tools/list":
            result: Any = {"tools": [TOOL]}
        else:
            result = {"content": [{"type": "text", "text": "hello"}], "isError": False}
        self._loop.call_soon(self._pending.resolve, {"jsonrpc": "2.0", "id": message["id"], "result": result})
        return ex

    async def send_notification(self, message: dict[str, Any], *, headers: Any = None) -> None:
        pass

    async def send_response(self, message: dict[str, Any]) -> None:
        pass

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        pass

    async def aclose(self) -> None:
        pass


class EchoUpstream:
    description = "in-memory echo"

    def __init__(self) -> None:
        self._link: EchoLink | None = None
        self.health = UpstreamHealth()

    async def probe(self) -> Capabilities:
        return Capabilities(legacy=False, modern=True)

    async def open(self, era: Era) -> EchoLink:
        if self._link is None:
            self._link = EchoLink()
        return self._link

    async def aclose(self) -> None:
        pass


async def one_call(app: McpHttpApp) -> None:
    sent = False
    done = asyncio.get_running_loop().create_future()
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await done  # like uvicorn: the disconnect comes only when the connection goes
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif not message.get("more_body") and not done.done():
            done.set_result(None)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": HEADERS, "query_string": b""}
    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"unexpected status {status}")


def _callgrind(switch: str) -> None:
    """Turn callgrind's instrumentation of this process on or off (it starts off: --instr-atstart=no)."""
    subprocess.run(["callgrind_control", "-i", switch, str(os.getpid())], check=True, capture_output=True, timeout=120)


async def run(mode: str, calls: int, concurrency: int, profile: str | None) -> float:
    settings = Settings(listen="http://127.0.0.1:8080/mcp", upstream="http://127.0.0.1:1/mcp")
    telemetry = build_telemetry(settings).telemetry if mode == "engine+telemetry" else None
    policies = PolicyStore(None)
    engine = None
    if mode != "plain":
        engine = Engine(
            policies=lambda: policies.current,
            telemetry=telemetry,
            upstream_name="echo",
            max_concurrent_calls=settings.max_concurrent_calls,  # as proxy/server.py builds it
        )
    service = Service(settings, EchoUpstream(), tool_calls=engine, telemetry=telemetry)  # type: ignore[arg-type]
    await service.start()
    app = McpHttpApp(service, settings)

    async def worker(n: int) -> None:
        for _ in range(n):
            await one_call(app)

    await asyncio.gather(*(worker(200 // concurrency + 1) for _ in range(concurrency)))  # warm-up
    per_worker = calls // concurrency
    profiler = cProfile.Profile() if profile else None
    counting = os.environ.get("BENCH_CALLGRIND") == "1"  # under valgrind: count this section only
    if counting:
        _callgrind("on")
    start = time.process_time()
    if profiler:
        profiler.enable()
    await asyncio.gather(*(worker(per_worker) for _ in range(concurrency)))
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)  # type: ignore[arg-type]
    if counting:
        _callgrind("off")
    elapsed = time.process_time() - start
    await service.aclose()
    return elapsed / (per_worker * concurrency) * 1e6


MODES = ("plain", "engine", "engine+telemetry")


def measure_here(mode: str, calls: int, concurrency: int, repeat: int, profile: str | None) -> float:
    """The best of `repeat` runs of one configuration, in this process."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)  # the proxy's default level
    logging.getLogger("proxy.calls").addHandler(logging.NullHandler())
    logging.getLogger("proxy.calls").propagate = False  # what is built is measured, not terminal I/O
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None
    best = None
    for _ in range(repeat):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            us = runner.run(run(mode, calls, concurrency, None))
        best = us if best is None else min(best, us)
    if profile:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(run(mode, calls, concurrency, profile))
    assert best is not None
    return best


def _collected(mode: str, calls: int, concurrency: int) -> tuple[int, int]:
    """(instructions, calls) of one measured section run under callgrind."""
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null"]
    argv += [sys.executable, __file__, "--only", mode, "--calls", str(calls), "--concurrency", str(concurrency)]
    argv += ["--repeat", "1"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, check=True, env={**os.environ, "BENCH_CALLGRIND": "1"}
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no callgrind total in: {done.stderr[-500:]}")
    return int(found.group(1)), calls // concurrency * concurrency


def count_instructions(calls: int, concurrency: int) -> None:
    """Instructions per call of each configuration: the difference between a run of `calls` and one
    of 3x `calls` (what the two share, such as switching callgrind on, cancels out). Deterministic to
    within a fraction of a percent, unlike CPU time on a shared VM; a proxy for CPU, not CPU."""
    per_call: dict[str, float] = {}
    for mode in MODES:
        small, n_small = _collected(mode, calls, concurrency)
        large, n_large = _collected(mode, calls * 3, concurrency)
        per_call[mode] = (large - small) / (n_large - n_small)
    base = per_call["plain"]
    print(f"in-process request path under callgrind: instructions per call, concurrency {concurrency}")
    print(f"{'configuration':<20}{'instr/call':>14}{'vs plain':>12}")
    for mode, n in per_call.items():
        print(f"{mode:<20}{n:>14,.0f}{(n - base) / base * 100:>+11.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the best is kept")
    parser.add_argument("--profile", help="write a cProfile of the engine+telemetry configuration here")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per call under valgrind's callgrind instead of timing (slow, deterministic)",
    )
    parser.add_argument("--only", choices=MODES, help=argparse.SUPPRESS)  # one configuration, for the parent
    args = parser.parse_args()
    if args.only:
        profile = args.profile
        print(measure_here(args.only, args.calls, args.concurrency, args.repeat, profile))
        return
    if args.instructions:
        count_instructions(args.calls, args.concurrency)
        return
    # Each configuration in a process of its own: measured one after the other in one process, the
    # last one paid for the heap and the collector the earlier ones left behind (+30-60 us a call).
    results: dict[str, float] = {}
    for mode in MODES:
        argv = [sys.executable, __file__, "--only", mode, "--calls", str(args.calls)]
        argv += ["--concurrency", str(args.concurrency), "--repeat", str(args.repeat)]
        if args.profile:
            argv += ["--profile", args.profile]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=True)
        results[mode] = float(done.stdout.strip().splitlines()[-1])
    base = results["plain"]
    print(f"in-process request path: {args.calls} calls at concurrency {args.concurrency}, best of {args.repeat}")
    print(f"{'configuration':<20}{'CPU us/call':>14}{'vs plain':>12}")
    for mode, us in results.items():
        print(f"{mode:<20}{us:>14.1f}{(us - base) / base * 100:>+11.1f}%")


if __name__ == "__main__":
    main()
