"""`--stdio-sessions shared`: every 2025 session served by a small set of shared stdio children
(`--stdio-shared-children N`), for servers that keep no state per session (docs/reliability.md,
"Sessions").

Without it each 2025 session starts its own server process, and a session per call pays a process
start per call. Here at most N children (`SharedChild`, each a supervised `StdioLink`: respawned
after a crash, its handshake replayed) serve every session, each session through its own
`SessionLink` (shared_link.py; the children know it by `Session`, what they need of it):

- Each child is initialized by the proxy, with its own `initialize` (`notifications/initialized`
  follows), before its first request; each session's `initialize` is answered by the proxy from
  the first such answer, with the session's requested revision when it is a 2025 one.
- Placement is per request, so that what a child sends without naming a request can still be tied
  to one session: a request goes to the child where its session already has requests in flight,
  else to a running child where no other session has requests in flight (its session's home child
  first). When every running child has another session's request, the next child is started in
  the background (at most N in all) and the request meanwhile shares the running child with the
  fewest requests: a process start costs a request far more than sharing does. Only when no child
  runs does a request wait for one to start. A child in its crash backoff is passed over while
  another can take the request. All N children are started once the upstream answered the
  start-up probe (the proxy is ready once they answered or gave up); after a child was reaped or
  died, the next contention starts it again in the background. A session's home child (the one with
  the fewest sessions when it opened) holds its resource subscriptions.
- Request ids and progress tokens are the proxy's own (one counter for every child), mapped back by
  each session's relay, so sessions never see each other's answers or progress.
- What a child sends without naming a request goes to the one session with requests in flight on
  that child: log lines (filtered by that session's own level), server-to-client requests
  (sampling, elicitation, roots/list: the answer goes back to that child under its own id) and
  other notifications. With no session, or several, in flight there, it reaches none: dropped and
  counted (`mcp_recovery_dropped_messages_total{reason="untied"}`), a server request answered with
  an error so the child does not wait for it. List-changed notifications go to every session homed
  on the child. No more sessions in flight at once than children therefore routes everything.
- `resources/subscribe` and `resources/unsubscribe`: a table per child (uri -> sessions). The first
  session to subscribe to a uri subscribes the child; later ones are answered by the proxy; the
  child is unsubscribed when the last session leaves the uri (or closes). A
  `notifications/resources/updated` goes to every session subscribed to its uri on that child.
- `logging/setLevel`: each session's level is kept by the proxy; the children run at the most
  verbose level any open session asked for, and each session gets only the log lines at or above
  its own level (a session that never set one gets every line tied to it, as it would from the
  server's default). One session's level never silences another. (Both are relayed to a child
  as they are when the children do not offer `logging` or `resources.subscribe`: its refusal is
  the answer.)
- A child that dies fails the requests in flight on it (`CLOSED`; the engine resolves its calls
  like any crash); the next request placed on it starts a replacement, which gets the handshake,
  the log level and its subscriptions replayed (`StdioLink.replay_after_handshake`).
- Children with no session homed on them and unused for the idle time are stopped (`reap_idle`),
  keeping one; they start again when placement needs them.
- A session's notifications other than cancellation (`notifications/initialized`,
  `notifications/roots/list_changed`) are not passed on: the children were initialized by the
  proxy, and roots are asked of the session a child's `roots/list` request is tied to.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Protocol

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import INTERNAL_ERROR, Message, RequestId, bounded, error, valid_id
from proxy.telemetry.shed import SHED
from proxy.upstream.base import Era, Exchange, initialize_request
from proxy.upstream.stdio.link import LinkOwner, StdioLink
from proxy.upstream.stdio.startwait import StartTimedOut

log = logging.getLogger("proxy.upstream.stdio_shared")

# RFC 5424 severities as MCP names them, most verbose first.
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
RANK = {name: rank for rank, name in enumerate(LEVELS)}
LIST_CHANGED = frozenset(
    {
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
    }
)


class SharedOwner(LinkOwner, Protocol):
    """What the shared children need of the upstream that owns them (`SharedOwner`)."""

    async def answer_of(self, link: StdioLink, ex: Exchange) -> Message:
        """The answer to one of the proxy's own requests on `link`, with a start's allowance."""
        ...


class Session(Protocol):
    """What a shared child needs of a session on it (`SessionLink`, shared_link.py)."""

    @property
    def home(self) -> SharedChild:
        """The child that holds the session's subscriptions."""
        ...

    def wants(self, message: Message) -> bool:
        """Whether a log line is at or above the session's own level."""
        ...

    def deliver(self, message: Message) -> None:
        """Pass a message of a child on to the session's client."""
        ...

    def server_request(self, child: SharedChild, message: Message) -> None:
        """A request of `child` tied to this session."""
        ...

    def server_request_cancelled(self, child: SharedChild, rid: RequestId, key: str, message: Message) -> None:
        """`child` cancelled its request `rid`, known to the client as `key`."""
        ...


