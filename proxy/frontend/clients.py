"""Which client a request comes from: the one key every per-client limit counts by.

Contract:
- `ClientIdentity.key(scope, headers, principal)` is the only place the proxy decides who a caller is; the
  sessions per client (`--max-sessions-per-client`), the 2026 requests in flight per caller and
  each client's share of the upstream (`--max-upstream-per-client`) all count by what it returns.
- With `--auth jwt` or `--auth tokens` (`by_principal`), a request's key is its principal
  (`principal:<Principal.id>`): one caller reaching the proxy from many addresses (pods behind a
  NAT that changes, an agent host with several interfaces, IPv6 privacy addresses) is one client,
  and callers behind one address (an ingress without `--forwarded-allow-ips`, a NAT) are several.
  Only a principal the proxy itself verified is a key: in `passthrough` the credential is judged
  by the upstream, after the request has taken its place (a session slot, a pooled connection),
  so a caller sending a fresh made-up token on each request would be a fresh client each time;
  there, as for `none` and for a request without a principal, the key is the address.
- The address key is the client's IP address as the HTTP server reports it (`scope["client"]`).
  Behind a load balancer or an ingress every caller arrives from the same few addresses; with
  `--forwarded-allow-ips`, uvicorn's `ProxyHeadersMiddleware` (not hand-written parsing) has
  already replaced the peer's address with the client named in `X-Forwarded-For` when, and only
  when, the peer is one of those trusted proxies, so a caller cannot choose its own key by
  writing the header. `Forwarded` (RFC 7239) is not read (uvicorn does not parse it; the common
  ingresses and load balancers send `X-Forwarded-For`).
- An IPv6 client counts by its /64 (one host usually holds a whole /64, and could otherwise
  take a fresh key per request); an IPv4-mapped IPv6 address counts as its IPv4 address.
- When no proxy is trusted and a request carries `X-Forwarded-For`, a warning is logged once:
  every caller behind that proxy shares one key (and one set of per-client limits).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.auth.base import Principal

log = logging.getLogger("proxy.clients")


@functools.lru_cache(maxsize=4096)
def address_key(host: str) -> str:
    """The key of a client address (see the module contract); also what the HTTP servers count
    connections per client by (proxy/frontend/uvicorn_h1.py)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host  # not an IP literal (a unix socket path): as given
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class ClientIdentity:
    __slots__ = ("_warned", "by_principal", "trusts_proxies")

    def __init__(self, *, trusts_proxies: bool, by_principal: bool = False) -> None:
        self.trusts_proxies = trusts_proxies  # --forwarded-allow-ips was given
        self.by_principal = by_principal  # the proxy verifies credentials itself (jwt, tokens)
        self._warned = False

    def key(
        self, scope: MutableMapping[str, Any], headers: Mapping[str, str], principal: Principal | None = None
    ) -> str | None:
        """The client `scope`'s request comes from (None: unknown, not counted per client)."""
        if principal is not None and self.by_principal:
            # Prefixed so that no principal id can equal an address key (or the reverse).
            return "principal:" + principal.id
        if not self._warned and not self.trusts_proxies and "x-forwarded-for" in headers:
            self._warned = True
            log.warning(
                "a request came through a proxy (X-Forwarded-For) but --forwarded-allow-ips "
                "(MCP_RECOVERY_FORWARDED_ALLOW_IPS) trusts none: every client behind it counts as one "
                "for the per-client limits"
            )
        client = scope.get("client")
        return address_key(str(client[0])) if client else None
