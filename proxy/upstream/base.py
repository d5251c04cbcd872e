"""The small interface every upstream transport implements, and the pieces they share.

An `UpstreamLink` is a message-level connection to the upstream server, in one protocol era:
- a *legacy* link serves exactly one downstream 2025 session (its own stdio child, HTTP session or
  SSE connection); it remembers the client's `initialize` request and `notifications/initialized`
  so that it can re-establish the upstream session (respawned child, expired HTTP session) before
  the next request, without that counting as an attempt;
- a *modern* link is shared by all 2026-07-28 requests.

Contract of `send_request`: the message's `id` comes from `new_id()`. It returns an `Exchange`
once the request was handed to the transport, or raises `UpstreamFailure` (with `dispatched=NO`
when nothing was sent). The exchange's `response` future then resolves to the upstream's JSON-RPC
response (result or error) or fails with `UpstreamFailure`. Messages tied to the request
(`notifications/progress` whose token equals the upstream id, and anything the transport carried
on that request's own response stream) go to `on_message`; everything else goes to the link's
unsolicited handler. Links never retry and never time out requests: the engine owns both.
`cancel` stops an exchange as the transport and era require and drops its late response.

`on_write` (optional): called synchronously, without blocking, once the request may have reached
the upstream: as it is written, or (where another task of the link writes it) when `send_request`
returns or is cancelled; maybe more than once, and always before `send_request` returns or
raises. It matters when `send_request` is cancelled after the write: the caller then has no
exchange, yet must count the request as sent (dispatch unknown, never "not sent"). A link whose
`send_request` is cancelled after the write cancels that request upstream itself, as `cancel`
would.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Final, Protocol, TypeGuard

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import (
    LATEST_LEGACY,
    LATEST_MODERN,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    Message,
    RequestId,
)
from proxy.telemetry.budget import TokenBucket

OnMessage = Callable[[Message], None]
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


CLIENT_INFO: Final = {"name": "mcp-recovery-proxy", "version": "0.1.0"}


def discover_request(request_id: RequestId) -> Message:
    """The proxy's own 2026 `server/discover` (probes, and readying a fresh modern stdio child)."""
    meta: dict[str, Any] = {
        META_PROTOCOL_VERSION: LATEST_MODERN,
        META_CLIENT_CAPABILITIES: {},
        META_CLIENT_INFO: CLIENT_INFO,
    }
    return {"jsonrpc": "2.0", "id": request_id, "method": "server/discover", "params": {"_meta": meta}}


def initialize_request(request_id: RequestId) -> Message:
    """The proxy's own 2025 `initialize` (probes and health checks), which every server answers."""
    params = {"protocolVersion": LATEST_LEGACY, "capabilities": {}, "clientInfo": CLIENT_INFO}
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}


class Era(StrEnum):
    LEGACY = "legacy"  # the 2025 handshake revisions (initialize, sessions)
    MODERN = "modern"  # 2026-07-28, stateless


@dataclass(eq=False, slots=True)
class Exchange:
    """One request in flight on an upstream link."""

    upstream_id: RequestId
    method: str
    on_message: OnMessage | None
    response: asyncio.Future[Message]
    written: bool = False  # bytes may have reached the peer: a failure from now on has dispatch unknown
    cancelled: bool = False
    transport_state: object = None  # adapter-private (e.g. the HTTP response stream task)
    heard: bool = False  # HTTP: the head of the answer came (the upstream has taken the request)
    on_heard: asyncio.Future[None] | None = None  # HTTP: a cancellation waiting for that head
    # The era bridge asks the client for input within this exchange: it calls `on_input(True)`
    # while it waits for the answers, `on_input(False)` once they are sent on (the relay's timer
    # then lets only the deadline run meanwhile). Set by the caller where `asks_input`.
    asks_input: bool = False
    on_input: Callable[[bool], None] | None = None
    # A log message that names no request (a 2026 server over stdio names none) goes to this
    # exchange while it is the only request in flight on its link (`PendingTable.route_related`):
    # set when the request asks for log messages (a 2026 `_meta` log level, which the era bridge
    # also sends for its 2025 sessions). With several requests in flight on the link such a message
    # could be any caller's (and carry its data), so it is nobody's to have.
    takes_untied_logs: bool = False


