"""The stdio frontend: the proxy as the server a client such as Claude Code launches.

One client on stdin/stdout, newline-delimited JSON-RPC. `initialize` opens a legacy session with
its own upstream link; requests carrying the 2026-07-28 envelope go to the shared modern relay
(a dual-era client probes with `server/discover` first, and falls back to `initialize` when the
upstream does not speak 2026). Malformed lines get a JSON-RPC error; nothing a client writes
stops the proxy: a line longer than the message limit (16 MiB) gets one JSON-RPC error and is
skipped up to its end, and the lines after it are served. stdout carries only MCP messages; logs
go to stderr. A client that does not read its stdout gets no more notifications once
`STDOUT_BUFFER_BYTES` wait in the pipe (counted); answers are always written, and while that much
waits no further line is read from stdin (backpressure: a client that keeps writing requests and
never reads cannot grow the proxy's buffer without bound).

Shutdown: stdin closing is the client's way to stop a stdio server, so it is a graceful shutdown,
like SIGTERM (proxy/server.py): requests in flight may finish within `--shutdown-grace-s`, the
rest end (a `tools/call` as an unresolved `shutdown` result, cancelled upstream), then the
children stop. After SIGTERM stdin is still read until then: a new request gets a JSON-RPC error
(`SHUTTING_DOWN`). A SIGTERM after stdin closed (the client's next step when the server does not
exit) ends the grace period at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from typing import Any

from proxy import jsonrpc
from proxy.core.relay import Relay
from proxy.core.resend import Flight
from proxy.core.service import Service
from proxy.errors import Refusal, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.telemetry.shed import SHED

log = logging.getLogger("proxy.frontend.stdio")


# What may wait in the stdout pipe's write buffer for a client that does not read: past it,
# notifications and server requests are dropped (counted); responses are always written.
STDOUT_BUFFER_BYTES = 4 * 1024 * 1024


class _StdoutOutbox:
    def __init__(self, writer: asyncio.StreamWriter | Any) -> None:
        self._writer = writer
        self._closed = False

    def send(self, message: Message) -> None:
        if self._closed:
            return
        transport = getattr(self._writer, "transport", None)
        if (
            transport is not None
            and transport.get_write_buffer_size() > STDOUT_BUFFER_BYTES
            and not jsonrpc.is_response(message)
        ):
            SHED.count("dropped_messages", "stream_full")
            return
        self._writer.write(jsonrpc.dumps_out(message) + b"\n")

    @property
    def closed(self) -> bool:
        return self._closed

    def hold(self, flight: Flight, owner: bool) -> None:
        """Only a tools/call's own outbox (`_CallOutbox`) reports to a flight."""

    def close(self) -> None:
        self._closed = True


class _CallOutbox:
    """The outbox of one `tools/call`: the shared stdout, plus what the engine's re-send table
    needs to hear (proxy/core/resend.py): the answer, and its delivery, which on a pipe is its
    being written (a stdio client that loses its pipe ends the proxy's session with it). So a call
    with the caller's idempotency key is kept, answered, for its window, and a repeat takes it."""

    __slots__ = ("_down_id", "_flight", "_out")

    def __init__(self, out: _StdoutOutbox, down_id: Any) -> None:
        self._out = out
        self._down_id = down_id
        self._flight: Flight | None = None

    def send(self, message: Message) -> None:
        flight = self._flight
        if flight is not None and message.get("id") == self._down_id and jsonrpc.is_response(message):
            flight.answered(message)
            self._out.send(message)
            if not self._out.closed:
                flight.delivered()
            return
        self._out.send(message)

    @property
    def closed(self) -> bool:
        return self._out.closed

    def hold(self, flight: Flight, owner: bool) -> None:
        self._flight = flight


