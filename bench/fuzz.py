"""Coverage-guided fuzzing (atheris, libFuzzer) of the proxy's pure parsers, bounded in time.

    .venv/bin/python bench/fuzz.py --seconds 60            # every target, 60 s each
    .venv/bin/python bench/fuzz.py --target sse --seconds 300 --corpus-dir /tmp/corpus

Targets (each is what a peer's bytes reach first):
  jsonrpc   bytes -> jsonrpc.loads -> validate -> request/notification/response; a request with a
            2026 envelope through the frontend's header shortcut and the SDK's ladder (with
            headers taken from the input): the shortcut must never route what the ladder rejects
  sse       bytes -> SseParser.feed in chunks cut where the input says; only SseError may escape
  host      bytes -> the Host/Origin allow-list of a loopback listener; no exception
  policy    bytes -> a policy file through the loader (compile_files); only PolicyError may escape
  http      bytes -> a caller's HTTP/1.1 requests into the frontend's protocol
            (LimitedHttpToolsProtocol and its request cycle, as the proxy's uvicorn config sets it
            up, in-process on a recording transport, fed in chunks, an ASGI app that reads each
            body and answers):
            nothing may escape the protocol or be logged as an error, and once the connection
            is lost it is no longer counted against its client address
  h1        bytes -> an upstream's HTTP/1.1 answers through the response reader (fed in chunks,
            answers one after another on a kept-alive connection) and each body through its
            decoding and bound (gzip included); nothing may escape, and the events keep their
            order: one head per request, body pieces after it, at most one end

Each target runs in its own process (libFuzzer ends the process when its time is up) with the
proxy's modules instrumented for coverage. An exception other than the allowed one is a crash: it
is counted by signature (type and raising line), its first input saved under --crash-dir, and the
run goes on. Prints, per target: executions, executions per second, distinct crashes and the
inputs that reproduce them. Exit status 1 when any target found a crash.

No timed assertion here: the figures are printed. A run is bounded by --seconds per target (and a
per-input time limit of --input-timeout seconds, which libFuzzer reports as a crash: a hang).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

TARGETS = ("jsonrpc", "sse", "host", "policy", "h1", "http")
REPO_ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ the targets


def _target_jsonrpc() -> Any:
    from mcp.shared.inbound import InboundModernRoute, classify_inbound_request

    from proxy import jsonrpc
    from proxy.frontend.http.checks import plainly_routable

    def one(data: bytes) -> None:
        # The input: a body, optionally followed by NUL and three header values split by NUL.
        body, _, rest = data.partition(b"\x00")
        try:
            message = jsonrpc.loads(body)
        except (ValueError, RecursionError):
            return
        if jsonrpc.validate(message) is not None:
            return
        kinds = (jsonrpc.is_request(message), jsonrpc.is_notification(message), jsonrpc.is_response(message))
        if kinds.count(True) != 1:
            raise AssertionError(f"validate accepted a message of {kinds.count(True)} kinds")
        if not jsonrpc.is_request(message):
            return
        values = rest.decode("latin-1").split("\x00") if rest else []
        headers = dict(zip(("mcp-protocol-version", "mcp-method", "mcp-name"), values, strict=False))
        if plainly_routable(message, headers):
            verdict = classify_inbound_request(message, headers=headers)
            if not isinstance(verdict, InboundModernRoute):
                raise AssertionError(f"the shortcut routed what the ladder rejects: {verdict}")

    return one, ()


def _target_sse() -> Any:
    from proxy.upstream.sse.parse import SseError, SseParser

    def one(data: bytes) -> None:
        # The first byte picks the chunk size, so the fuzzer explores the boundaries too.
        size = (data[0] % 16) + 1 if data else 1
        parser = SseParser(max_event_bytes=4096)
        body = data[1:]
        for i in range(0, len(body), size):
            parser.feed(body[i : i + size])

    return one, (SseError,)


def _target_host() -> Any:
    from proxy.frontend.http.app import McpHttpApp
    from proxy.settings import Settings

    class _NoService:
        pass

    app = McpHttpApp(_NoService(), Settings(listen="http://127.0.0.1:8080/mcp"))  # type: ignore[arg-type]

    def one(data: bytes) -> None:
        text = data.decode("latin-1")
        if app.allowed_hosts is not None:
            app.allowed_hosts(text)
        app.allowed_origins(text)

    return one, ()


def _target_policy() -> Any:
    from proxy.errors import PolicyError
    from proxy.policy.compile import compile_files

    def one(data: bytes) -> None:
        compile_files([("a.yaml", "policies/a.yaml", data)])

    return one, (PolicyError,)


def _target_h1() -> Any:
    from proxy.upstream.h1.headers import Headers
    from proxy.upstream.h1.reader import Phase, ResponseReader
    from proxy.upstream.h1.response import Response

    class _Carrier:
        """The connection a `Response` sees: no socket; closing it ends the answer."""

        loop = None
        paused = False

        def __init__(self) -> None:
            self.closed = False

        def pause(self) -> None:
            self.paused = True

        def resume(self) -> None:
            self.paused = False

        def close(self) -> None:
            self.closed = True

        def response_done(self, reusable: bool) -> None:
            if not reusable:
                self.closed = True

    class _Events:
        """The connection's side of the reader. What goes wrong in a callback is kept and raised
        after `feed` returns: the reader turns a callback's exception into a `ProtocolError`
        for the peer, which would hide it from the fuzzer."""

        def __init__(self, carrier: _Carrier, max_body: int | None) -> None:
            self.carrier = carrier
            self.max_body = max_body
            self.problem: Exception | None = None
            self.next_request()

        def next_request(self) -> None:
            self.response: Response | None = None
            self.ended = False
            self.keep_alive = False

        def check(self) -> None:
            if self.problem is not None:
                raise self.problem

        def _keep(self, exc: Exception) -> None:
            if self.problem is None:
                self.problem = exc

        def on_head(self, status: int, reason: str, headers: Headers) -> None:
            try:
                if self.response is not None:
                    raise AssertionError("a second head for one request")
                if not 200 <= status <= 999:
                    raise AssertionError(f"a head with status {status}")
                self.response = Response(self.carrier, status, reason, headers)  # type: ignore[arg-type]
                self.response.max_body = self.max_body
            except Exception as exc:
                self._keep(exc)

        def on_body(self, data: bytes) -> None:
            try:
                if self.response is None or self.ended:
                    raise AssertionError("a body piece outside an answer")
                if not (self.response.complete or self.response.error is not None):
                    self.response.feed(data)
            except Exception as exc:
                self._keep(exc)

        def on_end(self, keep_alive: bool) -> None:
            try:
                if self.response is None or self.ended:
                    raise AssertionError("an end without a head, or a second one")
                self.ended, self.keep_alive = True, keep_alive
                if not (self.response.complete or self.response.error is not None):
                    self.response.finish()
            except Exception as exc:
                self._keep(exc)

    def one(data: bytes) -> None:
        # Byte 0: the read size (1-64); byte 1: bit 0 a HEAD request, bit 1 a 256-byte body bound.
        if len(data) < 2:
            return
        size, flags, stream = (data[0] % 64) + 1, data[1], data[2:]
        carrier = _Carrier()
        events = _Events(carrier, 256 if flags & 2 else None)
        reader = ResponseReader(events)
        reader.expect(head_only=bool(flags & 1))
        for i in range(0, len(stream), size):
            if reader.phase is Phase.DONE:
                if not events.keep_alive or carrier.closed:
                    return  # the connection is not reused: the rest would never be read
                events.next_request()  # the next request's answer, on the same connection
                reader.expect()
            error = reader.feed(stream[i : i + size])
            events.check()
            if error is not None:
                return  # the peer's error, returned (never raised): the connection is dropped
        reader.feed_eof()
        events.check()

    return one, ()


def _target_http() -> Any:
    import asyncio
    import logging

    from uvicorn.server import ServerState

    from proxy.frontend.uvicorn_h1 import HttpLimits, LimitedHttpToolsProtocol
    from proxy.server import _uvicorn_config
    from tests.fixtures.echo_asgi import echo_app as app

    limits = HttpLimits(max_head_bytes=2048, max_connections=8, max_connections_per_client=2)
    config = _uvicorn_config(app, "127.0.0.1", 8080, lifespan="off", limits=limits)  # the proxy's own
    config.load()
    protocol_class = config.http_protocol_class
    assert issubclass(protocol_class, LimitedHttpToolsProtocol)
    loop = asyncio.new_event_loop()
    errors: list[str] = []

    class _Errors(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage()[:200])

    logging.getLogger().addHandler(_Errors())
    logging.getLogger().setLevel(logging.WARNING)

    class _Transport:
        """What uvicorn writes to, recorded; closing it reaches the protocol as a lost connection."""

        def __init__(self) -> None:
            self.out: list[bytes] = []
            self.closing = False
            self.protocol: Any = None

        def write(self, data: bytes) -> None:
            self.out.append(bytes(data))

        def writelines(self, lines: Any) -> None:
            self.write(b"".join(lines))

        def is_closing(self) -> bool:
            return self.closing

        def close(self) -> None:
            if not self.closing:
                self.closing = True
                loop.call_soon(self.protocol.connection_lost, None)

        abort = close

        def write_eof(self) -> None: ...

        def pause_reading(self) -> None: ...

        def resume_reading(self) -> None: ...

        def set_protocol(self, protocol: Any) -> None:
            self.protocol = protocol

        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return {"peername": ("127.0.0.1", 4242), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    async def run(data: bytes) -> None:
        # Byte 0: the read size (1-64); bytes 1..: what the caller sends.
        size, stream = (data[0] % 64) + 1, data[1:]
        state = ServerState()
        transport = _Transport()
        protocol = protocol_class(config=config, server_state=state, app_state={}, _loop=loop)
        transport.protocol = protocol
        protocol.connection_made(transport)  # type: ignore[arg-type]
        for i in range(0, len(stream), size):
            if transport.closing:
                break
            protocol.data_received(stream[i : i + size])
            for _ in range(3):
                await asyncio.sleep(0)
        if not transport.closing:
            transport.closing = True
            protocol.connection_lost(None)
        for _ in range(5):  # the request tasks see the disconnect and end
            await asyncio.sleep(0)
        for task in state.tasks:
            task.cancel()
        if state.tasks:
            await asyncio.wait(set(state.tasks), timeout=1.0)

    def one(data: bytes) -> None:
        if not data:
            return
        errors.clear()
        loop.run_until_complete(run(data))
        if errors:
            raise AssertionError(f"logged as an error: {errors[0]}")
        if protocol_class._by_client:
            counted = dict(protocol_class._by_client)
            protocol_class._by_client.clear()
            raise AssertionError(f"a lost connection still counted against its client: {counted}")

    return one, ()


_INSTRUMENT = {
    "jsonrpc": ["proxy.jsonrpc", "proxy.frontend.http", "mcp.shared.inbound"],
    "sse": ["proxy.upstream.sse.parse"],
    "host": ["proxy.frontend.http"],
    "policy": ["proxy.policy", "yaml"],
    "h1": ["proxy.upstream.h1"],
    "http": ["proxy.frontend.uvicorn_h1", "proxy.frontend.h1_cycle", "uvicorn.protocols.http.httptools_impl"],
}
_BUILDERS = {
    "jsonrpc": _target_jsonrpc,
    "sse": _target_sse,
    "host": _target_host,
    "policy": _target_policy,
    "h1": _target_h1,
    "http": _target_http,
}
_SEEDS: dict[str, list[bytes]] = {
    "jsonrpc": [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","_meta":'
        b'{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
        b"\x002026-07-28\x00tools/call\x00echo",
        b'{"jsonrpc":"2.0","id":"a","result":{}}',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}',
    ],
    "sse": [b"\x03id: 1\nretry: 10\nevent: message\ndata: {}\n\n", b"\x01\xef\xbb\xbfdata: a\r\ndata: b\r\r"],
    "host": [b"127.0.0.1:8080", b"[::1]:8080", b"http://localhost:3000", b"evil.example"],
    "policy": [
        b"tools: [refund]\nside_effect: state_changing\nattempts: 2\ndeadline: 6s\n",
        b"tools: [x]\nrules:\n  - {name: r, category: transient, text: 'busy'}\nbackoff: {initial: 1s}\n",
        b"a: &a [x, x]\nb: [*a, *a]\n",
    ],
    "http": [
        b"\x09POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:8080\r\ncontent-length: 2\r\n\r\n{}"
        b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n",
        b"\x03POST /mcp HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"\x3fGET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\nexpect: 100-continue\r\n\r\n",
    ],
    "h1": [
        b"\x07\x00HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"\x05\x02HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
        b"content-type: text/event-stream\r\n\r\n5\r\ndata:\r\n0\r\nx-trailer: 1\r\n\r\n",
        b"\x3f\x00HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\n\r\n"
        + bytes.fromhex("1f8b0800000000000003abae050043bfa6a302000000"),
        b"\x01\x01HTTP/1.0 404 Not Found\r\ncontent-length: 3\r\n\r\nabc",
    ],
}


def _signature(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def child(
    target: str, seconds: int, runs: int | None, input_timeout: int, crash_dir: Path, corpus_dir: Path | None
) -> None:
    """Runs inside the per-target process: never returns (libFuzzer exits)."""
    import atheris

    # Only the target's own modules are instrumented: instrumenting every import costs seconds of
    # start-up per target and guides the fuzzer toward code the input never reaches.
    with atheris.instrument_imports(include=_INSTRUMENT[target]):
        one, allowed = _BUILDERS[target]()
    seen: set[str] = set()
    crash_dir.mkdir(parents=True, exist_ok=True)

    def test_one_input(data: bytes) -> None:
        try:
            one(data)
        except allowed:
            pass
        except Exception as exc:
            signature = _signature(exc)
            if signature not in seen:
                seen.add(signature)
                path = crash_dir / f"{target}-{hashlib.sha256(data).hexdigest()[:12]}"
                path.write_bytes(data)
                line = {"signature": signature, "message": str(exc)[:200], "input": str(path)}
                with (crash_dir / "crashes.jsonl").open("a") as f:
                    f.write(json.dumps(line) + "\n")

    corpus = corpus_dir or Path(tempfile.mkdtemp(prefix=f"fuzz-{target}-"))
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(_SEEDS[target]):
        (corpus / f"seed-{i}").write_bytes(seed)
    args = [
        sys.argv[0],
        f"-max_total_time={seconds}",
        *([f"-runs={runs}", "-seed=1"] if runs is not None else []),
        f"-timeout={input_timeout}",
        "-rss_limit_mb=2048",
        "-max_len=4096",
        "-print_final_stats=1",
        f"-artifact_prefix={crash_dir}/",
        str(corpus),
    ]
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


def run_target(
    target: str, seconds: int, runs: int | None, input_timeout: int, crash_dir: Path, corpus_dir: Path | None
) -> dict[str, Any]:
    """Run one target in its own process; parse libFuzzer's final statistics."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        target,
        "--seconds",
        str(seconds),
        "--input-timeout",
        str(input_timeout),
        "--crash-dir",
        str(crash_dir),
    ]
    if runs is not None:
        cmd += ["--runs", str(runs)]
    if corpus_dir is not None:
        cmd += ["--corpus-dir", str(corpus_dir / target)]
    before = _crashes(crash_dir, target)
    proc = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=seconds + 120,  # start-up, seeds and libFuzzer's own wrap-up; a hang beyond is a failure
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", proc.stderr)
    secs = re.search(r"Done \d+ runs in (\d+) second", proc.stderr)
    crashes = [c for c in _crashes(crash_dir, target) if c not in before]
    # libFuzzer stops on what it calls a crash itself (a timeout, a signal, out of memory).
    fatal = None
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if "ERROR" in line or "Traceback" in line]
        fatal = (tail[0] if tail else f"exit {proc.returncode}")[:200]
    return {
        "target": target,
        "executions": int(runs.group(1)) if runs else None,
        "seconds": int(secs.group(1)) if secs else None,
        "crashes": crashes,
        "fatal": fatal,
        "stderr_tail": proc.stderr.splitlines()[-5:] if fatal else [],
    }


