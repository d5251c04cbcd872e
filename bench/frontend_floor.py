"""What answering one MCP POST costs a Python HTTP frontend, per frontend, in instructions per call.

    .venv/bin/python bench/frontend_floor.py                 # all three, about a minute
    .venv/bin/python bench/frontend_floor.py --servers raw   # one
    .venv/bin/python bench/frontend_floor.py --serve asgi --port 8123   # one of them, natively, until Ctrl-C

Each server does the same application work for a 2026-07-28 `tools/call` (its headers decoded,
its body read and parsed with orjson, a result serialised with the request's id, a
`application/json` answer with its length) and nothing else, behind a different HTTP layer:

- `asgi`: uvicorn as the proxy runs it (`proxy.server._uvicorn_config`: its httptools protocol
  with the proxy's bounds and one write per answer, `LimitedHttpToolsProtocol`) and an ASGI app;
- `asgi-plain`: uvicorn's own httptools protocol, default settings, the same ASGI app;
- `raw`: an `asyncio.Protocol` on httptools' parser that answers from its own callbacks.

The server runs under valgrind's callgrind, instrumentation off until the measured sections; the
load is bench/hop_instructions.py's client (16 keep-alive connections, every answer checked), the
count the difference between a section of N and one of 3N calls, per call. The gap between
`asgi` and `raw` is what the proxy's frontend pays for uvicorn's request cycle and the ASGI
messages on every call, whatever the proxy does behind it: the headroom of a frontend protocol
of its own (bench/hop_instructions.py gives the whole proxy's count to read it against).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
SERVERS = ("asgi", "asgi-plain", "raw")


def _answer(body: bytes) -> bytes:
    request = orjson.loads(body)
    result = {"content": [{"type": "text", "text": "hello"}], "isError": False}
    return orjson.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The application work behind both uvicorn servers."""
    if scope["type"] != "http":
        return
    headers = {k.decode("latin-1"): v.decode("latin-1").strip() for k, v in scope["headers"]}
    if not headers.get("content-type", "").startswith("application/json"):
        raise RuntimeError("not JSON")
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    out = _answer(b"".join(chunks))
    start = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
    await send({"type": "http.response.start", "status": 200, "headers": start})
    await send({"type": "http.response.body", "body": out})


class RawProtocol(asyncio.Protocol):
    """The same work on httptools' parser, answered from the protocol's own callbacks."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import httptools

        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.headers.get("content-type", "").startswith("application/json"):
            raise RuntimeError("not JSON")
        out = _answer(b"".join(self.body))
        self.body, self.headers = [], {}
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(out)
        self.transport.write(head + out)


def serve(kind: str, port: int) -> None:
    import uvicorn
    import uvloop

    if kind == "asgi":
        sys.path.insert(0, str(REPO))
        from proxy.frontend.uvicorn_h1 import HttpLimits
        from proxy.server import _uvicorn_config

        uvicorn.Server(_uvicorn_config(app, "127.0.0.1", port, lifespan="off", limits=HttpLimits())).run()
    elif kind == "asgi-plain":
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=port,
            http="httptools",
            loop="uvloop",
            lifespan="off",
            ws="none",
            access_log=False,
            log_level="warning",
        )
    else:

        async def main() -> None:
            server = await asyncio.get_running_loop().create_server(RawProtocol, "127.0.0.1", port)
            async with server:
                await server.serve_forever()

        uvloop.run(main())


def measure(kind: str, calls: int, warmup: int) -> float:
    sys.path.insert(0, str(REPO / "bench"))
    import hop_instructions as H
    import relay as R

    procs = R.Processes()
    with tempfile.TemporaryDirectory(prefix="frontend-floor-") as tmp:
        workdir = Path(tmp)
        try:
            port = R.free_port()
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={workdir}/cg.%p"]
            argv += [R.PYTHON, str(Path(__file__).resolve()), "--serve", kind, "--port", str(port)]
            server = procs.start(argv, workdir / "server.log")
            R.wait_until(lambda: R.port_open(port), kind, server, workdir / "server.log", timeout_s=300)

            def run(n: int, first: int) -> None:
                asyncio.run(asyncio.wait_for(H.drive(port, "modern", None, n, 16, first), timeout=600))

            run(warmup, 1)
            return H.per_call(server.pid, workdir, run, calls)
        finally:
            procs.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--calls", type=int, default=300, help="N: the sections are N and 3N calls")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--serve", choices=SERVERS, help="run that server (what the measurement starts)")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0
    if subprocess.run(["which", "valgrind"], capture_output=True).returncode != 0:
        sys.exit("frontend_floor: needs valgrind (Debian package valgrind)")
    for kind in args.servers:
        print(f"  {kind:<11} {measure(kind, args.calls, args.warmup):>9,.0f} instructions/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