class SharedChild:
    """One of the shared children: its link, the sessions homed on it, the sessions with requests
    in flight on it, and its subscription table."""

    def __init__(self, owner: SharedSessions, index: int) -> None:
        self.owner = owner
        self.index = index
        self.link: StdioLink = self._new_link()
        self.initialized = False
        self.homed: set[Session] = set()
        self.busy: dict[Session, int] = {}  # requests in flight, per session
        self.subscriptions: dict[str, set[Session]] = {}
        self.used_at = time.monotonic()
        self.warming = False  # being started in the background (`SharedSessions.warm`)
        self._initializing: asyncio.Task[None] | None = None

    def _new_link(self) -> StdioLink:
        link = StdioLink(self.owner.upstream, Era.LEGACY, takes_spare=False)
        link.set_unsolicited_handler(self._untied)
        link.replay_after_handshake = self._state
        return link

    @property
    def running(self) -> bool:
        child = self.link.child
        return self.initialized and child is not None and child.alive

    @property
    def backing_off(self) -> bool:
        child = self.link.child
        return (child is None or not child.alive) and self.link.next_spawn_at > time.monotonic()

    def tied(self) -> Session | None:
        """The one session with requests in flight here (None: no session, or several)."""
        if len(self.busy) != 1:
            return None
        return next(iter(self.busy))

    async def ready(self) -> dict[str, Any]:
        """Initialize this child once (a respawn replays it by itself); its `initialize` result.
        The handshake runs in a task of its own: a caller that stops waiting (a cancelled request)
        does not leave the child half initialized."""
        if not self.initialized or self.owner.initialize_answer is None:
            task = self._initializing
            if task is None or task.done():
                task = self._initializing = asyncio.get_running_loop().create_task(self._initialize())
                task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, if nobody waits
            await asyncio.shield(task)
        assert self.owner.initialize_answer is not None
        return self.owner.initialize_answer

    async def _initialize(self) -> None:
        link = self.link
        ex = await link.send_request(initialize_request(link.new_id()))
        child = link.child
        try:
            if child is None:  # it exited already, and failed `ex` as it went
                response = await ex.response
            else:
                response = await self.owner.upstream.first_answer(child, ex.response)
        except StartTimedOut as exc:
            await link.cancel(ex)
            await self._stop_child()  # its late answer must not meet a second initialize
            raise UpstreamFailure(
                FailureKind.TIMEOUT, Dispatch.NO, f"a shared upstream process did not answer initialize: {exc}"
            ) from None
        result = response.get("result")
        if not isinstance(result, dict):
            await self._stop_child()
            refused = response.get("error")
            code = refused.get("code") if isinstance(refused, dict) else None
            said = bounded(str(refused.get("message")), 200) if isinstance(refused, dict) else "no result"
            raise UpstreamFailure(
                FailureKind.PROTOCOL,
                Dispatch.NO,
                f"a shared upstream process refused initialize ({code}: {said})",
                refusal_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            )
        await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if self.owner.initialize_answer is None:
            self.owner.initialize_answer = result
        level = self.owner.upstream_level
        if level is not None:
            await self.ask(set_level_request(level))
        self.initialized = True

    async def _stop_child(self) -> None:
        """End a child whose handshake failed: the next request starts a fresh one."""
        child = self.link.child
        if child is not None:
            await child.terminate()

    def _state(self) -> list[Message]:
        """What a respawned child is told after its handshake: the level, its subscriptions."""
        replay: list[Message] = []
        if self.owner.upstream_level is not None:
            replay.append(set_level_request(self.owner.upstream_level))
        for uri, sessions in self.subscriptions.items():
            if sessions:
                replay.append(subscribe_request("resources/subscribe", uri))
        return replay

    async def ask(self, message: Message) -> Message:
        """One request of the proxy's own to this child, bounded; its response."""
        link = self.link
        ex = await link.send_request({**message, "id": link.new_id()})
        try:
            return await self.owner.upstream.answer_of(link, ex)  # a start's allowance on a busy host
        except TimeoutError:
            await link.cancel(ex)
            raise UpstreamFailure(
                FailureKind.TIMEOUT, Dispatch.UNKNOWN, f"a shared upstream process did not answer {message['method']}"
            ) from None

    def _untied(self, message: Message) -> None:
        """Whatever this child sends that no request waits for (module docstring)."""
        method = message.get("method")
        if method is None:
            return  # a late response to a cancelled attempt
        if "id" in message:
            session = self.tied()
            if session is None or not valid_id(message["id"]):
                self._refuse(message)
                return
            session.server_request(self, message)
            return
        if method == "notifications/resources/updated":
            params = message.get("params")
            uri = params.get("uri") if isinstance(params, dict) else None
            subscribed = self.subscriptions.get(uri, ()) if isinstance(uri, str) else ()
            if not subscribed:
                SHED.count("dropped_messages", "untied")
            for session in list(subscribed):
                session.deliver(message)
            return
        if method in LIST_CHANGED:
            for session in list(self.homed):
                session.deliver(message)
            return
        if method == "notifications/cancelled":
            params = message.get("params")
            rid: Any = params.get("requestId") if isinstance(params, dict) else None
            asked = self.owner.server_requests.get((self.index, rid)) if valid_id(rid) else None
            if asked is not None:
                session, key = asked
                session.server_request_cancelled(self, rid, key, message)
            return
        session = self.tied()
        if session is None:
            SHED.count("dropped_messages", "untied")
            return
        if method == "notifications/message" and not session.wants(message):
            return  # below the session's own level: what the server would not have sent it
        session.deliver(message)

    def _refuse(self, message: Message) -> None:
        SHED.count("dropped_messages", "untied")
        if not valid_id(message["id"]):
            return
        answer = error(message["id"], INTERNAL_ERROR, "the proxy cannot tie this request to one client")
        self.owner.background(self.link.send_response(answer))

    def reset(self) -> StdioLink:
        """Stop using this child (reaped): a fresh link takes its place, started when needed."""
        old, self.link = self.link, self._new_link()
        self.initialized = False
        self._initializing = None
        return old


