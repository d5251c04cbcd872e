"""The stdio upstream: a server process the proxy spawns, supervises and restarts.

- One child per legacy (2025) downstream session, and one shared child for all 2026-07-28
  requests: an SDK server fixes its era on the first request it reads, so one child cannot
  serve both. With `shared_sessions` (`--stdio-sessions shared`) at most `shared_children`
  children serve every 2025 session instead (stdio_shared.py); `probe` starts them.
- `single_session` (the proxy behind `--listen stdio`, whose one client is one session): exactly
  one child. `prestart()` starts it before the client speaks, and the first link that needs a
  child takes it, whichever era the client's first request opens (its answer is the probe; no
  spare is kept, no separate probe child is started while it lives). That child is usually the
  one `proxy.upstream.early` started before the proxy's own imports: it is adopted (`_adopt`: its pipes
  through the loop's pipe transports, its exit through its pidfd) and behaves as a spawned one;
  a respawn after it is spawned the normal way.
- Warm pool (`spares`, `--stdio-spares`): once a child of the command has answered, up to
  `spares` children are kept started ahead, so a new 2025 session (or a session whose child died,
  or the 2026 link whose shared child died) gets a running process at once. A spare has been asked
  nothing, so its era is not fixed yet: the link that takes it fixes it with its first request.
  They are started in the background, at most `spare_starts` at a time (a burst of sessions does
  not start a process per session at once on top of their own), handed out oldest first, refilled
  as they are taken, and reaped when unused for `spare_idle_s` (down to one, refilled again by
  demand). A spare is no session: it counts against neither `max_children` nor the proxy's
  `--max-sessions`. A session that finds the pool empty while spares are starting waits for one of
  them (one not already promised to another session); with none starting it starts its own child.
- Every child runs under `_guard.py` in its own process group, so no process it starts outlives
  the proxy, even a killed one.
- A child must answer the proxy's own first request (the probe's `server/discover`, a health
  check's `initialize`, the readiness check of a new 2026 child, a replayed handshake) within
  `handshake_timeout_s` of its start (`--stdio-start-timeout-s`, default 10 s), stretched up to six
  times that while the child is still busy starting (startwait.py: a slow start on a busy host is
  not a broken server); one that does not is stopped and the failure says which it was, naming the
  setting. (A 2025 client's own `initialize` is bounded by the request timeout.) The start-up
  probe is two such starts at most (`discover`, then `initialize` on a fresh child for a server
  silent to it): the service bounds it by their sum (`probe_bound_s`), and its failure names each
  step.
- Stopping: one child (a session's end) is stopped in the background, stdin closed, then SIGTERM
  to its group, then SIGKILL, 2 s apart. The proxy's shutdown (`aclose`) stops every child it
  started at once (`stop_children`): all stdins closed, one shared wait (`STOP_STDIN_S`), SIGTERM
  to every group still running, one shared wait (`STOP_TERM_S`), SIGKILL to the rest and a last
  wait for the exits (`STOP_KILL_S`), and for their reports (`STOP_REPORT_S`): at most
  `STOP_BOUND_S` (3 s) however many children there are. A child whose start was under way when the
  stop began (its process created, its pipes not yet connected) joins it as its start returns, and
  a stop already running in the background (a reaped spare's) is awaited: each of those two waits
  is bounded likewise, so `aclose` returns with no child it started still running (the event loop
  keeps only weak references to tasks: the background stops are held in a set until they end).
- When a child dies, every exchange in flight fails at once (`CLOSED`, dispatch unknown if the
  request was written); the next request spawns a fresh child and, for a legacy link, replays the
  client's `initialize` and `notifications/initialized` first. Replaying is not an attempt.
- Quick successive deaths back off (a crash loop): while the backoff lasts, a request fails at
  once with `NOT_RUNNING` (dispatch no) and the remaining wait as `retry_after_s`.
- Health (`UpstreamHealth`, the `mcp_recovery_upstream_up` gauge): up from any child's answer, on
  any link; down when a child exits unasked, or cannot be started, and no other live child has
  answered. Every child that exits unasked counts once in `health.restarts`, whether or not its
  link ever needs a new one. Exits the proxy asked for (a session's end, shutdown, a start-up
  exchange it gave up on) are neither. `check()` starts a throwaway child and asks it `initialize`.
- Messages are newline-delimited JSON; stdout lines that are not JSON are logged and skipped;
  stderr is logged line by line, never treated as an error signal. What a child can make the proxy
  log is bounded: each line to 2000 characters, and per child to a burst of `stderr_burst_lines`
  (100), then `stderr_lines_per_s` (20) a second (a token bucket; both are settings); lines
  beyond are counted (`mcp_recovery_stderr_lines_dropped_total`) and summed up in one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import proxy.upstream.early
from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import (
    LATEST_MODERN,
    Message,
    dumps,
    loads,
)
from proxy.telemetry.shed import SHED
from proxy.upstream.base import (
    Capabilities,
    Era,
    Exchange,
    Handshake,
    LinkBase,
    OnMessage,
    PendingTable,
    UpstreamHealth,
    discover_request,
    initialize_request,
)
from proxy.upstream.startwait import STRETCH, StartTimedOut, first_answer

if TYPE_CHECKING:
    from proxy.upstream.stdio_shared import SessionLink, SharedSessions

log = logging.getLogger("proxy.upstream.stdio")
stderr_log = logging.getLogger("proxy.upstream.stderr")

_GUARD = str(Path(__file__).with_name("_guard.py"))
_STDERR_LINE_LIMIT = 2000
_TERMINATE_GRACE_S = 2.0  # one child stopped in the background (a session's end): each stage
# The proxy's own shutdown stops every child at once (`stop_children`), each stage one bound shared
# by all of them, so that the proxy exits within its grace + a documented bound
# (docs/reliability.md): after every stdin is closed (the spec's first step), after SIGTERM to every
# process group still running, after SIGKILL (for the exits to be reaped).
STOP_STDIN_S = 1.0
STOP_TERM_S = 0.5
STOP_KILL_S = 1.0
STOP_REPORT_S = 0.5  # for the exits to be reported (`stop_children`)
STOP_BOUND_S = STOP_STDIN_S + STOP_TERM_S + STOP_KILL_S + STOP_REPORT_S
# Per step of the start-up probe, beyond the child's own start: spawning it, and stopping one that
# stayed silent (`StdioUpstream.probe_bound_s`).
_PROBE_STEP_MARGIN_S = 2 * _TERMINATE_GRACE_S + 1.0


class _LineBudget:
    """A token bucket for the log lines one child can cause (its stderr, its non-JSON stdout):
    `burst` lines at once, then `rate` a second. A child writing 200k lines in 2.5 s made as many
    log lines; what the bucket refuses is counted (`mcp_recovery_stderr_lines_dropped_total`) and
    summed up in one line when logging resumes or the child's stderr ends."""

    __slots__ = ("at", "burst", "dropped", "rate", "tokens")
    BURST = 100  # the defaults of --stderr-burst-lines and --stderr-lines-per-s
    RATE = 20.0

    def __init__(self, burst: int = BURST, rate: float = RATE) -> None:
        self.burst = float(burst)
        self.rate = rate
        self.tokens = self.burst
        self.at = time.monotonic()
        self.dropped = 0

    def take(self, name: str) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            self.dropped += 1
            SHED.count("stderr_lines_dropped")
            return False
        self.tokens -= 1.0
        self.summarize(name)
        return True

    def summarize(self, name: str) -> None:
        if self.dropped:
            stderr_log.warning(
                "%s: %d output lines not logged (at most %g a second, bursts of %d)",
                name,
                self.dropped,
                self.rate,
                int(self.burst),
            )
            self.dropped = 0


