"""The relays of 2026-07-28 requests: the shared one, the one of tool calls before the upstream is
reached, and those replaced when the upstream's eras changed; and the link of a new 2025 session
(`open_legacy`: the upstream's own, or bridged onto its 2026 link where it speaks only that).

Contract of `ModernRelays`:
- `current()` is the relay every 2026 request takes: over the upstream's own 2026 link where the
  upstream speaks 2026-07-28; over a 2025 session of the proxy's, translated by the bridge
  (proxy/upstream/bridge.py), where it speaks only the 2025 revisions and bridging is on
  (`--era-bridge`); None where neither (the caller refuses the request as that upstream would).
  One relay at a time, however many first requests race for it.
- When the upstream gains or loses the 2026 revision (a redeploy learnt by a re-probe), the next
  request gets a relay of the fitting kind; the replaced relay's requests finish on it, and a
  replaced bridge's session is closed with the proxy (`aclose`), or sooner when more than
  `MAX_RETIRED` were replaced (eras that flap): the oldest is closed, its requests ended.
- Where 2026 requests will be bridged onto a stdio server whose 2025 sessions each start a process
  (it keeps warm spares for them), the bridge's interactive sessions keep one process started
  ahead (bridge_interactive.py, `InteractiveCalls.warm`): from the moment the upstream's eras are
  known (`prepare`), before any 2026 request, since the first request that needs one may follow
  the first 2026 request within less than a process's start; and again when the bridge opens.
  It yields to 2025 clients: a session that finds the upstream at its limit gets its place
  (`yield_reserve`).
- `for_request(request)`: a `tools/call` that the shared relay cannot take yet (the upstream not
  reached: not started, crash-looping, refusing) goes to the engine all the same, over a relay
  whose link reaches the upstream on each attempt (proxy/core/reaching.py), so its failure is an
  outcome the engine classifies, retries and reports, never a transport error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from proxy.core.reaching import ReachingLink
from proxy.core.relay import Relay
from proxy.errors import FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.upstream.base import Capabilities, Era, Upstream, UpstreamLink
from proxy.upstream.bridge import ModernOverLegacy
from proxy.upstream.bridge_interactive import InteractiveCalls
from proxy.upstream.bridge_legacy import LegacyOverModern
from proxy.upstream.bridge_proving import ProvingLink


async def open_legacy(
    upstream: Upstream,
    caps: Capabilities | None,
    settings: Settings,
    on_verdict: Callable[[bool], None],
    make_room: Callable[[], Awaitable[bool]] | None = None,
) -> UpstreamLink:
    """The upstream link of a new 2025 session: the upstream's own, unless it speaks only
    2026-07-28 and bridging is on (`--era-bridge`): then a 2025 session held by the proxy over the
    upstream's shared 2026 link (proxy/upstream/bridge_legacy.py). Where 2025 is only assumed
    (`legacy_assumed`), the session's `initialize` finds out (proxy/upstream/bridge_proving.py)
    and `on_verdict` is told whether the upstream speaks 2025. Where the upstream is at its limit
    of sessions, `make_room` (`ModernRelays.yield_reserve`) may free one, and the link is asked
    for once more."""
    try:
        return await _open_legacy(upstream, caps, settings, on_verdict)
    except UpstreamFailure as failure:
        if failure.kind is not FailureKind.OVERLOADED or make_room is None or not await make_room():
            raise
    return await _open_legacy(upstream, caps, settings, on_verdict)


async def _open_legacy(
    upstream: Upstream, caps: Capabilities | None, settings: Settings, on_verdict: Callable[[bool], None]
) -> UpstreamLink:

    async def bridge() -> UpstreamLink:
        return LegacyOverModern(await upstream.open(Era.MODERN), settings.request_timeout_s)

    if caps is not None and caps.modern and settings.era_bridge:
        if not caps.legacy:
            return await bridge()
        if caps.legacy_assumed:
            return ProvingLink(await upstream.open(Era.LEGACY), bridge, on_verdict)
    return await upstream.open(Era.LEGACY)


def served(caps: Capabilities | None, bridge: bool) -> dict[str, str]:
    """How each era's clients are served: `native` (the upstream speaks it), `bridged` (2026
    clients over a 2025 session of the proxy's, or 2025 sessions over the upstream's 2026 link),
    `refused` (as the upstream would refuse it); nothing before the upstream's eras are known."""
    if caps is None:
        return {}
    modern = "native" if caps.modern else "bridged" if caps.legacy and bridge else "refused"
    legacy = "native" if caps.legacy else "bridged" if caps.modern and bridge else "refused"
    return {"2025": legacy, "2026-07-28": modern}


def settled(caps: Capabilities, speaks_legacy: bool) -> Capabilities:
    """`caps` once a 2025 session found out whether the upstream speaks 2025 (`open_legacy`)."""
    detail = caps.detail if speaks_legacy else f"{caps.detail}; initialize refused: 2026-07-28 only"
    return Capabilities(legacy=speaks_legacy, modern=caps.modern, detail=detail)


# Relays replaced after the upstream's eras changed, kept while their requests finish.
MAX_RETIRED = 2


