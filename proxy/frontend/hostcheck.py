"""Host and Origin checks against allow-lists (DNS rebinding), shared by the MCP port and the admin port.

Contract:
- A `Host` value is parsed strictly as `host[:port]` (RFC 9110/3986): a DNS name (letters,
  digits, `-`, `_`, dots), an IPv4 address, or an IPv6 literal in brackets (`[::1]:8080`); the
  port is 1-5 digits up to 65535. Userinfo (`a@b`), paths, spaces, empty labels, a zone id or
  anything else is not a Host: it matches nothing.
- An `Origin` is `scheme://host[:port]` and nothing more (no userinfo, path, query or fragment;
  `null` is not an origin of any page we serve).
- An allow-list entry is a pattern of the same shape: `host[:port]` for Host, `scheme://host[:port]`
  for Origin. The host part may use `*` for any run of name characters (`*.internal`), or be an
  IPv6 literal in brackets; the port part is a number or `*` (any port, or none). An entry without
  a port matches only a value without one; a lone `*` matches any Host. Hosts compare
  case-insensitively, an IPv6 literal by its address (`[::0:1]` is `[::1]`), a DNS name without
  its trailing dot. Nothing is read as a glob character class: `[::1]` is the IPv6 loopback, not "one of `:` or `1`".
- A bad entry is refused when the list is built (`ValueError` naming it), not silently never matched.
- Verdicts are cached per raw value (bounded): a proxy sees the same few values on every request.
- The admin port additionally accepts any IP-literal Host (`ip_literals=True`): a DNS-rebinding
  page reaches the proxy under its own domain name, never under an address, while Kubernetes
  probes and Prometheus scrapes name the pod by its IP.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

LOOPBACK_HOST_PATTERNS: Final = ("127.0.0.1:*", "localhost:*", "[::1]:*")
LOOPBACK_ORIGIN_PATTERNS: Final = tuple(
    f"{scheme}://{host}:*" for scheme in ("http", "https") for host in ("127.0.0.1", "localhost", "[::1]")
)

_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
_NAME_PATTERN = re.compile(r"[a-z0-9_*](?:[a-z0-9_*-]*[a-z0-9_*])?(?:\.[a-z0-9_*](?:[a-z0-9_*-]*[a-z0-9_*])?)*")
_PORT = re.compile(r"[0-9]{1,5}")
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://([^/?#]*)")


@dataclass(frozen=True, slots=True)
class Authority:
    host: str  # lower case; an IPv6 address without brackets, compressed
    port: int | None
    ip: bool  # an IP literal (v4 or v6), not a DNS name


def _split(value: str, *, pattern: bool) -> tuple[str, str | None, bool] | None:
    """`host[:port]` → (host, port text or None, is an IPv6 literal); None when malformed."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest, v6 = value[1:end], value[end + 1 :], True
    else:
        host, sep, port = value.partition(":")
        rest, v6 = (":" + port) if sep else "", False
    if not rest:
        return host, None, v6
    port = rest[1:]
    if rest[0] != ":" or not ((_PORT.fullmatch(port) and int(port) <= 65535) or (pattern and port == "*")):
        return None
    return host, port, v6


def parse_host(value: str) -> Authority | None:
    """A Host header value as an `Authority`, or None when it is not a valid `host[:port]`."""
    split = _split(value.lower(), pattern=False)
    if split is None:
        return None
    host, port, v6 = split
    if v6:
        if "%" in host:  # a zone id: no browser sends one, and ipaddress would accept it
            return None
        try:
            host = ipaddress.IPv6Address(host).compressed
        except ValueError:
            return None
        ip = True
    else:
        host = host[:-1] if host.endswith(".") else host
        if not _NAME.fullmatch(host):
            return None
        ip = _is_ipv4(host)
    return Authority(host, int(port) if port is not None else None, ip)