class _ChildProtocol(asyncio.SubprocessProtocol):
    """The child's pipes, read in the event loop's own callbacks: each stdout line is routed the
    moment its bytes arrive (no reader task to wake per message), stderr is logged line by line,
    and writes to stdin are flow-controlled (`drain` waits while the pipe is full)."""

    def __init__(self, max_line: int, log_budget: tuple[int, float] = (_LineBudget.BURST, _LineBudget.RATE)) -> None:
        self.max_line = max_line
        self.transport: asyncio.SubprocessTransport | None = None
        self.child: _Child | None = None
        self.exited = asyncio.get_running_loop().create_future()
        self.stdout_closed = asyncio.Event()
        self.stderr_closed = asyncio.Event()
        self.log_budget = _LineBudget(*log_budget)
        self._out = bytearray()
        self._err = bytearray()
        self._paused: asyncio.Future[None] | None = None
        self.overflow = False
        self.on_first_output: Callable[[], None] | None = None  # the child has started (StdioUpstream._spawn)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio subclass

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        if fd == 1:
            self._stdout(data)
        else:
            self._stderr(data)

    def _stdout(self, data: bytes | bytearray) -> None:
        if self.on_first_output is not None:
            started, self.on_first_output = self.on_first_output, None
            started()
        buf = self._out
        if self.overflow:
            return
        buf += data
        end = buf.rfind(b"\n")
        if end < 0:
            if len(buf) > self.max_line:  # a message over the limit: the stream cannot be resynchronised
                self._overflowed()
            return
        complete = bytes(buf[:end])
        del buf[: end + 1]
        child = self.child
        for line in complete.split(b"\n"):
            if len(line) > self.max_line:
                self._overflowed()
                return
            if child is not None and line.strip():
                try:
                    child.on_line(child, line)
                except Exception:  # a bug in routing must not kill the reader
                    log.exception("routing an upstream message failed")
        if len(buf) > self.max_line:
            self._overflowed()

    def _overflowed(self) -> None:
        name = self.child.name if self.child is not None else "upstream"
        log.error("%s wrote a message over the size limit; stopping it", name)
        self.overflow = True
        self._out.clear()
        self.stdout_closed.set()

    def _stderr(self, data: bytes | bytearray) -> None:
        buf = self._err
        buf += data
        end = buf.rfind(b"\n")
        if end < 0 and len(buf) < 65536:
            return
        if end < 0:
            end = len(buf)
        complete = bytes(buf[:end])
        del buf[: end + 1]
        self._log_stderr(complete)

    def _log_stderr(self, complete: bytes) -> None:
        name = self.child.name if self.child is not None else "upstream"
        budget = self.log_budget
        for line in complete.splitlines():
            if line.strip() and budget.take(name):
                stderr_log.info("%s: %s", name, line[:_STDERR_LINE_LIMIT].decode("utf-8", "replace"))

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.stdout_closed.set()
        elif fd == 2:
            if self._err:
                self._log_stderr(bytes(self._err))
                self._err.clear()
            self.log_budget.summarize(self.child.name if self.child is not None else "upstream")
            self.stderr_closed.set()
        elif fd == 0 and self._paused is not None and not self._paused.done():
            self._paused.set_result(None)  # nothing more will drain: the next write fails instead

    def process_exited(self) -> None:
        # stdout may still hold the last answers: the link ends on its EOF, not on this.
        if not self.exited.done():
            self.exited.set_result(None)

    def pause_writing(self) -> None:
        if self._paused is None or self._paused.done():
            self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    async def drain(self) -> None:
        paused = self._paused
        if paused is not None and not paused.done():
            # Shielded: every writer of this child waits on this one future, and cancelling a
            # waiter (its attempt timed out) would otherwise cancel it for all the others, each
            # then taking that CancelledError for its own caller's cancellation.
            await asyncio.shield(paused)