def mark_heard(ex: Exchange) -> None:
    """The head of the answer to `ex`'s request came (the upstream has taken the request): wakes a
    cancellation waiting for that (`wait_heard`)."""
    ex.heard = True
    waiter = ex.on_heard
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


async def wait_heard(ex: Exchange, timeout_s: float) -> None:
    """Wait, at most `timeout_s`, until the head of the answer to `ex`'s request came (`mark_heard`,
    or a failure that wakes `on_heard`), or the exchange's task ended. An exchange with neither a
    task nor a flight (`transport_state` None) has ended: no wait."""
    task = ex.transport_state
    if task is None:
        return
    waiter = ex.on_heard = asyncio.get_running_loop().create_future()
    waits: set[asyncio.Future[Any]] = {waiter}
    if isinstance(task, asyncio.Task):
        waits.add(task)
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ex.on_heard = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the upstream speaks, learnt by probing it."""

    legacy: bool
    modern: bool
    detail: str = ""
    # `legacy` is an assumption, not an answer (a stdio server whose `server/discover` names only
    # 2026-07-28, as dual-era servers do too): the first 2025 session's `initialize` settles it.
    legacy_assumed: bool = field(default=False, repr=False)


class UpstreamLink(Protocol):
    era: Era

    def new_id(self) -> RequestId: ...

    def set_unsolicited_handler(self, handler: OnMessage) -> None: ...

    async def send_request(
        self,
        message: Message,
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange: ...

    async def send_notification(self, message: Message, *, headers: Mapping[str, str] | None = None) -> None: ...

    async def send_response(self, message: Message) -> None: ...

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None: ...

    async def aclose(self) -> None: ...


class Health(Enum):
    """Whether an upstream answers: UNKNOWN until the first verdict, then UP from any answer and
    DOWN from a failure that shows nothing answers any more, back and forth."""

    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


class UpstreamHealth:
    """Whether the upstream answers, as its adapter sees it in the traffic it relays; the source of
    `mcp_recovery_upstream_up` and of `/readyz` after the start-up probe.

    `state` is `Health.UNKNOWN` until the first verdict, then UP from any answer (a JSON-RPC
    response, result or error) until a failure that shows nothing answers any more: for stdio,
    losing the last child that had answered (it exited, or a new one could not be started); for
    HTTP and SSE, a connection that cannot be established. Hot paths compare `state` with
    `Health.UP` and call `answered()` only when it differs, so an answer costs one comparison.
    Every change of `state`, and every unexpected exit of a supervised child (`restarts`,
    cumulative), is reported once to `on_report`. `up` reads the state as None (unknown), True or
    False, the form the status page and readiness show.
    """

    __slots__ = ("on_report", "restarts", "state", "why")

    def __init__(self) -> None:
        self.state = Health.UNKNOWN
        self.why: str | None = None  # what the last failure was, while down
        self.restarts = 0
        self.on_report: Callable[[], None] | None = None

    @property
    def up(self) -> bool | None:
        state = self.state
        return None if state is Health.UNKNOWN else state is Health.UP

    def answered(self) -> None:
        if self.state is Health.UP:
            return
        self.state, self.why = Health.UP, None
        self.report()

    def failed(self, why: str) -> bool:
        """Nothing answers any more. True if that was news (and was reported)."""
        self.why = why
        if self.state is Health.DOWN:
            return False
        self.state = Health.DOWN
        self.report()
        return True

    def report(self) -> None:
        if self.on_report is not None:
            self.on_report()


class Upstream(Protocol):
    """A configured upstream server: it probes, opens links, and keeps its `health`."""

    description: str
    health: UpstreamHealth

    async def probe(self) -> Capabilities: ...

    async def check(self) -> Capabilities | None:
        """Ask the upstream something now, bounded by the adapter's own timeouts. Its answer marks
        `health` up; no answer marks it down and raises `UpstreamFailure` with the reason. Returns
        the upstream's eras when the check was a full probe (network upstreams), else None."""
        ...

    async def open(self, era: Era) -> UpstreamLink:
        """A new link for one legacy session, or the shared modern link (same object every time)."""
        ...

    async def aclose(self) -> None: ...