def set_level_request(level: str) -> Message:
    return {"jsonrpc": "2.0", "id": 0, "method": "logging/setLevel", "params": {"level": level}}


def subscribe_request(method: str, uri: str) -> Message:
    return {"jsonrpc": "2.0", "id": 0, "method": method, "params": {"uri": uri}}


class SharedSessions:
    """The shared children, the cached answer to `initialize`, and the sessions' log levels."""

    def __init__(self, upstream: SharedOwner, children: int = 2) -> None:
        self.upstream = upstream
        self.children = [SharedChild(self, i) for i in range(max(1, children))]
        self.initialize_answer: dict[str, Any] | None = None  # the first child's, for every session
        self._ids = itertools.count(1)
        self.levels: dict[Session, str] = {}
        self.upstream_level: str | None = None
        # (child index, the child's request id) -> the session asked, and its key for it
        self.server_requests: dict[tuple[int, RequestId], tuple[Session, str]] = {}
        self._level_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def links(self) -> list[StdioLink]:
        return [child.link for child in self.children]

    def new_id(self) -> RequestId:
        # One counter for every child (a request is placed after its id is chosen); strings, so
        # they never meet the links' own integer ids (handshakes, replays).
        return f"s{next(self._ids)}"

    def home_for_session(self) -> SharedChild:
        """The home child of a session that opens now: the one with the fewest sessions homed."""
        return min(self.children, key=lambda c: (len(c.homed), not c.running, c.index))

    async def initialize_result(self) -> dict[str, Any]:
        if self.initialize_answer is not None:
            return self.initialize_answer
        running = [c for c in self.children if c.running]
        return await (running[0] if running else self.children[0]).ready()

    def place(self, session: Session) -> SharedChild:
        """The child for `session`'s next request (module docstring: placement)."""
        children = self.children
        for child in children:
            if session in child.busy:
                return child
        home = session.home
        running = [c for c in children if c.running and not c.backing_off]
        free = [c for c in running if not c.busy]
        if free:
            return home if home in free else free[0]
        idle = [c for c in children if not c.running and not c.busy and not c.backing_off]
        if running:
            # Every running child has another session's request: start the next one for the
            # requests to come, and meanwhile share a running one (a process start, seconds on a
            # busy machine, would cost this request more than sharing does).
            if idle:
                self.warm(home if home in idle else idle[0])
            return min(running, key=lambda c: (len(c.busy), c is not home, c.index))
        if idle:
            return home if home in idle else idle[0]
        usable = [c for c in children if not c.backing_off] or [home]
        return min(usable, key=lambda c: (len(c.busy), c is not home, c.index))

    def start_all(self) -> asyncio.Task[Any]:
        """Start and initialize every child at once, in the background (the upstream's probe
        awaits it, so that a ready proxy has its children running); one that fails is started
        again when a request needs it."""
        return self.background(self._start_all())

    async def _start_all(self) -> None:
        await asyncio.gather(*(self._start(child) for child in self.children))

    def warm(self, child: SharedChild) -> None:
        """Start and initialize `child` in the background."""
        if not child.warming and not child.running:
            self.background(self._start(child))

    async def _start(self, child: SharedChild) -> None:
        child.warming = True
        try:
            if child.initialized and not child.running:  # died: a request respawns it (state replayed)
                await child.ask({"jsonrpc": "2.0", "id": 0, "method": "ping"})
            await child.ready()
        except Exception as exc:  # the next request placed on it starts it again, or says why
            log.info("could not start a shared upstream child: %s", exc)
        finally:
            child.warming = False

    async def set_level(self, session: Session, message: Message) -> dict[str, Any]:
        params = message.get("params")
        level = params.get("level") if isinstance(params, dict) else None
        if level not in RANK:
            return {"error": {"code": -32602, "message": f"unknown log level (one of {', '.join(LEVELS)})"}}
        async with self._level_lock:
            before = self.levels.get(session)
            self.levels[session] = level
            refused = await self._apply_level()
            if refused is not None:
                if before is None:
                    del self.levels[session]
                else:
                    self.levels[session] = before
                return {"error": refused}
        return {"result": {}}

    async def _apply_level(self) -> dict[str, Any] | None:
        """Run the started children at the most verbose level an open session asked for; the
        first child's refusal (as a JSON-RPC error body), if it refused."""
        wanted = min(self.levels.values(), key=RANK.__getitem__) if self.levels else None
        if wanted is None or wanted == self.upstream_level:
            return None
        for child in self.children:
            if not child.running:
                continue  # it gets the level when it starts (`ready`) or respawns (`_state`)
            response = await child.ask(set_level_request(wanted))
            if "error" in response:
                refusal = response["error"]
                return refusal if isinstance(refusal, dict) else {"code": INTERNAL_ERROR, "message": "refused"}
        self.upstream_level = wanted
        return None

    async def leave(self, session: Session) -> None:
        for child in self.children:
            child.homed.discard(session)
            child.busy.pop(session, None)
        for key, (asked, _) in list(self.server_requests.items()):
            if asked is session:  # the child must not wait for an answer nobody will give
                del self.server_requests[key]
                child = self.children[key[0]]
                answer = error(key[1], INTERNAL_ERROR, "the client's session ended")
                self.background(child.link.send_response(answer))
        home = session.home
        emptied = []
        for uri, sessions in list(home.subscriptions.items()):
            if session in sessions:
                sessions.discard(session)
                if not sessions:
                    del home.subscriptions[uri]
                    emptied.append(uri)
        for uri in emptied:
            if home.running:
                try:
                    await home.ask(subscribe_request("resources/unsubscribe", uri))
                except UpstreamFailure as failure:
                    log.info("could not unsubscribe a shared upstream process: %s", failure.detail)
        home.used_at = time.monotonic()
        if self.levels.pop(session, None) is not None:
            async with self._level_lock:
                try:
                    await self._apply_level()  # a quieter level, when the most verbose session left
                except UpstreamFailure as failure:
                    log.info("could not set a shared upstream process's log level: %s", failure.detail)

    def reap_idle(self, idle_s: float) -> int:
        """Stop the children with no session homed and no request for `idle_s`, keeping one
        running (the first); returns how many were stopped."""
        now = time.monotonic()
        running = [c for c in self.children if c.running]
        reaped = 0
        for child in reversed(running):
            if len(running) - reaped <= 1:
                break
            if child.homed or child.busy or now - child.used_at <= idle_s:
                continue
            self.background(child.reset().aclose())
            reaped += 1
        if reaped:
            log.info("stopped %d shared upstream children unused for %g s", reaped, idle_s)
        return reaped

    def background(self, coroutine: Any) -> asyncio.Task[Any]:
        """Run `coroutine` without waiting for it, kept (strongly) until it ends."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        await asyncio.gather(*(child.link.aclose() for child in self.children), return_exceptions=True)