def parse_origin(value: str) -> tuple[str, Authority] | None:
    """An Origin header value as (scheme, authority), or None when it is not `scheme://host[:port]`."""
    match = _ORIGIN.fullmatch(value.lower())
    if match is None:
        return None
    authority = parse_host(match.group(2))
    return None if authority is None else (match.group(1), authority)


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class _HostPattern:
    host: re.Pattern[str] | str  # a compiled glob, or an exact (normalised) host
    port: int | str | None  # a port, "*", or None (the value must have no port)

    @classmethod
    def parse(cls, text: str) -> _HostPattern:
        if text.strip() == "*":  # "any Host", as the glob matched before: any name, any port
            return cls(re.compile(r"[a-z0-9_.:-]*"), "*")
        split = _split(text.strip().lower(), pattern=True)
        if split is None:
            raise ValueError(f"{text!r} is not host[:port] (a port is a number or *)")
        host, port, v6 = split
        host_match: re.Pattern[str] | str
        if v6:
            try:
                host_match = ipaddress.IPv6Address(host).compressed
            except ValueError:
                raise ValueError(f"{text!r}: [{host}] is not an IPv6 address") from None
        else:
            host = host[:-1] if host.endswith(".") else host
            if not _NAME_PATTERN.fullmatch(host):
                raise ValueError(f"{text!r}: {host!r} is not a host name (letters, digits, - _ . and * only)")
            if "*" in host:
                # `*` spans name characters and dots, never ':' '@' '[' or ']'.
                host_match = re.compile("[a-z0-9_.-]*".join(re.escape(part) for part in host.split("*")))
            else:
                host_match = host
        port_match: int | str | None = None if port is None else ("*" if port == "*" else int(port))
        return cls(host_match, port_match)

    def matches(self, authority: Authority) -> bool:
        if isinstance(self.host, str):
            if self.host != authority.host:
                return False
        elif not self.host.fullmatch(authority.host):
            return False
        return self.port == "*" or self.port == authority.port


class HostAllowList:
    """Host header values allowed by `patterns` (see the module contract)."""

    __slots__ = ("_cache", "_ip_literals", "_patterns")
    CACHE = 256

    def __init__(self, patterns: list[str] | tuple[str, ...], *, ip_literals: bool = False) -> None:
        self._patterns = [_HostPattern.parse(p) for p in patterns]
        self._ip_literals = ip_literals
        self._cache: dict[str, bool] = {}

    def __call__(self, value: str) -> bool:
        verdict = self._cache.get(value)
        if verdict is None:
            authority = parse_host(value)
            verdict = authority is not None and (
                (self._ip_literals and authority.ip) or any(p.matches(authority) for p in self._patterns)
            )
            if len(self._cache) >= self.CACHE:
                self._cache.clear()
            self._cache[value] = verdict
        return verdict


class OriginAllowList:
    """Origin header values allowed by `scheme://host[:port]` patterns (see the module contract)."""

    __slots__ = ("_cache", "_patterns")
    CACHE = 256

    def __init__(self, patterns: list[str] | tuple[str, ...]) -> None:
        self._patterns: list[tuple[str, _HostPattern]] = []
        for text in patterns:
            scheme, sep, rest = text.strip().lower().partition("://")
            if not sep or not re.fullmatch(r"[a-z][a-z0-9+.-]*|\*", scheme):
                raise ValueError(f"{text!r} is not an origin pattern (scheme://host[:port])")
            self._patterns.append((scheme, _HostPattern.parse(rest)))
        self._cache: dict[str, bool] = {}

    def __call__(self, value: str) -> bool:
        verdict = self._cache.get(value)
        if verdict is None:
            parsed = parse_origin(value)
            verdict = parsed is not None and any(
                (scheme in ("*", parsed[0])) and pattern.matches(parsed[1]) for scheme, pattern in self._patterns
            )
            if len(self._cache) >= self.CACHE:
                self._cache.clear()
            self._cache[value] = verdict
        return verdict


def duplicated(raw_headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...], name: bytes) -> bool:
    """True when the ASGI header list carries `name` (lower case) more than once."""
    seen = False
    for key, _ in raw_headers:
        if key == name:
            if seen:
                return True
            seen = True
    return False