class NoticeBudget(TokenBucket):
    """A token bucket for the log lines an upstream's messages cause one by one (an event that is
    not JSON, a server request with an invalid id): `burst` lines at once, then `rate` a second;
    what it refuses is summed up in one line when logging resumes, so that an upstream writing
    100,000 such events in one response cannot make 100,000 warnings. (A stdio child's stderr and
    non-JSON stdout have a bucket per child: proxy/upstream/stdio/process.py.)"""

    __slots__ = ()

    def __init__(self, burst: int = 100, rate: float = 20.0) -> None:
        super().__init__(burst, rate)

    def log(self, logger: logging.Logger, level: int, text: str) -> None:
        """Log `text` (a fixed message: nothing the upstream chose) if the bucket allows it."""
        if not self.allow():
            return
        dropped = self.take_dropped()
        if dropped:
            logger.log(level, "%d more upstream messages like the next were not logged", dropped)
        logger.log(level, text)


# Shared by every link of the process: what one upstream can make the proxy log is bounded in
# total, whatever the number of its sessions.
UPSTREAM_NOTICES = NoticeBudget()


def ours(value: object) -> TypeGuard[RequestId]:
    """Whether `value` can be an id (or progress token, or subscription id) the proxy sent: a str
    or an int, compared by type as well as value. Python takes `true` and `1.0` for 1 (equal, and
    the same dict key): by value alone, an upstream answering `"id": true` would resolve request 1
    of a stdio link, and an answer with `"id": 1.0` on a 2025 HTTP request's own stream would be
    taken for that request's answer yet resolve nothing, leaving its caller to wait for its
    timeout."""
    cls = value.__class__
    return cls is int or cls is str


