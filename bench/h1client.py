"""Client-side cost of one upstream HTTP call: proxy.upstream.h1 against aiohttp, same request shape.

    python bench/h1client.py [--requests 5000] [--rounds 3] [--uvloop]

A minimal keep-alive HTTP/1.1 server (an asyncio Protocol, no framework) runs in a child process
on 127.0.0.1 and answers every POST at once with a small JSON body and a Content-Length, so this
process's CPU time is the client's alone. Each round runs N requests at concurrency 1 and 16 with
each client, alternating, and the figures printed are the median over rounds of requests/s and of
CPU time per request (`time.process_time`, this process only). The aiohttp side is configured as
the proxy's aiohttp session was (`aiohttp_client`), so the comparison is the one that matters.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ANSWER_BODY = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hello"}],"isError":false}}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(ANSWER_BODY)).encode()
    + b"\r\n\r\n"
    + ANSWER_BODY
)
REQUEST_BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
REQUEST_HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2026-07-28",
    "mcp-method": "tools/call",
    "mcp-name": "echo",
}
DEFAULT_HEADERS = {"authorization": "Bearer bench-token", "user-agent": "mcp-recovery-proxy/0.1.0"}


# ---------------------------------------------------------------------------------------------
# the server (child process)
# ---------------------------------------------------------------------------------------------
class _Server(asyncio.Protocol):
    """Answers each complete request (head + Content-Length body) with the fixed answer."""

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            i = head.find(b"\r\ncontent-length:")
            length = 0
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                length = int(head[i + 17 : j if j >= 0 else None])
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length :]
            out.append(ANSWER)
        self.buf = buf
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


def serve(use_uvloop: bool) -> None:
    if use_uvloop:
        import uvloop

        uvloop.install()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Server, "127.0.0.1", 0, backlog=256)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent goes

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# the clients
# ---------------------------------------------------------------------------------------------
Call = Callable[[], Awaitable[bytes]]


async def h1_client(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    from proxy.upstream.h1 import HttpClient

    client = HttpClient(url, headers=DEFAULT_HEADERS, connect_timeout_s=5.0, max_connections=100)
    written = [False]

    def on_write() -> None:
        written[0] = True

    async def call() -> bytes:
        async with await client.request("POST", headers=REQUEST_HEADERS, body=REQUEST_BODY, on_write=on_write) as r:
            if r.status != 200:
                raise RuntimeError(f"status {r.status}")
            return await r.read()

    return call, client.aclose


async def aiohttp_client(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """The client the proxy used before `h1` (a dev dependency now), configured as the proxy had
    it: keep-alive pool, no redirects, no environment proxies, the written-hook on the body."""
    import aiohttp
    from yarl import URL

    class Body(aiohttp.BytesPayload):
        def __init__(self, data: bytes, on_write: Callable[[], None]) -> None:
            super().__init__(data, content_type="application/json")
            self._on_write = on_write

        async def write_with_length(self, writer: Any, content_length: int | None) -> None:
            self._on_write()
            await super().write_with_length(writer, content_length)

    session = aiohttp.ClientSession(
        headers=DEFAULT_HEADERS,
        connector=aiohttp.TCPConnector(limit=100, limit_per_host=0),
        cookie_jar=aiohttp.CookieJar(unsafe=True),
        timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_connect=5.0),
        trust_env=False,
    )
    yurl = URL(url)
    written = [False]

    def on_write() -> None:
        written[0] = True

    async def call() -> bytes:
        body = Body(REQUEST_BODY, on_write)
        async with session.post(yurl, data=body, headers=REQUEST_HEADERS, allow_redirects=False) as r:
            if r.status != 200:
                raise RuntimeError(f"status {r.status}")
            return await r.read()

    return call, session.close


async def run(call: Call, requests: int, concurrency: int) -> tuple[float, float]:
    """(requests/s, CPU µs per request) for `requests` calls spread over `concurrency` workers."""
    per_worker = requests // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            body = await call()
            if len(body) != len(ANSWER_BODY):
                raise RuntimeError("short answer")

    await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm-up: connections, caches
    total = per_worker * concurrency
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return total / wall, cpu / total * 1e6


async def bench(url: str, requests: int, rounds: int) -> None:
    clients = {"h1": h1_client, "aiohttp": aiohttp_client}
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for concurrency in (1, 16):
            for name, make in clients.items():
                call, close = await make(url)
                try:
                    results.setdefault((name, concurrency), []).append(await run(call, requests, concurrency))
                finally:
                    await close()
    print(
        f"{'client':<8} {'conc':>4} {'req/s':>9} {'CPU µs/req':>11}   (median of {rounds} rounds, {requests} requests)"
    )
    for concurrency in (1, 16):
        for name in clients:
            rows = results[(name, concurrency)]
            rps = statistics.median(r for r, _ in rows)
            cpu = statistics.median(c for _, c in rows)
            print(f"{name:<8} {concurrency:>4} {rps:>9.0f} {cpu:>11.1f}")
        ours = statistics.median(c for _, c in results[("h1", concurrency)])
        theirs = statistics.median(c for _, c in results[("aiohttp", concurrency)])
        print(f"{'':<8} {concurrency:>4} h1 CPU per request = {ours / theirs:.0%} of aiohttp's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000, help="requests per client and concurrency per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--uvloop", action="store_true", help="run client and server on uvloop (as the proxy does)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.uvloop)
        return
    cmd = [sys.executable, __file__, "--serve", *(["--uvloop"] if args.uvloop else [])]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        line = server.stdout.readline().decode()
        if not line.startswith("PORT "):
            raise SystemExit("the benchmark server did not start")
        url = f"http://127.0.0.1:{int(line.split()[1])}/mcp"
        print(f"python {sys.version.split()[0]}, loop: {'uvloop' if args.uvloop else 'asyncio'}, pid {os.getpid()}")
        if args.uvloop:
            import uvloop

            uvloop.install()
        asyncio.run(asyncio.wait_for(bench(url, args.requests, args.rounds), 600))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
