"""One `tools/call` in progress: its policy snapshot, its attempts, and what ends it.

`ToolCall.run` is the attempt loop the engine (proxy/core/engine.py) starts for every call: each
attempt through the relay with its own timers, `decide` (proxy/recovery) after each, a backoff
between, and at the end the upstream's answer or the unresolved result (the report). Its
`CallProgress` (proxy/core/outbox.py) relays the caller's progress and keeps the latest notes as
partial evidence of how far a failed call got.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from proxy.auth.base import Principal
from proxy.core.attempt_end import (
    UNCLASSIFIED,
    category_label,
    classify_attempt,
    continues,
    is_success,
    result_label,
    rpc_error_of,
    timed_out,
    trace_entries,
    uncancel,
)
from proxy.core.outbox import CallProgress, Outbox, progress_token_of
from proxy.core.relay import Relay
from proxy.errors import Dispatch, FailureKind, UpstreamFailure, refuses_the_caller, untraced
from proxy.jsonrpc import (
    META_APPROVE_BUDGET,
    META_DEADLINE_MS,
    META_IDEMPOTENCY_KEY,
    META_PREFIX,
    STRUCTURED_CONTENT_VERSIONS,
    Message,
)
from proxy.policy.compiled import SideEffect, ToolPolicy
from proxy.recovery import (
    LEDGER_RECORDED,
    AttemptRecord,
    CallState,
    Deliver,
    GiveUp,
    PartialResult,
    Refused,
    Retry,
    StopReason,
    Success,
    TransportError,
    attempt_timeout_s,
    classify,
    decide,
    decide_first_attempt,
    ledger_summary,
    new_budget_id,
    outcome_from_response,
    unresolved_result,
    with_attempts_meta,
)
from proxy.recovery.classify import SUCCESS as _SUCCESS
from proxy.recovery.outcome import Outcome
from proxy.recovery.report import report_of, unreachable_s
from proxy.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BackoffStarted,
    CallFinished,
    CallReported,
    CallStarted,
    CallSucceeded,
)
from proxy.upstream.base import Era

if TYPE_CHECKING:
    from proxy.core.engine import Engine

_TOOL_ERROR_REASONS = frozenset({StopReason.NOT_RETRYABLE, StopReason.UPSTREAM_DECLINED})
# A NamedTuple's constructor is a Python-level `__new__` (a frame per event); `tuple.__new__` builds
# the same `CallSucceeded` at half the cost. Once per successful call, so its fields go in positionally.
new_event = tuple.__new__


class ToolCall:
    """One tools/call in progress (the per-request retry state of the Envoy model)."""

    __slots__ = (
        "_budget_id",
        "_op",
        "approved_id",
        "arguments",
        "attempts",
        "backoff_s",
        "began",
        "call_id",
        "catalog",
        "e",
        "headers",
        "in_flight",
        "label",
        "meta",
        "name",
        "outbox",
        "params",
        "policy",
        "principal",
        "relay",
        "request",
        "state",
    )

    def __init__(
        self,
        engine: Engine,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        params: dict[str, Any],
        name: str,
        arguments: dict[str, Any] | None,
        *,
        policy: ToolPolicy | None = None,
        principal: Principal | None = None,
    ) -> None:
        self.e = engine
        self.principal = principal.id if principal is not None else None
        self.relay = relay
        self.request = request
        self.outbox = outbox
        self.headers = headers
        self.name = name
        self.arguments = arguments
        self.call_id = engine.new_call_id()
        self.catalog = catalog = relay.catalog_of(principal)
        tool = catalog.tools.get(name)
        self.label = name if tool is not None else "other"  # bounded: catalog names only
        if policy is None:
            annotations = tool.get("annotations") if tool is not None else None
            policy = engine.policy_for(name, annotations if isinstance(annotations, dict) else None)
        self.policy: ToolPolicy = policy
        meta = params.get("_meta")
        self.meta: dict[str, Any] = meta if isinstance(meta, dict) else {}
        self.params = self._upstream_params(params)
        self.attempts: list[AttemptRecord] = []
        self.backoff_s = 0.0
        self.in_flight = 0  # the number of the attempt being awaited, 0 between attempts
        self._op: str | None = None
        self._budget_id: str | None = None
        self.state: CallState
        self.approved_id: str | None = None
        self.began: float | None = None  # set when the call began before `run` (a tool lookup)

    @property
    def op(self) -> str:
        """The operation digest: (upstream, tool, arguments without the proxy's idempotency key);
        computed when first needed (a report or the ledger), which most calls never are."""
        if self._op is None:
            self._op = self.e.operation(self.name, self.arguments, self.policy, self.principal)
        return self._op

    @property
    def keeps_running(self) -> bool:
        """Whether the call goes on when its client's stream closes: a tool that is not
        read-only, with re-sends on, runs to its answer for a re-send to take (docs/recovery.md,
        "Re-sends"); a read-only call stops, as a new one costs nothing."""
        return self.e.resends is not None and (
            self.policy.side_effect is not SideEffect.READ_ONLY or META_IDEMPOTENCY_KEY in self.meta
        )

    @property
    def budget_id(self) -> str:
        if self._budget_id is None:
            self._budget_id = new_budget_id(os.urandom(9))
        return self._budget_id

    def _upstream_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The params every attempt sends: our own _meta keys removed, the idempotency key placed."""
        key = self.policy.idempotency_key
        if key is None:
            for k in self.meta:
                if k.startswith(META_PREFIX):
                    break
            else:
                return params  # nothing to remove or add: the caller's params as they came (never mutated)
        out = dict(params)
        meta = {k: v for k, v in self.meta.items() if not k.startswith(META_PREFIX)}
        if key is not None:
            value = self._key_value()
            if key.location == "argument":
                out["arguments"] = {**(self.arguments or {}), key.name: value}
            else:
                meta[key.name] = value
        if meta or "_meta" in params:
            out["_meta"] = meta
        else:
            out.pop("_meta", None)
        return out

    def _key_value(self) -> str:
        """The idempotency key the policy places upstream: the caller's own
        (`io.mcp-recovery-proxy/idempotencyKey`) where it gave one, so a re-send the proxy could
        not match (another replica, after a restart) is one operation for the server too;
        under authentication a digest of (principal, key), so two principals' keys never meet
        at the server. Else a new one per call, the same for all its attempts."""
        given = self.meta.get(META_IDEMPOTENCY_KEY)
        if not isinstance(given, str):
            return uuid.uuid4().hex
        if self.principal is None:
            return given
        return hashlib.sha256(f"{self.principal}\0{given}".encode()).hexdigest()[:32]

    # -- the loop -------------------------------------------------------------------------------
    async def run(self) -> Message:
        e, policy, label = self.e, self.policy, self.label
        flying = e.calls_in_flight
        flying[label] = flying.get(label, 0) + 1
        e.in_flight += 1
        try:
            telemetry = e.telemetry
            now = e.clock()
            meta = self.meta
            approval = meta.get(META_APPROVE_BUDGET) if meta else None
            # The digest is needed to consult the ledger; with nothing in the ledger it waits until
            # a report or a ledger entry needs it (most calls succeed and never do).
            size = e.ledger_size
            entry = e.ledger.check(self.op, now) if size is None or size() else None
            approved = entry is not None and isinstance(approval, str) and await e.approve(self.op, approval, now)
            state = CallState.start(
                policy,
                now_s=now if self.began is None else self.began,
                caller_deadline_ms=meta.get(META_DEADLINE_MS) if meta else None,
            )
            self.state = state
            self.approved_id = approval if approved else None
            if telemetry.starts:
                telemetry.emit(
                    CallStarted(
                        self.call_id,
                        label,
                        policy.side_effect.value,
                        self.relay.session_id,
                        self.relay.era.value,
                        e.policies().version,
                        policy.attempts,
                        state.deadline_s,
                        trace_meta=trace_entries(meta),
                        trace_headers=trace_entries(self.headers),
                        principal=self.principal,
                    )
                )
            if entry is None and e.max_concurrent_calls is None and policy.anti_storm.breaker_failures is None:
                e.antistorm.count_call(label, now)  # nothing can refuse it: only the budget's count
            else:
                stop = decide_first_attempt(now_s=now, exhausted=entry, approved=approved, admission=self._admit_first)
                if stop is not None:
                    return await self._give_up(stop, earlier=entry)
            token = progress_token_of(self.request)
            progress = CallProgress(token, now) if token is not None or policy.idle_timeout_s else None
            return await self.attempts_loop(progress)
        finally:
            e.left(label)

    async def still_running(self, began: float) -> Message:
        """A re-send whose own deadline (its policy's, or the shorter `deadlineMs` it carries) passed
        while the execution it repeats still runs (docs/recovery.md, "Re-sends"): an unresolved
        `still_running` result. Nothing was sent upstream for it; that execution goes on, and its
        answer is kept for the next re-send."""
        self.state = CallState.start(self.policy, now_s=began, caller_deadline_ms=self.meta.get(META_DEADLINE_MS))
        self.approved_id = None
        return await self._give_up(GiveUp(StopReason.STILL_RUNNING))

    def start_after_first(self, started: float) -> None:
        """The state `run` sets up, for a call the engine's direct path admitted at `started`
        (nothing in the ledger, no approval, no caller deadline, no breaker, no limit)."""
        self.state = CallState.start(self.policy, now_s=started)
        self.approved_id = None

    async def attempts_loop(
        self, progress: CallProgress | None, first: tuple[Outcome, float, float] | None = None
    ) -> Message:
        """Attempt, decide, back off, until delivered or given up. `first` is attempt 1's
        (outcome, started, ended) when the direct path already made it."""
        e, policy, label, state = self.e, self.policy, self.label, self.state
        telemetry = e.telemetry
        # attempt 1's timeout: from now when the call began earlier (a tool lookup)
        timeout_s = attempt_timeout_s(policy, state, state.started_at_s if self.began is None else e.clock())
        try:
            while True:
                number = len(self.attempts) + 1
                if first is not None:
                    outcome, started, now = first
                    first = None
                else:
                    if progress is not None:
                        progress.attempt = number
                    started = e.clock()
                    waiting = self._attempt(number, timeout_s, progress, started)
                    self.in_flight = number
                    try:
                        response = await waiting
                    except TimeoutError as timeout:  # untraced: see `_direct`
                        outcome = timed_out(number, timeout_s, untraced(timeout), policy, state.deadline_s)
                    except UpstreamFailure as failure:
                        outcome = TransportError.from_failure(untraced(failure))
                    else:
                        if number == 1 and is_success(response):
                            # Nearly every call: a first answer that is a success leaves
                            # nothing to classify or decide (decide() on a success is
                            # Deliver whatever else holds).
                            return self._first_success(response["result"], started, e.clock())
                        outcome = outcome_from_response(response)
                    now = e.clock()
                    self.in_flight = 0
                duration = now - started
                classified = classify_attempt(outcome, policy, self.request)
                self.state = state = state.attempted()
                e.antistorm.record(label, policy, classified.category, now)
                # A 2025 client that disconnected has not cancelled: the attempt in flight is
                # finished and its success still delivered (the client may resume the stream);
                # only a new attempt is not started, unless the call keeps running for a re-send.
                gone = self.outbox.closed and classified.category is not None and not self.keeps_running
                decision = decide(
                    policy, state, classified, now_s=now, rand=e.rand, admission=self._admit_retry, cancelled=gone
                )
                backoff = decision.delay_s if isinstance(decision, Retry) else None
                self.attempts.append(
                    AttemptRecord(number, started - state.started_at_s, duration, outcome, classified, backoff)
                )
                if telemetry.active:
                    telemetry.emit(self._attempt_finished(number, duration, outcome, classified))
                if (
                    outcome.__class__ is TransportError
                    and self.relay.pass_auth_refusals
                    and refuses_the_caller(outcome.kind, outcome.http_status)
                ):
                    # --auth passthrough: the upstream refused the caller's own credential (or
                    # the session it named). The caller answers that (its OAuth flow, a step-up,
                    # a session of its own), not a retry or a tool result: the relay turns this
                    # into the same HTTP status.
                    self._finished("unresolved", StopReason.NOT_RETRYABLE, category_label(classified), False)
                    raise outcome.as_failure()
                match decision:
                    case Deliver():
                        return self._deliver(outcome)
                    case Retry(delay_s=delay):
                        if telemetry.active:
                            telemetry.emit(BackoffStarted(self.call_id, label, number + 1, delay))
                        await asyncio.sleep(delay)
                        self.backoff_s += delay
                        if self.outbox.closed and not self.keeps_running:
                            # A 2025 client that disconnected during the backoff: no new attempt.
                            partials = list(progress.notes) if progress is not None else []
                            return await self._give_up(GiveUp(StopReason.CANCELLED), partials=partials)
                        self.state = state = state.retried()
                        timeout_s = attempt_timeout_s(policy, state, e.clock())
                    case GiveUp():
                        partials = list(progress.notes) if progress is not None else []
                        return await self._give_up(decision, partials=partials)
        except asyncio.CancelledError:
            if e.stopping:
                uncancel()
                return await self.shut_down(progress, started if self.in_flight else None)
            # The attempt the caller's cancellation stopped counts: it was sent (or being sent).
            self._finished(
                "cancelled", StopReason.CANCELLED, None, False, attempts=len(self.attempts) + bool(self.in_flight)
            )
            raise

    async def shut_down(self, progress: CallProgress | None, attempt_started: float | None) -> Message:
        """The shutdown grace period ended during this call: an unresolved `shutdown` result. The
        attempt in flight (started at `attempt_started`, None between attempts) was cancelled
        upstream; it is recorded as the last attempt, dispatch unknown (it may have run)."""
        e, state = self.e, self.state
        if attempt_started is not None:
            outcome = TransportError(
                FailureKind.CLOSED, Dispatch.UNKNOWN, "cancelled upstream: the proxy is shutting down"
            )
            classified = classify(outcome, self.policy)
            self.state = state.attempted()
            self.attempts.append(
                AttemptRecord(
                    len(self.attempts) + 1,
                    attempt_started - state.started_at_s,
                    e.clock() - attempt_started,
                    outcome,
                    classified,
                    None,
                )
            )
        partials = list(progress.notes) if progress is not None else []
        return await self._give_up(GiveUp(StopReason.SHUTDOWN), partials=partials)

    def _attempt_finished(self, number: int, duration: float, outcome: Outcome, classified: Any) -> AttemptFinished:
        if classified is _SUCCESS:
            return AttemptFinished(self.call_id, self.label, number, duration, "success", None, "yes", "upstream")
        return AttemptFinished(
            self.call_id,
            self.label,
            number,
            duration,
            result_label(outcome),
            category_label(classified),
            classified.dispatched.value,
            classified.evidence.source.value,
            classified.evidence.rule,
        )

    def _first_success(self, result: dict[str, Any], started: float, ended: float) -> Message:
        """Deliver a first attempt's success: what `_deliver` does for a call of one attempt."""
        e, policy = self.e, self.policy
        if policy.anti_storm.breaker_failures is not None:
            e.antistorm.record(self.label, policy, None, ended)
        if self.approved_id is not None:
            e.clear(self.op)
            result = with_attempts_meta(result, 1, self.approved_id)  # the approval shows (docs/recovery.md, "Ledger")
        telemetry = e.telemetry
        if telemetry.active:
            telemetry.emit_success(
                new_event(
                    CallSucceeded,
                    (self.call_id, self.label, ended - started, ended - self.state.started_at_s, self.principal),
                )
            )
        return {"jsonrpc": "2.0", "id": self.request["id"], "result": result}

    def _admit_first(self, now_s: float) -> Refused | None:
        """Before attempt 1: the proxy's concurrency limit, then the tool's circuit breaker."""
        return self.e.admit_first(now_s) or self.e.antistorm.admit_first(self.label, self.policy, now_s)

    def _admit_retry(self, now_s: float) -> Refused | None:
        """Before a retry: the tool's circuit breaker and retry budget."""
        return self.e.antistorm.admit_retry(self.label, self.policy, now_s)

    def _attempt(self, number: int, timeout_s: float, progress: CallProgress | None, now: float) -> Awaitable[Message]:
        """Attempt `number`, ready to await (its response, or TimeoutError / UpstreamFailure). The
        relay's timer runs the policy's idle timer too (see `Relay.attempt`)."""
        e = self.e
        params = self.params
        headers = self.headers
        telemetry = e.telemetry
        if telemetry.tracer is not None:
            context = telemetry.attempt_context(self.call_id, number)
            if context:
                params = {**params, "_meta": {**params.get("_meta", {}), **context}}
                headers = {**(headers or {}), **context}
        if telemetry.starts or (number > 1 and telemetry.active):
            telemetry.emit(AttemptStarted(self.call_id, self.label, number, timeout_s))
        # Starting a stdio child or connecting is bounded by the deadline, not by the attempt
        # timer: a slow cold start must not turn every first call after a crash into a timeout.
        deadline_left_s = self.state.deadline_left_s(now)
        return self.relay.attempt(
            self.request,
            self.outbox,
            headers,
            progress=progress,
            params=params,
            response_timeout_s=timeout_s,
            send_deadline_s=max(deadline_left_s, timeout_s),
            idle_s=self.policy.idle_timeout_s,
        )

    # -- endings --------------------------------------------------------------------------------
    def _deliver(self, outcome: Outcome) -> Message:
        assert isinstance(outcome, Success)
        n = len(self.attempts)
        approved = self.approved_id
        if approved is not None:
            self.e.clear(self.op)
        if approved is not None or n > 1:
            # the approval shows, and how long the upstream was unreachable before it answered
            result = with_attempts_meta(outcome.result, n, approved, unreachable_s(self.attempts))
        else:
            result = outcome.result
        self._finished("recovered" if n > 1 else "success", None, None, False)
        return {"jsonrpc": "2.0", "id": self.request["id"], "result": result}

    async def _give_up(
        self, stop: GiveUp, *, earlier: Any = None, partials: list[PartialResult] | None = None
    ) -> Message:
        e, policy, state = self.e, self.policy, self.state
        now = e.clock()
        last = self.attempts[-1].outcome if self.attempts else None
        error = rpc_error_of(last)
        if error is not None:
            self.relay.protocol_mismatch(error)  # -32020/-32022: the service asks the upstream again
        if error is not None and stop.reason in _TOOL_ERROR_REASONS and self._keep_rpc_error(error):
            self._finished("tool_error", stop.reason, category_label(self.attempts[-1].classified), False)
            return {"jsonrpc": "2.0", "id": self.request["id"], "error": error}
        # With `jsonrpc_errors_as_results: false` a call whose last attempt was answered with a
        # JSON-RPC error gets that error as it came, whatever stopped the retries (the ledger still
        # records a spent budget below).
        forward = error is not None and not policy.jsonrpc_errors_as_results
        result = unresolved_result(
            policy,
            stop,
            attempts=self.attempts,
            elapsed_s=now - state.started_at_s,
            deadline_s=state.deadline_s,
            arguments_digest=self.op,
            budget_id=earlier.budget_id if earlier is not None else self.budget_id,
            arguments=self.arguments,
            partial_results=partials or (),
            earlier=earlier,
            approved_budget_id=self.approved_id,
            structured=self._report_fits_structured(),
        )
        report = report_of(result)
        assert report is not None
        if stop.reason in LEDGER_RECORDED:
            entry = e.ledger.record_exhausted(
                self.op, self.budget_id, stop.reason, policy.ledger_window_s, now, ledger_summary(report)
            )
            if e.shared is not None:
                # Written before the caller hears of it: a coordinator that comes back through
                # another replica finds it there (bounded by the store timeout; kept locally else).
                await e.shared.recorded(entry)
        if stop.reason is StopReason.CANCELLED:
            outcome = "cancelled"  # a 2025 HTTP client that disconnected: nobody reads this answer
        elif stop.reason in _TOOL_ERROR_REASONS:
            outcome = "tool_error"
        else:
            outcome = "unresolved"
        if e.telemetry.reports:
            e.telemetry.emit(CallReported(self.call_id, self.label, report))
        # An unclassified failure is counted as such, not under the label the policy gives it in the
        # report: a dashboard must not show it as transient.
        classification = report.get("classification")
        defaulted = isinstance(classification, dict) and classification.get("defaulted") is True
        category = UNCLASSIFIED if defaulted else report.get("errorCategory")
        # the same call outcome for metrics and logs whichever shape the answer takes
        self._finished(outcome, stop.reason, category, bool(report.get("outcomeUnknown")))
        if forward:
            assert error is not None
            return {"jsonrpc": "2.0", "id": self.request["id"], "error": error}
        if self.relay.era is Era.MODERN:
            result["resultType"] = "complete"
        return {"jsonrpc": "2.0", "id": self.request["id"], "result": result}

    def _report_fits_structured(self) -> bool:
        """Whether the unresolved report may also be the result's `structuredContent`: never for a
        tool that declares an output schema (clients validate any structuredContent against it,
        errors included: the TypeScript SDK throws), nor for a client whose revision predates
        structuredContent. A 2026 request always has it; a 2025 session's revision is the one its
        initialize negotiated (unknown: no). A tool the catalog does not know (not listed, or the
        listing failed) may have an output schema: placed as for one that has."""
        tool = self.catalog.tools.get(self.name)
        if tool is None or tool.get("outputSchema") is not None:
            return False
        if self.relay.era is Era.MODERN:
            return True
        return self.relay.protocol_version in STRUCTURED_CONTENT_VERSIONS

    def _keep_rpc_error(self, error: dict[str, Any]) -> bool:
        """Whether a JSON-RPC error of tools/call goes back as it came instead of as an isError result.

        Deliberate deviation, documented in docs/recovery.md: the 2026 protocol errors
        (-32020..-32022) and any error answering an input-required continuation (a request that
        carries `requestState` or `inputResponses`) belong to the client's protocol machinery
        (re-listing tools, declaring a capability, restarting the rounds); turned into a tool
        result they would be invisible to it. They are still classified (validation) and never
        retried. Everything else follows the policy's `jsonrpc_errors_as_results`.
        """
        if not self.policy.jsonrpc_errors_as_results:
            return True
        code = error.get("code")
        if isinstance(code, int) and -32022 <= code <= -32020:
            return True
        return continues(self.request)

    def _finished(
        self, outcome: str, reason: StopReason | None, category: Any, unknown: bool, *, attempts: int | None = None
    ) -> None:
        e = self.e
        if not e.telemetry.active:
            return
        e.telemetry.emit(
            CallFinished(
                self.call_id,
                self.label,
                outcome,
                reason.value if reason is not None else None,
                str(category.value if hasattr(category, "value") else category) if category else None,
                len(self.attempts) if attempts is None else attempts,
                e.clock() - self.state.started_at_s,
                self.backoff_s,
                unknown,
                self.principal,
            )
        )
