"""A stdio upstream's child process: its pipes, its bounded logging, and how it is stopped.

- `ChildProtocol` reads a child's pipes in the event loop's own callbacks: each stdout line is
  routed to its `Child.on_line` the moment its bytes arrive; a line over `max_line` bytes stops the
  child (the stream cannot be resynchronised); stderr is logged line by line (logger
  `proxy.upstream.stderr`), never treated as an error signal. Writes to stdin are flow-controlled.
- What a child can make the proxy log is bounded (`LineBudget`): each line to
  `STDERR_LINE_LIMIT` characters, and per child to a burst of lines, then a rate (a token bucket;
  `--stderr-burst-lines`, `--stderr-lines-per-s`); lines beyond are counted
  (`mcp_recovery_stderr_lines_dropped_total`) and summed up in one log line.
- `Child` is one running process (its guard, `_guard.py`, leading its own process group) and the
  task (`end_with_output`) that makes sure, once its stdout ends, that the whole group is gone and
  its exit is reported exactly once (`Child.on_exit`).
- `stop_children` stops any number of children together in the spec's order (stdin closed,
  SIGTERM to each group, SIGKILL), each stage one wait shared by all: at most `STOP_BOUND_S`
  however many there are. `Child.terminate` is the same for one child, `TERMINATE_GRACE_S` a stage.
- `lower_priority` is `--stdio-nice`: a started child's whole group runs below the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence

from proxy.telemetry.budget import TokenBucket
from proxy.telemetry.shed import SHED

log = logging.getLogger("proxy.upstream.stdio")
stderr_log = logging.getLogger("proxy.upstream.stderr")

STDERR_LINE_LIMIT = 2000

TERMINATE_GRACE_S = 2.0  # one child stopped in the background (a session's end): each stage
# The proxy's own shutdown stops every child at once (`stop_children`), each stage one bound shared
# by all of them, so that the proxy exits within its grace + a documented bound
# (docs/reliability.md): after every stdin is closed (the spec's first step), after SIGTERM to every
# process group still running, after SIGKILL (for the exits to be reaped).
STOP_STDIN_S = 1.0
STOP_TERM_S = 0.5
STOP_KILL_S = 1.0
STOP_REPORT_S = 0.5  # for the exits to be reported (`stop_children`)
STOP_BOUND_S = STOP_STDIN_S + STOP_TERM_S + STOP_KILL_S + STOP_REPORT_S


class LineBudget(TokenBucket):
    """A token bucket for the log lines one child can cause (its stderr, its non-JSON stdout):
    `burst` lines at once, then `rate` a second, so that a child writing lines as fast as it can
    cannot flood the proxy's log; what the bucket refuses is counted
    (`mcp_recovery_stderr_lines_dropped_total`) and summed up in one line when logging resumes or
    the child's stderr ends."""

    __slots__ = ()
    BURST = 100  # the defaults of --stderr-burst-lines and --stderr-lines-per-s
    RATE = 20.0

    def __init__(self, burst: int = BURST, rate: float = RATE) -> None:
        super().__init__(burst, rate)

    def take(self, name: str) -> bool:
        if not self.allow():
            SHED.count("stderr_lines_dropped")
            return False
        self.summarize(name)
        return True

    def summarize(self, name: str) -> None:
        dropped = self.take_dropped()
        if dropped:
            stderr_log.warning(
                "%s: %d output lines not logged (at most %g a second, bursts of %d)",
                name,
                dropped,
                self.rate,
                int(self.burst),
            )


class ChildProtocol(asyncio.SubprocessProtocol):
    """The child's pipes, read in the event loop's own callbacks: each stdout line is routed the
    moment its bytes arrive (no reader task to wake per message), stderr is logged line by line,
    and writes to stdin are flow-controlled (`drain` waits while the pipe is full)."""

    def __init__(self, max_line: int, log_budget: tuple[int, float] = (LineBudget.BURST, LineBudget.RATE)) -> None:
        self.max_line = max_line
        self.transport: asyncio.SubprocessTransport | None = None
        self.child: Child | None = None
        self.exited = asyncio.get_running_loop().create_future()
        self.stdout_closed = asyncio.Event()
        self.stderr_closed = asyncio.Event()
        self.log_budget = LineBudget(*log_budget)
        self._out = bytearray()
        self._err = bytearray()
        self._paused: asyncio.Future[None] | None = None
        self.overflow = False
        self.on_first_output: Callable[[], None] | None = None  # the child has started (StdioUpstream.spawn)

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
                stderr_log.info("%s: %s", name, line[:STDERR_LINE_LIMIT].decode("utf-8", "replace"))

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


# What a child's owner hears of it: each line of its stdout, and its exit (with its status).
OnLine = Callable[["Child", bytes], None]
OnExit = Callable[["Child", int | None], None]


class Child:
    """One running upstream process (its guard) and the task that ends it when its output ends."""

    def __init__(
        self,
        protocol: ChildProtocol,
        description: str,
        on_line: OnLine,
        on_exit: OnExit,
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
        self.asked = False  # something was written to it (a warm spare has been asked nothing)
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
        self.asked = True

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
        await stop_children([self], stdin_s=TERMINATE_GRACE_S, term_s=TERMINATE_GRACE_S, kill_s=TERMINATE_GRACE_S)

    def close_stdin(self) -> None:
        with contextlib.suppress(Exception):
            stdin = self.transport.get_pipe_transport(0)
            if stdin is not None:
                stdin.close()

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


async def stop_children(
    children: Sequence[Child],
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
    # Each child's output watcher (`end_with_output`) reports its exit (`exited`, `on_exit`): those
    # of the children that exited get a moment to, then what is left is cancelled. (Cancelled at
    # once, a watcher still between the pipe's end and the exit's report would never set `exited`,
    # and an exited child would read as alive.)
    watching = [task for child in children for task in child.tasks if not task.done()]
    if watching:
        await asyncio.wait(watching, timeout=STOP_REPORT_S)
    for child in children:
        for task in child.tasks:
            task.cancel()
        if child.returncode is not None:
            child.exited.set()
    return counts


def lower_priority(pid: int, nice: int) -> None:
    """`--stdio-nice`: the process group `pid` leads (a guard, its command and all they started)
    runs `nice` below the proxy from now on, and so does what they start later (inherited).

    Applied once the child has started, not before: a start is most of a Python server's CPU, a
    niced one on a busy host can take longer than its start timeout, and starts are already bounded
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


# How long a child's stdout may stay open after its process (the guard) exited: its last writes are
# already in the pipe, so this is only for the loop to read them.
EXITED_OUTPUT_S = 2.0


async def _output_ended(child: Child) -> None:
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


async def end_with_output(child: Child) -> None:
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
