"""The Host/Origin parser and allow-list matching (proxy/frontend/hostcheck.py): host + port, not
globs on raw text (a glob reads `[::1]` as a character class, and accepts `Host: 1:80` or an Origin
whose host hides behind userinfo). The running proxy's answers are in test_host_origin.py."""

from __future__ import annotations

import pytest

from proxy.frontend.hostcheck import (
    LOOPBACK_HOST_PATTERNS,
    LOOPBACK_ORIGIN_PATTERNS,
    Authority,
    HostAllowList,
    OriginAllowList,
    parse_host,
    parse_origin,
)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("[::1]:8080", Authority("::1", 8080, True)),
        ("[0:0::1]", Authority("::1", None, True)),
        ("LocalHost.:80", Authority("localhost", 80, False)),
        ("10.0.0.7:9464", Authority("10.0.0.7", 9464, True)),
        ("mcp.internal", Authority("mcp.internal", None, False)),
    ],
)
def test_valid_hosts_parse_to_host_and_port(value: str, parsed: Authority) -> None:
    assert parse_host(value) == parsed


@pytest.mark.parametrize(
    "value",
    [
        "",
        ":80",
        "a@b",
        "127.0.0.1:1@evil.com",
        "h:99999",
        "h:",
        "h:8x",
        "[::1",
        "[::1]x",
        "[fe80::1%eth0]",
        "a..b",
        "a b",
        "h/p",
        "-a.com",
        "[::g]",
    ],
)
def test_malformed_hosts_do_not_parse(value: str) -> None:
    assert parse_host(value) is None


def test_origins_parse_strictly() -> None:
    assert parse_origin("https://App.Example:443") == ("https", Authority("app.example", 443, False))
    for bad in ("http://127.0.0.1:1@evil.com", "http://a/b", "http://a?x", "null", "127.0.0.1", "http://"):
        assert parse_origin(bad) is None, bad


def test_loopback_lists_match_host_and_port_not_characters() -> None:
    hosts = HostAllowList(LOOPBACK_HOST_PATTERNS)
    for ok in ("[::1]:8080", "[::1]", "127.0.0.1:1", "localhost"):
        assert hosts(ok), ok
    for bad in ("1:80", ":1", "[::2]:80", "127.0.0.2", "localhost.evil.com", "evil.com:80"):
        assert not hosts(bad), bad
    origins = OriginAllowList(LOOPBACK_ORIGIN_PATTERNS)
    assert origins("http://[::1]:3000") and origins("https://localhost")
    assert not origins("http://127.0.0.1:1@evil.com") and not origins("ftp://localhost")


def test_configured_patterns() -> None:
    hosts = HostAllowList(["mcp.internal:*", "*.svc.cluster.local:8080", "[2001:db8::1]:443"])
    assert hosts("mcp.internal") and hosts("MCP.internal:9")
    assert hosts("proxy.ns.svc.cluster.local:8080") and not hosts("proxy.ns.svc.cluster.local:8081")
    assert not hosts("evil.com:1@proxy.ns.svc.cluster.local:8080")
    assert hosts("[2001:db8:0::1]:443") and not hosts("[2001:db8::1]")
    assert HostAllowList(["*"])("[::1]:80") and HostAllowList(["*"])("a.b:1") and not HostAllowList(["*"])("a@b")
    assert HostAllowList([], ip_literals=True)("10.1.2.3:9464") and not HostAllowList([], ip_literals=True)("a.b")
    with pytest.raises(ValueError, match="not host"):
        HostAllowList(["a:b:c"])
    with pytest.raises(ValueError, match="origin pattern"):
        OriginAllowList(["app.example"])