class ModernRelays:
    def __init__(
        self,
        upstream: Upstream,
        probe: Callable[[], Awaitable[Capabilities | None]],
        build: Callable[[UpstreamLink, bool], Relay],
        *,
        bridge: bool,
        bridge_timeout_s: float,
        engine_takes_calls: bool,
        bridge_sessions: int = 0,
        bridge_input_wait_s: float = 300.0,
    ) -> None:
        """`probe`: the upstream's eras (raises UpstreamFailure while it is not reached);
        `build(link, reaching)`: the service's relay over `link` (`reaching`: the relay of calls
        before the upstream is reached); `bridge`: serve a 2025-only upstream's 2026 callers over
        a 2025 session, whose handshake is bounded by `bridge_timeout_s`, and with up to
        `bridge_sessions` more on which the server may ask its caller (bridge_interactive.py),
        holding such a request `bridge_input_wait_s` for the caller's answers."""
        self._upstream = upstream
        self._probe = probe
        self._build = build
        self._bridge = bridge
        self._bridge_timeout_s = bridge_timeout_s
        self._engine_takes_calls = engine_takes_calls
        self._bridge_sessions = bridge_sessions
        self._bridge_input_wait_s = bridge_input_wait_s
        self.shared: Relay | None = None
        self.reaching: Relay | None = None
        self.retired: list[Relay] = []
        self.closing: set[asyncio.Task[None]] = set()  # retired relays being closed
        self._lock = asyncio.Lock()
        # The interactive sessions of the next bridge (made before it, to start one ahead: `prepare`).
        self._interactive: InteractiveCalls | None = None

    def live(self) -> list[Relay]:
        """The relays requests may still be running on."""
        return [relay for relay in (self.shared, self.reaching, *self.retired) if relay is not None]

    async def current(self) -> Relay | None:
        caps = await self._probe()
        if caps is None or not (caps.modern or (caps.legacy and self._bridge)):
            return None
        relay = self.shared
        if relay is not None and isinstance(relay.link, ModernOverLegacy) is caps.modern:
            self._retire(relay)  # the upstream gained or lost the 2026 revision
            self.shared = relay = None
            self._interactive = None  # a retired bridge's sessions close with it
        if relay is not None:
            return relay
        async with self._lock:
            if self.shared is None:
                self.shared = self._build(await self._link(caps), False)
            return self.shared

    def _retire(self, relay: Relay) -> None:
        """Keep `relay` for its requests to finish; past `MAX_RETIRED` (an upstream whose eras
        flap, as during a rolling deploy behind a load balancer), the oldest is closed now: its
        requests end, and a bridge's 2025 session with them."""
        self.retired.append(relay)
        while len(self.retired) > MAX_RETIRED:
            task = asyncio.ensure_future(_close_bridge(self.retired.pop(0)))
            self.closing.add(task)
            task.add_done_callback(self.closing.discard)

    def prepare(self, caps: Capabilities | None) -> None:
        """The upstream's eras are known: where its 2026 requests will be bridged, the bridge's
        interactive sessions start one process ahead now (the module's contract)."""
        if caps is not None and caps.legacy and not caps.modern and self._bridge and self.shared is None:
            interactive = self._interactive_calls()
            if interactive is not None:
                interactive.warm()

    async def yield_reserve(self) -> bool:
        """A 2025 client's session found the upstream at its limit of sessions: the process the
        bridge started ahead, if any, is closed to make room; whether there was one."""
        interactive = self._interactive
        return interactive is not None and await interactive.yield_reserve()

    def _interactive_calls(self) -> InteractiveCalls | None:
        if self._bridge_sessions <= 0:
            return None
        if self._interactive is None:
            self._interactive = InteractiveCalls(
                lambda: self._upstream.open(Era.LEGACY),
                timeout_s=self._bridge_timeout_s,
                max_sessions=self._bridge_sessions,
                input_wait_s=self._bridge_input_wait_s,
                # only where a 2025 session is a process of its own, kept warm ahead: not over
                # HTTP, nor with shared stdio children, nor the one child behind --listen stdio
                reserve=getattr(self._upstream, "spares", 0) > 0,
            )
        return self._interactive

    async def _link(self, caps: Capabilities) -> UpstreamLink:
        if caps.modern:
            return await self._upstream.open(Era.MODERN)
        interactive = self._interactive_calls()
        bridge = await ModernOverLegacy.open(await self._upstream.open(Era.LEGACY), self._bridge_timeout_s, interactive)
        if interactive is not None:
            interactive.warm()
        return bridge

    async def for_request(self, request: Message) -> Relay | None:
        try:
            return await self.current()
        except UpstreamFailure:
            if request.get("method") != "tools/call" or not self._engine_takes_calls:
                raise
        if self.reaching is None:
            self.reaching = self._build(ReachingLink(self.current), True)
        return self.reaching

    async def end_requests(self) -> None:
        """Every request of these relays is ended (bounded, each relay's own)."""
        await asyncio.gather(*(relay.end_requests() for relay in self.live()), return_exceptions=True)

    async def aclose(self) -> None:
        """The reaching relay closes; a bridge's 2025 session ends with its requests (the
        upstream's own 2026 link is the upstream's to close)."""
        closing = [relay for relay in (self.shared, *self.retired) if relay is not None]
        bridged = self.shared is not None and isinstance(self.shared.link, ModernOverLegacy)
        unopened = None if bridged else self._interactive  # sessions started ahead for no bridge yet
        await asyncio.gather(
            *((self.reaching.aclose(),) if self.reaching is not None else ()),
            *(_close_bridge(relay) for relay in closing),
            *((unopened.aclose(),) if unopened is not None else ()),
            *self.closing,
            return_exceptions=True,
        )


async def _close_bridge(relay: Relay) -> None:
    if isinstance(relay.link, ModernOverLegacy):
        await relay.end_requests()
        await relay.link.aclose()
