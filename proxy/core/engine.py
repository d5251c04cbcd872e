"""The recovery engine: the attempt loop of every `tools/call`. The only place that awaits an
upstream attempt, sleeps, cancels and emits events; every decision comes from `proxy.recovery`.

For one call:
1. Resolve the tool's policy once (the snapshot the call keeps), the operation digest, and the
   ledger: an operation whose budget was exhausted within its window is answered at once, unless
   the caller names the earlier budget in `io.mcp-recovery-proxy/approveBudget` (single use).
2. Each attempt gets a fresh upstream id (the relay's `attempt`), a hard timeout of
   min(attempt timeout, deadline left) — optionally an idle timer that progress restarts — the
   same idempotency key when the policy places one, and, with tracing on, its own trace context.
   An attempt the engine stops waiting for is cancelled upstream as its transport requires.
3. `decide` says deliver, retry after a backoff, or give up; a give-up becomes the enriched
   unresolved result, and a budget exhaustion is written to the ledger.
With a shared store (`shared`, proxy/state), the ledger the engine reads is the store's local view
(no round trip per call), an approval is decided by the store (one bounded round trip, only for a
call that names one), an exhaustion is written to the store before the caller gets its result
(bounded), and the retry budget's counts are exchanged by the store's own task.
A caller's cancellation ends everything at once, with no response. A 2025 HTTP client that only
disconnected has not cancelled: the attempt in flight finishes, no new one starts. A call of a tool
that is not read-only, with re-sends on (proxy/core/resend.py, docs/recovery.md "Re-sends"), goes
on whichever era its client left: its answer is kept for a re-send, and a re-send (same operation
digest) is answered by it instead of running the tool again. A cancellation
while `stopping` is set is the end of the shutdown grace period (proxy/core/lifecycle.py), not the
caller's: the call resolves as an unresolved result with stop reason `shutdown`, the attempt in
flight (cancelled upstream by the relay) recorded as its last, dispatch unknown.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from proxy.auth.base import Principal
from proxy.core.attempt_end import TRACE_KEYS, timed_out, uncancel
from proxy.core.call import ToolCall, new_event
from proxy.core.outbox import CallProgress, Outbox
from proxy.core.relay import Relay
from proxy.core.resend import Abandoned, Flight, Resends, SharedRecord, as_resent
from proxy.errors import UpstreamFailure, untraced
from proxy.jsonrpc import (
    INVALID_PARAMS,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_DEADLINE_MS,
    META_IDEMPOTENCY_KEY,
    META_LOG_LEVEL,
    META_PREFIX,
    META_PROTOCOL_VERSION,
    Message,
    bounded,
    error,
)
from proxy.policy.compiled import PolicySet, SideEffect, ToolPolicy
from proxy.recovery import (
    CallState,
    InMemoryLedger,
    Ledger,
    Refused,
    StopReason,
    TransportError,
    operation_digest,
    outcome_from_response,
)
from proxy.recovery.antistorm import AntiStorm
from proxy.recovery.outcome import Outcome
from proxy.state import SharedState
from proxy.telemetry.events import (
    CallFinished,
    CallSucceeded,
    Telemetry,
)

log = logging.getLogger("proxy.engine")

# `_meta` keys requests commonly carry that are not the proxy's own: a set lookup (the parser hands
# over its cached key strings) spares the direct path a prefix test per key on every call.
_FOREIGN_META = frozenset(
    (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, *TRACE_KEYS)
)
assert not any(key.startswith(META_PREFIX) for key in _FOREIGN_META)
OVERLOAD_RETRY_AFTER_S = 1.0
LOOKUP_TIMEOUT_S = 5.0  # listing tools for a call whose tool the catalog lacks, at most (and within its deadline)
_POLICY_CACHE = 4096
_IN_FLIGHT_KEEP = 256  # tool labels whose in-flight count stays listed at 0
_READ_ONLY = SideEffect.READ_ONLY
MAX_KEY_CHARS = 255  # the caller's idempotency key, at most


def _keyed(meta: Any) -> bool:
    """The call carries the caller's idempotency key (a read-only tool's call is held then too)."""
    return meta.__class__ is dict and META_IDEMPOTENCY_KEY in meta


async def _answered(message: Message) -> Message:
    return message


def _key_reused(down_id: Any, name: str) -> Message:
    """The refusal of a caller's idempotency key sent again with other arguments."""
    return error(
        down_id,
        INVALID_PARAMS,
        f"this {META_IDEMPOTENCY_KEY} was used for a call of {bounded(name, 80)} with other "
        "arguments: a key names one call; use a new key for a new call",
    )


