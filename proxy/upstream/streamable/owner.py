"""An upstream reached over HTTP, whatever its transport (Streamable HTTP, legacy HTTP+SSE): its
URL, the proxy's own headers, its one HTTP client, its health, and the translation of the client's
exceptions for it.

One `h1.HttpClient` per upstream (the proxy's own HTTP/1.1 keep-alive pool, no retries, no
redirects, no read timeout): the proxy owns every retry and every attempt timeout, so the client
does neither. A request that finds every pooled connection busy waits its turn within its own
bound: a tools/call attempt's send deadline, a relayed request's `--request-timeout-s`, its
caller's cancellation; what has no deadline of its own (a notification, an answer to a server's
request, a cancellation sent upstream) passes `wait_s` (`--request-timeout-s` too) to the client.
It sends the configured headers on every request, follows no redirect, keeps cookies per upstream
and does not ask for compressed answers (a compressed one is still decoded). The TLS
context (`--upstream-ca`, the client certificate) and the egress proxy
(`HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`) are resolved once at start (proxy/net/tls.py, egress.py)
and handed to the client; a connection that cannot be established for either reason is
`CONNECT_FAILED` with the client's message, which says what failed (an untrusted or mismatched
certificate, a refused client certificate, the egress proxy's 407/403/502) and never carries a
credential. `replace_ssl_context` swaps the TLS context of every later connection (a reload).

Health (`UpstreamHealth`, the `mcp_recovery_upstream_up` gauge): a JSON-RPC response marks the
upstream up (the links do that, one flag compare per answer); a connection that cannot be
established (refused, DNS, TLS, connect timeout; not a full pool) marks it down (`translate`).
HTTP error statuses and connections lost mid-answer change nothing: the upstream was reached, or a
pooled keep-alive connection was closing. `check()` probes again and says up or down.

A transport subclasses `HttpClientOwner` with `probe`, `open` and `forget` (a link it opened is
closed and goes).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

from proxy.errors import Dispatch, FailureKind, UpstreamFailure, untraced
from proxy.upstream.base import Capabilities, LinkBase, UpstreamHealth
from proxy.upstream.h1 import HttpClient, PoolTimeout, ProxyRoute
from proxy.upstream.streamable.failures import CLIENT_ERRORS, read_bounded, translate_exception


class HttpClientOwner:
    """An upstream reached over HTTP: its URL, the proxy's own headers, and one HTTP client
    created on first use (a client binds to the loop of its first request)."""

    def __init__(
        self,
        url: str,
        label: str,
        *,
        headers: Mapping[str, str] | None,
        connect_timeout_s: float,
        max_connections: int,
        max_event_bytes: int | None,
        wait_s: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        proxy: ProxyRoute | None = None,
    ) -> None:
        self.url = url
        parts = urlsplit(url)
        self.description = f"{label}:{parts.hostname}:{parts.port or ''}{parts.path}"
        self.connect_timeout_s = connect_timeout_s
        self.max_event_bytes = max_event_bytes
        # How long a request with no deadline of its own waits for a pooled connection.
        self.wait_s = wait_s
        self._headers = dict(headers or {})
        self._max_connections = max_connections
        # One TLS context and one egress route for the upstream's life (proxy/net/tls.py and
        # egress.py): a client rebuilt after `aclose` reuses them, so nothing is re-read later.
        self._ssl = ssl_context if ssl_context is not None or parts.scheme != "https" else ssl.create_default_context()
        self.proxy = proxy
        self._client: HttpClient = self._new_client()  # here: a bad URL or header fails at start-up
        self.health = UpstreamHealth()
        # --auth passthrough: the upstream authenticates callers, so a 401/403 to the proxy's own
        # probe means it answered (up), not that it is down.
        self.behind_caller_auth = False

    def _new_client(self) -> HttpClient:
        return HttpClient(
            self.url,
            headers=self._headers,
            connect_timeout_s=self.connect_timeout_s,
            max_connections=self._max_connections,
            ssl_context=self._ssl,
            proxy=self.proxy,
        )

    def replace_ssl_context(self, context: ssl.SSLContext) -> None:
        """The reloaded TLS context (proxy/net/tls.py, `TlsWatcher`): every connection opened
        from now on, by this client or one rebuilt later, uses it."""
        self._ssl = context
        self._client.set_ssl_context(context)

    @property
    def client(self) -> HttpClient:
        if self._client.closed:
            self._client = self._new_client()
        return self._client

    async def _close_client(self) -> None:
        await self._client.aclose()

    async def probe(self) -> Capabilities:
        raise NotImplementedError

    def forget(self, link: LinkBase) -> None:
        """`link`, which this upstream opened, closed: it is no longer the upstream's to close."""
        raise NotImplementedError

    async def check(self) -> Capabilities | None:
        """Probe again: an upstream that answers the probe is up, one that refuses the connection
        (or the proxy's credentials) is down. Returns what it speaks now."""
        try:
            caps = await self.probe()
        except UpstreamFailure as failure:
            if self.behind_caller_auth and failure.http_status in (401, 403):
                self.health.answered()  # it wants a caller's credential, which the probe has none of
                return None
            self.health.failed(failure.detail)
            raise
        self.health.answered()
        return caps

    async def get_document(self, target: str, limit: int = 64 * 1024) -> tuple[int, bytes, str | None]:
        """GET `target` on the upstream's origin (its OAuth protected-resource metadata), bounded
        in time (twice the connect timeout) and size; (status, body, its Cache-Control). Raises
        UpstreamFailure."""
        try:
            async with asyncio.timeout(self.connect_timeout_s * 2):
                request = self.client.request("GET", target=target, headers={"accept": "application/json"})
                async with await request as response:
                    return response.status, await read_bounded(response, limit), response.headers.get("cache-control")
        except TimeoutError:
            raise UpstreamFailure(FailureKind.TIMEOUT, Dispatch.NO, "the upstream did not answer in time") from None
        except CLIENT_ERRORS as exc:
            raise self.translate(exc, False, "metadata request") from None

    def translate(self, exc: BaseException, written: bool, what: str = "request") -> UpstreamFailure:
        """`translate_exception`, and a connection that could not be established marks the
        upstream down (a full pool does not: the upstream is busy, not gone)."""
        failure = translate_exception(untraced(exc), written, what)  # see `untraced`: kept as context
        if failure.kind is FailureKind.CONNECT_FAILED and not isinstance(exc, PoolTimeout):
            self.health.failed(failure.detail)
        return failure
