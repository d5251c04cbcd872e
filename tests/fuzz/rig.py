"""A proxy assembled in-process for the fuzz tests: the real service and HTTP frontend in front of
a real stdio upstream (the scripted SDK server as a child process, over real pipes), driven
through its ASGI interface, and a log capture that fails an example on any error or traceback.

The loop is owned here and run per example with a bound (`Rig.run`): an example that hangs fails
with TimeoutError instead of stalling the test run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from proxy import jsonrpc
from proxy.core.service import Service
from proxy.frontend.http.app import McpHttpApp
from proxy.policy.store import PolicyStore
from proxy.server import build_service
from proxy.settings import Settings
from proxy.upstream.sse.parse import SseParser
from tests.fixtures.helpers import PYTHON, scripted_args

T = TypeVar("T")
EXAMPLE_TIMEOUT_S = 10.0


class LogCapture(logging.Handler):
    """Every record of level ERROR and above, and every record carrying a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bad: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.bad.append(record)

    def take(self) -> list[str]:
        out = [f"{r.levelname} {r.name}: {r.getMessage()} exc={r.exc_info!r}" for r in self.bad]
        self.bad.clear()
        return out


@contextlib.contextmanager
def capture_logs() -> Iterator[LogCapture]:
    handler = LogCapture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def messages(self) -> list[Any]:
        """The JSON-RPC messages of a JSON or event-stream body."""
        if self.content_type.startswith("application/json"):
            return [jsonrpc.loads(self.body)]
        if self.content_type.startswith("text/event-stream"):
            return [jsonrpc.loads(e.data) for e in SseParser().feed(self.body) if e.data.strip()]
        return []


@dataclass
class Rig:
    loop: asyncio.AbstractEventLoop
    service: Service
    app: McpHttpApp
    logs: LogCapture
    session_id: str = ""
    _ids: Iterable[int] = field(default_factory=lambda: iter(range(10**9)))

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = EXAMPLE_TIMEOUT_S) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout_s))

    async def request(
        self, method: str, headers: list[tuple[bytes, bytes]], body: bytes = b"", *, path: str = "/mcp"
    ) -> Response:
        """One HTTP request through the ASGI app. The client stays connected until the response
        ends, except on a listen stream (GET answered with an event stream), which it leaves as
        soon as the head arrives."""
        done = asyncio.Event()
        sent_body = False
        status = 0
        out_headers: dict[str, str] = {}
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                out_headers.update({k.decode("latin-1"): v.decode("latin-1") for k, v in message["headers"]})
                if method == "GET" and out_headers.get("content-type", "").startswith("text/event-stream"):
                    done.set()
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    done.set()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
        }
        try:
            await self.app(scope, receive, send)
        finally:
            done.set()
        return Response(status, out_headers, b"".join(chunks))

    async def post(self, message: Any, headers: dict[str, str] | None = None, *, raw: bytes | None = None) -> Response:
        hdrs = {
            "host": "127.0.0.1:8080",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }
        hdrs.update(headers or {})
        body = raw if raw is not None else jsonrpc.dumps(message)
        # Header values as a client sends them: UTF-8 bytes (the frontend reads them as latin-1).
        return await self.request("POST", [(k.encode(), v.encode()) for k, v in hdrs.items()], body)

    def legacy_headers(self) -> dict[str, str]:
        return {"mcp-session-id": self.session_id, "mcp-protocol-version": "2025-11-25"}


def modern_meta() -> dict[str, Any]:
    return {jsonrpc.META_PROTOCOL_VERSION: "2026-07-28", jsonrpc.META_CLIENT_CAPABILITIES: {}}


def modern_call(id_: Any, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """A valid 2026 request and its mirrored routing headers."""
    message = {"jsonrpc": "2.0", "id": id_, "method": method, "params": {**params, "_meta": modern_meta()}}
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    return message, headers


@contextlib.contextmanager
def proxy_rig(tmp: Path, argv: list[str] | None = None, policies: Path | None = None, **settings: Any) -> Iterator[Rig]:
    """Start the service (probing the upstream), open one 2025 session, yield; stop everything.

    `argv`: the stdio upstream's command, by default the scripted SDK server."""
    argv = argv or [PYTHON, *scripted_args("stdio", tmp / "journal")]
    command = shlex.join(argv)
    config = Settings(
        listen="http://127.0.0.1:8080/mcp",
        upstream_command=command,
        stdio_spares=0,
        max_sessions=4,
        **settings,
    )
    loop = asyncio.new_event_loop()
    with capture_logs() as logs:
        service = build_service(config, PolicyStore(policies))
        app = McpHttpApp(service, config)
        rig = Rig(loop, service, app, logs)
        try:
            rig.run(service.start(), 60)
            init = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "fuzz", "version": "0"},
                },
            }
            answer = rig.run(rig.post(init), 60)
            assert answer.status == 200, answer
            rig.session_id = answer.headers["mcp-session-id"]
            ack = rig.run(rig.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, rig.legacy_headers()))
            assert ack.status == 202, ack
            assert service.capabilities is not None and service.capabilities.modern, "the upstream speaks 2026"
            logs.take()
            yield rig
        finally:
            loop.run_until_complete(asyncio.wait_for(service.aclose(), 30))
            loop.close()
