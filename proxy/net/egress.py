"""Which egress proxy, if any, reaches the upstream: `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`.

Contract:
- `route_for(url)` reads the environment once (at start) with the standard library's own rules,
  `urllib.request.getproxies_environment()` and `proxy_bypass_environment()`: the lower-case
  variable wins over the upper-case one, `HTTP_PROXY` is ignored when `REQUEST_METHOD` is set (a
  CGI environment, "httpoxy"), and `NO_PROXY` is a comma-separated list of host names or domain
  suffixes (a leading dot optional, `host:port` for one port only, `*` for every host). An
  `https://` upstream uses `HTTPS_PROXY`, an `http://` one `HTTP_PROXY`. Loopback is not exempt
  on its own (as with curl and urllib): list it in `NO_PROXY` where a proxy is set for the pod;
  `proxy/core/service.py` warns when a loopback upstream goes through a proxy.
- The proxy itself is an `http://` proxy (a scheme-less value is read as one); its port defaults
  to 80. Credentials in its URL (`http://user:password@proxy:3128`, percent-encoded) become a
  `Proxy-Authorization: Basic …` header sent on the CONNECT request only, never to the upstream.
  `ProxyRoute.secrets()` lists the password and that header's values for the secret registry, and
  `ProxyRoute.shown` names the proxy without the password, for logs and error messages.
- Every upstream connection goes through a CONNECT tunnel, for `http://` upstreams too (see
  `proxy/upstream/h1/`): a refusal or an unreachable upstream is then a connection failure that
  provably sent nothing, and the event streams pass through byte for byte.
- A proxy URL that cannot be used (another scheme, no host, a bad port) raises `ValueError` naming
  the variable, never its password.
"""

from __future__ import annotations

import base64
import os
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """An HTTP egress proxy that every connection tunnels through (CONNECT).

    `authorization` is the `Proxy-Authorization` value (a credential: sent on CONNECT requests
    only, never logged); `shown` names the proxy in messages, without its password;
    `secret_values` are what the secret registry must remove (proxy/secret_values.py)."""

    host: str
    port: int
    authorization: str | None = None
    shown: str = ""
    secret_values: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"ProxyRoute({self.shown or f'{self.host}:{self.port}'})"


__all__ = ["ProxyRoute", "route_for"]


def route_for(url: str) -> ProxyRoute | None:
    """The egress proxy for `url` from the environment, or None (direct, or bypassed)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower().removeprefix("sse+")
    host = (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        return None
    proxies = urllib.request.getproxies_environment()
    value = proxies.get(scheme)
    if not value:
        return None
    port = parts.port or (443 if scheme == "https" else 80)
    literal = f"[{host}]" if ":" in host else host
    # Both forms: a bare host entry matches any port, a `host:port` entry only that port.
    # proxy_bypass_environment is urllib's own NO_PROXY matcher (public in the module, absent from
    # typeshed): the same rules as every urllib-based tool the operator already configured.
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if bypass(host, proxies) or bypass(f"{literal}:{port}", proxies):
        return None
    return _parse(value, _variable(scheme))


@dataclass(frozen=True, slots=True)
class _Parsed:
    host: str
    port: int
    user: str | None
    password: str | None


def _variable(scheme: str) -> str:
    """The name of the variable the value came from, as the environment spells it."""
    lower = f"{scheme}_proxy"
    return lower if os.environ.get(lower) else lower.upper()


def _parse(value: str, variable: str) -> ProxyRoute:
    raw = value.strip()
    if "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        raise ValueError(f"{variable}: not a proxy URL (expected http://[user:password@]host:port)") from None
    if parts.scheme.lower() != "http":
        raise ValueError(
            f"{variable}: only an http:// egress proxy is supported (got {parts.scheme.lower()!r}); "
            "the upstream's own TLS runs inside the proxy's CONNECT tunnel"
        )
    if not parts.hostname:
        raise ValueError(f"{variable}: the proxy URL has no host")
    port = port or 80
    host = parts.hostname
    literal = f"[{host}]" if ":" in host else host
    authorization = None
    secrets: tuple[str, ...] = ()
    shown = f"http://{literal}:{port}"
    if parts.username is not None or parts.password is not None:
        user = unquote(parts.username or "")
        password = unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
        secrets = tuple(s for s in {password, parts.password or "", token} if s)
        shown = f"http://{user}@{literal}:{port}" if user else shown
    return ProxyRoute(
        host=host,
        port=port,
        authorization=authorization,
        shown=f"{shown} (from {variable})",
        secret_values=secrets,
    )
