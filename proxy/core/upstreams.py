"""The upstream adapter the settings name, and the proxy's own credentials for reaching it.

Contract:
- `build_upstream(settings)`: a command after `--` is a stdio upstream (a child per session, or
  shared children); `sse+http(s)://` the legacy SSE transport; `http(s)://` Streamable HTTP. An https
  upstream gets one TLS context (proxy/net/tls.py); a TLS flag given for any other upstream is
  refused (`ValueError` naming it) rather than ignored. The egress proxy comes from the environment
  (proxy/net/egress.py) and is logged without its credentials, with a warning when a loopback
  upstream would go through it.
- `upstream_secrets(settings)`: every value the secret registry must remove from what the proxy
  writes (configured header values, the egress proxy's password, the client key's passphrase).
Transports are imported only for the upstream named, so a stdio proxy never loads the HTTP client.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from proxy.settings import Settings
from proxy.upstream.base import Upstream

if TYPE_CHECKING:
    from proxy.upstream.streamable.owner import HttpClientOwner

log = logging.getLogger("proxy.service")


def build_upstream(settings: Settings) -> Upstream:
    """The upstream adapter the settings name: a command (stdio), sse+http(s)://, or http(s)://.

    An https upstream gets one TLS context built here (proxy/net/tls.py); a TLS flag given for
    any other upstream is refused rather than ignored. The egress proxy comes from the environment
    (proxy/net/egress.py) and is logged, without its credentials."""
    tls_flags = settings.upstream_tls_flags
    if settings.upstream_argv:
        if settings.upstream:
            raise ValueError("give either --upstream URL or a command after --, not both")
        if tls_flags:
            raise ValueError(f"{', '.join(tls_flags)}: only for an https:// upstream, not a command after --")
        from proxy.upstream.stdio import StdioUpstream

        # `--listen stdio` serves one client, one session: one child, no spare (see StdioUpstream)
        single = settings.listen == "stdio"
        return StdioUpstream(
            settings.upstream_argv,
            max_children=settings.sessions_cap,
            spares=settings.stdio_spares,
            spares_max=settings.stdio_spares_max,
            spare_starts=settings.stdio_spare_starts,
            spare_idle_s=settings.session_idle_timeout_s,
            single_session=single,
            stderr_burst_lines=settings.stderr_burst_lines,
            stderr_lines_per_s=settings.stderr_lines_per_s,
            shared_sessions=settings.stdio_sessions == "shared",
            shared_children=settings.stdio_shared_children,
            modern_children=settings.stdio_modern_children,
            handshake_timeout_s=settings.stdio_start_timeout_s,
            max_starting=settings.stdio_max_starting,
            # the children's work waits for the proxy's, not the reverse (docs/reliability.md); one
            # client's one child (a desktop's) keeps the priority it would have without the proxy
            nice=settings.stdio_nice if settings.stdio_nice is not None else (0 if single else 10),
        )
    url = settings.upstream
    if not url:
        raise ValueError("no upstream: give --upstream http://HOST:PORT/mcp, --upstream sse+http://…, or -- COMMAND")
    headers = settings.header_pairs()
    target = url.removeprefix("sse+")
    if not target.startswith(("http://", "https://")):
        raise ValueError(f"unsupported upstream URL scheme: {url.split(':', 1)[0]!r} (use http, https or sse+http)")
    from proxy.net import egress, tls

    ssl_context = None
    if target.startswith("https://"):
        ssl_context = tls.client_context(
            ca=settings.upstream_ca,
            cert=settings.upstream_client_cert,
            key=settings.upstream_client_key,
            key_password=tls.read_key_password(settings.upstream_client_key_password_file),
        )
    elif tls_flags:
        raise ValueError(f"{', '.join(tls_flags)}: only for an https:// upstream, not {url.split('://', 1)[0]}://")
    proxy = egress.route_for(target)
    _log_route(target, ssl_context is not None, settings, proxy)
    common: dict[str, Any] = {
        "headers": headers,
        "ssl_context": ssl_context,
        "proxy": proxy,
        "connect_timeout_s": settings.upstream_connect_timeout_s,
        "max_connections": settings.upstream_pool,
        # what waits for a pooled connection with no deadline of its own (a notification)
        "wait_s": settings.request_timeout_s,
    }
    upstream: HttpClientOwner
    if url.startswith("sse+"):
        from proxy.upstream.sse.link import SseUpstream

        upstream = SseUpstream(target, **common)
    else:
        from proxy.upstream.streamable.upstream import HttpUpstream

        upstream = HttpUpstream(target, **common)
    upstream.behind_caller_auth = settings.auth == "passthrough"
    return upstream


def upstream_secrets(settings: Settings) -> list[str]:
    """The proxy's credentials for reaching the upstream, for the secret registry: the configured
    header values, the egress proxy's password and Proxy-Authorization values, and the client
    key's passphrase."""
    from proxy.net import egress, tls

    values = list(settings.header_pairs().values())
    if settings.upstream:
        route = egress.route_for(settings.upstream)
        if route is not None:
            values += route.secret_values
    password = tls.read_key_password(settings.upstream_client_key_password_file)
    if password is not None:
        values.append(password)
    return values


def _log_route(url: str, tls_on: bool, settings: Settings, proxy: Any) -> None:
    parts = urlsplit(url)
    if tls_on:
        roots = f"the CA bundle {settings.upstream_ca}" if settings.upstream_ca else "the system roots"
        client = f", client certificate {settings.upstream_client_cert}" if settings.upstream_client_cert else ""
        log.info("upstream TLS: certificates verified against %s%s", roots, client)
    if proxy is None:
        return
    where = f"{parts.scheme}://{parts.hostname}:{parts.port or ''}"
    log.info("upstream %s reached through the egress proxy %s", where, proxy.shown)
    host = (parts.hostname or "").lower()
    if host == "localhost" or _is_loopback(host):
        log.warning(
            "the upstream %s is on loopback but goes through the egress proxy %s: add it to NO_PROXY "
            "unless that is intended",
            host,
            proxy.shown,
        )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
