"""The events the engine and the relay emit, and the fan-out that delivers them to observers.

Contract:
- Events are frozen records (named tuples: several are built per call, and a tuple is four times
  cheaper to build than a frozen dataclass); match them by class, never by tuple equality, and
  observers must not keep references to mutable state.
- A call's events, in order: `CallStarted`, then per attempt `AttemptStarted`, `AttemptFinished`
  and, before a retry, `BackoffStarted`; then `CallFinished`. A call whose first attempt
  succeeded ends with the single `CallSucceeded` instead of that attempt's `AttemptFinished` and
  the `CallFinished` (`as_finished()` gives the pair): it is nearly every call, and one event
  costs a quarter of four.
- `CallStarted` and the first `AttemptStarted` are only emitted when some observer needs them
  (`Telemetry.starts`): an observer declares `needs_starts = False` when it does not (metrics
  and the call log read nothing from them; tracing opens its spans on them). Observers without
  the attribute get every event.
- Likewise `needs_call_ids = False` declares that an observer never reads the `call_id` of a
  `CallSucceeded` (the only event whose id can be left out; others always carry it). When no
  observer that takes `CallSucceeded` needs call ids (`Telemetry.success_ids` is False: the
  metrics alone, as shipped), a first-attempt success's `call_id` is "" (the engine's id counter
  still advances, so the ids of other calls are unchanged); otherwise it is the call's id.
- An observer may route events itself: `handler_for(event_type)` returns the callable that
  takes events of that type, or None for a type it ignores (it is then never called for them);
  without it, `on_event` takes every event. Routes are fixed when the `Telemetry` is built.
- `AttemptFinished.rule` names what decided a failed attempt's category where a rule did: the
  policy rule's name (evidence `rule`), or a shipped rule's id; None otherwise. Rule names come
  from the policy files and the shipped table, never from the upstream or a caller.
- `CallReported` carries the unresolved report (the `_meta` report of docs/recovery.md, "The
  unresolved result", already redacted and bounded, exactly as the caller gets it) of a call the engine gave up on, just
  before its `CallFinished`. It is built only when some observer takes it (`Telemetry.reports`:
  the status page's observer does; the metrics and the call log route it nowhere).
- `Telemetry.emit` calls every observer synchronously on the event loop; an observer that raises
  is logged (once per observer and event type) and never breaks traffic. `emit_success` is
  `emit` for `CallSucceeded` only, its routing resolved when the `Telemetry` is built. Observers must be
  cheap: no I/O on the request path (an exporter's own worker thread is fine).
- `Telemetry.attempt_context(call_id, number)` asks the tracing observer, if any, for the W3C
  trace-context entries (`traceparent`, `tracestate`) the engine puts into that attempt's
  `_meta` and HTTP headers. It returns None when tracing is off: the caller's own context then
  passes through unchanged.
- Labels derived from events must stay bounded: `tool` is only ever a name the upstream listed
  (the engine passes a catalog name or "other"); arguments never
  appear in any event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

log = logging.getLogger("proxy.telemetry")


class CallStarted(NamedTuple):
    call_id: str
    tool: str  # bounded label
    side_effect: str
    session_id: str | None
    era: str
    policy_version: str
    max_attempts: int
    deadline_s: float
    trace_meta: Mapping[str, str] = MappingProxyType({})  # traceparent/tracestate from the caller's _meta
    trace_headers: Mapping[str, str] = MappingProxyType({})  # traceparent/tracestate HTTP headers
    principal: str | None = None  # Principal.id when authentication is on: never a metric label


class AttemptStarted(NamedTuple):
    call_id: str
    tool: str
    number: int  # 1-based
    timeout_s: float


class AttemptFinished(NamedTuple):
    call_id: str
    tool: str
    number: int
    duration_s: float
    result: str  # success | tool_error | rpc_error | transport_error | timeout | cancelled
    category: str | None  # transient | validation | business | permission | unclassified | None on success
    dispatched: str  # no | unknown | yes
    evidence: str  # transport | http | jsonrpc | upstream | rule | shipped | default | none
    rule: str | None = None  # what decided: a policy rule's name (evidence "rule"), a shipped rule's id, or None


class BackoffStarted(NamedTuple):
    call_id: str
    tool: str
    next_attempt: int
    delay_s: float


class CallFinished(NamedTuple):
    call_id: str
    tool: str
    outcome: str  # success | recovered | unresolved | tool_error | cancelled
    stop_reason: str | None
    category: str | None
    attempts: int
    duration_s: float
    backoff_s: float
    outcome_unknown: bool
    principal: str | None = None  # Principal.id when authentication is on: never a metric label


class CallSucceeded(NamedTuple):
    """A call answered by its first attempt: that attempt's `AttemptFinished` and the call's
    `CallFinished` in one event."""

    call_id: str
    tool: str
    attempt_s: float  # the attempt's duration
    duration_s: float  # the call's, from its arrival
    principal: str | None = None  # the engine always gives it (None: --auth none)

    def as_finished(self) -> tuple[AttemptFinished, CallFinished]:
        return (
            AttemptFinished(self.call_id, self.tool, 1, self.attempt_s, "success", None, "yes", "upstream"),
            CallFinished(
                self.call_id, self.tool, "success", None, None, 1, self.duration_s, 0.0, False, self.principal
            ),
        )


class CallReported(NamedTuple):
    call_id: str
    tool: str
    report: Mapping[str, Any]  # the caller's unresolved report: observers copy what they keep


class UpstreamStatus(NamedTuple):
    upstream: str
    up: bool
    restarts: int = 0  # cumulative restarts of supervised children


class PolicyReloaded(NamedTuple):
    result: str  # ok | unchanged | error
    version: str


Event = (
    CallStarted
    | AttemptStarted
    | AttemptFinished
    | BackoffStarted
    | CallFinished
    | CallSucceeded
    | CallReported
    | UpstreamStatus
    | PolicyReloaded
)


class Observer(Protocol):
    def on_event(self, event: Event) -> None: ...


def needs_starts(observer: Observer) -> bool:
    """Whether `observer` wants `CallStarted` and first-attempt `AttemptStarted` events."""
    return bool(getattr(observer, "needs_starts", True))


def needs_call_ids(observer: Observer) -> bool:
    """Whether `observer` reads the `call_id` of the events it takes."""
    return bool(getattr(observer, "needs_call_ids", True))


class Tracer(Protocol):
    def attempt_context(self, call_id: str, number: int) -> dict[str, str] | None: ...


EVENT_TYPES: tuple[type, ...] = (
    CallStarted,
    AttemptStarted,
    AttemptFinished,
    BackoffStarted,
    CallFinished,
    CallSucceeded,
    CallReported,
    UpstreamStatus,
    PolicyReloaded,
)

Handler = Callable[[Event], None]


def _handler_for(observer: Observer, event_type: type) -> Handler | None:
    route = getattr(observer, "handler_for", None)
    return observer.on_event if route is None else route(event_type)


class Telemetry:
    """Fan-out of events to observers; failures are contained and logged."""

    def __init__(self, observers: list[Observer] | None = None, tracer: Tracer | None = None) -> None:
        self.observers: tuple[Observer, ...] = tuple(observers or ())
        self.tracer = tracer
        # What the engine needs to build: nothing without observers; start events only when wanted.
        self.active = bool(self.observers)
        self.starts = any(needs_starts(o) for o in self.observers)
        # Per event type, the (observer, handler) pairs that take it.
        self._routes: dict[type, tuple[tuple[Observer, Handler], ...]] = {}
        for event_type in EVENT_TYPES:
            pairs = ((o, _handler_for(o, event_type)) for o in self.observers)
            self._routes[event_type] = tuple((o, h) for o, h in pairs if h is not None)
        self._reported: set[tuple[int, type]] = set()
        # `emit` for the event nearly every call ends with, routed once here instead of per event
        # (with one observer taking it, as shipped, a direct call inside the same containment).
        self.emit_success: Callable[[CallSucceeded], None] = self._emitter(CallSucceeded)
        # Whether a first-attempt success's call id is read: formatting one costs more than building its event.
        self.success_ids = any(needs_call_ids(o) for o, _ in self._routes[CallSucceeded])
        # Whether an unresolved report is wanted as an event (the engine builds none otherwise).
        self.reports = bool(self._routes[CallReported])

    def emit(self, event: Event) -> None:
        for observer, handler in self._routes.get(event.__class__, ()):
            try:
                handler(event)
            except Exception:
                self._failed(observer, event)

    def _emitter(self, event_type: type) -> Callable[[Event], None]:
        """`emit` for events of `event_type` only."""
        routes = self._routes[event_type]
        if len(routes) != 1:
            return self.emit
        ((observer, handler),) = routes

        def emit_one(event: Event) -> None:
            try:
                handler(event)
            except Exception:
                self._failed(observer, event)

        return emit_one

    def _failed(self, observer: Observer, event: Event) -> None:
        key = (id(observer), type(event))
        if key not in self._reported:
            self._reported.add(key)
            log.exception("telemetry observer %r failed on %s", observer, type(event).__name__)

    def attempt_context(self, call_id: str, number: int) -> dict[str, str] | None:
        if self.tracer is None:
            return None
        try:
            return self.tracer.attempt_context(call_id, number)
        except Exception:
            log.exception("tracing failed to give an attempt context")
            return None