class _Child:
    """One running upstream process (its guard) and the task that ends it when its output ends."""

    def __init__(
        self,
        protocol: _ChildProtocol,
        description: str,
        on_line: Callable[[_Child, bytes], None],
        on_exit: Callable[[_Child, int | None], None],
    ) -> None:
        assert protocol.transport is not None
        self.protocol = protocol
        self.transport = protocol.transport
        self.pid = self.transport.get_pid()
        self.name = f"{description}[{self.pid}]"
        self.on_line = on_line  # both rebound when a warm spare is handed to a session
        self.on_exit = on_exit
        self.started_at = time.monotonic()
        self.pooled_at = self.started_at  # when it joined the warm pool (a spare)
        self.answered = False
        self.stopping = False  # the proxy ended it: its exit is no crash
        self.exited = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        protocol.child = self

    @property
    def alive(self) -> bool:
        return not self.exited.is_set()

    @property
    def returncode(self) -> int | None:
        return self.transport.get_returncode()

    async def wait(self) -> int | None:
        await asyncio.shield(self.protocol.exited)
        return self.returncode

    def write(self, data: bytes) -> None:
        stdin = self.transport.get_pipe_transport(0)
        if stdin is None or stdin.is_closing() or self.protocol.overflow:
            raise BrokenPipeError("stdin closed")
        stdin.write(data)  # type: ignore[attr-defined]

    def pause_reading(self, paused: bool) -> None:
        """Stop (or resume) reading the child's stdout: the child then blocks on its full pipe."""
        stdout = self.transport.get_pipe_transport(1)
        if stdout is None or stdout.is_closing():
            return
        if paused:
            stdout.pause_reading()  # type: ignore[attr-defined]
            SHED.count("upstream_read_pauses")
        else:
            stdout.resume_reading()  # type: ignore[attr-defined]

    async def drain(self) -> None:
        await self.protocol.drain()
        stdin = self.transport.get_pipe_transport(0)
        if stdin is None or stdin.is_closing():
            raise BrokenPipeError("stdin closed")

    async def terminate(self) -> None:
        """Close stdin, wait, then SIGTERM the group, then SIGKILL it (the spec's shutdown order)."""
        await stop_children([self], stdin_s=_TERMINATE_GRACE_S, term_s=_TERMINATE_GRACE_S, kill_s=_TERMINATE_GRACE_S)

    def close_stdin(self) -> None:
        with contextlib.suppress(Exception):
            stdin = self.transport.get_pipe_transport(0)
            if stdin is not None:
                stdin.close()

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


async def stop_children(
    children: Sequence[_Child],
    *,
    stdin_s: float = STOP_STDIN_S,
    term_s: float = STOP_TERM_S,
    kill_s: float = STOP_KILL_S,
) -> dict[str, int]:
    """Stop `children` together, in the spec's order: every stdin closed, then one wait of `stdin_s`
    for all of them; SIGTERM to the process group of each still running, one wait of `term_s`;
    SIGKILL to what is left, one wait of `kill_s` for the exits. So stopping many children takes as
    long as stopping one (at most the three bounds), not one child's stop after another. Returns
    how many ended at each stage (`stdin`, `sigterm`, `sigkill`; `left`: still not reaped)."""
    counts = {"stdin": 0, "sigterm": 0, "sigkill": 0, "left": 0}
    running = [child for child in children if child.returncode is None]
    for child in children:
        child.stopping = True
    for child in running:
        child.close_stdin()
    stages = (("stdin", None, stdin_s), ("sigterm", signal.SIGTERM, term_s), ("sigkill", signal.SIGKILL, kill_s))
    for stage, sig, wait_s in stages:
        if not running:
            break
        if sig is not None:
            for child in running:
                child.signal_group(sig)
        waits = [asyncio.ensure_future(child.wait()) for child in running]
        try:
            await asyncio.wait(waits, timeout=wait_s)
        finally:
            for waiting in waits:
                waiting.cancel()
        still = [child for child in running if child.returncode is None]
        counts[stage] = len(running) - len(still)
        running = still
    counts["left"] = len(running)
    # Each child's output watcher (`_end_with_output`) reports its exit (`exited`, `on_exit`): those
    # of the children that exited get a moment to, then what is left is cancelled. (Cancelled at
    # once, a watcher still between the pipe's end and the exit's report never set `exited`, and
    # an exited child read as alive.)
    watching = [task for child in children for task in child.tasks if not task.done()]
    if watching:
        await asyncio.wait(watching, timeout=STOP_REPORT_S)
    for child in children:
        for task in child.tasks:
            task.cancel()
        if child.returncode is not None:
            child.exited.set()
    return counts


