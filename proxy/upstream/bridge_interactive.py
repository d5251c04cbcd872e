"""What a 2025 server asks of its client mid-request, turned into the 2026-07-28 input-required
round trip: the interactive half of the era bridge (proxy/upstream/bridge.py).

A 2025 server asks during a request (`sampling/createMessage`, `elicitation/create`, `roots/list`)
with a request of its own on the session, which over stdio and legacy SSE names no request of the
client's. A 2026 client has no session: it is asked with an input-required result and answers by
retrying its request with the answers. Contract of `InteractiveCalls`:

- A 2026 request whose `_meta` declares client capabilities a 2025 server can ask for (sampling,
  elicitation, roots) runs on a 2025 session of its own for its whole duration: one leased from a
  pool of sessions initialized with exactly those capabilities, opened on demand, at most
  `max_sessions` in all, each closed after `IDLE_S` unused, and closed after a request during
  which the server asked its client anything (the server may keep the answers per session, as
  the roots it was told: they are not handed to the next caller). So the server sees the client as a
  2025 client declaring them would be seen (a server may list some tools only to a client that can
  sample), and, one request per session, whatever the server sends on it belongs to that request,
  whatever the transport.
- A server request during a `tools/call`, `prompts/get` or `resources/read` (the requests 2026
  lets a server answer with input-required) ends the caller's request with an input-required
  result: the server's
  requests under keys of the bridge's (`elicitation-1`, ...), all that arrived together in one
  result, and a `requestState` naming the parked request (128 random bits). `ping` is answered
  here; any other server request is refused with an error that names the bridge.
- The client's retry (a new request id, the same method and tool, prompt or resource,
  `requestState` echoed, `inputResponses` by key) answers the server's requests under their own
  ids and waits on the same upstream request: its answer, or the next round. A request the retry
  left unanswered is asked again; an unknown, expired or mismatched `requestState` is answered
  -32602 and starts nothing (it is never a second execution).
- A parked request is held at most `input_wait_s`. Then, and when its caller cancels or the proxy
  closes, the server's open requests are answered with an error, the upstream request is cancelled
  and the session closed rather than reused (a late message of the abandoned request could
  otherwise reach the next one).
- With `max_sessions` busy, or when no session could be opened (no room for another stdio child),
  `start` returns None: the request goes over the bridge's shared session (the server sees a
  client without those capabilities), logged at most once a minute.
- `reserve` (in front of a stdio server whose sessions each start a process): `warm` opens one
  session ahead, not initialized, since the capabilities it will declare are not known yet: its
  child is started and asked `ping` (which a 2025 server answers before `initialize`), so that it
  has booted when a request needs a session; the next request that finds no idle session for its
  capabilities takes it (its handshake is then one exchange with a running process). It counts
  within `max_sessions`, is closed after `IDLE_S` unused, and is made again once a request on an
  interactive session ended, while there is room (not while it runs: a process starting takes the
  CPU that request's answer needs); never because one closed idle (no demand, no process). It
  yields to a 2025 client: `yield_reserve` closes it where a client's session found no room.

The round trip spends no retry budget: each retry is a request of its own to the engine, whose
first attempt resumes the parked one; a retry of that attempt finds the state spent (-32602).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, Message, RequestId, bounded
from proxy.telemetry.bridge import BRIDGE
from proxy.upstream.base import Exchange, OnMessage, UpstreamLink
from proxy.upstream.bridge import CONTINUATION, INTERACTIVE, LOG_LEVELS, handshake, legacy_form, level_of

log = logging.getLogger("proxy.upstream.bridge")

# The 2025 server-to-client requests that have a 2026 input-request form, by the capability each needs.
ASKABLE: Final = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
IDLE_S: Final = 60.0  # an interactive session unused this long is closed
STATE_BYTES: Final = 16
REFUSAL_LOG_EVERY_S: Final = 60.0
# What identifies "the same request" across rounds, per method.
SUBJECT: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

Translate = Callable[[str, Message], Message]


def subject_of(message: Message) -> tuple[str, Any]:
    method = str(message.get("method"))
    params = message.get("params")
    key = SUBJECT.get(method)
    return method, params.get(key) if isinstance(params, dict) and key else None


@dataclass(eq=False, slots=True)
class _Session:
    """One interactive 2025 session of the pool."""

    link: UpstreamLink
    key: str  # the capabilities it declared (canonical JSON)
    call: _Call | None = None
    idle: asyncio.TimerHandle | None = None
    closed: bool = False


@dataclass(eq=False, slots=True)
class _Call:
    """One 2026 request running on an interactive session, across its rounds."""

    session: _Session
    subject: tuple[str, Any]
    translate: Translate
    inner: Exchange | None = None  # the upstream request
    outer: Exchange | None = None  # the caller's request waiting on it now (None while parked)
    level: int | None = None  # the log level the waiting request asked for
    inner_token: Any = None  # the progress token the upstream request carries
    outer_token: Any = None  # the waiting request's own
    asked: dict[str, Message] = field(default_factory=dict)  # key -> server request not answered
    parking: bool = False  # an input-required result is about to go out
    state: str | None = None  # requestState while parked
    timer: asyncio.TimerHandle | None = None
    final: Message | None = None  # the upstream's answer that came while parked
    failure: BaseException | None = None  # or how the upstream request failed meanwhile
    asks: int = 0


def _progress_token(message: Message) -> Any:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


def _error(request_id: RequestId, code: int, text: str) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": text}}


class InteractiveCalls:
    """The interactive sessions of one bridge and the requests parked on them (see the module's
    contract)."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[UpstreamLink]],
        *,
        timeout_s: float,
        max_sessions: int,
        input_wait_s: float,
        reserve: bool = False,
    ) -> None:
        """`opener`: a new legacy link of the upstream's transport; `timeout_s` bounds each
        session's handshake; `reserve`: keep one session's process started ahead (`warm`)."""
        self._opener = opener
        self._timeout_s = timeout_s
        self.max_sessions = max_sessions
        self.input_wait_s = input_wait_s
        self.reserves = reserve
        self._idle: dict[str, list[_Session]] = {}
        self._sessions: set[_Session] = set()
        self._opening = 0
        self._reserve: UpstreamLink | None = None  # a session's link whose child is started, not initialized
        self._reserve_idle: asyncio.TimerHandle | None = None
        self._reserve_booted = False  # its process answered the `ping`
        self._warming = False  # the reserve's link is being opened
        self._parked: dict[str, _Call] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._refusal_logged = -math.inf
        self._closed = False
        BRIDGE.watch_interactive(self)

    @property
    def sessions(self) -> int:
        """Interactive sessions open or opening, the reserve among them."""
        return len(self._sessions) + self._opening + (self._reserve is not None or self._warming)

    def session_states(self) -> dict[str, int]:
        """The sessions by state, for /metrics (proxy/telemetry/bridge.py)."""
        idle = sum(len(sessions) for sessions in self._idle.values())
        return {
            "busy": len(self._sessions) - idle,
            "idle": idle,
            "reserved": int(self._reserve is not None and self._reserve_booted),
            "opening": self._opening + int(self._warming or (self._reserve is not None and not self._reserve_booted)),
        }

    @property
    def parked(self) -> int:
        return len(self._parked)

    # -- the caller's requests -------------------------------------------------------------------

    async def start(
        self,
        message: Message,
        capabilities: Mapping[str, Any],
        on_message: OnMessage | None,
        translate: Translate,
        *,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange | None:
        """Send `message` on an interactive session declaring `capabilities`; None when every
        session allowed is busy or none could be opened (the caller uses the shared session).
        Raises `UpstreamFailure` when the request could not be sent."""
        try:
            session = await self._lease(capabilities)
            reason, why = "busy", f"all {self.max_sessions} interactive sessions are busy"
        except UpstreamFailure as exc:  # e.g. no room for another stdio child: the shared session serves
            session, reason = None, "unavailable"
            why = f"no interactive session could be opened ({bounded(str(exc), 200)})"
        if session is None:
            BRIDGE.count_fallback(reason)
            now = time.monotonic()
            if now - self._refusal_logged >= REFUSAL_LOG_EVERY_S:
                self._refusal_logged = now
                log.warning(
                    "era bridge: %s; a request declaring client capabilities goes over the shared session, where "
                    "the server cannot ask its client anything",
                    why,
                )
            return None
        call = _Call(session, subject_of(message), translate)
        session.call = call
        outer = self._waiting(call, message, on_message)
        call.inner_token = call.outer_token
        try:
            call.inner = await session.link.send_request(
                legacy_form(message),
                on_message=lambda m: self._from_session(session, m),
                headers=headers,
                on_write=on_write,
            )
        except BaseException:
            self._finish(call, reuse=False)
            raise
        call.inner.response.add_done_callback(lambda done: self._answered(call, done))
        return outer

    def resume(self, message: Message, on_message: OnMessage | None) -> Exchange:
        """The client's retry, carrying a `requestState`: answered -32602 unless it names a request
        parked here for the same tool, prompt or resource."""
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        state = params.get("requestState")
        call = self._parked.get(state) if isinstance(state, str) else None
        if call is None or not isinstance(state, str):
            return self._refused(message, "requestState is unknown or expired: send the request again without it")
        if subject_of(message) != call.subject:
            return self._refused(message, "requestState belongs to another request")
        responses = params.get("inputResponses", {})
        if not isinstance(responses, dict):
            return self._refused(message, "inputResponses must be an object keyed as inputRequests was")
        del self._parked[state]
        call.state = None
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        outer = self._waiting(call, message, on_message)
        if call.failure is not None:  # the execution failed while it waited for these answers
            self._fail(call, call.failure)
            self._finish(call, reuse=False)
            return outer
        for key in [k for k in call.asked if isinstance(responses.get(k), dict)]:
            asked = call.asked.pop(key)
            answer = {k: v for k, v in responses[key].items() if k != "resultType"}
            self._spawn(call.session.link.send_response({"jsonrpc": "2.0", "id": asked["id"], "result": answer}))
        if call.final is not None:
            self._complete(call, call.final)
        elif call.asked:
            self._park_soon(call)  # answers missing: asked again
        return outer

    def owns(self, exchange: Exchange) -> bool:
        return isinstance(exchange.transport_state, _Call)

    async def cancel(self, exchange: Exchange, reason: str | None) -> None:
        call = exchange.transport_state
        if isinstance(call, _Call) and call.outer is exchange:
            call.outer = None
            await self._abandon(call, reason or "the caller cancelled the request")

    async def aclose(self) -> None:
        self._closed = True
        self._drop_reserve()
        for call in list(self._parked.values()):
            await self._abandon(call, "the proxy is shutting down")
        for session in list(self._sessions):
            if session.call is not None:
                outer = session.call.outer
                if outer is not None and not outer.response.done():
                    outer.response.set_exception(
                        untraced(UpstreamFailure(FailureKind.CLOSED, Dispatch.UNKNOWN, "the bridged session closed"))
                    )
                    outer.response.exception()
            self._close(session)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # -- rounds ------------------------------------------------------------------------------

    def _waiting(self, call: _Call, message: Message, on_message: OnMessage | None) -> Exchange:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        outer = Exchange(message["id"], str(message.get("method")), on_message, future, written=True)
        outer.transport_state = call
        call.outer = outer
        call.level = level_of(message)
        call.outer_token = _progress_token(message)
        return outer

    def _answered(self, call: _Call, done: asyncio.Future[Message]) -> None:
        """The upstream request ended: answer the waiting request, or keep it for the retry."""
        if done.cancelled() or done.exception() is not None:
            failure = done.exception() if not done.cancelled() else None
            if failure is None:
                failure = UpstreamFailure(FailureKind.CLOSED, Dispatch.UNKNOWN, "the upstream request ended unanswered")
            if call.outer is None and call.state is not None:
                # parked: the retry learns how the execution ended (the session cannot be reused)
                call.failure = failure
                self._close(call.session)
                return
            self._fail(call, failure)
            self._finish(call, reuse=False)
            return
        response = done.result()
        if call.outer is None:
            call.final = response  # parked: the retry gets it
            return
        self._complete(call, response)

    def _fail(self, call: _Call, failure: BaseException) -> None:
        outer = call.outer
        call.outer = None
        if outer is not None and not outer.response.done():
            outer.response.set_exception(failure)
            outer.response.exception()

    def _complete(self, call: _Call, response: Message) -> None:
        outer = call.outer
        call.outer = None
        if outer is not None and not outer.response.done():
            body = call.translate(outer.method, {**response, "id": outer.upstream_id})
            outer.response.set_result(body)
        for asked in call.asked.values():  # asked, then not waited for: the server has moved on
            self._spawn(call.session.link.send_response(_error(asked["id"], -32603, "the request ended")))
        call.asked.clear()
        # A session on which the server asked the client holds that client's answers (a server
        # may keep the roots it was told per session): it is not handed to another caller.
        self._finish(call, reuse=call.asks == 0)

    def _park_soon(self, call: _Call) -> None:
        """Requests the server sends together go out in one input-required result."""
        if not call.parking:
            call.parking = True
            asyncio.get_running_loop().call_soon(self._park, call)

    def _park(self, call: _Call) -> None:
        call.parking = False
        outer = call.outer
        if outer is None or outer.response.done() or not call.asked:
            return
        state = secrets.token_urlsafe(STATE_BYTES)
        call.state = state
        self._parked[state] = call
        call.timer = asyncio.get_running_loop().call_later(self.input_wait_s, self._expired, call)
        call.outer = None
        requests = {key: {"method": m["method"], "params": m.get("params") or {}} for key, m in call.asked.items()}
        BRIDGE.count_round("2026")
        result = {"resultType": "input_required", "inputRequests": requests, "requestState": state}
        outer.response.set_result({"jsonrpc": "2.0", "id": outer.upstream_id, "result": result})

    def _expired(self, call: _Call) -> None:
        call.timer = None
        if call.state is not None:
            self._spawn(
                self._abandon(
                    call, f"the client did not answer within {self.input_wait_s:g} s (--era-bridge-input-wait-s)"
                )
            )

    def _unpark(self, call: _Call) -> None:
        if call.state is not None:
            self._parked.pop(call.state, None)
            call.state = None
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None

    async def _abandon(self, call: _Call, reason: str) -> None:
        """Answer the server's open requests with an error, cancel the upstream request and close
        the session."""
        if call.state is not None:
            log.info("era bridge: a request waiting on its client's answers was cancelled upstream: %s", reason)
        self._unpark(call)
        link = call.session.link
        for asked in call.asked.values():
            self._spawn(link.send_response(_error(asked["id"], -32603, bounded(reason, 200))))
        call.asked.clear()
        inner = call.inner
        if inner is not None and not inner.response.done():
            try:
                await link.cancel(inner, reason)
            except UpstreamFailure:
                pass
        self._finish(call, reuse=False)

    # -- what the session sends ---------------------------------------------------------------

    def _from_session(self, session: _Session, message: Message) -> None:
        call = session.call
        method = message.get("method")
        if "id" in message and isinstance(method, str):
            if method == "ping":
                self._spawn(session.link.send_response({"jsonrpc": "2.0", "id": message["id"], "result": {}}))
            elif call is not None and method in ASKABLE and call.subject[0] in INTERACTIVE:
                call.asks += 1
                call.asked[f"{method.split('/')[0]}-{call.asks}"] = message
                if call.outer is not None:
                    self._park_soon(call)
            else:
                text = f"{bounded(method, 80)} is not available through the proxy's era bridge"
                self._spawn(session.link.send_response(_error(message["id"], METHOD_NOT_FOUND, text)))
            return
        if call is None or call.outer is None or call.outer.on_message is None:
            return  # nothing waits to hear it (a parked request's messages have no stream)
        if method == "notifications/message":
            params = message.get("params")
            severity = params.get("level") if isinstance(params, dict) else None
            if call.level is None or severity not in LOG_LEVELS or LOG_LEVELS.index(severity) < call.level:
                return
        elif method == "notifications/progress" and call.outer_token != call.inner_token:
            params = message.get("params")
            if not isinstance(params, dict) or call.outer_token is None:
                return
            message = {**message, "params": {**params, "progressToken": call.outer_token}}
        call.outer.on_message(message)

    # -- the pool ------------------------------------------------------------------------------

    async def _lease(self, capabilities: Mapping[str, Any]) -> _Session | None:
        key = json.dumps(capabilities, sort_keys=True, separators=(",", ":"))
        idle = self._idle.get(key)
        while idle:
            session = idle.pop()
            if session.idle is not None:
                session.idle.cancel()
                session.idle = None
            if not session.closed:
                return session
        reserve = self._take_reserve()
        if reserve is None and (self._closed or self.sessions >= self.max_sessions):
            return None
        self._opening += 1
        log.info(
            "era bridge: opening a 2025 session%s declaring %s for requests whose server may ask their client",
            " (on the process started ahead)" if reserve is not None else "",
            ", ".join(sorted(capabilities)),
        )
        try:
            link = reserve if reserve is not None else await self._opener()
            session = _Session(link, key)
            link.set_unsolicited_handler(lambda m: self._from_session(session, m))
            await handshake(link, self._timeout_s, capabilities)
        finally:
            self._opening -= 1
        self._sessions.add(session)
        return session

    # -- the reserve ---------------------------------------------------------------------------

    def warm(self) -> None:
        """Start one session's process ahead, where `reserve` is on and none is started or
        starting, within `max_sessions` (the module's contract)."""
        if not self.reserves or self._closed or self._reserve is not None or self._warming:
            return
        if self.sessions >= self.max_sessions:
            return
        self._warming = True
        self._spawn(self._warm())

    async def _warm(self) -> None:
        try:
            link = await self._opener()
        except UpstreamFailure as exc:
            log.info("era bridge: no session could be started ahead: %s", bounded(str(exc), 200))
            return
        finally:
            self._warming = False
        if self._closed:
            await link.aclose()
            return
        self._reserve, self._reserve_booted = link, False
        self._reserve_idle = asyncio.get_running_loop().call_later(IDLE_S, self._drop_reserve)
        # `ping` is the one request a client may send before `initialize`: its answer says the
        # process has booted, and it fixes nothing a later `initialize` declares.
        ping: Message = {"jsonrpc": "2.0", "id": link.new_id(), "method": "ping"}
        try:
            ex = await link.send_request(ping)
            await asyncio.wait_for(asyncio.shield(ex.response), self._timeout_s)
        except TimeoutError:
            return  # still starting: a request that takes it waits for the rest of its start
        except UpstreamFailure as exc:
            if self._reserve is link and exc.kind is not FailureKind.CLOSED:
                log.info("era bridge: the session started ahead failed: %s", bounded(str(exc), 200))
            if self._reserve is link:
                self._drop_reserve()
            return
        if self._reserve is link:
            self._reserve_booted = True

    async def yield_reserve(self) -> bool:
        """Close the process started ahead, if there is one, so that its upstream session goes to
        whoever needs one now (a 2025 client's session at the upstream's limit); whether there was."""
        link = self._take_reserve()
        if link is None:
            return False
        log.info("era bridge: the session started ahead gave its upstream session to a 2025 client")
        await link.aclose()
        return True

    def _take_reserve(self) -> UpstreamLink | None:
        link, self._reserve = self._reserve, None
        if self._reserve_idle is not None:
            self._reserve_idle.cancel()
            self._reserve_idle = None
        return link

    def _drop_reserve(self) -> None:
        link = self._take_reserve()
        if link is not None:
            self._spawn(link.aclose())

    def _finish(self, call: _Call, *, reuse: bool) -> None:
        session = call.session
        if session.call is not call:
            return
        session.call = None
        if not reuse or self._closed:
            self._close(session)
        else:
            self._idle.setdefault(session.key, []).append(session)
            session.idle = asyncio.get_running_loop().call_later(IDLE_S, self._close, session)
        self.warm()  # (a session closed after its server asked: its room goes to the reserve)

    def _close(self, session: _Session) -> None:
        if session.closed:
            return
        session.closed = True
        if session.idle is not None:
            session.idle.cancel()
            session.idle = None
        self._sessions.discard(session)
        idle = self._idle.get(session.key)
        if idle and session in idle:
            idle.remove(session)
        self._spawn(session.link.aclose())

    # -- helpers ------------------------------------------------------------------------------

    def _refused(self, message: Message, text: str) -> Exchange:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        future.set_result(_error(message["id"], INVALID_PARAMS, text))
        return Exchange(message["id"], str(message.get("method")), None, future, written=False)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(_quietly(coro))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def is_continuation(message: Message) -> bool:
    params = message.get("params")
    return isinstance(params, dict) and bool(CONTINUATION.intersection(params))


async def _quietly(coro: Awaitable[Any]) -> None:
    """A message of the bridge's own to a session that may have ended meanwhile: its failure is
    the session's, already seen by the request that used it."""
    try:
        await coro
    except (UpstreamFailure, OSError) as exc:
        log.debug("era bridge: a message to an interactive session failed: %s", bounded(str(exc), 200))
