"""`StdioUpstream`: a stdio server command the proxy spawns, supervises and restarts.

- One child per legacy (2025) downstream session, and one shared child for all 2026-07-28
  requests: an SDK server fixes its era on the first request it reads, so one child cannot
  serve both. With `shared_sessions` (`--stdio-sessions shared`) at most `shared_children`
  children serve every 2025 session instead (shared.py); `probe` starts them. With
  `modern_children` N > 1 (`--stdio-modern-children`) the 2026 requests spread over up to N
  children, started as the load asks for them (modern_pool.py).
- `single_session` (the proxy behind `--listen stdio`, whose one client is one session): exactly
  one child. `prestart()` starts it before the client speaks, and the first link that needs a
  child takes it, whichever era the client's first request opens (its answer is the probe; no
  spare is kept, no separate probe child is started while it lives). That child is usually the
  one `early.start` started before the proxy's own imports: it is adopted (adopt.py: its pipes
  through the loop's pipe transports, its exit through its pidfd) and behaves as a spawned one;
  a respawn after it is spawned the normal way.
- Warm pool (`spares`, `--stdio-spares`; spares.py): once a child of the command has answered,
  `spares` children are kept started ahead, more (up to `spares_max`, `--stdio-spares-max`) while
  the recent peak of sessions opened within one child start time calls for them, within the room
  `max_children` leaves and a share of the available memory; at most `spare_starts` starting at
  once, reaped when unused for `spare_idle_s` or once that peak has decayed. A spare counts against
  neither `max_children` nor the proxy's `--max-sessions`; the pool's growth stays within them.
- Every child runs under `_guard.py` in its own process group, so no process it starts outlives
  the proxy, even a killed one. At most `max_starting` children start at once (`spawn`), the
  others wait their turn in order, refused only when no start completed for as long as one may
  take (`StartQueue`, startwait.py); once a child has started, `nice` lowers its group's priority
  (`--stdio-nice`).
- A child must answer the proxy's own first request (the probe's `server/discover`, a health
  check's `initialize`, the readiness check of a new 2026 child, a replayed handshake) within
  `handshake_timeout_s` of its start (`--stdio-start-timeout-s`, default 10 s), stretched up to six
  times that while the child is still busy starting (startwait.py: a slow start on a busy host is
  not a broken server); one that does not is stopped and the failure says which it was, naming the
  setting. So is a 2025 session's own `initialize` to its new child (link.py: that answer is the
  child's start; a child that does not start in time refuses the session with a `Refusal`, 503,
  naming the setting), and none of this counts against the request timeout (`single_session`: the
  request timeout bounds that answer, as it bounds the client's). The start-up
  probe is two such starts at most (`discover`, then `initialize` on a fresh child for a server
  silent to it): the service bounds it by their sum (`probe_bound_s`), and its failure names each
  step.
- Stopping: one child (a session's end) is stopped in the background, stdin closed, then SIGTERM
  to its group, then SIGKILL, 2 s apart. The proxy's shutdown (`aclose`) stops every child it
  started at once (`stop_children`, process.py): at most `STOP_BOUND_S` (3 s) however many
  children there are. A child whose start was under way when the stop began (its process created,
  its pipes not yet connected) joins it as its start returns, and a stop already running in the
  background (a reaped spare's) is awaited: each of those two waits is bounded likewise, so
  `aclose` returns with no child it started still running (the event loop keeps only weak
  references to tasks: the background stops are held in a set until they end).
- A dead child's link fails its exchanges in flight, and respawns with the handshake replayed
  and a backoff after quick successive deaths (link.py).
- Health (`UpstreamHealth`, the `mcp_recovery_upstream_up` gauge): up from any child's answer, on
  any link; down when a child exits unasked, or cannot be started, and no other live child has
  answered. Every child that exits unasked counts once in `health.restarts`, whether or not its
  link ever needs a new one. Exits the proxy asked for (a session's end, shutdown, a start-up
  exchange it gave up on) are neither. `check()` starts a throwaway child and asks it `initialize`.
- What a child can make the proxy log is bounded (`LineBudget`, process.py: `stderr_burst_lines`,
  `stderr_lines_per_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections import deque
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path

import proxy.upstream.stdio.early as early
from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import LATEST_MODERN, LEGACY_VERSIONS, Message
from proxy.upstream.base import (
    Capabilities,
    Era,
    Exchange,
    UpstreamHealth,
    discover_request,
    initialize_request,
)
from proxy.upstream.stdio.adopt import adopt
from proxy.upstream.stdio.link import StdioLink
from proxy.upstream.stdio.modern_pool import ModernPool
from proxy.upstream.stdio.process import (
    STOP_BOUND_S,
    TERMINATE_GRACE_S,
    Child,
    ChildProtocol,
    LineBudget,
    OnExit,
    OnLine,
    end_with_output,
    lower_priority,
    stop_children,
)
from proxy.upstream.stdio.shared import SharedSessions
from proxy.upstream.stdio.shared_link import SessionLink
from proxy.upstream.stdio.spares import SparePool
from proxy.upstream.stdio.startwait import BUSY_WINDOW_S, STRETCH, StartQueue, StartTimedOut, first_answer

log = logging.getLogger("proxy.upstream.stdio")

_GUARD = str(Path(__file__).with_name("_guard.py"))
# Per step of the start-up probe, beyond the child's own start: spawning it, and stopping one that
# stayed silent (`StdioUpstream.probe_bound_s`).
_PROBE_STEP_MARGIN_S = 2 * TERMINATE_GRACE_S + 1.0


class StdioUpstream:
    """A stdio server command; spawns one child per legacy link plus one shared modern child (or up
    to `modern_children` of them: modern_pool.py)."""

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
        spares_max: int = 0,
        spare_starts: int = 2,
        spare_idle_s: float = 600.0,
        single_session: bool = False,
        stderr_burst_lines: int = LineBudget.BURST,
        stderr_lines_per_s: float = LineBudget.RATE,
        shared_sessions: bool = False,
        shared_children: int = 2,
        modern_children: int = 1,
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
        # `--stdio-modern-children N` (N > 1): 2026 requests spread over up to N children
        # (modern_pool.py), the first of them `_modern`'s
        self.modern_children = 1 if single_session else max(1, modern_children)
        self._modern_pool: ModernPool | None = None
        self.single_session = single_session
        # `--stdio-sessions shared`: every 2025 session on a few shared children (shared.py)
        self.shared_sessions = shared_sessions and not single_session
        self.shared_children = max(1, shared_children)
        self._shared: SharedSessions | None = None
        # the warm pool (spares.py); one session, or shared sessions, need none
        self.spares = 0 if single_session or self.shared_sessions else spares
        self.spare_starts = max(1, spare_starts)
        self.spare_idle_s = spare_idle_s
        self.spare_pool = SparePool(
            self.spawn,
            size=self.spares,
            starts=self.spare_starts,
            idle_s=spare_idle_s,
            room=lambda: self.max_children - len(self._links),
            in_background=self._in_background,
            ceiling=spares_max,
            start_s=lambda: self.start_s,
            sample_pid=self._sample_pid,
        )
        self._closed = False
        self._spawned = 0
        self._running: set[Child] = set()  # every child started and not yet exited
        # Children being started (`spawn`, between the process's creation and its return) and the
        # stops run in the background (`_in_background`): `aclose` waits for both. The set keeps
        # the tasks alive, since the event loop keeps only weak references to them.
        self._spawning: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[object]] = set()
        # Children starting at once (see `spawn`); 0: the CPU count, at least 2. A start waiting its
        # turn is refused only when none completed for as long as one may take (a busy start's
        # stretched wait, then its child's stop), so the queue keeps progressing whatever its length.
        self.max_starting = max_starting if max_starting > 0 else max(2, os.cpu_count() or 2)
        stall_s = STRETCH * handshake_timeout_s + BUSY_WINDOW_S + 2 * TERMINATE_GRACE_S
        self.start_queue = StartQueue(self.max_starting, stall_s)
        self.nice = nice  # `--stdio-nice`: applied once a child has started (`_started`)
        self.start_s: float | None = None  # how long the first child took from spawn to its first answer
        self.probe_step: str | None = None  # the step of `probe` under way
        self.health = UpstreamHealth()

    async def probe(self) -> Capabilities:
        """`_probe`; then, with shared sessions, the shared children are started and awaited (each
        bounded by the handshake timeout; one that fails is started again by the request that
        needs it; a probe that gives up meanwhile does not stop them), so that a ready proxy has
        them running and no 2025 session waits for a process start. After the probe, not beside
        it: on a loaded machine several processes starting at once can make every start miss its
        timeout.

        Per session, a child answered, so the command works: the warm pool starts filling now,
        not once the first 2025 session's own child answered, which would make that session wait
        for a whole cold start (seconds on a loaded machine).

        `probe_step` names the step under way, and stays set when the probe is cancelled (by the
        service's own bound, `probe_bound_s`), for its error to say where it was."""
        try:
            capabilities = await self._probe()
            if self.shared_sessions and capabilities.legacy and not self._closed:
                self.probe_step = "starting the shared children (initialize)"
                await asyncio.shield(self._shared_sessions().start_all())
            elif capabilities.legacy:
                self.replenish()  # (no pool with shared sessions, nor behind --listen stdio)
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
            self._shared = SharedSessions(self, self.shared_children)
        return self._shared

    async def _probe(self) -> Capabilities:
        """Ask a child `server/discover`; a server that refuses it is legacy-only. One that does not
        answer it at all (exits, or stays silent) is legacy-only only if a fresh child answers a
        2025 `initialize` (`check`): a command that crashes at once must not read as ready. A probe
        that fails says what each step met."""
        self.probe_step = "server/discover on a new process"
        if self._modern is None:
            self._modern = StdioLink(self, Era.MODERN)
        link = self._modern  # the 2026 link itself, pooled or not (`open`)
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
            # A dual-era stdio server names only 2026-07-28 too: 2025 is assumed until a session's
            # `initialize` is answered or refused (proxy/upstream/bridge_proving.py).
            assumed = modern and not any(v in LEGACY_VERSIONS for v in versions)
            return Capabilities(
                legacy=True, modern=modern, detail=f"supportedVersions={versions}", legacy_assumed=assumed
            )
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
        pool, self._modern_pool = self._modern_pool, None
        if pool is not None:
            await pool.aclose()
        elif link is not None:
            await link.aclose()

    def _modern_links(self) -> list[StdioLink]:
        """The 2026 links: the one, or every link of the pool (its first the same one)."""
        if self._modern_pool is not None:
            return list(self._modern_pool.links)
        return [self._modern] if self._modern is not None else []

    async def open(self, era: Era) -> StdioLink | SessionLink | ModernPool:
        if era is Era.MODERN:
            if self._modern is None:
                self._modern = StdioLink(self, Era.MODERN)
            if self.modern_children == 1:
                return self._modern
            if self._modern_pool is None:  # (`_drop_modern` drops it with `_modern`)
                self._modern_pool = ModernPool(self._modern, self.modern_children, lambda: StdioLink(self, Era.MODERN))
            return self._modern_pool
        if self.shared_sessions:
            return SessionLink(self._shared_sessions())  # bounded by the proxy's --max-sessions, not by children
        if len(self._links) >= self.max_children:
            raise UpstreamFailure(
                FailureKind.OVERLOADED,
                Dispatch.NO,
                f"the proxy runs its maximum of {self.max_children} upstream sessions",
            )
        # a session among many waits for its child's start within the start wait; the one session
        # behind --listen stdio keeps the request timeout for it (no queue; a first `npx` download)
        link = StdioLink(self, Era.LEGACY, session=not self.single_session)
        self._links.add(link)
        return link

    async def check(self) -> None:
        """Start a throwaway child (never the warm spare) and ask it a 2025 `initialize`, which
        every stdio server answers; its answer marks the upstream up (in `StdioLink.on_line`). Raises
        `UpstreamFailure` when the child exits or stays silent."""
        link = StdioLink(self, Era.LEGACY, takes_spare=False)
        try:
            ex = await link.send_request(initialize_request(link.new_id()))
            child = link.child
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
            self.lost(None, failure.detail)  # (a child that exited was counted as it went)
            raise
        finally:
            await link.aclose()

    async def first_answer(self, child: Child, answer: asyncio.Future[Message]) -> Message:
        """The answer to the proxy's own first request to `child`, bounded by the start timeout
        (stretched while the child is busy starting: startwait.py); `StartTimedOut`
        says why not, naming the setting, so an operator whose server starts slowly knows what to
        raise."""
        return await first_answer(answer, pid=child.pid, timeout_s=self.handshake_timeout_s)

    async def answer_of(self, link: StdioLink, ex: Exchange) -> Message:
        """The answer to one of the proxy's own requests (the probe's, a shared child's state) on
        `link`, with the allowance of a start: the start timeout, stretched while the child is busy
        (a loaded host delays a request's answer as it delays a start). `TimeoutError` (a
        `StartTimedOut`, naming the setting) when it does not come."""
        child = link.child
        if child is None:
            return await asyncio.wait_for(ex.response, self.handshake_timeout_s)
        return await first_answer(ex.response, pid=child.pid, timeout_s=self.handshake_timeout_s)

    def lost(self, child: Child | None, why: str, *, crashed: bool = False) -> None:
        """A child exited unasked (`crashed`), or none could be started: down unless another live
        child has answered (one that serves a session still works)."""
        health = self.health
        if crashed:
            health.restarts += 1
        if self._working_child(but=child) is None and health.failed(why):
            return
        if crashed:
            health.report()  # the restart, with the state unchanged

    def _working_child(self, *, but: Child | None) -> Child | None:
        links = list(self._links)
        links += self._modern_links()
        if self._shared is not None:
            links += self._shared.links
        for link in links:
            child = link.child
            if child is None or child is but or child.protocol.overflow:
                continue
            if child.answered and child.alive:
                return child
        return None

    def _sample_pid(self) -> int | None:
        """A live child of the command that has answered (the warm pool measures a child's memory on it)."""
        child = self._working_child(but=None)
        return None if child is None else child.pid

    def forget(self, link: StdioLink) -> None:
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
        await self.spare_pool.close()
        links = list(self._links)
        links += self._modern_links()
        self._modern = self._modern_pool = None
        if self._shared is not None:
            links += self._shared.links
            self._shared = None
        for link in links:
            link.close_now()
            self.forget(link)
        if self._spawning:  # their children join this stop (`spawn` sees the upstream closed)
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

    async def spawn(self, on_line: OnLine, on_exit: OnExit) -> Child:
        """A new child of the command under the guard, supervised (`_started`); `SPAWN_FAILED` when
        it cannot be started."""
        argv = [sys.executable, "-I", "-S", _GUARD, str(os.getpid()), "--", *self.command]
        loop = asyncio.get_running_loop()
        # `--listen stdio`: the child `early.start` started before the proxy's imports, if it runs this
        adopted = early.take(self.command) if self.single_session and not (self.env or self.cwd) else None
        if adopted is not None:
            with self._start_under_way():
                protocol = await adopt(adopted, ChildProtocol(self.max_message_bytes, self.log_budget))
                return self._started(Child(protocol, self.description, on_line, on_exit))
        # At most `max_starting` children start at once; the others wait here for a slot. Without
        # the bound, a burst of 2025 sessions starts as many interpreters at once: on a small host
        # each start takes many times as long, and the proxy's own event loop, one process among
        # them, stalls for seconds (every deadline in flight overshoots by as much;
        # bench/load_faults.py, its deadline probe, measures it). A slot is given back at the
        # child's first output (it has started and answers), at its exit, or, for a child nobody
        # has asked anything yet (a warm spare), after about as long as this command's first child
        # took to answer.
        give_back = await self.start_queue.take()  # bounded by the queue's progress (startwait.py)
        if self._closed:  # the proxy began stopping while this start waited its turn
            give_back()
            raise UpstreamFailure(FailureKind.NOT_RUNNING, Dispatch.NO, "the proxy is stopping its upstream")
        try:
            with self._start_under_way():
                _, protocol = await loop.subprocess_exec(
                    lambda: ChildProtocol(self.max_message_bytes, self.log_budget),
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
                child = Child(protocol, self.description, on_line, on_exit)
                hold_s = self.handshake_timeout_s if self.start_s is None else 2 * self.start_s

                def spare_gives_back() -> None:  # a child asked something keeps its slot until it answers
                    if not child.asked:
                        give_back()

                loop.call_later(min(hold_s, self.handshake_timeout_s), spare_gives_back)
                return self._started(child)
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

    def _started(self, child: Child) -> Child:
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
        child.tasks.append(asyncio.create_task(end_with_output(child)))
        self._running.add(child)
        child.protocol.exited.add_done_callback(lambda _: self._running.discard(child))
        if self._closed:
            self._in_background(stop_children([child]))
        return child

    # -- warm pool (spares.py) ------------------------------------------------------------------
    def prestart(self) -> None:
        """Start the child the first request will take (`single_session`: the only one), so that
        the process starts while the client is still starting too."""
        if not self._closed:
            self.spare_pool.prestart()

    @property
    def spawned(self) -> int:
        """How many children this upstream has started."""
        return self._spawned

    @property
    def spares_ready(self) -> int:
        return len(self.spare_pool.ready)

    @property
    def _pool(self) -> deque[Child]:
        """The warm spares, oldest first (`SparePool.ready`), under the name the tests read."""
        return self.spare_pool.ready

    @property
    def _starting(self) -> set[asyncio.Task[Child | None]]:
        """The spares being started (`SparePool.starting`), under the name the tests read."""
        return self.spare_pool.starting

    async def child_for(self, link: StdioLink) -> Child:
        """A child for `link`: a warm spare, else one being started for the pool, else a fresh one
        (`SparePool.child_for`)."""
        return await self.spare_pool.child_for(link.on_line, link.on_exit)

    def replenish(self) -> None:
        """A child of this command answered: fill the warm pool (`SparePool.replenish`)."""
        self.spare_pool.replenish()

    def reap_idle_spares(self) -> int:
        """Stop the spares unused for `spare_idle_s`, keeping one (the pool refills as sessions take
        them again); returns how many were stopped. Called by the service's idle reaper."""
        return self.spare_pool.reap_idle()

    @property
    def children(self) -> int:
        n = sum(1 for link in self._links if link.child is not None and link.child.alive)
        others = [*self._modern_links(), *(self._shared.links if self._shared is not None else ())]
        for link in others:
            if link is not None and link.child is not None and link.child.alive:
                n += 1
        return n

    def reap_idle_modern(self) -> int:
        """`--stdio-modern-children N`: stop the 2026 children beyond the first unused for
        `spare_idle_s` (modern_pool.py). Called by the service's idle reaper."""
        pool = self._modern_pool
        return pool.reap_idle(self.spare_idle_s, self._in_background) if pool is not None else 0

    def reap_idle_shared(self) -> int:
        """`--stdio-sessions shared`: stop the shared children unused for `spare_idle_s` with no
        session on them, keeping one (shared.py). Called by the service's
        idle reaper."""
        return self._shared.reap_idle(self.spare_idle_s) if self._shared is not None else 0
