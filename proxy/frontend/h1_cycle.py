"""The request-response cycle of the proxy's HTTP ports: uvicorn's httptools protocol, with the
ASGI cycle of each request its own.

uvicorn keeps the connection: httptools' parser, keep-alive and its timeout, pipelined requests,
flow control, graceful shutdown, the task that runs the app (`HttpToolsProtocol`). What it starts
for each request, `RequestResponseCycle` (the scope, and the `receive` and `send` the app is
called with), is replaced here by `Cycle`, which keeps every rule of uvicorn's and costs less per
request (`bench/frontend_floor.py` counts the instructions):

- A response head is written with the first bytes of its body, in one `write`: on loopback each
  `send()` system call runs the receiver's half of TCP in the sender's call too, so two writes
  per answer were the largest single share of the frontend's CPU. A head that starts a stream (no
  `content-length`) goes out at the next loop step at the latest, with the first chunk if that
  comes first.
- Response header names and values are checked once per response (the same characters uvicorn
  refuses, searched for in all names, then in all values), not with two searches per header;
  a response whose head is refused is an app error answered 500 (nothing was written yet).
- The scope is built in one step per request, its `asgi` entry one dict per connection.
- The keep-alive timeout (uvicorn's `timeout_keep_alive`: an idle connection is closed that long
  after its last answer) is one timer per connection, re-armed only when it comes due early,
  instead of a timer armed at each answer and cancelled at the next request (about 6,000
  instructions a request under uvloop). The connection is closed as uvicorn closes it: when no
  byte has come for the timeout since its last answer.

Kept as uvicorn has it: a body longer or shorter than its `content-length` is an app error;
`HEAD`, 204 and 304 carry no body; a response without a length is chunked; `connection: close`
(the app's, an HTTP/1.0 request's, or a graceful shutdown's) closes the connection after the
response; `Expect: 100-continue` is answered when the app first reads the body; reading pauses
past 64 KiB of unread body; an app's exception is logged ("Exception in ASGI application") and
answered 500 if no response started, else the connection is closed.

What uvicorn's cycle has and this one has not, since the proxy runs none of it
(`proxy.server._uvicorn_config`): the access log, `limit_concurrency` (the proxy bounds
connections itself, `LimitedHttpToolsProtocol`) and WebSocket upgrades (`ws="none"`: a request
that asks for one is an ordinary request).
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol

log = logging.getLogger("uvicorn.error")  # where uvicorn logs an app's exception

# uvicorn's own status lines (`STATUS_LINE`) and response-header checks (`HEADER_RE`: a name is an
# RFC 9110 token; `HEADER_VALUE_RE`: a value has no control character but tab) are used as they
# are: the cycle refuses exactly what uvicorn's refuses.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ERROR_HEAD = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"), (b"connection", b"close")]


class Cycle:
    """One request and its response, as the ASGI app sees them (`receive`, `send`), on `protocol`'s
    connection. The attributes uvicorn's protocol reads of its cycle keep their names and meaning:
    `response_started`, `response_complete`, `disconnected`, `keep_alive`, `message_event`.

    It keeps no reference to the protocol but its `on_response_complete`, and that one only until
    the app returns: the protocol holds its cycle, and a reference back would leave the two (with
    the scope, the parser and the connection's state) as cyclic garbage for the collector once
    the connection closes, as uvicorn's own cycle does not."""

    __slots__ = (
        "_chunked",
        "_date",
        "_head",
        "_left",
        "_loop",
        "_no_body",
        "_on_response",
        "body",
        "body_bytes",
        "disconnected",
        "flow",
        "keep_alive",
        "message_event",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(self, protocol: CycleHttpToolsProtocol, scope: dict[str, Any], keep_alive: bool, expect: bool) -> None:
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect
        # the request body received and not yet read by the app
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self._head: bytes | None = None  # a response head not written yet (see `_start`)
        self._chunked = False
        self._no_body = False  # HEAD
        self._left = 0  # of the content-length, the bytes still to send
        # the protocol's `on_response_complete`, until the app returns (a send after that, from a
        # task the app left behind, does not start the next pipelined request)
        self._on_response: Callable[[], None] | None = protocol.on_response_complete
        self._loop = protocol.loop
        self._date = protocol.server_state.default_headers  # uvicorn's `date` header, renewed each second

    async def run_asgi(self, app: Any) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.transport.close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self._on_response = None

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _ERROR_HEAD})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> dict[str, Any]:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(CONTINUE)
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            event = self.message_event
            if not event.is_set():
                await event.wait()
            event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = b"".join(self.body)
        self.body = []
        self.body_bytes = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self._start(message["status"], message.get("headers", ()))
            return
        if self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self._no_body:
            out = b""
        elif self._chunked:
            out = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                out += b"0\r\n\r\n"
        else:
            if len(body) > self._left:
                raise RuntimeError("Response content longer than Content-Length")
            self._left -= len(body)
            out = body
        head = self._head
        if head is not None:
            self._head = None
            out = head + out
        if out:
            self.transport.write(out)
        if not more:
            if self._left:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            on_response = self._on_response
            if on_response is not None:
                on_response()

    def _start(self, status: int, headers: Any) -> None:
        """Build the response head; it is written with the body's first bytes, or (a stream: no
        content-length) at the next loop step if those have not come by then."""
        content = [STATUS_LINE[status]]
        for name, value in self._date:
            content += (name, b": ", value, b"\r\n")
        names: list[bytes] = []
        values: list[bytes] = []
        length: int | None = None
        close = False
        for name, value in headers:
            name = name.lower()
            names.append(name)
            values.append(value)
            if name == b"content-length":
                if length is None and not self._chunked:
                    length = int(value)
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                length = None
                self._chunked = True
            elif name == b"connection" and b"close" in [token.strip() for token in value.lower().split(b",")]:
                self.keep_alive = False
                close = True
            content += (name, b": ", value, b"\r\n")
        if HEADER_RE.search(b"".join(names)):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"\t".join(values)):
            raise RuntimeError("Invalid HTTP header value.")
        if not self.keep_alive and not close:
            content.append(b"connection: close\r\n")
        self._no_body = self.scope["method"] == "HEAD"
        if length is None and not self._chunked and not self._no_body and status not in (204, 304):
            self._chunked = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self._left = 0 if length is None or self._no_body else length
        self._head = b"".join(content)
        self.response_started = True
        self.waiting_for_100_continue = False
        if self._chunked:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self.disconnected and not self.transport.is_closing():
                self.transport.write(head)


class CycleHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol running each request in a `Cycle` (see the module docstring)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._asgi = {"version": self.asgi_version, "spec_version": "2.3"}
        self._idle_since = -1.0  # when its last answer completed, if no byte came since; else -1

    # -- keep-alive: one timer per connection (module docstring) -------------------------------
    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this as bytes arrive (and as an answer completes, or the connection is
        # lost): the connection is not idle. Its timer, if armed, finds that when it comes due.
        self._idle_since = -1.0

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # a pipelined request runs now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self._arm_keep_alive(self._idle_since + self.timeout_keep_alive)

    def _arm_keep_alive(self, due: float) -> None:
        self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since < 0 or self.transport.is_closing():
            return  # a request came: the timer is armed again when its answer completes
        due = since + self.timeout_keep_alive
        if due > self.loop.time() + 0.001:  # (the loop's timers are of milliseconds)
            self._arm_keep_alive(due)  # answered again since the timer was armed
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        timer = self.timeout_keep_alive_task
        if timer is not None:  # (it would hold the protocol until it came due)
            self.timeout_keep_alive_task = None
            timer.cancel()

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": self._asgi,
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        self.scope = scope  # type: ignore[assignment]

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope["method"] = parser.get_method().decode("ascii")
        if version != "1.1":
            scope["http_version"] = version
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        scope["path"] = root + path
        scope["raw_path"] = root.encode("ascii") + raw_path if root else raw_path
        scope["query_string"] = url.query or b""
        previous = self.cycle
        cycle = Cycle(self, scope, version != "1.0" and parser.should_keep_alive(), self.expect_100_continue)
        self.cycle = cycle  # type: ignore[assignment]
        if previous is None or previous.response_complete:
            self._start_asgi_task(cycle, self.app)  # type: ignore[arg-type]
        else:  # a pipelined request: it runs once the one before it is answered
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))  # type: ignore[arg-type]

    def on_body(self, body: bytes) -> None:
        cycle: Cycle = self.cycle  # type: ignore[assignment]
        if cycle.response_complete:
            return
        cycle.body.append(body)
        cycle.body_bytes += len(body)
        if cycle.body_bytes > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if cycle.response_complete:
            return
        cycle.more_body = False
        cycle.message_event.set()
