"""The bounds of the proxy's HTTP ports: `LimitedHttpToolsProtocol`, what both of them run.

It is uvicorn's httptools protocol with the proxy's own request cycle (`CycleHttpToolsProtocol`,
proxy/frontend/h1_cycle.py: a response's head and body in one write), and bounds on what a peer
can hold before its request runs: head size (431), head and body read time (408), connections in
all and per client address (503), requests pipelined behind a running one; see there.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from typing import Any, ClassVar

from proxy.frontend.clients import address_key
from proxy.frontend.h1_cycle import CycleHttpToolsProtocol
from proxy.telemetry.shed import SHED


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP connection may cost before it is answered and closed (see `LimitedHttpToolsProtocol`)."""

    max_head_bytes: int = 64 * 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024
    # None: no cap per client address. `trusted_peers` (`--forwarded-allow-ips`: proxies that
    # carry many clients' connections) are not capped per address.
    max_connections_per_client: int | None = None
    trusted_peers: tuple[str, ...] = ()


# Requests a connection may have parsed and waiting behind the one it runs (HTTP/1.1 pipelining).
# uvicorn parses every request of a read at once and queues each as a request cycle (its scope,
# headers and state, about 7 KB): 0.8 MB of minimal pipelined requests on one connection held
# 48 MB, and a client that reads its answers kept the queue growing. No MCP client pipelines;
# past this many, the connection takes no further request from the peer, answers those queued,
# and closes (a pipelining client retries the unanswered ones on a new connection, RFC 9112 9.3.2).
MAX_PIPELINED = 32


def _refusal(status: int, reason: bytes, text: bytes) -> bytes:
    return b"".join(
        (
            b"HTTP/1.1 %d " % status,
            reason,
            b"\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
            % len(text),
            text,
        )
    )


# Each refusal with the `mcp_recovery_http_refused_total` reason it is counted under.
_TOO_MANY = (_refusal(503, b"Service Unavailable", b"too many connections"), "connections")
_TOO_MANY_FROM_CLIENT = (
    _refusal(503, b"Service Unavailable", b"too many connections from this client"),
    "connections_per_client",
)
_RECLAIMED = (
    _refusal(503, b"Service Unavailable", b"connection closed to make room: no complete request head"),
    "head_pending",
)
_HEAD_TOO_LARGE = (_refusal(431, b"Request Header Fields Too Large", b"request head too large"), "head_too_large")
_HEAD_TIMEOUT = (_refusal(408, b"Request Timeout", b"request head not received in time"), "head_timeout")
_BODY_TIMEOUT = (_refusal(408, b"Request Timeout", b"request body stalled"), "body_timeout")


