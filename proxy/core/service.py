"""The running proxy: its upstream, what the upstream speaks, the shared modern relay, the legacy
sessions, and readiness. Frontends and the admin endpoint share one `Service`.

- `start()` probes the upstream (bounded); until a probe succeeds, a background loop retries it
  with backoff and `/readyz` says why it is not ready. Requests are not refused meanwhile: a legacy
  `initialize` still opens a link (a stdio child may start fine later).
- After that, the upstream's `health` (kept by its adapter from the traffic it relays: up on any
  answer, down when nothing can answer) is `mcp_recovery_upstream_up` and decides `/readyz`. While
  it is down, a background loop re-checks the upstream with backoff (0.5 s doubling to 30 s), so
  the gauge and readiness come back without waiting for traffic; an HTTP or SSE upstream is also
  re-probed by `/readyz` every `ready_check_interval_s`, so an idle one that went away is noticed.
- Each legacy session owns a relay and an upstream link; sessions idle longer than the configured
  timeout (with nothing in flight) are closed, which stops their stdio children.
- Sessions are bounded in total (`max_sessions`, derived from what a session costs:
  proxy/core/capacity.py) and, where configured, per client (`max_sessions_per_client`: by default
  only per verified principal, with `--auth jwt|tokens`). At either bound the least recently used
  session with nothing in flight (of the whole proxy, or of that client) is closed first, its stdio
  child reclaimed (its client gets 404 for that session id and initializes again); only when every
  session in question is busy is the new one refused (503 at the proxy's bound, 429 at a client's,
  with Retry-After and the flag that raises it; counted in
  `mcp_recovery_http_refused_total{reason="sessions"|"sessions_per_client"}`, closed sessions in
  `mcp_recovery_sessions_evicted_total`). A session whose client sent nothing (no
  `notifications/initialized`, no request) within `session_init_timeout_s` of the answer to its
  `initialize` is closed (`mcp_recovery_sessions_closed_uninitialized_total`). `/readyz` says not
  ready, with the reason, while no session slot is free and none could be made free.
- Shutdown (`drain`): `/readyz` turns 503 and new sessions are refused at once (the frontends
  refuse new requests too, while `draining`); requests in flight may finish within the grace
  period; what is still running then is ended (proxy/core/lifecycle.py: a `tools/call` resolves as an
  unresolved `shutdown` result, cancelled upstream), and the cancellations are sent before
  `aclose` stops the children.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from proxy.auth.vouch import VouchGate
from proxy.core import capacity
from proxy.core.admission import ClientShares
from proxy.core.catalog import Catalogs
from proxy.core.eras import ModernRelays, open_legacy, served, settled
from proxy.core.lifecycle import InFlight
from proxy.core.outbox import ToolCallHandler
from proxy.core.relay import Relay
from proxy.core.task_owners import TaskOwners
from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.state import SharedState
from proxy.telemetry.events import Telemetry, UpstreamStatus
from proxy.telemetry.shed import SHED
from proxy.upstream.base import Capabilities, Upstream, UpstreamLink

log = logging.getLogger("proxy.service")

PROBE_TIMEOUT_S = 15.0
READY_PROBE_TIMEOUT_S = 3.0
RECHECK_FIRST_S = 0.5
RECHECK_MAX_S = 30.0
CLOSE_WAIT_S = 10.0  # a new session waits this long, at most, for a closed one's link to close


class Service:
    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        *,
        tool_calls: ToolCallHandler | None = None,
        telemetry: Telemetry | None = None,
        state: SharedState | None = None,
    ) -> None:
        self.settings = settings
        self.state = state  # the shared store (None: the engine's memory is the whole state)
        self.upstream = upstream
        self.telemetry = telemetry or Telemetry()
        self.health = upstream.health
        self.health.on_report = self._health_reported
        # The upstream's tools, listed when it is first reached (proxy/core/catalog.py); one per
        # principal as well with --auth passthrough, whose callers may be listed other tools.
        self.catalogs = Catalogs(per_principal=settings.auth == "passthrough")
        self.catalog = self.catalogs.upstream
        self.tool_calls = tool_calls
        self.capabilities: Capabilities | None = None
        self.probe_error: str | None = "not probed yet"
        self.sessions: dict[str, Relay] = {}
        self._session_clients: dict[str, str] = {}  # session id -> the client that opened it (its key)
        self.uninitialized_closed = 0  # sessions closed because nothing followed their initialize
        self._probe_lock = asyncio.Lock()
        self.eras = ModernRelays(
            upstream,
            self.ensure_probed,
            self._era_relay,
            bridge=settings.era_bridge,
            bridge_timeout_s=settings.request_timeout_s,
            engine_takes_calls=tool_calls is not None,
            bridge_sessions=settings.era_bridge_sessions or 0,
            bridge_input_wait_s=settings.era_bridge_input_wait_s,
        )
        # passthrough: the upstream refused the proxy's own probe (see `_probed_behind_auth`)
        self.probe_refusal: UpstreamFailure | None = None
        self._recheck: asyncio.Task[None] | None = None
        self._renegotiated_at = float("-inf")
        self._renegotiation: asyncio.Task[None] | None = None
        self._stopping = False
        self.requests = InFlight()  # every relay's requests in flight (for a graceful shutdown)
        self.draining = False  # shutting down: no new sessions or requests, /readyz 503
        self._drained: asyncio.Future[None] | None = None
        self._cut_short = asyncio.Event()
        self._checked_at = time.monotonic()
        self._supervised = bool(getattr(upstream, "supervised", False))
        # A stdio upstream's probe is made of child starts, each bounded by --stdio-start-timeout-s
        # (stretched while the child is busy starting): its bound is the sum of its steps'
        # (`probe_bound_s`), so that it never cuts short a step that would end by its own bound,
        # and never less than the default.
        steps_s = getattr(upstream, "probe_bound_s", 0.0) if self._supervised else 0.0
        self._probe_timeout_s = max(PROBE_TIMEOUT_S, steps_s)
        # Each client's share of a network upstream's connections, across its sessions and both
        # eras (a stdio upstream has no pool to share: each 2025 session has its own child).
        # Off (None) unless configured, or per verified principal (settings.py).
        share = settings.max_upstream_per_client
        self.shares = None if self._supervised or share is None else ClientShares(share)
        # One stdio client's one child: its answer to the client's first request is the probe
        # (a probe of its own would fix the child's era, or start a second process).
        self._deferred = bool(getattr(upstream, "single_session", False))
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()  # sessions whose links are still shutting down
        self._opening = 0  # sessions admitted whose upstream link is being opened
        self.on_session_change: Callable[[int], None] | None = None
        # --auth jwt|tokens: the proxy verified each caller, the upstream sees one (the proxy)
        self.task_owners = TaskOwners() if settings.auth in ("jwt", "tokens") else None
        self.started_at = time.monotonic()

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.state is not None:
            await self.state.start()  # bounded: an unreachable store leaves the proxy on local state
        if self._deferred:
            self.probe_error = "waiting for the client's first request (the upstream process is starting)"
            self.upstream.prestart()  # type: ignore[attr-defined]
        else:
            await self.ensure_probed(raise_on_failure=False)
        if self.capabilities is None and not self._deferred:
            self._tasks.append(asyncio.create_task(self._probe_until_ready()))
        self._tasks.append(asyncio.create_task(self._reap_idle_sessions()))

    async def aclose(self) -> None:
        self._stopping = True
        if self._recheck is not None:
            self._tasks.append(self._recheck)
        if self._renegotiation is not None:
            self._tasks.append(self._renegotiation)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        sessions, self.sessions = list(self.sessions.values()), {}
        closing = list(self._closing)
        if self._supervised:
            # stdio: every relay ends what it still runs and its cancellations are written (each
            # bounded), then the upstream stops every child at once, one bound for all of them
            # (proxy/upstream/stdio/process.py `stop_children`); closing a relay's link after that
            # is quick. Closing one relay after another would stop the children one group after
            # another, each with its own bound.
            await asyncio.gather(
                *(relay.end_requests() for relay in sessions), self.eras.end_requests(), return_exceptions=True
            )
            await self.upstream.aclose()
        await asyncio.gather(
            *(relay.aclose() for relay in sessions),
            self.eras.aclose(),
            *closing,
            return_exceptions=True,
        )
        await self.upstream.aclose()
        if self.state is not None:
            await self.state.aclose()

    def cut_drain_short(self) -> None:
        """A second stop signal: end what is in flight now instead of at the grace period's end."""
        self._cut_short.set()

    async def drain(self, grace_s: float) -> int:
        """Stop taking work, let requests in flight finish within `grace_s` (or until
        `cut_drain_short`), then end the rest; returns how many were ended. A second call (stdin
        closed, then SIGTERM) cuts the first one short and waits for it. The children keep running
        until `aclose`."""
        if self._drained is not None:
            self._cut_short.set()
            await asyncio.shield(self._drained)
            return 0
        self._drained = asyncio.get_running_loop().create_future()
        try:
            return await self._drain(grace_s)
        finally:
            self._drained.set_result(None)

    async def _drain(self, grace_s: float) -> int:
        self.draining = True
        requests = self.requests
        log.info("shutting down: %d requests in flight, up to %g s to finish", requests.counted, grace_s)
        waiting = asyncio.ensure_future(requests.wait_idle(grace_s))
        cut = asyncio.ensure_future(self._cut_short.wait())
        try:
            await asyncio.wait([waiting, cut], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            cut.cancel()
        if not requests.tasks:
            return 0
        engine = self.tool_calls
        if engine is not None and hasattr(engine, "stopping"):
            engine.stopping = True
        ended = requests.end()
        log.warning("shutdown grace period over: ending %d requests still in flight", len(ended))
        # Each ends at once (its attempt is cancelled, its answer written); bounded all the same.
        await asyncio.wait(ended, timeout=5.0)
        relays = [*self.sessions.values(), *self.eras.live()]
        await asyncio.gather(*(relay.settle() for relay in relays), return_exceptions=True)
        return len(ended)

    @property
    def ready(self) -> bool:
        if self.capabilities is None and self._deferred:
            return self.health.up is True  # the one child answered the client
        return self.capabilities is not None and self.health.up is not False

    async def readiness(self) -> tuple[bool, str | None]:
        """For /readyz: the upstream answered a probe, and its health is not down; the same verdict
        as `mcp_recovery_upstream_up`.

        A stdio upstream's health follows its children (see proxy/upstream/stdio/upstream.py). An HTTP or
        SSE upstream is also probed again when the last check is older than
        `ready_check_interval_s`, bounded in time, so an upstream that went away while no traffic
        flowed is noticed; the verdict is cached in between.
        """
        if self.draining:
            return False, "shutting down"
        if self.capabilities is None and not (self._deferred and self.health.up is True):
            return False, self.probe_error or "upstream not probed yet"
        interval_s = self.settings.ready_check_interval_s
        if not self._supervised and time.monotonic() - self._checked_at >= interval_s:
            await self._check(READY_PROBE_TIMEOUT_S, unless_checked_within_s=interval_s)
        if self.health.up is False:
            return False, f"upstream not answering: {self.health.why or 'no answer'}"
        if self.state is not None and not self.state.up and self.settings.state_required_for_ready:
            return False, f"shared state store unreachable: {self.state.status().get('error') or 'down'}"
        if self.legacy_supported():
            full = self.no_session_slot()
            if full is not None:
                return False, full
        return True, None

    def no_session_slot(self) -> str | None:
        """Why a new 2025 session cannot be opened now (None: it can). The one answer both
        admission (`new_session`, 503) and readiness (`/readyz`) give: a session holds its slot
        until its upstream link is closed, not only until it leaves `sessions` (a stdio child
        that is still stopping counts against the upstream's cap of children, so an `initialize`
        in that window was refused while `/readyz` said ready)."""
        limit = self.settings.sessions_cap
        held = len(self.sessions) + len(self._closing)
        if held < limit or capacity.least_recently_used(self.sessions) is not None:
            return None  # free, or one can be made free (an idle session closed)
        closing = f" ({len(self._closing)} closing)" if self._closing else ""
        return f"no session slot free: {held} of {limit} in use{closing}"

    async def _check(self, timeout_s: float, *, unless_checked_within_s: float = 0.0) -> None:
        """Ask the upstream now (one check at a time; skipped if another finished within
        `unless_checked_within_s`); its adapter updates `health` from the answer or the failure. A
        network upstream's answer is a full probe: the eras it speaks now replace the ones learnt
        before (an upstream redeployed with or without the 2026 revision is served accordingly)."""
        async with self._probe_lock:
            if time.monotonic() - self._checked_at < unless_checked_within_s:
                return
            try:
                caps = await asyncio.wait_for(self.upstream.check(), timeout_s)
            except TimeoutError:
                self.health.failed(f"no answer within {timeout_s:g} s")
            except UpstreamFailure as failure:
                log.debug("upstream check failed: %s", failure.detail)
            else:
                self._learn(caps)
            finally:
                self._checked_at = time.monotonic()

    def _learn(self, caps: Capabilities | None) -> None:
        known = self.capabilities
        if caps is None or known is None or (caps.legacy, caps.modern) == (known.legacy, known.modern):
            return
        log.warning("upstream %s now speaks: %s (was: %s)", self.upstream.description, caps, known)
        self.capabilities = caps

    def renegotiate(self) -> None:
        """The upstream answered a 2026 header or version error (-32020, -32022): proxy and upstream
        disagree about the protocol, so ask it again what it speaks (docs/recovery.md, "Classification": renegotiate
        before further tool calls), at most once per `ready_check_interval_s`."""
        if self._supervised or self._stopping or self.capabilities is None:
            return  # a stdio child is asked on every (re)start
        now = time.monotonic()
        if now - self._renegotiated_at < self.settings.ready_check_interval_s:
            return
        self._renegotiated_at = now
        if self._renegotiation is None or self._renegotiation.done():
            self._renegotiation = asyncio.get_running_loop().create_task(self._check(READY_PROBE_TIMEOUT_S))

    async def ensure_probed(self, *, raise_on_failure: bool = True) -> Capabilities | None:
        if self.capabilities is not None:
            return self.capabilities
        async with self._probe_lock:
            if self.capabilities is None:
                try:
                    self.capabilities = await asyncio.wait_for(self.upstream.probe(), self._probe_timeout_s)
                    self.probe_error = None
                    self._log_served()
                    self.eras.prepare(self.capabilities)
                    self.health.answered()
                except UpstreamFailure as exc:
                    if self.settings.auth == "passthrough" and exc.http_status in (401, 403):
                        self._probed_behind_auth(exc)
                    else:
                        self._probe_failed(exc)
                except TimeoutError:
                    step = getattr(self.upstream, "probe_step", None)
                    during = f" (during {step})" if step else ""
                    self._probe_failed(f"no answer within {self._probe_timeout_s:g} s{during}")
                except OSError as exc:
                    self._probe_failed(exc)
        if self.capabilities is None and raise_on_failure:
            raise UpstreamFailure(FailureKind.CONNECT_FAILED, Dispatch.NO, self.probe_error or "upstream not ready")
        return self.capabilities

    def _log_served(self) -> None:
        served = ", ".join(f"{era} {how}" for era, how in self.served_eras().items())
        log.info("upstream %s: %s; clients served: %s", self.upstream.description, self.capabilities, served)

    def _legacy_settled(self, speaks_legacy: bool) -> None:
        """A 2025 session's `initialize` found out whether the upstream speaks 2025 (eras.py)."""
        if self.capabilities is not None and self.capabilities.legacy_assumed:
            self.capabilities = settled(self.capabilities, speaks_legacy)
            if not speaks_legacy:
                self._log_served()

    def _probe_failed(self, why: BaseException | str) -> None:
        self.probe_error = f"upstream probe failed: {str(why) or type(why).__name__}"
        log.warning("%s", self.probe_error)
        self.health.failed(self.probe_error)

    def _probed_behind_auth(self, refusal: UpstreamFailure) -> None:
        """`--auth passthrough`: the upstream refused the proxy's own probe for want of a caller's
        credential, which the proxy does not have. It answered, so it is up. Which eras it speaks
        cannot be asked without a credential, and asking with a caller's would be a request the
        caller did not make (a server may count them, or rotate on them): both eras are served,
        each request goes upstream in its caller's era, and the upstream answers it as it would
        directly (a 2025-only server refuses a 2026 request itself). The refusal is kept: its
        challenge names where the upstream's metadata lives."""
        modern = getattr(self.upstream, "speaks_modern", True)  # a legacy SSE server never does
        self.capabilities = Capabilities(
            legacy=True,
            modern=modern,
            detail=f"probe refused with HTTP {refusal.http_status}: "
            + ("both eras relayed, the upstream answers" if modern else "2025 sessions relayed, the upstream answers"),
        )
        self.probe_refusal = refusal
        self.probe_error = None
        log.info("upstream %s requires the caller's credentials: %s", self.upstream.description, self.capabilities)
        self.health.answered()

    async def _probe_until_ready(self) -> None:
        delay_s = 0.5
        while self.capabilities is None:
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 10.0)
            await self.ensure_probed(raise_on_failure=False)

    def _health_reported(self) -> None:
        health = self.health
        self.telemetry.emit(UpstreamStatus(self.upstream.description, health.up is True, health.restarts))
        if health.up is False and self.capabilities is not None and not self._stopping:
            if self._recheck is None or self._recheck.done():
                self._recheck = asyncio.get_running_loop().create_task(self._recheck_until_up())

    async def _recheck_until_up(self) -> None:
        """While the upstream is down, ask it again with backoff, until something answers (this
        check or any traffic). Before the first successful probe, `_probe_until_ready` does this."""
        delay_s = RECHECK_FIRST_S
        while self.health.up is False:
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RECHECK_MAX_S)
            if self.health.up is not False:
                break
            await self._check(self._probe_timeout_s)

    # -- relays ---------------------------------------------------------------------------------
    async def modern_relay(self) -> Relay | None:
        """The shared relay for 2026-07-28 requests, or None when the upstream does not speak it
        and is not bridged (proxy/core/eras.py)."""
        return await self.eras.current()

    async def modern_relay_for(self, request: Message) -> Relay | None:
        """The relay of a 2026 request; a `tools/call` always gets one (proxy/core/eras.py)."""
        return await self.eras.for_request(request)

    def _era_relay(self, link: UpstreamLink, reaching: bool) -> Relay:
        """A relay of 2026 requests over `link`; `reaching`: the one of tool calls before the
        upstream is reached, whose link reaches it on each attempt."""
        relay = Relay(
            link,
            catalogs=self.catalogs,
            tool_calls=self.tool_calls,
            shared=self.settings.listen != "stdio",  # unless the one client on stdio is the only caller
            shares=self.shares,
            requests=self.requests,
            on_protocol_mismatch=None if reaching else self.renegotiate,
            **self._relay_options(),
        )
        if not reaching:
            relay.list_tools_soon()  # the upstream is reached: its tools are known before a call needs them
        return relay

    def served_eras(self) -> dict[str, str]:
        """How each era's clients are served: native, bridged or refused (eras.py `served`)."""
        return served(self.capabilities, self.settings.era_bridge)

    def legacy_supported(self) -> bool:
        """Whether 2025 clients are served (natively or bridged; yes while not yet probed)."""
        caps = self.capabilities
        return caps is None or caps.legacy or (caps.modern and self.settings.era_bridge)

    def _relay_options(self) -> dict[str, Any]:
        """What every relay of this service is built with: every relayed request's timeout; the
        in-flight cap per session (or per caller of the shared relay) where requests hold pooled
        connections (an HTTP or SSE upstream); task ownership (jwt, tokens); whether an upstream's
        refusal of the caller's credential is the caller's to answer (passthrough)."""
        cap = None if self._supervised else self.settings.max_requests_per_session
        return {
            "request_timeout_s": self.settings.request_timeout_s,
            "max_in_flight": cap,
            "task_owners": self.task_owners,
            "pass_auth_refusals": self.settings.auth == "passthrough",
        }

    async def new_session(self, client: str | None = None, owner: str | None = None) -> tuple[str, Relay]:
        """A 2025 session for `client` (`ClientIdentity.key`; None: unknown, not counted per client),
        usable only by the principal `owner` where one is given (jwt, tokens)."""
        settings = self.settings
        if self.draining:
            SHED.count("http_refused", "shutdown")
            raise UpstreamFailure(FailureKind.OVERLOADED, Dispatch.NO, "the proxy is shutting down", http_status=503)
        await self._make_room(client)
        self._opening += 1  # holds its slot while its link opens (concurrent initializes at the cap)
        try:
            link = await open_legacy(
                self.upstream, self.capabilities, self.settings, self._legacy_settled, self.eras.yield_reserve
            )
        finally:
            self._opening -= 1
        session_id = secrets.token_hex(16)
        relay = Relay(
            link,
            catalogs=self.catalogs,
            tool_calls=self.tool_calls,
            session_id=session_id,
            requests=self.requests,
            shares=self.shares,
            client=client,
            owner=owner,
            vouch_gate=(
                VouchGate(settings.vouch_pings_burst, settings.vouch_pings_per_s)
                if settings.auth == "passthrough"
                else None
            ),
            **self._relay_options(),
        )
        self.sessions[session_id] = relay
        if client is not None:
            self._session_clients[session_id] = client
        self._sessions_changed()
        asyncio.get_running_loop().call_later(settings.session_init_timeout_s, self._check_initialized, session_id)
        return session_id, relay

    async def _make_room(self, client: str | None) -> None:
        """Room for one more session, or a `capacity.Refusal` (see the module docstring)."""
        settings = self.settings
        share = settings.max_sessions_per_client
        if client is not None and share is not None:
            mine = [sid for sid, c in self._session_clients.items() if c == client]
            if len(mine) >= share:
                victim = capacity.least_recently_used(self.sessions, mine)
                if victim is None:
                    raise capacity.refusal(
                        "sessions_per_client",
                        "--max-sessions-per-client",
                        f"this client holds its maximum of {share} sessions, each with a request in flight",
                        http_status=429,
                    )
                self._evict(victim, "its client holds its maximum of sessions")
        limit = settings.sessions_cap
        while len(self.sessions) + len(self._closing) + self._opening >= limit:
            if len(self.sessions) + self._opening >= limit:  # live sessions fill it: close one
                victim = capacity.least_recently_used(self.sessions)
                if victim is None:
                    busy = f"{len(self.sessions)} sessions, each with a request in flight"
                    raise capacity.refusal(
                        "sessions",
                        "--max-sessions",
                        f"the proxy holds its maximum of {limit} sessions ({busy})",
                        http_status=503,
                    )
                self._evict(victim, "the proxy holds its maximum of sessions")
            # A closed session holds its slot until its link is closed (a stdio child stopping
            # counts against the upstream's cap of children): wait for one, bounded.
            done, _ = await asyncio.wait(list(self._closing), timeout=CLOSE_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise capacity.refusal(
                    "sessions",
                    "--max-sessions",
                    f"the proxy holds its maximum of {limit} sessions ({len(self._closing)} still closing)",
                    http_status=503,
                )

    def _evict(self, session_id: str, why: str) -> None:
        """Close an idle session to make room for a new one (counted; logged at debug: at capacity
        this happens on every new session, and the counter says how often)."""
        log.debug("closing idle session %s… to make room: %s", session_id[:8], why)
        SHED.count("sessions_evicted")
        self._end_session(session_id)

    def _check_initialized(self, session_id: str) -> None:
        """A session whose client said nothing within `session_init_timeout_s` of the answer to its
        `initialize` is closed; one whose initialize is still running (a slow upstream start) is
        looked at again later. Counted from the answer, not from the request: a stdio child whose
        cold start took most of the timeout left a benign client a sliver of it, and on a loaded
        machine its `notifications/initialized` came after the session was gone (the soak lost
        long-lived sessions that way; every later request of theirs got 404)."""
        relay = self.sessions.get(session_id)
        if relay is None or relay.initialized or self._stopping:
            return
        timeout_s = self.settings.session_init_timeout_s
        quiet_s = time.monotonic() - relay.last_activity  # set when the initialize was answered
        if relay.busy or quiet_s < timeout_s:
            later_s = timeout_s if relay.busy else timeout_s - quiet_s
            asyncio.get_running_loop().call_later(later_s, self._check_initialized, session_id)
            return
        log.info(
            "closing session %s…: nothing followed its initialize within %g s",
            session_id[:8],
            self.settings.session_init_timeout_s,
        )
        self.uninitialized_closed += 1
        SHED.count("sessions_closed_uninitialized")
        self._end_session(session_id)

    async def close_session(self, session_id: str) -> bool:
        """End a session at once; its upstream link (a stdio child's graceful exit, an HTTP DELETE)
        is closed in the background, so a client's DELETE is not kept waiting for it."""
        return self._end_session(session_id)

    def _end_session(self, session_id: str) -> bool:
        relay = self.sessions.pop(session_id, None)
        self._session_clients.pop(session_id, None)
        if relay is None:
            return False
        self._sessions_changed()
        task = asyncio.create_task(self._close_relay(relay, session_id))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return True

    async def _close_relay(self, relay: Relay, session_id: str) -> None:
        try:
            await relay.aclose()
        except Exception:  # a link that fails to close must not go unnoticed, nor crash anything
            log.exception("closing session %s… failed", session_id[:8])

    def _sessions_changed(self) -> None:
        if self.on_session_change is not None:
            self.on_session_change(len(self.sessions))

    async def _reap_idle_sessions(self) -> None:
        idle_s = self.settings.session_idle_timeout_s
        while True:
            await asyncio.sleep(min(30.0, idle_s / 2))
            now = time.monotonic()
            for sid, relay in list(self.sessions.items()):
                if not relay.busy and now - relay.last_activity > idle_s:
                    log.info("closing idle session %s…", sid[:8])
                    await self.close_session(sid)
            # A stdio upstream's children unused as long: warm-pool spares, shared children
            # (`--stdio-sessions shared`) with no session, 2026 children beyond the first.
            for name in ("reap_idle_spares", "reap_idle_shared", "reap_idle_modern"):
                reap = getattr(self.upstream, name, None)
                if reap is not None:
                    reap()