def _crashes(crash_dir: Path, target: str) -> list[str]:
    path = crash_dir / "crashes.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if Path(entry["input"]).name.startswith(target + "-"):
            out.append(f"{entry['signature']}: {entry['message']} (input: {entry['input']})")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=TARGETS, action="append", help="repeatable; default: all")
    parser.add_argument("--seconds", type=int, default=30, help="fuzzing time per target")
    parser.add_argument(
        "--runs", type=int, default=None, help="stop after this many inputs, with a fixed seed (reproducible)"
    )
    parser.add_argument("--input-timeout", type=int, default=5, help="seconds one input may take (else: a hang)")
    parser.add_argument("--crash-dir", type=Path, default=None, help="where reproducing inputs go")
    parser.add_argument("--corpus-dir", type=Path, default=None, help="keep the corpus here (default: temporary)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--child", choices=TARGETS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    crash_dir = args.crash_dir or Path(tempfile.mkdtemp(prefix="fuzz-crashes-"))
    if args.child:
        child(args.child, args.seconds, args.runs, args.input_timeout, crash_dir, args.corpus_dir)
        return 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("atheris is not installed for this Python (pip install atheris); nothing was fuzzed", file=sys.stderr)
        return 2
    results = [
        run_target(t, args.seconds, args.runs, args.input_timeout, crash_dir, args.corpus_dir)
        for t in args.target or TARGETS
    ]
    if args.json:
        print(json.dumps({"crash_dir": str(crash_dir), "results": results}, indent=2))
    else:
        print(f"{'target':<8} {'executions':>11} {'exec/s':>8} {'crashes':>8}  (reproducing inputs in {crash_dir})")
        for r in results:
            rate = str(r["executions"] // r["seconds"]) if r["executions"] and r["seconds"] else "-"
            print(f"{r['target']:<8} {r['executions'] or 0:>11} {rate:>8} {len(r['crashes']):>8}")
            for crash in r["crashes"]:
                print(f"    crash: {crash}")
            if r["fatal"]:
                print(f"    stopped by libFuzzer: {r['fatal']}")
    return 1 if any(r["crashes"] or r["fatal"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