class LimitedHttpToolsProtocol(CycleHttpToolsProtocol):
    """`CycleHttpToolsProtocol` with bounds on what a peer can hold before its request runs.

    - **Head size**: the bytes of a request head (request line and headers) are counted as they
      arrive, before the parser sees them; past `max_head_bytes` the connection is answered 431
      and closed. httptools has no limit of its own, and its Python wrapper joins a header that
      arrives in pieces by concatenation (a 1 GB header would take 2.4 GB and stall the loop).
    - **Head time**: a head must be complete `head_timeout_s` after the connection opened or its
      first byte arrived (408, then close). An idle keep-alive connection is uvicorn's own
      `timeout_keep_alive` (closed silently).
    - **Body time**: while a body is being received, `body_timeout_s` without a byte (and not
      because the app has not read what it has) answers 408 and closes; the app sees a disconnect.
    - **Pipelining**: at most `MAX_PIPELINED` requests parsed and waiting behind a running one;
      past that, the rest of what the peer sends on the connection is not parsed, and the
      connection is closed once the queued requests are answered.
    - **Connections**: past `max_connections` open connections on this server, a new one is
      answered 503 and closed at once (uvicorn's `limit_concurrency` also counts running requests,
      event streams included, and keeps the refused connection open). Past
      `max_connections_per_client` from one client address (`proxy.frontend.clients.address_key`: an
      IPv6 client by its /64), likewise: without it, one address holding every connection
      (idle ones, half-sent heads, each renewed before its timeout) would have the port answer 503 to
      everyone else. Peers in `trusted_peers` (the ingresses `--forwarded-allow-ips` names) carry
      many clients' connections and are not capped per address. At either cap, the connection
      that has waited longest for a request head and runs no request (a half-sent head, an idle
      keep-alive connection) is closed first (`_reclaim`), and the new one refused only if there
      is none: a complete `/healthz` request is answered while anything but running requests
      holds the port.

    Each refusal is counted in `mcp_recovery_http_refused_total{reason}` (proxy/telemetry/shed.py).

    Timers are armed only when a head or body spans reads, so a request that arrives in one read
    costs no timer; a connection arms one at its start (a peer that connects and sends nothing).
    """

    limits: HttpLimits = HttpLimits()
    # Per server (each `with_limits` class has its own): open connections by client address, and
    # the networks not counted so.
    _by_client: ClassVar[dict[str, int]] = {}
    _trusted: ClassVar[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client_key: str | None = None  # counted in `_by_client` under this key
        self._in_head = True  # the next bytes belong to a request head
        self._head_started = False  # ... and some of them arrived
        self._in_body = False
        self._head_bytes = 0
        self._heads = 0  # heads completed, to tell whether a cut-off prefix completed one
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_at = 0.0
        self._waiting_since = 0.0  # since when it waits for a request head (`_reclaim`)
        self._overrun = False  # past MAX_PIPELINED: nothing more is parsed; closed once answered

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn warns of every request that asks to upgrade when it serves no WebSockets,
        advising to install a WebSocket library: the proxy serves none on purpose (its config's
        `ws="none"`) and answers such a request as an ordinary one, so a caller's header is not
        worth two log lines, nor the advice."""

    @classmethod
    def with_limits(cls, limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
        """A protocol class for uvicorn's `http` setting, bound to `limits`."""
        trusted = tuple(ipaddress.ip_network(entry, strict=False) for entry in limits.trusted_peers)
        return type(cls.__name__, (cls,), {"limits": limits, "_by_client": {}, "_trusted": trusted})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        if len(self.connections) > self.limits.max_connections and not self._reclaim(None):
            self._refuse(_TOO_MANY)
            return
        cap = self.limits.max_connections_per_client
        if cap is not None and self.client is not None:
            key = self._counted_key(str(self.client[0]))
            if key is not None:
                held = self._by_client.get(key, 0)
                if held >= cap and not self._reclaim(key):
                    self._refuse(_TOO_MANY_FROM_CLIENT)
                    return
                self._by_client[key] = self._by_client.get(key, 0) + 1
                self._client_key = key
        self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_expired)

    def _reclaim(self, key: str | None) -> bool:
        """At a connection cap, close a connection (of client `key`, or any) that holds a place
        without a complete request head and runs no request: the one that has waited longest with
        a half-sent head, else the one idle longest (a keep-alive connection between requests, or
        one that sent nothing yet). A half-sent head is answered 503; an idle connection is closed
        without a response: it asked nothing, and a client that reuses it as the close arrives
        would take a 503 written there for the answer to its next request. False if there is
        none: every connection runs a request (or this new one is the only candidate). So a
        complete probe request is answered while anything but running requests holds the port
        (counted as `head_pending`)."""
        partial: LimitedHttpToolsProtocol | None = None
        idle: LimitedHttpToolsProtocol | None = None
        for conn in self.connections:
            if conn is self or not isinstance(conn, LimitedHttpToolsProtocol) or not conn._in_head:
                continue
            if key is not None and conn._client_key != key:
                continue
            cycle = conn.cycle
            if cycle is not None and not cycle.response_complete:
                continue
            if conn.transport.is_closing():
                continue
            if conn._head_started:
                if partial is None or conn._waiting_since < partial._waiting_since:
                    partial = conn
            elif idle is None or conn._waiting_since < idle._waiting_since:
                idle = conn
        victim = partial or idle
        if victim is None:
            return False
        victim._refuse(_RECLAIMED, silently=victim is idle)
        victim._uncount()  # its place is free now, not when the loop reports the close
        return True

    def _counted_key(self, host: str) -> str | None:
        """The key this peer's connections count under; None for a trusted proxy (not counted)."""
        if self._trusted:
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:
                ip = None
            if ip is not None and any(ip in network for network in self._trusted):
                return None
        return address_key(host)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        """Out of the counts the caps compare with (idempotent)."""
        self.connections.discard(self)
        key = self._client_key
        if key is not None:
            self._client_key = None
            left = self._by_client[key] - 1
            if left:
                self._by_client[key] = left
            else:
                del self._by_client[key]

    def data_received(self, data: bytes) -> None:
        if self._overrun:
            return  # taking no further request: what comes is not parsed
        if self._in_head:
            limit = self.limits.max_head_bytes
            seen = self._head_bytes + len(data)
            if seen > limit:
                # Feed only what the head may still take: if that completes it, the rest is body
                # (or the next request, counted again); else the head is too large.
                room = limit - self._head_bytes
                heads = self._heads
                if room > 0:
                    super().data_received(data[:room])
                if self.transport.is_closing():
                    return
                if self._heads == heads:
                    self._refuse(_HEAD_TOO_LARGE)
                    return
                self.data_received(data[room:])
                return
            self._head_bytes = seen
            self._head_started = True
        elif self._in_body:
            self._body_at = self.loop.time()
        super().data_received(data)
        if self._overrun:
            self._cancel_timers()  # no head or body it still waits for: it only answers
            return
        if self._in_head and self._head_started and self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_expired)
        elif self._in_body and self._body_timer is None and not self.transport.is_closing():
            self._body_at = self.loop.time()
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_expired)

    def on_headers_complete(self) -> None:
        self._in_head = self._head_started = False
        self._in_body = True
        self._head_bytes = 0
        self._heads += 1
        timer = self._head_timer
        if timer is not None:
            self._head_timer = None
            timer.cancel()
        if not self._overrun and len(self.pipeline) >= MAX_PIPELINED:
            self._overrun = True
            SHED.count("http_refused", "pipelined")
        if self._overrun:
            return  # no request cycle for it (nor, through the parser's callbacks, for its body)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._overrun:
            super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle  # the last request taken (no more are, once overrun)
        if self._overrun and not self.pipeline and cycle is not None and cycle.response_complete:
            if not self.transport.is_closing():
                self.transport.close()  # every request it took is answered

    def on_message_complete(self) -> None:
        if self._overrun:
            self._in_body = False
            return
        self._in_body = False
        self._in_head = True
        self._waiting_since = self.loop.time()
        timer = self._body_timer
        if timer is not None:
            self._body_timer = None
            timer.cancel()
        super().on_message_complete()

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(_HEAD_TIMEOUT)

    def _body_expired(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        now = self.loop.time()
        due = self._body_at + self.limits.body_timeout_s
        if self.flow is not None and self.flow.read_paused:
            due = now + self.limits.body_timeout_s  # the app has not read yet: not the peer's stall
            self._body_at = now
        if due > now + 0.001:
            self._body_timer = self.loop.call_at(due, self._body_expired)
            return
        self._refuse(_BODY_TIMEOUT)

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _refuse(self, refusal: tuple[bytes, str], *, silently: bool = False) -> None:
        """Answer the refusal (unless a response already started on this connection, or
        `silently`), count it, and close.

        A request that is running sees a disconnect: its reads end and its writes are dropped."""
        answer, reason = refusal
        SHED.count("http_refused", reason)
        self._cancel_timers()
        self._in_head = self._in_body = False
        cycle = self.cycle
        started = False
        if cycle is not None and not cycle.response_complete:
            started = cycle.response_started
            cycle.disconnected = True
            cycle.message_event.set()
        if not started and not silently:
            self.transport.write(answer)
        self.transport.close()
