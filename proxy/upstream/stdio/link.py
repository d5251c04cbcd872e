"""`StdioLink`: a message-level link to one supervised stdio child, respawned as needed.

- Messages are newline-delimited JSON. A stdout line that is not JSON is logged (within the child's
  `LineBudget`) and skipped; one that is JSON after a UTF-8 byte order mark is read as its message.
- A child answers each request of the link's `PendingTable`; what names no request of the link goes
  to the link's unsolicited handler (`set_unsolicited_handler`).
- When its child dies, every exchange in flight fails at once (`CLOSED`, dispatch unknown if the
  request was written); the next request gets a fresh child from the link's owner (`LinkOwner`: a
  warm spare when `takes_spare`, else a spawned one). A 2026-07-28 link's new child answers one
  `server/discover` before real work; a legacy link's new child gets the client's `initialize` and
  `notifications/initialized` replayed first, then `replay_after_handshake`'s messages. Replaying
  is not an attempt.
- A client session's link (`session`): its `initialize` to a child that has not answered yet
  returns only once answered, within the busy-aware start wait (startwait.py); a child that does
  not start in time is stopped and the session refused (`Refusal`, 503). `starting` tells a relay
  that the next request waits for a start the link bounds itself (the start queue's progress and
  the start wait), not for the upstream's answer.
- Quick successive deaths back off (a crash loop): while the backoff lasts, a request fails at
  once with `NOT_RUNNING` (dispatch no) and the remaining wait as `retry_after_s`
  (`next_spawn_at`).
- A request is written at once; `send_request` then waits while the child's stdin pipe is full.
  Cancelled in that wait, the request counts as written (`on_write` ran) and is cancelled here
  (`notifications/cancelled` queued behind it): its caller never got the exchange to cancel.
- An answer from a child marks it `answered`, resets the crash count and reports the upstream up;
  an exit the proxy did not ask for is reported to the owner (`LinkOwner.lost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from proxy.errors import Dispatch, FailureKind, Refusal, UpstreamFailure
from proxy.jsonrpc import Message, RequestId, dumps, loads
from proxy.upstream.base import (
    Era,
    Exchange,
    Handshake,
    Health,
    LinkBase,
    OnMessage,
    PendingTable,
    UpstreamHealth,
    discover_request,
)
from proxy.upstream.stdio.process import STDERR_LINE_LIMIT, Child, OnExit, OnLine
from proxy.upstream.stdio.startwait import StartTimedOut

log = logging.getLogger("proxy.upstream.stdio")
stderr_log = logging.getLogger("proxy.upstream.stderr")


class LinkOwner(Protocol):
    """What a `StdioLink` needs of the upstream that supervises it (`StdioUpstream`)."""

    health: UpstreamHealth
    max_restart_backoff_s: float
    start_s: float | None  # how long the first child took from spawn to its first answer

    async def child_for(self, link: StdioLink) -> Child:
        """A child for `link`: a warm spare if one is ready or starting, else a spawned one."""
        ...

    async def spawn(self, on_line: OnLine, on_exit: OnExit) -> Child:
        """A freshly spawned child."""
        ...

    async def first_answer(self, child: Child, answer: asyncio.Future[Message]) -> Message:
        """`answer`, bounded by the start timeout (`StartTimedOut`)."""
        ...

    def lost(self, child: Child | None, why: str, *, crashed: bool = False) -> None:
        """`child` exited unasked (`crashed`), or none could be started."""
        ...

    def forget(self, link: StdioLink) -> None:
        """`link` is closed."""
        ...

    def replenish(self) -> None:
        """A child of the command answered: the warm pool may fill."""
        ...


class StdioLink(LinkBase):
    """A message-level link to one upstream child (respawned as needed)."""

    def __init__(self, upstream: LinkOwner, era: Era, *, takes_spare: bool = True, session: bool = False) -> None:
        self.era = era
        # A client's 2025 session (`StdioUpstream.open`): its `initialize` is its new child's first
        # request, and the answer is the child's start (`_await_start`).
        self._session = session
        self._upstream = upstream
        self._health = upstream.health
        # A warm spare has been asked nothing, so it can become any link's child: a 2025 session's,
        # the 2026 link's (whose child's crash would otherwise cost every 2026 call a cold start),
        # the one child behind --listen stdio. Not the throwaway child of a health check (`check`).
        self._takes_spare = takes_spare
        self._pending = PendingTable()
        self._handshake = Handshake()
        self._child: Child | None = None
        self._spawn_lock = asyncio.Lock()
        self._unsolicited: OnMessage = lambda m: None
        # What a respawned child gets after the replayed handshake, beyond it (a shared child's
        # log level and resource subscriptions: shared.py).
        self.replay_after_handshake: Callable[[], list[Message]] | None = None
        self._quick_deaths = 0
        self._next_spawn_at = 0.0
        self._closed = False

    @property
    def child(self) -> Child | None:
        """The child serving this link now (None: none yet, or it exited)."""
        return self._child

    @property
    def starting(self) -> bool:
        """Whether the next request starts this link's child first (none yet, it exited, or it has
        not answered yet). The link bounds that start itself (the start queue's progress, the
        busy-aware start wait: startwait.py), so a relay does not count it against its request
        timer (proxy/core/relay.py `Relay.forward`)."""
        child = self._child
        return child is None or not child.alive or not child.answered

    @property
    def ready(self) -> bool:
        """A child runs and has answered: a request goes to it without a start."""
        return not self._closed and not self.starting

    @property
    def in_flight(self) -> int:
        """Requests written to (or waiting for) this link's child and not answered yet."""
        return len(self._pending)

    def holds(self, upstream_id: RequestId) -> bool:
        """Whether a request of this id was sent on this link and is not answered yet."""
        return self._pending.get(upstream_id) is not None

    async def start(self) -> None:
        """Start this link's child now, ahead of its first request (a 2026 child: up to its answer to
        `server/discover`). Raises `UpstreamFailure` as a request's start would."""
        await self._ensure_child({})

    @property
    def next_spawn_at(self) -> float:
        """The `time.monotonic()` before which no child is started again (the crash backoff)."""
        return self._next_spawn_at

    # -- UpstreamLink -------------------------------------------------------------------------

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
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
        if on_write is not None:
            on_write()
        try:
            await child.drain()
            if self._session and not child.answered and message.get("method") == "initialize":
                await self._await_start(child, ex)
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._pending.fail(ex, UpstreamFailure(FailureKind.CLOSED, Dispatch.UNKNOWN, f"write failed: {exc}"))
        except asyncio.CancelledError:
            # Cancelled while the child's stdin pipe is full (the child does not read it): the
            # request is written (it reaches the child once it reads again), and the caller gets
            # no exchange to cancel. So it is cancelled here, its notification queued right
            # behind it, or the child would run it to its end.
            self._cancel_written(child, ex, "request cancelled by the proxy")
            raise
        return ex

    async def _await_start(self, child: Child, ex: Exchange) -> None:
        """A session's `initialize`, written to its child that has not answered yet: its answer is
        the child's start, so it is awaited here, within the start wait (busy-aware: startwait.py),
        and the exchange returned answered. A child that does not start in time is stopped and
        the session refused (`Refusal`, 503, naming `--stdio-start-timeout-s`); one that exits
        fails the exchange as it goes."""
        try:
            await self._upstream.first_answer(child, ex.response)
        except StartTimedOut as exc:
            self._pending.discard(ex)
            await child.terminate()
            raise Refusal(
                f"this session's stdio child did not start: {exc}; --stdio-start-timeout-s raises this limit",
                limit="session_starts",
                flag="--stdio-start-timeout-s",
                http_status=503,
            ) from None
        except UpstreamFailure:
            pass  # the exchange holds it: its caller gets it from `ex.response`

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
        await self.send_notification(_cancelled_note(exchange, reason))

    def _cancel_written(self, child: Child, exchange: Exchange, reason: str) -> None:
        """`cancel` for a request written to `child` whose `send_request` was cancelled: the
        notification is queued on the child's stdin without waiting for the pipe to drain (the
        caller is being cancelled; the bytes go out once the child reads)."""
        exchange.cancelled = True
        self._pending.discard(exchange)
        if exchange.method == "initialize" or not child.alive:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
            child.write(dumps(_cancelled_note(exchange, reason)) + b"\n")

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
        self._upstream.forget(self)

    def close_now(self) -> Child | None:
        """Close the link (its requests in flight fail, no child is started for it again) and hand
        over its child, for the caller to stop."""
        self._closed = True
        child, self._child = self._child, None
        self._pending.fail_all(FailureKind.CLOSED, "proxy closed the upstream link")
        return child

    # -- supervision --------------------------------------------------------------------------
    async def _ensure_child(self, message: Message) -> Child:
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
                    child = await self._upstream.child_for(self)
                else:
                    child = await self._upstream.spawn(self.on_line, self.on_exit)
            except UpstreamFailure as failure:
                if not isinstance(failure, Refusal):  # a queue of starts refused: load, not a broken command
                    self._upstream.lost(None, failure.detail)
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

    async def _await_ready(self, child: Child) -> None:
        """A fresh modern child answers one `server/discover` before it gets real work, so that an
        attempt's timer never counts the child's start-up (a cold `npx` can take seconds)."""
        probe = discover_request(self._pending.new_id())
        await self._exchange_internally(child, probe, "starting the upstream")

    async def _exchange_internally(self, child: Child, message: Message, what: str) -> Message:
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

    async def _replay_handshake(self, child: Child) -> None:
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
        if self.on_reestablished is not None:
            self.on_reestablished()

    def on_line(self, child: Child, line: bytes) -> None:
        try:
            message = loads(line)
        except ValueError:
            message = _without_bom(line)
        if message is _NOT_JSON:
            if child.protocol.log_budget.take(child.name):
                stderr_log.info(
                    "%s stdout (not JSON): %s", child.name, line[:STDERR_LINE_LIMIT].decode("utf-8", "replace")
                )
            return
        if not isinstance(message, dict):
            return
        if "method" not in message:
            if "id" in message:
                if self._pending.resolve(message):
                    if not child.answered:
                        if self.era is Era.LEGACY:
                            self._upstream.replenish()  # this command works: warm the next session's child
                        child.answered = True
                        if self._upstream.start_s is None:
                            self._upstream.start_s = time.monotonic() - child.started_at
                    self._quick_deaths = 0
                    if self._health.state is not Health.UP:  # the one check an answer pays for the gauge
                        self._health.answered()
            return
        if self._pending.route_related(message):
            return
        self._unsolicited(message)

    def on_exit(self, child: Child, code: int | None) -> None:
        if self._child is child:
            self._child = None
        detail = f"upstream process exited with code {code}"
        if not self._closed and not child.stopping:
            log.warning("%s: %s", child.name, detail)
            self._upstream.lost(child, f"{child.name}: {detail}", crashed=True)
        self._pending.fail_all(FailureKind.CLOSED, detail)
        lived_s = time.monotonic() - child.started_at
        if child.answered and lived_s > 5.0:
            self._quick_deaths = 0
        else:
            self._quick_deaths += 1
        n = self._quick_deaths
        delay_s = 0.0 if n <= 1 else min(self._upstream.max_restart_backoff_s, 0.25 * 2 ** (n - 2))
        self._next_spawn_at = time.monotonic() + delay_s


def _cancelled_note(exchange: Exchange, reason: str | None) -> Message:
    params: dict[str, object] = {"requestId": exchange.upstream_id}
    if reason:
        params["reason"] = reason
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


_NOT_JSON = object()
_BOM = b"\xef\xbb\xbf"


def _without_bom(line: bytes) -> object:
    """A line that is JSON after a UTF-8 byte order mark (what a .NET or PowerShell server's
    console writes before its first line when set to UTF-8): its message; else `_NOT_JSON`.
    Without this, that first line, the answer to the proxy's probe, would be dropped as not JSON
    and the server read as one that never answers. Only tried on a line that failed to parse."""
    if line.startswith(_BOM):
        try:
            return loads(line[len(_BOM) :])
        except ValueError:
            pass
    return _NOT_JSON