class StdioFrontend:
    def __init__(self, service: Service, *, max_message_bytes: int = 16 * 1024 * 1024) -> None:
        self.service = service
        self.max_message_bytes = max_message_bytes
        self._legacy: Relay | None = None
        self._session_id: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, reader: asyncio.StreamReader, writer: Any) -> None:
        out = _StdoutOutbox(writer)
        skipping = False  # the rest of a line past the size limit is still to come
        try:
            while True:
                await self._await_reader(writer)
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as end:
                    line = end.partial  # stdin ended: its last line had no newline (or nothing came)
                    if not line:
                        break
                except asyncio.LimitOverrunError as over:
                    # Drop what was read of the line and go on to its end; one error per line, and
                    # the session goes on. (A readline() here would discard the buffer and raise
                    # ValueError, after which the line's tail is read as a line of its own.)
                    await reader.readexactly(over.consumed)
                    if not skipping:
                        skipping = True
                        out.send(
                            jsonrpc.error(
                                None,
                                jsonrpc.INVALID_REQUEST,
                                f"message exceeds the size limit of {self.max_message_bytes} bytes",
                            )
                        )
                    continue
                if skipping:
                    skipping = False  # the end of the oversized line
                    continue
                if line.strip():
                    await self._handle_line(line, out)
            # stdin closed: the client is done; what it asked for may still finish
            await self.service.drain(self.service.settings.shutdown_grace_s)
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            out.close()
            if self._session_id is not None:
                await self.service.close_session(self._session_id)

    async def _await_reader(self, writer: Any) -> None:
        """Backpressure: while more than `STDOUT_BUFFER_BYTES` wait in the stdout pipe for a client
        that does not read, read no further request (each would add an answer that is always
        written). Waits for the pipe to drain, or for shutdown to start (SIGTERM: the lines still
        to come are then read, and refused, as the module docstring says); the check is once a
        second meanwhile."""
        transport = getattr(writer, "transport", None)
        if transport is None:
            return
        while transport.get_write_buffer_size() > STDOUT_BUFFER_BYTES and not self.service.draining:
            try:
                await asyncio.wait_for(writer.drain(), 1.0)
            except TimeoutError:
                continue
            except Exception:  # stdout is gone: nothing waits in it any more
                return

    async def _handle_line(self, line: bytes, out: _StdoutOutbox) -> None:
        try:
            message = jsonrpc.loads(line)
        except (ValueError, RecursionError):
            out.send(jsonrpc.error(None, jsonrpc.PARSE_ERROR, "Parse error: the line is not valid JSON"))
            return
        problem = jsonrpc.validate(message)
        if problem is not None:
            id_ = message.get("id") if isinstance(message, dict) and jsonrpc.valid_id(message.get("id")) else None
            out.send(jsonrpc.error(id_, jsonrpc.INVALID_REQUEST, f"Invalid Request: {problem}"))
            return
        if jsonrpc.is_request(message):
            if self.service.draining:
                out.send(jsonrpc.error(message["id"], jsonrpc.SHUTTING_DOWN, "the proxy is shutting down"))
                return
            task = asyncio.create_task(self._request(message, out))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        relay = self._legacy
        if relay is None:
            with contextlib.suppress(UpstreamFailure):
                relay = await self.service.modern_relay()
        if relay is None:
            return
        if jsonrpc.is_notification(message):
            await relay.handle_notification(message)
        else:
            await relay.handle_response(message)

    async def _request(self, message: Message, out: _StdoutOutbox) -> None:
        try:
            relay = await self._relay_for(message)
        except UpstreamFailure as failure:
            out.send(jsonrpc.error(message["id"], jsonrpc.INTERNAL_ERROR, jsonrpc.bounded(failure.detail)))
            return
        if relay is None:
            if message.get("method") == "server/discover":
                out.send(jsonrpc.error(message["id"], jsonrpc.METHOD_NOT_FOUND, "Method not found"))
            else:
                out.send(jsonrpc.error(message["id"], jsonrpc.INVALID_REQUEST, "send initialize first"))
            return
        try:
            call = message.get("method") == "tools/call"
            await relay.handle_request(message, _CallOutbox(out, message["id"]) if call else out)
        except Refusal as refused:  # the session's child did not start: the limit and its flag, as data
            text = jsonrpc.bounded(refused.detail)
            out.send(jsonrpc.error(message["id"], jsonrpc.SHUTTING_DOWN, text, refused.data()))
        except Exception:
            log.exception("relaying %s failed", message.get("method"))
            out.send(jsonrpc.error(message["id"], jsonrpc.INTERNAL_ERROR, "internal proxy error"))

    async def _relay_for(self, message: Message) -> Relay | None:
        if message.get("method") == "initialize":
            if self._legacy is None:
                self._session_id, self._legacy = await self.service.new_session()
            return self._legacy
        if jsonrpc.is_modern_request(message):
            return await self.service.modern_relay_for(message)  # a tools/call: always one
        return self._legacy


async def serve_stdio(service: Service, stop: asyncio.Event | None = None) -> None:
    """Serve the client on stdin/stdout until stdin closes or `stop` is set (SIGTERM): either way
    a graceful shutdown (module docstring)."""
    loop = asyncio.get_running_loop()
    frontend = StdioFrontend(service)
    reader = asyncio.StreamReader(limit=frontend.max_message_bytes)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    await service.start()
    gc.freeze()  # the start-up heap out of the collector's reach (see McpHttpApp._lifespan)

    async def stop_reading() -> None:
        assert stop is not None
        await stop.wait()
        # SIGTERM: drain while the client may still write (a new request gets its error), then
        # end as stdin's end would (reading stops first: data after an EOF fed by hand would be an
        # error in the stream reader). After stdin closed, this cuts that drain short instead.
        await service.drain(service.settings.shutdown_grace_s)
        with contextlib.suppress(Exception):  # stdin may have closed meanwhile
            read_transport.pause_reading()
        reader.feed_eof()

    stopper = asyncio.create_task(stop_reading()) if stop is not None else None
    try:
        await frontend.run(reader, writer)
    finally:
        if stopper is not None:
            stopper.cancel()
        await service.aclose()