class StdioLink(LinkBase):
    """A message-level link to one upstream child (respawned as needed)."""

    def __init__(self, upstream: StdioUpstream, era: Era, *, takes_spare: bool = True) -> None:
        self.era = era
        self._upstream = upstream
        self._health = upstream.health
        # A warm spare has been asked nothing, so it can become any link's child: a 2025 session's,
        # the 2026 link's (whose child's crash would otherwise cost every 2026 call a cold start),
        # the one child behind --listen stdio. Not the throwaway child of a health check (`check`).
        self._takes_spare = takes_spare
        self._pending = PendingTable()
        self._handshake = Handshake()
        self._child: _Child | None = None
        self._spawn_lock = asyncio.Lock()
        self._unsolicited: OnMessage = lambda m: None
        # What a respawned child gets after the replayed handshake, beyond it (a shared child's
        # log level and resource subscriptions: proxy/upstream/stdio_shared.py).
        self.replay_after_handshake: Callable[[], list[Message]] | None = None
        self._quick_deaths = 0
        self._next_spawn_at = 0.0
        self._closed = False

    # -- UpstreamLink -------------------------------------------------------------------------

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        self._handshake.observe(message)
        child = await self._ensure_child(message)
        ex = self._pending.add(message, on_message)
        try:
            child.write(dumps(message) + b"\n")
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            self._pending.discard(ex)
            raise UpstreamFailure(FailureKind.CLOSED, Dispatch.NO, f"upstream stdin closed: {exc}") from None
        ex.written = True
        try:
            await child.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._pending.fail(ex, UpstreamFailure(FailureKind.CLOSED, Dispatch.UNKNOWN, f"write failed: {exc}"))
        return ex

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        self._handshake.observe(message)
        child = self._child
        if child is None or not child.alive:
            return  # nothing to notify: a respawned child gets the handshake replayed, nothing else
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
            child.write(dumps(message) + b"\n")
            await child.drain()

    async def send_response(self, message: Message) -> None:
        await self.send_notification(message)

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        """stdio: `notifications/cancelled` with the attempt's request id; its late response is dropped."""
        exchange.cancelled = True
        self._pending.discard(exchange)
        if not exchange.written or exchange.method == "initialize":
            return
        params: dict[str, object] = {"requestId": exchange.upstream_id}
        if reason:
            params["reason"] = reason
        await self.send_notification({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})

    def pause_reading(self, paused: bool) -> None:
        """Backpressure from this link's one client (a legacy session): while a stream of its
        holds more than the client reads, the child's stdout is not read, so the child waits on
        its pipe instead of the proxy buffering what it writes. Never used on the shared modern
        link (one slow caller must not stall the others)."""
        child = self._child
        if child is not None and child.alive:
            child.pause_reading(paused)

    async def aclose(self) -> None:
        child = self.close_now()
        if child is not None:
            await child.terminate()
        self._upstream._forget(self)

    def close_now(self) -> _Child | None:
        """Close the link (its requests in flight fail, no child is started for it again) and hand
        over its child, for the caller to stop."""
        self._closed = True
        child, self._child = self._child, None
        self._pending.fail_all(FailureKind.CLOSED, "proxy closed the upstream link")
        return child

    # -- supervision --------------------------------------------------------------------------
    async def _ensure_child(self, message: Message) -> _Child:
        child = self._child
        if child is not None and child.alive:
            return child
        async with self._spawn_lock:
            child = self._child
            if child is not None and child.alive:
                return child
            if self._closed:
                raise UpstreamFailure(FailureKind.NOT_RUNNING, Dispatch.NO, "upstream link is closed")
            wait_s = self._next_spawn_at - time.monotonic()
            if wait_s > 0:
                raise UpstreamFailure(
                    FailureKind.NOT_RUNNING,
                    Dispatch.NO,
                    f"upstream process is restarting after repeated crashes (next start in {wait_s:.1f}s)",
                    retry_after_s=wait_s,
                )
            try:
                if self._takes_spare:
                    child = await self._upstream._child_for(self)
                else:
                    child = await self._upstream._spawn(self._on_line, self._on_exit)
            except UpstreamFailure as failure:
                self._upstream._lost(None, failure.detail)
                raise
            if self._closed:  # closed (the proxy is stopping) while the child started
                await child.terminate()
                raise UpstreamFailure(FailureKind.NOT_RUNNING, Dispatch.NO, "upstream link is closed")
            self._child = child
            if self.era is Era.MODERN:
                await self._await_ready(child)
            elif message.get("method") != "initialize" and self._handshake.initialize is not None:
                await self._replay_handshake(child)
            return child

    async def _await_ready(self, child: _Child) -> None:
        """A fresh modern child answers one `server/discover` before it gets real work, so that an
        attempt's timer never counts the child's start-up (a cold `npx` can take seconds)."""
        probe = discover_request(self._pending.new_id())
        await self._exchange_internally(child, probe, "starting the upstream")

    async def _exchange_internally(self, child: _Child, message: Message, what: str) -> Message:
        ex = self._pending.add(message, None)
        try:
            child.write(dumps(message) + b"\n")
            ex.written = True
            await child.drain()
            return await self._upstream.first_answer(child, ex.response)
        except (StartTimedOut, UpstreamFailure, BrokenPipeError, ConnectionResetError) as exc:
            self._pending.discard(ex)
            await child.terminate()
            raise UpstreamFailure(FailureKind.SPAWN_FAILED, Dispatch.NO, f"{what} failed: {exc}") from None

    async def _replay_handshake(self, child: _Child) -> None:
        assert self._handshake.initialize is not None
        init = dict(self._handshake.initialize)
        init["id"] = self._pending.new_id()
        response = await self._exchange_internally(child, init, "re-initializing the restarted upstream")
        if "error" in response:
            await child.terminate()
            raise UpstreamFailure(
                FailureKind.SPAWN_FAILED,
                Dispatch.NO,
                "the restarted upstream refused the replayed initialize",
            )
        if self._handshake.initialized is not None:
            child.write(dumps(self._handshake.initialized) + b"\n")
            await child.drain()
        extra = self.replay_after_handshake() if self.replay_after_handshake is not None else ()
        for message in extra:  # their answers do not matter: the state is the proxy's to keep
            await self._exchange_internally(child, {**message, "id": self._pending.new_id()}, "restoring its state")

    def _on_line(self, child: _Child, line: bytes) -> None:
        try:
            message = loads(line)
        except ValueError:
            message = _without_bom(line)
        if message is _NOT_JSON:
            if child.protocol.log_budget.take(child.name):
                stderr_log.info(
                    "%s stdout (not JSON): %s", child.name, line[:_STDERR_LINE_LIMIT].decode("utf-8", "replace")
                )
            return
        if not isinstance(message, dict):
            return
        if "method" not in message:
            if "id" in message:
                if self._pending.resolve(message):
                    if not child.answered:
                        if self.era is Era.LEGACY:
                            self._upstream._replenish()  # this command works: warm the next session's child
                        child.answered = True
                        if self._upstream.start_s is None:
                            self._upstream.start_s = time.monotonic() - child.started_at
                    self._quick_deaths = 0
                    if not self._health.up:  # the one check an answer pays for the gauge
                        self._health.answered()
            return
        if self._pending.route_related(message):
            return
        self._unsolicited(message)

    def _on_exit(self, child: _Child, code: int | None) -> None:
        if self._child is child:
            self._child = None
        detail = f"upstream process exited with code {code}"
        if not self._closed and not child.stopping:
            log.warning("%s: %s", child.name, detail)
            self._upstream._lost(child, f"{child.name}: {detail}", crashed=True)
        self._pending.fail_all(FailureKind.CLOSED, detail)
        lived_s = time.monotonic() - child.started_at
        if child.answered and lived_s > 5.0:
            self._quick_deaths = 0
        else:
            self._quick_deaths += 1
        n = self._quick_deaths
        delay_s = 0.0 if n <= 1 else min(self._upstream.max_restart_backoff_s, 0.25 * 2 ** (n - 2))
        self._next_spawn_at = time.monotonic() + delay_s