class Engine:
    def __init__(
        self,
        *,
        policies: Callable[[], PolicySet],
        ledger: Ledger | None = None,
        telemetry: Telemetry | None = None,
        upstream_name: str = "",
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        max_concurrent_calls: int | None = None,
        shared: SharedState | None = None,
        resends: Resends | None = None,
    ) -> None:
        self.policies = policies
        # Re-sends of calls whose answer was lost (proxy/core/resend.py); None: every call runs.
        self.resends = resends
        self.max_concurrent_calls = max_concurrent_calls
        # The shutdown grace period is over: a cancelled call answers `shutdown` (module docstring).
        self.stopping = False
        self.in_flight = 0
        # Calls in flight per tool label, read by the metrics at scrape time (no event per start).
        self.calls_in_flight: dict[str, int] = {}
        self.shared = shared
        if shared is not None:
            ledger = shared.ledger  # the store's local view: read on every call, no round trip
        self.ledger: Ledger = ledger if ledger is not None else InMemoryLedger(clock)
        self.antistorm = AntiStorm()
        if shared is not None:
            shared.attach(self.antistorm)
            if resends is not None:
                resends.share(shared.resends)  # re-sends are matched across replicas too
        self.telemetry = telemetry or Telemetry()
        self.upstream_name = upstream_name
        self.clock = clock
        self.rand = rand
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(3).hex() + "-"  # call ids unique across restarts, cheap per call
        self._policy_cache: dict[str, tuple[PolicySet, dict[str, Any] | None, ToolPolicy]] = {}
        # A ledger that can say it is empty spares a digest (the default ledger's `size` is C-level).
        size = getattr(self.ledger, "size", None) or getattr(self.ledger, "__len__", None)
        self.ledger_size: Callable[[], int] | None = size

    def __call__(
        self,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        principal: Principal | None = None,
    ) -> Awaitable[Message]:
        """The call's coroutine (the relay awaits it): one coroutine frame per call, not a stack.

        `principal`: who calls, when authentication is on (None: `--auth none`). Its id is part of
        the operation digest, so a budget (and its approval) belongs to the principal that spent
        it; it is named in the call's events (log line, span), never in a metric label."""
        params = request.get("params")
        if not isinstance(params, dict):
            return relay.forward(request, outbox, headers)  # malformed: the upstream's answer
        name = params.get("name")
        arguments = params.get("arguments")
        if not isinstance(name, str) or (arguments is not None and not isinstance(arguments, dict)):
            return relay.forward(request, outbox, headers)  # malformed too
        catalog = (
            relay.catalog if principal is None or not relay.catalogs.per_principal else relay.catalog_of(principal)
        )
        tool = catalog.tools.get(name)
        if tool is None:
            return self._after_lookup(relay, request, outbox, headers, name, principal)
        annotations = tool.get("annotations")
        if not isinstance(annotations, dict):
            annotations = None
        # policy_for(), its cache hit inline: every call of a listed tool under the same policy set
        hit = self._policy_cache.get(name)
        policy = (
            hit[2]
            if hit is not None and hit[0] is self.policies() and hit[1] is annotations
            else self.policy_for(name, annotations)
        )
        if self.resends is not None and (policy.side_effect is not _READ_ONLY or _keyed(params.get("_meta"))):
            answered = self._hold(relay, request, outbox, headers, name, arguments, policy, principal)
            if answered is not None:
                return answered
        limit = self.max_concurrent_calls
        if policy.direct and not self.telemetry.starts and (limit is None or self.in_flight < limit):
            size = self.ledger_size
            if size is not None and not size():
                meta = params.get("_meta")
                if meta is None:
                    return self._direct(relay, request, outbox, headers, params, name, arguments, policy, principal)
                if meta.__class__ is dict and "progressToken" not in meta:
                    for key in meta:
                        if key not in _FOREIGN_META and key.startswith(META_PREFIX):
                            break  # an own key (approveBudget, deadlineMs, ...): the whole engine
                    else:
                        return self._direct(relay, request, outbox, headers, params, name, arguments, policy, principal)
        return ToolCall(self, relay, request, outbox, headers, params, name, arguments, principal=principal).run()

    async def _direct(
        self,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        params: dict[str, Any],
        name: str,
        arguments: dict[str, Any] | None,
        policy: ToolPolicy,
        principal: Principal | None,
    ) -> Message:
        """Attempt 1 of a call whose first attempt only its own answer can affect: nothing in the
        ledger, no approval or caller deadline, no progress token, no idempotency key, breaker
        or start-event observer, and room under the concurrency limit. It is what `ToolCall.run` does in that
        case, without building the call's state unless the answer is not a success; then the
        call goes on in `ToolCall.attempts_loop` with this attempt as its first."""
        label = name  # the bounded label: a catalog name (else "other")
        flying = self.calls_in_flight
        flying[label] = flying.get(label, 0) + 1
        self.in_flight += 1
        started = self.clock()
        try:
            self.antistorm.count_call(label, started)
            # attempt_timeout_s() and the send bound of `_attempt`, for a call that starts now
            timeout_s = policy.first_timeout_s
            # With an idle timer the upstream gets a progress token (the caller sent none): what it
            # reports is kept as the call's partial results, as `ToolCall.run` keeps it.
            idle_s = policy.idle_timeout_s
            progress = CallProgress(None, started) if idle_s is not None else None
            try:
                # positional: the interpreter does not specialize a call with keywords (see Relay.attempt)
                response = await relay.attempt(
                    request, outbox, headers, timeout_s, policy.first_send_s, progress, None, None, idle_s
                )
            # untraced: the failure's frames hold the exchange that holds the failure (a cycle)
            except TimeoutError as timeout:
                first: Outcome = timed_out(1, timeout_s, untraced(timeout), policy, policy.deadline_s)
            except UpstreamFailure as failure:
                first = TransportError.from_failure(untraced(failure))
            except asyncio.CancelledError:
                if self.stopping:
                    uncancel()
                    call = ToolCall(self, relay, request, outbox, headers, params, name, arguments, policy=policy)
                    call.start_after_first(started)
                    return await call.shut_down(None, started)
                if self.telemetry.active:
                    self.telemetry.emit(
                        CallFinished(
                            self.new_call_id(),
                            label,
                            "cancelled",
                            StopReason.CANCELLED.value,
                            None,
                            1,  # the first attempt, stopped in flight by the caller's cancellation
                            self.clock() - started,
                            0.0,
                            False,
                            principal.id if principal is not None else None,
                        )
                    )
                raise
            else:
                result = response.get("result")
                if (  # _is_success, inline
                    result.__class__ is dict
                    and result.get("isError") is not True
                    and response.get("error").__class__ is not dict
                ):
                    ended = self.clock()
                    telemetry = self.telemetry
                    if telemetry.active:
                        # new_call_id(), inline, and formatted only when an observer reads it (the
                        # metrics alone do not): the number is still taken, so other calls' ids stay.
                        number = next(self._ids)
                        call_id = f"{self._id_prefix}{number:x}" if telemetry.success_ids else ""
                        took = ended - started
                        who = principal.id if principal is not None else None
                        telemetry.emit_success(new_event(CallSucceeded, (call_id, label, took, took, who)))
                    return {"jsonrpc": "2.0", "id": request["id"], "result": result}
                first = outcome_from_response(response)
            call = ToolCall(
                self, relay, request, outbox, headers, params, name, arguments, policy=policy, principal=principal
            )
            call.start_after_first(started)
            return await call.attempts_loop(progress, (first, started, self.clock()))
        finally:
            # left(label), inline as the entry above is: a method call more on every call
            self.in_flight -= 1
            left = flying[label] - 1
            if left or len(flying) <= _IN_FLIGHT_KEEP:
                flying[label] = left
            else:
                del flying[label]

    async def _after_lookup(
        self,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        name: str,
        principal: Principal | None,
    ) -> Message:
        """A tool the catalog lacks: wait for the catalog's listing first (the tool's annotations
        decide its side-effect class, its output schema where the report may go). `request` was
        checked by `__call__`: its params are an object with a valid name and arguments.

        The listing is the catalog's, started when the upstream was first reached (or now, by
        this call), and never cut short by this call's deadline (proxy/core/catalog.py). The wait is part
        of the call, counted in its elapsed time: at most `LOOKUP_TIMEOUT_S`, and never more than
        leaves attempt 1 the minimum useful attempt time, or half the deadline when that is shorter
        than the minimum (a short caller deadline waits too: the listing is usually done)."""
        began = self.clock()
        params = request["params"]
        meta = params.get("_meta")
        caller_ms = meta.get(META_DEADLINE_MS) if isinstance(meta, dict) else None
        policy = self.policy_for(name, None)
        room = CallState.start(policy, now_s=began, caller_deadline_ms=caller_ms).deadline_left_s(began)
        wait_s = min(LOOKUP_TIMEOUT_S, room - min(policy.min_attempt_s, room / 2))
        await relay.lookup_tool(name, request, max(0.0, wait_s), headers, principal)
        call = ToolCall(
            self, relay, request, outbox, headers, params, name, params.get("arguments"), principal=principal
        )
        if self.resends is not None and (call.policy.side_effect is not _READ_ONLY or _keyed(call.meta)):
            answered = self._hold(relay, request, outbox, headers, name, call.arguments, call.policy, principal, began)
            if answered is not None:
                return await answered
        call.began = began
        return await call.run()

    # -- re-sends (proxy/core/resend.py) ----------------------------------------------------------
    def operation(
        self, name: str, arguments: dict[str, Any] | None, policy: ToolPolicy, principal_id: str | None
    ) -> str:
        """The operation digest of a call: the ledger's key and the re-send table's."""
        key = policy.idempotency_key
        key_argument = key.name if key is not None and key.location == "argument" else None
        return operation_digest(name, arguments, key_argument, principal_id, upstream=self.upstream_name)

    def _hold(
        self,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        name: str,
        arguments: dict[str, Any] | None,
        policy: ToolPolicy,
        principal: Principal | None,
        began: float | None = None,
    ) -> Awaitable[Message] | None:
        """A call of a tool that is not read-only, or one with the caller's idempotency key: the
        answer of the earlier call it repeats (`_attach`), if one is listed; a refusal for a key
        reused with other arguments or malformed; else None, and this call's outbox now reports
        its answer's delivery to a flight of its own. Without a key the digest is computed only
        if the flight gets listed or a table lookup needs it."""
        resends = self.resends
        assert resends is not None
        if began is None:
            began = self.clock()
        who = principal.id if principal is not None else None
        meta = request["params"].get("_meta")
        key = meta.get(META_IDEMPOTENCY_KEY) if meta.__class__ is dict else None
        if key is not None:
            if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
                return _answered(
                    error(
                        request["id"],
                        INVALID_PARAMS,
                        f"{META_IDEMPOTENCY_KEY} must be a string of 1 to {MAX_KEY_CHARS} characters",
                    )
                )
            keyed_op = operation_digest("\0key", {"tool": name, "key": key}, None, who, upstream=self.upstream_name)
            arguments_op = self.operation(name, arguments, policy, who)
            twin = resends.find(keyed_op)
            remote = resends.remote(keyed_op) if twin is None else None
            if twin is None and remote is None:
                if resends.shared is not None:
                    keyed = (keyed_op, arguments_op)
                    return self._claim_keyed(keyed, relay, request, outbox, headers, name, policy, principal, began)
                outbox.hold(resends.keyed(keyed_op, arguments_op, policy.deadline_s), True)
                return None
            if (twin is not None and twin.arguments_differ(arguments_op)) or (
                remote is not None and remote.arguments_op != arguments_op
            ):
                return _answered(_key_reused(request["id"], name))
            if twin is not None:
                return self._attach(twin, relay, request, outbox, headers, policy, principal, began)
            assert remote is not None
            return self._attach_remote(keyed_op, remote, relay, request, outbox, headers, policy, principal, began)
        if resends:
            op = self.operation(name, arguments, policy, who)
            twin = resends.find(op)
            if twin is not None:
                return self._attach(twin, relay, request, outbox, headers, policy, principal, began)
            remote = resends.remote(op)
            if remote is not None:
                return self._attach_remote(op, remote, relay, request, outbox, headers, policy, principal, began)
        outbox.hold(resends.flight(lambda: self.operation(name, arguments, policy, who), policy.deadline_s), True)
        return None

    async def _attach(
        self,
        twin: Flight,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        policy: ToolPolicy,
        principal: Principal | None,
        began: float,
    ) -> Message:
        """A re-send: answered by its twin's execution (running, or answered and kept), never by
        running the tool again. This request's outbox reports to the same flight, so the answer
        stays kept until some client has it. A twin that ends without an answer (its caller
        cancelled it) leaves this call to run as a call of its own. The wait is this call's and
        keeps to its own deadline (`_room_s`): past it, the re-send is answered `still_running`
        and the twin runs on, its answer kept for the next re-send."""
        outbox.hold(twin, False)
        try:
            async with asyncio.timeout(self._room_s(request, policy, began)):
                answer = await twin.wait()
        except Abandoned:
            return await self(relay, request, outbox, headers, principal)
        except TimeoutError:
            return await self._still_running(relay, request, outbox, headers, policy, principal, began)
        assert self.resends is not None
        self.resends.attached_one()
        log.info(
            "tools/call %s is a re-send of a call whose answer was not delivered: answered by that call's execution",
            request["params"]["name"] if len(request["params"]["name"]) <= 80 else "(a long name)",
        )
        return as_resent(answer, request["id"])

    async def _claim_keyed(
        self,
        keyed: tuple[str, str],
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        name: str,
        policy: ToolPolicy,
        principal: Principal | None,
        began: float,
    ) -> Message:
        """A call with the caller's idempotency key and a shared store: its record is claimed in
        the store before it runs (one bounded round trip), so the same key sent to two replicas
        at once runs once: the replica that lost the claim answers with the other's execution.
        A store that does not answer leaves the call to run, matched on this replica only."""
        keyed_op, arguments_op = keyed
        resends = self.resends
        assert resends is not None and resends.shared is not None
        claimed = await resends.shared.claim(keyed_op, arguments_op, policy.deadline_s)
        if claimed is False:
            remote = resends.remote(keyed_op)
            if remote is not None and remote.arguments_op != arguments_op:
                return _key_reused(request["id"], name)
            if remote is not None:
                return await self._attach_remote(
                    keyed_op, remote, relay, request, outbox, headers, policy, principal, began
                )
        outbox.hold(resends.keyed(keyed_op, arguments_op, policy.deadline_s, claimed=claimed is True), True)
        params = request["params"]
        arguments = params.get("arguments")
        call = ToolCall(self, relay, request, outbox, headers, params, name, arguments, principal=principal)
        call.began = began  # the claim's round trip is part of the call's time
        return await call.run()

    async def _attach_remote(
        self,
        op: str,
        record: SharedRecord,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        policy: ToolPolicy,
        principal: Principal | None,
        began: float,
    ) -> Message:
        """A re-send of a call another replica listed in the shared store (proxy/state/resends.py):
        answered by that call's execution, whose answer the store keeps or will keep. The wait is
        bounded by the call's deadline (that call cannot run longer) and by this call's own
        (`_room_s`), and ends early if the record goes (its call was cancelled) or the store stops
        answering; without an answer this call runs as a call of its own, as it would on one
        replica, unless its own deadline is what ended the wait while the record still stands:
        then it is answered `still_running`, as a re-send on one replica is."""
        resends = self.resends
        assert resends is not None and resends.shared is not None
        flight = resends.attach_remote(op, record)
        outbox.hold(flight, False)
        room_s = self._room_s(request, policy, began)
        answer = await resends.shared.answer(op, min(policy.deadline_s, room_s))
        if answer is None:
            if room_s < policy.deadline_s and self.clock() - began >= room_s and resends.remote(op) is not None:
                return await self._still_running(relay, request, outbox, headers, policy, principal, began)
            flight.abandoned()  # its waiters (re-sends here) run anew too
            return await self(relay, request, outbox, headers, principal)
        resends.attached_one()
        log.info(
            "tools/call %s is a re-send of a call another replica ran: answered by that call's execution",
            request["params"]["name"] if len(request["params"]["name"]) <= 80 else "(a long name)",
        )
        return as_resent(answer, request["id"])

    def _room_s(self, request: Message, policy: ToolPolicy, began: float) -> float:
        """How long a re-send that began at `began` may still wait: to its own deadline (`deadlineMs`)."""
        meta = request["params"].get("_meta")
        caller_ms = meta.get(META_DEADLINE_MS) if isinstance(meta, dict) else None
        return CallState.start(policy, now_s=began, caller_deadline_ms=caller_ms).deadline_left_s(self.clock())

    async def _still_running(
        self,
        relay: Relay,
        request: Message,
        outbox: Outbox,
        headers: Mapping[str, str] | None,
        policy: ToolPolicy,
        principal: Principal | None,
        began: float,
    ) -> Message:
        """A re-send's own deadline passed before the execution it waited for answered: its
        outbox stops reporting to that execution's flight (this answer is not the execution's,
        and its delivery delivers nothing of it), and it is answered `still_running`."""
        assert self.resends is not None
        outbox.hold(self.resends.deaf(), False)
        params = request["params"]
        name = params["name"]
        log.info(
            "tools/call %s is a re-send of a call still running upstream; its own deadline passed first",
            name if len(name) <= 80 else "(a long name)",
        )
        arguments = params.get("arguments")
        call = ToolCall(
            self, relay, request, outbox, headers, params, name, arguments, policy=policy, principal=principal
        )
        return await call.still_running(began)

    def left(self, label: str) -> None:
        """A call of `label` is over: the in-flight counts (entered where the call starts)."""
        self.in_flight -= 1
        flying = self.calls_in_flight
        left = flying[label] - 1
        if left or len(flying) <= _IN_FLIGHT_KEEP:
            flying[label] = left
        else:
            del flying[label]  # bounded: past the cap, idle labels are dropped

    def new_call_id(self) -> str:
        """Unique across restarts (a random prefix per engine), cheap per call."""
        return f"{self._id_prefix}{next(self._ids):x}"

    def in_flight_by_tool(self) -> list[tuple[str, int]]:
        """(tool label, calls in flight) for /metrics; a snapshot, safe from another thread."""
        return list(self.calls_in_flight.items())

    async def approve(self, op: str, budget_id: str, now_s: float) -> bool:
        """A coordinator's approval of `budget_id` (single use): the store decides when shared."""
        if self.shared is None:
            return self.ledger.approve(op, budget_id, now_s)
        return await self.shared.approve(op, budget_id, now_s)

    def clear(self, op: str) -> None:
        """An approved call succeeded: its operation leaves the ledger (everywhere, when shared)."""
        self.ledger.clear(op)
        if self.shared is not None:
            self.shared.cleared(op)

    def admit_first(self, now_s: float) -> Refused | None:
        """The proxy's own concurrency limit: a call beyond it is refused before its first attempt."""
        if self.max_concurrent_calls is not None and self.in_flight > self.max_concurrent_calls:
            return Refused(StopReason.OVERLOADED, OVERLOAD_RETRY_AFTER_S)
        return None

    def policy_for(self, name: str, annotations: dict[str, Any] | None) -> ToolPolicy:
        """The tool's policy in the current set; remembered per tool until the set or the tool's
        annotations (a new listing) change. Bounded: forgotten wholesale past `_POLICY_CACHE`."""
        policies = self.policies()
        hit = self._policy_cache.get(name)
        if hit is not None and hit[0] is policies and hit[1] is annotations:
            return hit[2]
        policy = policies.resolve(name, annotations)
        if len(self._policy_cache) >= _POLICY_CACHE:
            self._policy_cache.clear()
        self._policy_cache[name] = (policies, annotations, policy)
        return policy