@dataclass(eq=False)
class PendingTable:
    """Request ids and in-flight exchanges of one link; routes responses and progress by id."""

    prefix: str = ""
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _pending: dict[RequestId, Exchange] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None

    def new_id(self) -> RequestId:
        n = next(self._ids)
        return f"{self.prefix}{n}" if self.prefix else n

    def add(self, message: Message, on_message: OnMessage | None) -> Exchange:
        loop = self._loop
        if loop is None:  # asked once: on Python 3.11 each get_running_loop() is a getpid() syscall
            loop = self._loop = asyncio.get_running_loop()
        ex = Exchange(message["id"], message.get("method", ""), on_message, loop.create_future())
        params = message.get("params")
        if isinstance(params, dict):
            meta = params.get("_meta")
            ex.takes_untied_logs = isinstance(meta, dict) and META_LOG_LEVEL in meta
        self._pending[ex.upstream_id] = ex
        return ex

    def get(self, upstream_id: RequestId) -> Exchange | None:
        return self._pending.get(upstream_id)

    def discard(self, ex: Exchange) -> None:
        if self._pending.get(ex.upstream_id) is ex:
            del self._pending[ex.upstream_id]

    def __len__(self) -> int:
        return len(self._pending)

    def exchanges(self) -> list[Exchange]:
        return list(self._pending.values())

    def resolve(self, message: Message) -> bool:
        """Deliver a response to its exchange. False if nobody waits for it (late or unknown id)."""
        upstream_id: Any = message.get("id")
        cls = upstream_id.__class__  # `ours`, inlined: this runs for every answer
        if cls is not int and cls is not str:
            return False  # not one of ours (and maybe not hashable): a peer's malformed answer
        ex = self._pending.pop(upstream_id, None)
        if ex is None or ex.response.done():
            return False
        ex.response.set_result(message)
        return True

    def route_progress(self, message: Message) -> bool:
        """Deliver `notifications/progress` whose token is one of our request ids."""
        params = message.get("params")
        if not isinstance(params, dict):
            return False
        token = params.get("progressToken")
        ex = self._pending.get(token) if ours(token) else None
        if ex is None or ex.on_message is None:
            return False
        ex.on_message(message)
        return True

    def route_subscription(self, message: Message) -> bool:
        """Deliver a notification of a 2026 `subscriptions/listen` stream to the listen request.

        The SDK uses the listen request's id as the subscription id, so a notification whose
        `_meta["io.modelcontextprotocol/subscriptionId"]` is one of our ids belongs to it.
        """
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if not isinstance(meta, dict):
            return False
        subscription = meta.get(SUBSCRIPTION_ID)
        ex = self._pending.get(subscription) if ours(subscription) else None
        if ex is None or ex.on_message is None:
            return False
        ex.on_message(message)
        return True

    def route_related(self, message: Message) -> bool:
        """Progress by token, subscription notifications by subscription id (what stdio can tell),
        and a log message to the one request in flight that takes untied log messages."""
        method = message.get("method")
        if method == "notifications/progress":
            return self.route_progress(message)
        if "id" in message:
            return False
        if self.route_subscription(message):
            return True
        return method == "notifications/message" and self.route_sole_log(message)

    def route_sole_log(self, message: Message) -> bool:
        """Deliver a log message that names no request to the exchange in flight when it is the
        only one (listen streams aside: a server logs on behalf of a request, never of a stream)
        and takes untied log messages (`Exchange.takes_untied_logs`)."""
        sole: Exchange | None = None
        for ex in self._pending.values():
            if ex.method == "subscriptions/listen":
                continue
            if sole is not None:
                return False
            sole = ex
        if sole is None or not sole.takes_untied_logs or sole.on_message is None:
            return False
        sole.on_message(message)
        return True

    def fail(self, ex: Exchange, failure: UpstreamFailure) -> None:
        self.discard(ex)
        if not ex.response.done():
            ex.response.set_exception(untraced(failure))
            ex.response.exception()  # mark retrieved: a cancelled waiter must not log "never retrieved"

    def fail_all(self, kind: FailureKind, detail: str, keep: Exchange | None = None) -> None:
        """Fail every exchange in flight, all but `keep` (which stays in the table)."""
        pending, self._pending = self._pending, {}
        if keep is not None and pending.pop(keep.upstream_id, None) is keep:
            self._pending[keep.upstream_id] = keep
        for ex in pending.values():
            if not ex.response.done():
                dispatched = Dispatch.UNKNOWN if ex.written else Dispatch.NO
                ex.response.set_exception(UpstreamFailure(kind, dispatched, detail))
                ex.response.exception()


class LinkBase:
    """What every link shares: its pending table and its handler for unsolicited messages."""

    _pending: PendingTable
    _unsolicited: OnMessage
    # Called once a legacy link re-established its upstream session (a respawned child, an expired
    # HTTP session, a reopened SSE stream) and replayed the handshake: whatever else the session
    # held (resource subscriptions) is its owner's to make again.
    on_reestablished: Callable[[], None] | None = None

    def new_id(self) -> RequestId:
        return self._pending.new_id()

    def set_unsolicited_handler(self, handler: OnMessage) -> None:
        self._unsolicited = handler

    @property
    def in_flight(self) -> int:
        return len(self._pending)


@dataclass(eq=False)
class Handshake:
    """What a legacy link replays to re-establish an upstream session: the client's own messages."""

    initialize: Message | None = None
    initialized: Message | None = None

    def observe(self, message: Message) -> None:
        method = message.get("method")
        if method == "initialize":
            self.initialize = message
        elif method == "notifications/initialized":
            self.initialized = message