class StdioUpstream:
    """A stdio server command; spawns one child per legacy link plus one shared modern child."""

    supervised = True  # a dead child is respawned on demand: readiness follows `health`, no re-probe

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_children: int = 64,
        max_message_bytes: int = 16 * 1024 * 1024,
        handshake_timeout_s: float = 10.0,
        max_restart_backoff_s: float = 30.0,
        spares: int = 1,
        spare_starts: int = 2,
        spare_idle_s: float = 600.0,
        single_session: bool = False,
        stderr_burst_lines: int = _LineBudget.BURST,
        stderr_lines_per_s: float = _LineBudget.RATE,
        shared_sessions: bool = False,
        shared_children: int = 2,
        max_starting: int = 0,
        nice: int = 0,
    ) -> None:
        if not command:
            raise ValueError("a stdio upstream needs a command")
        self.command = list(command)
        self.description = f"stdio:{Path(self.command[0]).name}"
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.max_children = max_children
        self.max_message_bytes = max_message_bytes
        self.handshake_timeout_s = handshake_timeout_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self.log_budget = (stderr_burst_lines, stderr_lines_per_s)  # each child's own bucket
        self._links: set[StdioLink] = set()
        self._modern: StdioLink | None = None
        self.single_session = single_session
        # `--stdio-sessions shared`: every 2025 session on a few shared children (stdio_shared.py)
        self.shared_sessions = shared_sessions and not single_session
        self.shared_children = max(1, shared_children)
        self._shared: SharedSessions | None = None
        # the warm pool (module docstring); one session, or shared sessions, need none
        self.spares = 0 if single_session or self.shared_sessions else spares
        self.spare_starts = max(1, spare_starts)
        self.spare_idle_s = spare_idle_s
        self._pool: deque[_Child] = deque()  # started, oldest first
        self._unclaimed: deque[asyncio.Task[_Child | None]] = deque()  # starting, promised to no session
        self._starting: set[asyncio.Task[_Child | None]] = set()
        self._closed = False
        self._spawned = 0
        self._running: set[_Child] = set()  # every child started and not yet exited
        # Children being started (`_spawn`, between the process's creation and its return) and the
        # stops run in the background (`_in_background`): `aclose` waits for both. The set keeps
        # the tasks alive, since the event loop keeps only weak references to them.
        self._spawning: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[object]] = set()
        # Children starting at once (see `_spawn`); 0: the CPU count, at least 2.
        self.max_starting = max_starting if max_starting > 0 else max(2, os.cpu_count() or 2)
        self._start_slots: asyncio.Semaphore | None = None
        self.nice = nice  # `--stdio-nice`: applied once a child has started (`_started`)
        self.start_s: float | None = None  # how long the first child took from spawn to its first answer
        self.probe_step: str | None = None  # the step of `probe` under way
        self.health = UpstreamHealth()

    async def probe(self) -> Capabilities:
        """`_probe`; then, with shared sessions, the shared children are started and awaited (each
        bounded by the handshake timeout; one that fails is started again by the request that
        needs it; a probe that gives up meanwhile does not stop them), so that a ready proxy has
        them running and no 2025 session waits for a process start. After the probe, not beside
        it: on a loaded machine several processes starting at once made every start miss its
        timeout.

        Per session, a child answered, so the command works: the warm pool starts filling now.
        Waiting for the first 2025 session's own child to answer (as before) made that session wait
        for a whole cold start, 10 s on a loaded machine in the conformance suite's first scenario.

        `probe_step` names the step under way, and stays set when the probe is cancelled (by the
        service's own bound, `probe_bound_s`), for its error to say where it was."""
        try:
            capabilities = await self._probe()
            if self.shared_sessions and capabilities.legacy and not self._closed:
                self.probe_step = "starting the shared children (initialize)"
                await asyncio.shield(self._shared_sessions().start_all())
            elif capabilities.legacy:
                self._replenish()  # (no pool with shared sessions, nor behind --listen stdio)
        except Exception:
            self.probe_step = None
            raise
        self.probe_step = None
        return capabilities

    @property
    def probe_bound_s(self) -> float:
        """The longest `probe` can take, from its parts: a `server/discover` on a new process, then,
        for one that stays silent to it, an `initialize` on another (each a start: the start
        timeout, stretched while the child is busy starting), the probe's second `discover` on the
        child that answered (one more such allowance), the shared children's start (one more start, all at
        once), and a margin for stopping a silent child and spawning. The service bounds the probe
        by this, so the bound never cuts a step short that would still have ended by its own."""
        start_s = STRETCH * self.handshake_timeout_s
        starts = 3 if self.shared_sessions else 2
        return starts * (start_s + _PROBE_STEP_MARGIN_S) + start_s

    def _shared_sessions(self) -> SharedSessions:
        if self._shared is None:
            from proxy.upstream.stdio_shared import SharedSessions

            self._shared = SharedSessions(self, self.shared_children)
        return self._shared

    async def _probe(self) -> Capabilities:
        """Ask a child `server/discover`; a server that refuses it is legacy-only. One that does not
        answer it at all (exits, or stays silent) is legacy-only only if a fresh child answers a
        2025 `initialize` (`check`): a command that crashes at once must not read as ready. A probe
        that fails says what each step met."""
        self.probe_step = "server/discover on a new process"
        link = await self.open(Era.MODERN)
        try:
            ex = await link.send_request(discover_request(link.new_id()))
        except UpstreamFailure as failure:
            if failure.kind is not FailureKind.SPAWN_FAILED or "starting" not in failure.detail:
                raise
            await self._drop_modern()  # no answer to discover at all: legacy-only, if anything answers
            await self._fall_back(f"server/discover: {failure.detail}")
            return Capabilities(legacy=True, modern=False, detail="server/discover unanswered: legacy only")
        assert isinstance(link, StdioLink)  # a modern link is never a shared session's
        try:
            response = await self.answer_of(link, ex)
        except TimeoutError as timeout:
            await link.cancel(ex)
            await self._drop_modern()
            await self._fall_back(f"server/discover: {timeout}")
            return Capabilities(legacy=True, modern=False, detail="server/discover timed out: legacy only")
        result = response.get("result")
        if isinstance(result, dict):
            versions = [v for v in result.get("supportedVersions", []) if isinstance(v, str)]
            modern = LATEST_MODERN in versions
            if not modern:
                await self._drop_modern()
            return Capabilities(legacy=True, modern=modern, detail=f"supportedVersions={versions}")
        await self._drop_modern()
        return Capabilities(legacy=True, modern=False, detail="server/discover refused: legacy only")

    async def _fall_back(self, discover: str) -> None:
        """The probe's second step, `check`, after `discover` (what the first step met): a failure
        says both."""
        self.probe_step = "initialize on a new process, after server/discover went unanswered"
        try:
            await self.check()
        except UpstreamFailure as failure:
            raise UpstreamFailure(
                failure.kind,
                failure.dispatched,
                f"{discover}; then {failure.detail}",
                retry_after_s=failure.retry_after_s,
            ) from None

    async def _drop_modern(self) -> None:
        link, self._modern = self._modern, None
        if link is not None:
            await link.aclose()

    async def open(self, era: Era) -> StdioLink | SessionLink:
        if era is Era.MODERN:
            if self._modern is None:
                self._modern = StdioLink(self, Era.MODERN)
            return self._modern
        if self.shared_sessions:
            return self._shared_sessions().session()  # bounded by the proxy's --max-sessions, not by children
        if len(self._links) >= self.max_children:
            raise UpstreamFailure(
                FailureKind.OVERLOADED,
                Dispatch.NO,
                f"the proxy runs its maximum of {self.max_children} upstream sessions",
            )
        link = StdioLink(self, Era.LEGACY)
        self._links.add(link)
        return link

    async def check(self) -> None:
        """Start a throwaway child (never the warm spare) and ask it a 2025 `initialize`, which
        every stdio server answers; its answer marks the upstream up (in `_on_line`). Raises
        `UpstreamFailure` when the child exits or stays silent."""
        link = StdioLink(self, Era.LEGACY, takes_spare=False)
        try:
            ex = await link.send_request(initialize_request(link.new_id()))
            child = link._child
            try:
                if child is None:  # it exited already, and failed `ex` as it went
                    await ex.response
                else:
                    await self.first_answer(child, ex.response)
            except StartTimedOut as exc:
                raise UpstreamFailure(
                    FailureKind.TIMEOUT, Dispatch.NO, f"a fresh upstream process did not answer initialize: {exc}"
                ) from None
        except UpstreamFailure as failure:
            self._lost(None, failure.detail)  # (a child that exited was counted as it went)
            raise
        finally:
            await link.aclose()

    async def first_answer(self, child: _Child, answer: asyncio.Future[Message]) -> Message:
        """The answer to the proxy's own first request to `child`, bounded by the start timeout
        (stretched while the child is busy starting: proxy/upstream/startwait.py); `StartTimedOut`
        says why not, naming the setting, so an operator whose server starts slowly knows what to
        raise."""
        return await first_answer(answer, pid=child.pid, timeout_s=self.handshake_timeout_s)

    async def answer_of(self, link: StdioLink, ex: Exchange) -> Message:
        """The answer to one of the proxy's own requests (the probe's, a shared child's state) on
        `link`, with the allowance of a start: the start timeout, stretched while the child is busy
        (a loaded host delays a request's answer as it delays a start). `TimeoutError` (a
        `StartTimedOut`, naming the setting) when it does not come."""
        child = link._child
        if child is None:
            return await asyncio.wait_for(ex.response, self.handshake_timeout_s)
        return await first_answer(ex.response, pid=child.pid, timeout_s=self.handshake_timeout_s)

    def _lost(self, child: _Child | None, why: str, *, crashed: bool = False) -> None:
        """A child exited unasked (`crashed`), or none could be started: down unless another live
        child has answered (one that serves a session still works)."""
        health = self.health
        if crashed:
            health.restarts += 1
        if self._working_child(but=child) is None and health.failed(why):
            return
        if crashed:
            health.report()  # the restart, with the state unchanged

    def _working_child(self, *, but: _Child | None) -> _Child | None:
        links = list(self._links)
        if self._modern is not None:
            links.append(self._modern)
        if self._shared is not None:
            links += self._shared.links
        for link in links:
            child = link._child
            if child is None or child is but or child.protocol.overflow:
                continue
            if child.answered and child.alive:
                return child
        return None

    def _forget(self, link: StdioLink) -> None:
        self._links.discard(link)

    async def aclose(self) -> None:
        """Stop every child this upstream started and that still runs, all at once
        (`stop_children`: one bound for all of them, not one child's stop after another): the warm
        spares, every session's (also those of sessions still closing), the 2026 one, the shared
        ones. Every link is closed first, so none starts a child again. A child whose start was under
        way joins the stop once its start returns (waited for first); the stops already running in
        the background (a reaped spare's) are awaited last. Each wait is bounded by `STOP_BOUND_S`;
        in the common case (no start under way, nothing in the background) the whole takes one."""
        self._closed = True
        starting = list(self._starting)
        for task in starting:
            task.cancel()
        if starting:
            await asyncio.gather(*starting, return_exceptions=True)
        self._pool.clear()
        links = list(self._links)
        if self._modern is not None:
            links.append(self._modern)
            self._modern = None
        if self._shared is not None:
            links += self._shared.links
            self._shared = None
        for link in links:
            link.close_now()
            self._forget(link)
        if self._spawning:  # their children join this stop (`_spawn` sees the upstream closed)
            await asyncio.wait(list(self._spawning), timeout=STOP_BOUND_S)
        running = [child for child in self._running if child.returncode is None]
        if running:
            counts = await stop_children(running)
            log.info(
                "stopped %d upstream children: %d after stdin closed, %d by SIGTERM, %d by SIGKILL, %d not reaped",
                len(running),
                counts["stdin"],
                counts["sigterm"],
                counts["sigkill"],
                counts["left"],
            )
        if self._background:  # stops begun before (a reaped spare) or beside this one (a late child)
            _, late = await asyncio.wait(list(self._background), timeout=STOP_BOUND_S)
            for stopping in late:
                stopping.cancel()

    def _in_background(self, stopping: Coroutine[object, None, object]) -> None:
        """Run a child's stop without waiting for it, kept (strongly) until it ends; `aclose` awaits it."""
        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(stopping)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _spawn(
        self, on_line: Callable[[_Child, bytes], None], on_exit: Callable[[_Child, int | None], None]
    ) -> _Child:
        argv = [sys.executable, "-I", "-S", _GUARD, str(os.getpid()), "--", *self.command]
        loop = asyncio.get_running_loop()
        # `--listen stdio`: the child `proxy.upstream.early` started before the proxy's imports, if it runs this
        early = proxy.upstream.early.take(self.command) if self.single_session and not (self.env or self.cwd) else None
        if early is not None:
            with self._start_under_way():
                protocol = await _adopt(early, _ChildProtocol(self.max_message_bytes, self.log_budget))
                return self._started(_Child(protocol, self.description, on_line, on_exit))
        # At most `max_starting` children start at once; the others wait here for a slot. Fifty
        # 2025 sessions opened together started fifty interpreters at once on two cores: each took
        # 45 s instead of one, and the proxy's own event loop, one process among fifty, stalled
        # for seconds (every deadline in flight overshot by as much; bench/load_faults.py, its
        # deadline probe). A slot is given back at the child's first output (it has started and
        # answers), at its exit, or, for a child nobody has asked anything yet (a warm spare),
        # after about as long as this command's first child took to answer.
        slots = self._start_slots
        if slots is None:
            slots = self._start_slots = asyncio.Semaphore(self.max_starting)
        await slots.acquire()
        if self._closed:  # the proxy began stopping while this start waited its turn
            slots.release()
            raise UpstreamFailure(FailureKind.NOT_RUNNING, Dispatch.NO, "the proxy is stopping its upstream")
        given_back = False

        def give_back(*_: object) -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                slots.release()

        try:
            with self._start_under_way():
                _, protocol = await loop.subprocess_exec(
                    lambda: _ChildProtocol(self.max_message_bytes, self.log_budget),
                    *argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
                protocol.on_first_output = give_back
                protocol.exited.add_done_callback(give_back)
                hold_s = self.handshake_timeout_s if self.start_s is None else 2 * self.start_s
                loop.call_later(min(hold_s, self.handshake_timeout_s), give_back)
                return self._started(_Child(protocol, self.description, on_line, on_exit))
        except OSError as exc:
            give_back()
            raise UpstreamFailure(FailureKind.SPAWN_FAILED, Dispatch.NO, f"cannot start upstream: {exc}") from None
        except BaseException:
            give_back()
            raise

    @contextlib.contextmanager
    def _start_under_way(self) -> Iterator[None]:
        """While a child's process exists but its start has not returned (its pipes are being
        connected), a stop that begins waits for it (`aclose`); the child then joins the stop
        (`_started`)."""
        under_way = asyncio.get_running_loop().create_future()
        self._spawning.add(under_way)
        try:
            yield
        finally:
            self._spawning.discard(under_way)
            under_way.set_result(None)

    def _started(self, child: _Child) -> _Child:
        """Supervise a new child: its output's end stops its group; it is among the children
        `aclose` stops until it exits; once it has started (its first output), it runs `nice`
        below the proxy (`lower_priority`). One that started while the upstream was closing is
        stopped at once (its caller gets it, and finds it stopping)."""
        self._spawned += 1
        if self.nice > 0:
            pid, nice = child.pid, self.nice
            before = child.protocol.on_first_output

            def started() -> None:
                if before is not None:
                    before()
                lower_priority(pid, nice)

            child.protocol.on_first_output = started
        child.tasks.append(asyncio.create_task(_end_with_output(child)))
        self._running.add(child)
        child.protocol.exited.add_done_callback(lambda _: self._running.discard(child))
        if self._closed:
            self._in_background(stop_children([child]))
        return child

    # -- warm pool ------------------------------------------------------------------------------
    def prestart(self) -> None:
        """Start the child the first request will take (`single_session`: the only one), so that
        the process starts while the client is still starting too."""
        if not self._pool and not self._starting and not self._closed:
            self._start_spare()

    @property
    def spares_ready(self) -> int:
        return len(self._pool)

    async def _child_for(self, link: StdioLink) -> _Child:
        """A child for a new legacy session, the 2026 link (its first, or one replacing a child that
        died), or, `single_session`, the one link of either era: a warm one from the pool, else one
        being started for the pool and promised to no session yet (it started earlier than a new
        one would), else a fresh one. A spare taken from the pool starts the next one."""
        while self._pool:
            spare = self._pool.popleft()
            if spare.alive and not spare.protocol.overflow:
                self._replenish()  # the command is known to work: the next spare starts booting now
                return self._bind(spare, link)
            await spare.terminate()
        while self._unclaimed:
            starting = self._unclaimed.popleft()
            promised: _Child | None
            try:
                promised = await asyncio.shield(starting)
            except asyncio.CancelledError:
                if not starting.done():  # our caller gave up: the child goes to the pool after all
                    starting.add_done_callback(self._unwanted)
                raise
            except Exception:
                promised = None
            if promised is not None and promised.alive and not promised.protocol.overflow:
                return self._bind(promised, link)
            if promised is not None:
                await promised.terminate()
        return await self._spawn(link._on_line, link._on_exit)

    def _bind(self, spare: _Child, link: StdioLink) -> _Child:
        spare.on_line = link._on_line
        spare.on_exit = link._on_exit
        return spare

    def _replenish(self) -> None:
        """Fill the pool up to `spares`, at most `spare_starts` starting at once (only once a child
        of this command has answered, so a broken command never spawns in a loop)."""
        if self.spares <= 0 or self._closed:
            return
        while (
            len(self._pool) + len(self._starting) < self.spares
            and len(self._starting) < self.spare_starts
            and len(self._links) < self.max_children
        ):
            self._start_spare()

    def _start_spare(self) -> None:
        task = asyncio.create_task(self._make_spare())
        self._starting.add(task)
        self._unclaimed.append(task)
        task.add_done_callback(self._spare_started)

    async def _make_spare(self) -> _Child | None:
        try:
            child = await self._spawn(_spare_line, self._spare_exited)
        except UpstreamFailure as failure:
            log.info("could not start a spare upstream child: %s", failure.detail)
            return None
        child.pooled_at = time.monotonic()
        return child

    def _spare_started(self, task: asyncio.Task[_Child | None]) -> None:
        self._starting.discard(task)
        if task in self._unclaimed:  # nobody is waiting for this one: it joins the pool
            self._unclaimed.remove(task)
            self._unwanted(task)
        if not task.cancelled() and task.exception() is None and task.result() is not None:
            self._replenish()  # (a start that failed does not start the next one at once)

    def _unwanted(self, task: asyncio.Task[_Child | None]) -> None:
        child = None if task.cancelled() or task.exception() is not None else task.result()
        if child is None:
            return
        if self._closed:
            return  # among the children `aclose` stops
        child.on_line, child.on_exit = _spare_line, self._spare_exited
        self._pool.append(child)

    def _spare_exited(self, child: _Child, code: int | None) -> None:
        if child in self._pool:
            self._pool.remove(child)
            log.info("%s: the spare upstream child exited with code %s before it was used", child.name, code)

    def reap_idle_spares(self) -> int:
        """Stop the spares unused for `spare_idle_s`, keeping one (the pool refills as sessions take
        them again); returns how many were stopped. Called by the service's idle reaper."""
        now = time.monotonic()
        reaped = 0
        while len(self._pool) > 1 and now - self._pool[0].pooled_at > self.spare_idle_s:
            spare = self._pool.popleft()
            self._in_background(spare.terminate())
            reaped += 1
        if reaped:
            log.info("stopped %d spare upstream children unused for %g s", reaped, self.spare_idle_s)
        return reaped

    @property
    def children(self) -> int:
        n = sum(1 for link in self._links if link._child is not None and link._child.alive)
        others = [self._modern, *(self._shared.links if self._shared is not None else ())]
        for link in others:
            if link is not None and link._child is not None and link._child.alive:
                n += 1
        return n

    def reap_idle_shared(self) -> int:
        """`--stdio-sessions shared`: stop the shared children unused for `spare_idle_s` with no
        session on them, keeping one (proxy/upstream/stdio_shared.py). Called by the service's
        idle reaper."""
        return self._shared.reap_idle(self.spare_idle_s) if self._shared is not None else 0


class _AdoptedTransport:
    """What `_Child` needs of a `SubprocessTransport`, for the child `proxy.upstream.early` started before the
    event loop existed (asyncio cannot wrap a running process in its own transport): the three pipe
    transports, the pid, and the exit status, read when the process's pidfd becomes readable."""

    def __init__(self, early: proxy.upstream.early.EarlyChild) -> None:
        self._early = early
        self._pipes: dict[int, asyncio.BaseTransport] = {}
        self._closed = False

    def get_pid(self) -> int:
        return self._early.popen.pid

    def get_returncode(self) -> int | None:
        return self._early.popen.returncode

    def get_pipe_transport(self, fd: int) -> asyncio.BaseTransport | None:
        return self._pipes.get(fd)

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        for pipe in self._pipes.values():
            pipe.close()


class _PipeProtocol(asyncio.Protocol):
    """One pipe of an adopted child, forwarded to its `_ChildProtocol` as a subprocess transport
    would (asyncio's own subprocess pipes do the same)."""

    def __init__(self, child: _ChildProtocol, fd: int) -> None:
        self.child = child
        self.fd = fd

    def data_received(self, data: bytes) -> None:
        self.child.pipe_data_received(self.fd, data)

    def eof_received(self) -> None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.child.pipe_connection_lost(self.fd, exc)

    def pause_writing(self) -> None:
        self.child.pause_writing()

    def resume_writing(self) -> None:
        self.child.resume_writing()


def lower_priority(pid: int, nice: int) -> None:
    """`--stdio-nice`: the process group `pid` leads (a guard, its command and all they started)
    runs `nice` below the proxy from now on, and so does what they start later (inherited).

    Applied once the child has started, not before: a start is most of a Python server's CPU, a
    niced one on a busy host took longer than its start timeout, and starts are already bounded
    (`--stdio-max-starting`). On a host with autogroup scheduling each session is weighed as one
    task whatever its processes' nice, and each guard leads a session of its own, so that group
    is lowered too (best effort: unprivileged writes are rate-limited by the kernel). In a
    container (a cgroup of its own) the processes' nice is what counts."""
    value = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    try:
        os.setpriority(os.PRIO_PGRP, pid, value)
    except OSError:  # it has exited already
        return
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:  # procfs: no disk behind it
            f.write(str(value))
    except OSError:
        pass


async def _adopt(early: proxy.upstream.early.EarlyChild, protocol: _ChildProtocol) -> _ChildProtocol:
    """Connect `protocol` to a child `proxy.upstream.early` started: its pipes through the loop's pipe
    transports, its exit through its pidfd (reaped with the `Popen` that started it)."""
    loop = asyncio.get_running_loop()
    transport = _AdoptedTransport(early)
    popen = early.popen
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    pipes = transport._pipes
    try:
        pipes[0], _ = await loop.connect_write_pipe(lambda: _PipeProtocol(protocol, 0), popen.stdin)
        pipes[1], _ = await loop.connect_read_pipe(lambda: _PipeProtocol(protocol, 1), popen.stdout)
        pipes[2], _ = await loop.connect_read_pipe(lambda: _PipeProtocol(protocol, 2), popen.stderr)
    except BaseException:
        transport.close()
        early.kill()
        raise

    def exited() -> None:
        loop.remove_reader(early.pidfd)
        os.close(early.pidfd)
        early.pidfd = -1
        popen.poll()  # readable pidfd: the guard has exited, so this reaps it at once
        protocol.process_exited()

    loop.add_reader(early.pidfd, exited)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol


_NOT_JSON = object()
_BOM = b"\xef\xbb\xbf"


def _without_bom(line: bytes) -> object:
    """A line that is JSON after a UTF-8 byte order mark (what a .NET or PowerShell server's
    console writes before its first line when set to UTF-8): its message; else `_NOT_JSON`.
    Before, that first line, the answer to the proxy's probe, was dropped as not JSON and the
    server read as one that never answers. Only tried on a line that failed to parse."""
    if line.startswith(_BOM):
        try:
            return loads(line[len(_BOM) :])
        except ValueError:
            pass
    return _NOT_JSON


def _spare_line(child: _Child, line: bytes) -> None:
    if child.protocol.log_budget.take(child.name):
        stderr_log.info("%s (spare) wrote before any request: %s", child.name, line[:200].decode("utf-8", "replace"))


# How long a child's stdout may stay open after its process (the guard) exited: its last writes are
# already in the pipe, so this is only for the loop to read them.
EXITED_OUTPUT_S = 2.0


async def _output_ended(child: _Child) -> None:
    """Until the child's stdout ends, or its process has exited and the pipe stayed open
    `EXITED_OUTPUT_S` longer: something outside the guard's reach holds it (a process that left
    the group and escaped the guard's end), and could keep the link waiting on a dead child for
    ever. Its pipes are then closed."""
    protocol = child.protocol
    closed = asyncio.ensure_future(protocol.stdout_closed.wait())
    try:
        await asyncio.wait([closed, protocol.exited], return_when=asyncio.FIRST_COMPLETED)
        if closed.done():
            return
        done, _ = await asyncio.wait([closed], timeout=EXITED_OUTPUT_S)
        if not done:
            log.warning("%s exited, but a process it started still holds its stdout: closing its pipes", child.name)
            with contextlib.suppress(Exception):
                child.transport.close()
            # The guard is gone, so nobody else will end what is left of its group (a group's id
            # is not reused while it has members).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
    finally:
        closed.cancel()


async def _end_with_output(child: _Child) -> None:
    """When the child's stdout ends (it exited, closed it, or overflowed the size limit), make sure
    its whole process group is gone, then report the exit once."""
    try:
        await _output_ended(child)
    finally:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.wait(), 5.0)
        child.exited.set()
        child.on_exit(child, child.returncode)
