"""`--stdio-sessions shared`: every 2025 session served by a small set of shared stdio children
(`--stdio-shared-children N`), for servers that keep no state per session (docs/reliability.md,
"Sessions").

Without it each 2025 session starts its own server process, and a session per call pays a process
start per call. Here at most N children (`SharedChild`, each a supervised `StdioLink`: respawned
after a crash, its handshake replayed) serve every session:

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import INTERNAL_ERROR, LEGACY_VERSIONS, Message, RequestId, error, valid_id
from proxy.telemetry.shed import SHED
from proxy.upstream.base import Era, Exchange, OnMessage, initialize_request
from proxy.upstream.startwait import StartTimedOut

if TYPE_CHECKING:
    from proxy.upstream.stdio import StdioLink, StdioUpstream

log = logging.getLogger("proxy.upstream.stdio_shared")

# RFC 5424 severities as MCP names them, most verbose first.
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_RANK = {name: rank for rank, name in enumerate(LEVELS)}
LIST_CHANGED = frozenset(
    {
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
    }
)
_SERVER_REQUESTS_KEPT = 1024  # unanswered server requests remembered per session (then the oldest go)


class SharedChild:
    """One of the shared children: its link, the sessions homed on it, the sessions with requests
    in flight on it, and its subscription table."""

    def __init__(self, owner: SharedSessions, index: int) -> None:
        self.owner = owner
        self.index = index
        self.link: StdioLink = self._new_link()
        self.initialized = False
        self.homed: set[SessionLink] = set()
        self.busy: dict[SessionLink, int] = {}  # requests in flight, per session
        self.subscriptions: dict[str, set[SessionLink]] = {}
        self.used_at = time.monotonic()
        self.warming = False  # being started in the background (`SharedSessions.warm`)
        self._initializing: asyncio.Task[None] | None = None

    def _new_link(self) -> StdioLink:
        from proxy.upstream.stdio import StdioLink

        link = StdioLink(self.owner.upstream, Era.LEGACY, takes_spare=False)
        link.set_unsolicited_handler(self._untied)
        link.replay_after_handshake = self._state
        return link

    @property
    def running(self) -> bool:
        child = self.link._child
        return self.initialized and child is not None and child.alive

    @property
    def backing_off(self) -> bool:
        child = self.link._child
        return (child is None or not child.alive) and self.link._next_spawn_at > time.monotonic()

    def tied(self) -> SessionLink | None:
        """The one session with requests in flight here (None: no session, or several)."""
        if len(self.busy) != 1:
            return None
        return next(iter(self.busy))

    async def ready(self) -> dict[str, Any]:
        """Initialize this child once (a respawn replays it by itself); its `initialize` result.
        The handshake runs in a task of its own: a caller that stops waiting (a cancelled request)
        does not leave the child half initialized."""
        if not self.initialized or self.owner._initialized is None:
            task = self._initializing
            if task is None or task.done():
                task = self._initializing = asyncio.get_running_loop().create_task(self._initialize())
                task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, if nobody waits
            await asyncio.shield(task)
        assert self.owner._initialized is not None
        return self.owner._initialized

    async def _initialize(self) -> None:
        link = self.link
        ex = await link.send_request(initialize_request(link.new_id()))
        child = link._child
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
            raise UpstreamFailure(FailureKind.PROTOCOL, Dispatch.NO, "a shared upstream process refused initialize")
        await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if self.owner._initialized is None:
            self.owner._initialized = result
        level = self.owner.upstream_level
        if level is not None:
            await self._ask(set_level_request(level))
        self.initialized = True

    async def _stop_child(self) -> None:
        """End a child whose handshake failed: the next request starts a fresh one."""
        child = self.link._child
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

    async def _ask(self, message: Message) -> Message:
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
            session._server_request(self, message)
            return
        if method == "notifications/resources/updated":
            params = message.get("params")
            uri = params.get("uri") if isinstance(params, dict) else None
            subscribed = self.subscriptions.get(uri, ()) if isinstance(uri, str) else ()
            if not subscribed:
                SHED.count("dropped_messages", "untied")
            for session in list(subscribed):
                session._deliver(message)
            return
        if method in LIST_CHANGED:
            for session in list(self.homed):
                session._deliver(message)
            return
        if method == "notifications/cancelled":
            params = message.get("params")
            rid: Any = params.get("requestId") if isinstance(params, dict) else None
            asked = self.owner._server_requests.get((self.index, rid)) if valid_id(rid) else None
            if asked is not None:
                session, key = asked
                session._server_request_cancelled(self, rid, key, message)
            return
        session = self.tied()
        if session is None:
            SHED.count("dropped_messages", "untied")
            return
        if method == "notifications/message" and not session.wants(message):
            return  # below the session's own level: what the server would not have sent it
        session._deliver(message)

    def _refuse(self, message: Message) -> None:
        SHED.count("dropped_messages", "untied")
        if not valid_id(message["id"]):
            return
        answer = error(message["id"], INTERNAL_ERROR, "the proxy cannot tie this request to one client")
        self.owner._background(self.link.send_response(answer))

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

    def __init__(self, upstream: StdioUpstream, children: int = 2) -> None:
        self.upstream = upstream
        self.children = [SharedChild(self, i) for i in range(max(1, children))]
        self._initialized: dict[str, Any] | None = None
        self._ids = itertools.count(1)
        self.levels: dict[SessionLink, str] = {}
        self.upstream_level: str | None = None
        # (child index, the child's request id) -> the session asked, and its key for it
        self._server_requests: dict[tuple[int, RequestId], tuple[SessionLink, str]] = {}
        self._level_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def links(self) -> list[StdioLink]:
        return [child.link for child in self.children]

    def new_id(self) -> RequestId:
        # One counter for every child (a request is placed after its id is chosen); strings, so
        # they never meet the links' own integer ids (handshakes, replays).
        return f"s{next(self._ids)}"

    def session(self) -> SessionLink:
        home = min(self.children, key=lambda c: (len(c.homed), not c.running, c.index))
        session = SessionLink(self, home)
        home.homed.add(session)
        return session

    async def initialize_result(self) -> dict[str, Any]:
        if self._initialized is not None:
            return self._initialized
        running = [c for c in self.children if c.running]
        return await (running[0] if running else self.children[0]).ready()

    def place(self, session: SessionLink) -> SharedChild:
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
        return self._background(self._start_all())

    async def _start_all(self) -> None:
        await asyncio.gather(*(self._start(child) for child in self.children))

    def warm(self, child: SharedChild) -> None:
        """Start and initialize `child` in the background."""
        if not child.warming and not child.running:
            self._background(self._start(child))

    async def _start(self, child: SharedChild) -> None:
        child.warming = True
        try:
            if child.initialized and not child.running:  # died: a request respawns it (state replayed)
                await child._ask({"jsonrpc": "2.0", "id": 0, "method": "ping"})
            await child.ready()
        except Exception as exc:  # the next request placed on it starts it again, or says why
            log.info("could not start a shared upstream child: %s", exc)
        finally:
            child.warming = False

    async def set_level(self, session: SessionLink, message: Message) -> dict[str, Any]:
        params = message.get("params")
        level = params.get("level") if isinstance(params, dict) else None
        if level not in _RANK:
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
        wanted = min(self.levels.values(), key=_RANK.__getitem__) if self.levels else None
        if wanted is None or wanted == self.upstream_level:
            return None
        for child in self.children:
            if not child.running:
                continue  # it gets the level when it starts (`ready`) or respawns (`_state`)
            response = await child._ask(set_level_request(wanted))
            if "error" in response:
                refusal = response["error"]
                return refusal if isinstance(refusal, dict) else {"code": INTERNAL_ERROR, "message": "refused"}
        self.upstream_level = wanted
        return None

    async def leave(self, session: SessionLink) -> None:
        for child in self.children:
            child.homed.discard(session)
            child.busy.pop(session, None)
        for key, (asked, _) in list(self._server_requests.items()):
            if asked is session:  # the child must not wait for an answer nobody will give
                del self._server_requests[key]
                child = self.children[key[0]]
                answer = error(key[1], INTERNAL_ERROR, "the client's session ended")
                self._background(child.link.send_response(answer))
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
                    await home._ask(subscribe_request("resources/unsubscribe", uri))
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
            self._background(child.reset().aclose())
            reaped += 1
        if reaped:
            log.info("stopped %d shared upstream children unused for %g s", reaped, idle_s)
        return reaped

    def _background(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        await asyncio.gather(*(child.link.aclose() for child in self.children), return_exceptions=True)


class SessionLink:
    """One 2025 session's view of the shared children: what `Relay` needs of an `UpstreamLink`."""

    era = Era.LEGACY

    def __init__(self, sessions: SharedSessions, home: SharedChild) -> None:
        self._sessions = sessions
        self.home = home
        self._handler: OnMessage = lambda m: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked: dict[str, tuple[SharedChild, RequestId]] = {}  # server requests, by our key
        self._keys = itertools.count(1)
        self._flying: dict[RequestId, SharedChild] = {}

    def new_id(self) -> RequestId:
        return self._sessions.new_id()

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        self._handler = handler

    @property
    def in_flight(self) -> int:
        return len(self._flying)

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        method = message.get("method", "")
        if method == "initialize":
            return self._answered(message, {"result": self._session_initialize(message, await self._cached())})
        if method == "logging/setLevel" and self._offers("logging"):
            return self._answered(message, await self._sessions.set_level(self, message))
        if method in ("resources/subscribe", "resources/unsubscribe") and self._offers("subscribe"):
            return self._answered(message, await self._subscription(method, message))
        child = self._sessions.place(self)
        busy = child.busy
        busy[self] = busy.get(self, 0) + 1  # before any wait: the next placement sees it
        try:
            await child.ready()
            ex = await child.link.send_request(message, on_message=on_message, headers=headers)
        except BaseException:
            self._done(child)
            raise
        ex.transport_state = child
        uid = ex.upstream_id
        self._flying[uid] = child
        ex.response.add_done_callback(lambda _: self._finished(uid, child))
        return ex

    def _finished(self, uid: RequestId, child: SharedChild) -> None:
        self._flying.pop(uid, None)
        self._done(child)

    def _done(self, child: SharedChild) -> None:
        n = child.busy.get(self, 0) - 1
        if n > 0:
            child.busy[self] = n
        else:
            child.busy.pop(self, None)
            child.used_at = time.monotonic()

    def _offers(self, what: str) -> bool:
        """Whether the children said they support it (else the request goes to a child, whose
        own refusal the session gets)."""
        capabilities = (self._sessions._initialized or {}).get("capabilities")
        if not isinstance(capabilities, dict):
            return False
        if what == "logging":
            return "logging" in capabilities
        resources = capabilities.get("resources")
        return isinstance(resources, dict) and bool(resources.get("subscribe"))

    async def _subscription(self, method: str, message: Message) -> dict[str, Any]:
        params = message.get("params")
        uri = params.get("uri") if isinstance(params, dict) else None
        if not isinstance(uri, str):
            return {"error": {"code": -32602, "message": "a resource uri (string) is required"}}
        home = self.home
        await home.ready()
        sessions = home.subscriptions.get(uri)
        if method == "resources/subscribe":
            if sessions:
                sessions.add(self)
                return {"result": {}}
            # (a respawn meanwhile replays the table, this uri included once it is in it)
            response = await home._ask(subscribe_request(method, uri))
            if "error" not in response:
                home.subscriptions.setdefault(uri, set()).add(self)
            return {k: v for k, v in response.items() if k in ("result", "error")}
        if not sessions or self not in sessions:
            return {"result": {}}  # not subscribed: nothing to undo
        sessions.discard(self)
        if sessions:
            return {"result": {}}
        del home.subscriptions[uri]
        response = await home._ask(subscribe_request(method, uri))
        return {k: v for k, v in response.items() if k in ("result", "error")}

    async def _cached(self) -> dict[str, Any]:
        return await self._sessions.initialize_result()

    def _session_initialize(self, message: Message, cached: dict[str, Any]) -> dict[str, Any]:
        params = message.get("params")
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        result = dict(cached)
        if isinstance(asked, str) and asked in LEGACY_VERSIONS:
            result["protocolVersion"] = asked
        return result

    def _answered(self, message: Message, body: dict[str, Any]) -> Exchange:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        ex = Exchange(message["id"], message.get("method", ""), None, loop.create_future(), written=True)
        ex.response.set_result({"jsonrpc": "2.0", "id": message["id"], **body})
        return ex

    # -- from the children ----------------------------------------------------------------------
    def wants(self, message: Message) -> bool:
        level = self._sessions.levels.get(self)
        if level is None:
            return True
        params = message.get("params")
        said = params.get("level") if isinstance(params, dict) else None
        return _RANK.get(said, len(LEVELS)) >= _RANK[level] if isinstance(said, str) else True

    def _deliver(self, message: Message) -> None:
        self._handler(message)

    def _server_request(self, child: SharedChild, message: Message) -> None:
        """A child's request tied to this session: under a key of ours (two children may use the
        same id), answered back to that child under its own id."""
        key = f"c{child.index}-{next(self._keys)}"
        asked = self._asked
        if len(asked) >= _SERVER_REQUESTS_KEPT:
            old_child, old_id = asked.pop(next(iter(asked)))
            self._sessions._server_requests.pop((old_child.index, old_id), None)
        asked[key] = (child, message["id"])
        self._sessions._server_requests[(child.index, message["id"])] = (self, key)
        self._handler({**message, "id": key})

    def _server_request_cancelled(self, child: SharedChild, rid: RequestId, key: str, message: Message) -> None:
        self._asked.pop(key, None)
        self._sessions._server_requests.pop((child.index, rid), None)
        params = message["params"]
        self._handler({**message, "params": {**params, "requestId": key}})

    # -- to the children ------------------------------------------------------------------------
    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None:
        if message.get("method") != "notifications/cancelled":
            return  # anything else a session notifies is not passed on (module docstring)
        params = message.get("params")
        rid = params.get("requestId") if isinstance(params, dict) else None
        child = self._flying.get(rid) if valid_id(rid) else None
        if child is not None:
            await child.link.send_notification(message)

    async def send_response(self, message: Message) -> None:
        key = message.get("id")
        asked = self._asked.pop(key, None) if isinstance(key, str) else None
        if asked is None:
            log.info("dropped a client response for an unknown server request")
            return
        child, rid = asked
        self._sessions._server_requests.pop((child.index, rid), None)
        await child.link.send_response({**message, "id": rid})

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        child = exchange.transport_state
        if isinstance(child, SharedChild):
            await child.link.cancel(exchange, reason)
        # else: answered by the proxy itself, nothing upstream to cancel

    async def aclose(self) -> None:
        # the children serve the other sessions; the relay cancelled this one's requests
        await self._sessions.leave(self)
