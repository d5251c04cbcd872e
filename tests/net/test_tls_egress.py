"""TLS to the upstream and the egress proxy, against real parts on loopback (docs/security.md,
"Upstream TLS and egress").

The upstream is the SDK's `MCPServer` under uvicorn serving HTTPS with a private CA generated in
the test (tests/fixtures/tls.py), requiring a client certificate (mTLS) where a test says so. The
egress proxy is tests/fixtures/egress_proxy.py, a real CONNECT proxy on its own thread that counts
its tunnels; the upstream's name `mcp-upstream.test` resolves only inside that proxy, so a request
that reached the upstream by that name went through a tunnel. Proxy settings come from the real
environment variables (monkeypatched), read by `proxy.net.egress.route_for`.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.transport_security import TransportSecuritySettings

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.net import egress
from proxy.net.tls import TlsConfigError, client_context
from proxy.upstream.base import Era
from proxy.upstream.h1 import HttpClient, TlsClosed, TlsError
from proxy.upstream.sse.link import SseUpstream
from proxy.upstream.streamable.failures import translate_exception
from proxy.upstream.streamable.upstream import HttpUpstream
from tests.fixtures.egress_proxy import EgressProxy
from tests.fixtures.helpers import free_port, terminate, wait_port
from tests.fixtures.tls import Pki, make_pki
from tests.upstream.servers import Journal, serve, sse_app, streamable_app

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*deprecated as of 2026-07-28")]
WAIT = 10.0
NAME = "mcp-upstream.test"  # known to the egress proxy only
PROXY_PASSWORD = "egress-canary-Zt81q"

MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
}
SECURITY = TransportSecuritySettings(
    enable_dns_rebinding_protection=True,
    allowed_hosts=["127.0.0.1:*", "localhost:*", f"{NAME}:*"],
    allowed_origins=[],
)
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy", "ALL_PROXY")


@pytest.fixture(autouse=True)
def clean_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", dns_names=("localhost", NAME))


def tls_options(pki: Pki, *, mutual: bool = True) -> dict[str, Any]:
    options: dict[str, Any] = {"ssl_certfile": str(pki.server_cert), "ssl_keyfile": str(pki.server_key)}
    if mutual:
        options |= {"ssl_ca_certs": str(pki.ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


@pytest.fixture
async def mtls_port(pki: Pki) -> AsyncIterator[int]:
    async with serve(streamable_app(Journal(), transport_security=SECURITY), **tls_options(pki)) as port:
        yield port


@pytest.fixture
def egress_proxy() -> Iterator[EgressProxy]:
    with EgressProxy(user="agent", password=PROXY_PASSWORD, names={NAME: "127.0.0.1"}) as proxy:
        yield proxy


def mtls(pki: Pki) -> ssl.SSLContext:
    return client_context(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)


def echo_call(link: Any, text: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "echo", "arguments": {"text": text}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": link.new_id(), "method": "tools/call", "params": params}


async def legacy_echo(up: HttpUpstream | SseUpstream, texts: list[str]) -> list[str]:
    """A 2025 session (initialize, initialized) and one echo call per text."""
    link = await up.open(Era.LEGACY)
    try:
        init = {
            "jsonrpc": "2.0",
            "id": link.new_id(),
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        await asyncio.wait_for((await link.send_request(init)).response, WAIT)
        await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        out = []
        for text in texts:
            answer = await asyncio.wait_for((await link.send_request(echo_call(link, text))).response, WAIT)
            out.append(answer["result"]["content"][0]["text"])
        return out
    finally:
        await link.aclose()


async def modern_echo(up: HttpUpstream, text: str) -> str:
    link = await up.open(Era.MODERN)
    answer = await asyncio.wait_for((await link.send_request(echo_call(link, text, MODERN_META))).response, WAIT)
    return str(answer["result"]["content"][0]["text"])


async def check_fails(up: HttpUpstream | SseUpstream) -> UpstreamFailure:
    with pytest.raises(UpstreamFailure) as info:
        await asyncio.wait_for(up.check(), WAIT)
    return info.value


# --- mTLS, direct -------------------------------------------------------------------------------
async def test_mtls_with_the_private_ca_and_client_certificate_serves_both_eras(pki: Pki, mtls_port: int) -> None:
    up = HttpUpstream(f"https://127.0.0.1:{mtls_port}/mcp", ssl_context=mtls(pki))
    try:
        caps = await asyncio.wait_for(up.check(), WAIT)
        assert caps is not None and caps.legacy and caps.modern
        assert await legacy_echo(up, ["one", "two"]) == ["one", "two"]
        assert await modern_echo(up, "2026") == "2026"
        assert up.health.up is True
    finally:
        await up.aclose()


async def test_without_the_private_ca_the_connection_fails_naming_the_untrusted_issuer(
    pki: Pki, mtls_port: int
) -> None:
    # The client certificate is there; only the CA is missing (the system roots do not know it).
    up = HttpUpstream(
        f"https://127.0.0.1:{mtls_port}/mcp", ssl_context=client_context(cert=pki.client_cert, key=pki.client_key)
    )
    try:
        failure = await check_fails(up)
        assert failure.kind is FailureKind.CONNECT_FAILED and failure.dispatched is Dispatch.NO
        assert "certificate was rejected" in failure.detail and "--upstream-ca" in failure.detail, failure.detail
        assert up.health.up is False and "--upstream-ca" in (up.health.why or "")
    finally:
        await up.aclose()


async def test_without_a_client_certificate_the_refused_handshake_is_a_connect_failure(
    pki: Pki, mtls_port: int
) -> None:
    up = HttpUpstream(f"https://127.0.0.1:{mtls_port}/mcp", ssl_context=client_context(ca=pki.ca))
    try:
        failure = await check_fails(up)
        # TLS 1.3: the server refuses after the client's handshake is done, and uvicorn closes
        # without an alert, so the request had been written: a connect failure, dispatch unknown.
        assert failure.kind is FailureKind.CONNECT_FAILED, failure
        assert failure.dispatched in (Dispatch.NO, Dispatch.UNKNOWN)
        assert "client certificate" in failure.detail and "--upstream-client-cert" in failure.detail, failure.detail
        assert up.health.up is False
    finally:
        await up.aclose()


async def test_a_client_certificate_from_another_ca_is_refused_too(pki: Pki, mtls_port: int, tmp_path: Path) -> None:
    stranger = make_pki(tmp_path / "stranger")
    context = client_context(ca=pki.ca, cert=stranger.client_cert, key=stranger.client_key)
    up = HttpUpstream(f"https://127.0.0.1:{mtls_port}/mcp", ssl_context=context)
    try:
        failure = await check_fails(up)
        assert failure.kind is FailureKind.CONNECT_FAILED and "client certificate" in failure.detail
    finally:
        await up.aclose()


async def test_a_certificate_for_another_name_fails_naming_the_mismatch(tmp_path: Path) -> None:
    other = make_pki(tmp_path / "other", dns_names=("upstream.internal",), ip_addresses=())
    async with serve(streamable_app(Journal()), **tls_options(other, mutual=False)) as port:
        up = HttpUpstream(f"https://localhost:{port}/mcp", ssl_context=client_context(ca=other.ca))
        try:
            failure = await check_fails(up)
            assert failure.kind is FailureKind.CONNECT_FAILED and failure.dispatched is Dispatch.NO
            assert "mismatch" in failure.detail.lower() and "does not name localhost" in failure.detail, failure.detail
        finally:
            await up.aclose()


@pytest.fixture
def openssl_mtls_port(pki: Pki) -> Iterator[int]:
    """`openssl s_server` requiring a client certificate (-Verify), answering GET with a page."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command (Debian package openssl)")
    port = free_port()
    tls = ["-cert", str(pki.server_cert), "-key", str(pki.server_key), "-CAfile", str(pki.ca)]
    server = subprocess.Popen(
        ["openssl", "s_server", "-quiet", "-Verify", "1", "-www", "-accept", f"127.0.0.1:{port}", *tls],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        yield port
    finally:
        terminate(server)  # type: ignore[arg-type]


async def test_an_alert_from_an_openssl_server_refusing_no_client_certificate_is_not_dispatched(
    pki: Pki, openssl_mtls_port: int
) -> None:
    """OpenSSL-based servers (nginx, Envoy, Go alike) answer a missing client certificate in TLS 1.3
    with an alert after the client's handshake: nothing was processed, so dispatch no."""
    client = HttpClient(f"https://localhost:{openssl_mtls_port}/", ssl_context=client_context(ca=pki.ca))
    with pytest.raises(TlsError) as info:
        await asyncio.wait_for(client.request("GET"), WAIT)
    await client.aclose()
    assert not isinstance(info.value, TlsClosed) and "certificate required" in str(info.value)
    failure = translate_exception(info.value, written=True)
    assert failure.kind is FailureKind.CONNECT_FAILED and failure.dispatched is Dispatch.NO
    assert "--upstream-client-cert" in failure.detail
    good = HttpClient(f"https://localhost:{openssl_mtls_port}/", ssl_context=mtls(pki))
    async with await asyncio.wait_for(good.request("GET"), WAIT) as response:
        assert response.status == 200
    await good.aclose()


# --- the egress proxy ---------------------------------------------------------------------------
async def test_https_through_the_tunnel_with_credentials_pools_its_tunnels(
    pki: Pki, mtls_port: int, egress_proxy: EgressProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", egress_proxy.url)
    url = f"https://{NAME}:{mtls_port}/mcp"
    route = egress.route_for(url)
    assert route is not None and PROXY_PASSWORD not in repr(route) and PROXY_PASSWORD not in route.shown
    assert PROXY_PASSWORD in route.secret_values
    up = HttpUpstream(url, ssl_context=mtls(pki), proxy=route)
    try:
        caps = await asyncio.wait_for(up.check(), WAIT)
        assert caps is not None and caps.legacy and caps.modern
        assert await legacy_echo(up, ["a", "b"]) == ["a", "b"]
        assert await modern_echo(up, "warm") == "warm"
        warm = len(egress_proxy.opened)
        assert warm >= 1
        # Sequential requests reuse the pooled tunnels: no new CONNECT.
        for i in range(5):
            assert await modern_echo(up, f"call-{i}") == f"call-{i}"
        assert len(egress_proxy.opened) == warm
        assert {t.authority for t in egress_proxy.tunnels} == {f"{NAME}:{mtls_port}"}
        assert all(t.status == 200 and t.authorization == route.authorization for t in egress_proxy.tunnels)
    finally:
        await up.aclose()


async def test_a_plain_http_upstream_goes_through_a_tunnel_too(
    egress_proxy: EgressProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", egress_proxy.url)
    async with serve(streamable_app(Journal(), transport_security=SECURITY)) as port:
        url = f"http://{NAME}:{port}/mcp"
        up = HttpUpstream(url, proxy=egress.route_for(url))
        try:
            assert await legacy_echo(up, ["plain"]) == ["plain"]
            assert egress_proxy.opened and {t.authority for t in egress_proxy.opened} == {f"{NAME}:{port}"}
        finally:
            await up.aclose()


async def test_the_legacy_sse_upstream_over_tls_through_the_tunnel(
    pki: Pki, egress_proxy: EgressProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", egress_proxy.url)
    async with serve(sse_app(Journal(), transport_security=SECURITY), **tls_options(pki)) as port:
        url = f"https://{NAME}:{port}/sse"
        up = SseUpstream(url, ssl_context=mtls(pki), proxy=egress.route_for(f"sse+{url}"))
        try:
            caps = await asyncio.wait_for(up.check(), WAIT)
            assert caps is not None and caps.legacy
            assert await legacy_echo(up, ["sse"]) == ["sse"]
            assert egress_proxy.opened
        finally:
            await up.aclose()


async def test_a_proxy_without_credentials_gets_no_proxy_authorization(
    pki: Pki, mtls_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EgressProxy(names={NAME: "127.0.0.1"}) as open_proxy:
        monkeypatch.setenv("HTTPS_PROXY", open_proxy.url)
        url = f"https://{NAME}:{mtls_port}/mcp"
        route = egress.route_for(url)
        assert route is not None and route.authorization is None and route.secret_values == ()
        up = HttpUpstream(url, ssl_context=mtls(pki), proxy=route)
        try:
            assert await modern_echo(up, "open") == "open"
            assert open_proxy.opened and all(t.authorization is None for t in open_proxy.tunnels)
        finally:
            await up.aclose()


@pytest.mark.parametrize(
    ("refuse_with", "password", "expected"),
    [
        (None, "a-wrong-password", "407"),
        (403, PROXY_PASSWORD, "403"),
        (502, PROXY_PASSWORD, "502"),
    ],
)
async def test_a_refused_tunnel_is_a_connect_failure_that_names_the_status_without_the_password(
    pki: Pki, mtls_port: int, monkeypatch: pytest.MonkeyPatch, refuse_with: int | None, password: str, expected: str
) -> None:
    with EgressProxy(user="agent", password=PROXY_PASSWORD, refuse_with=refuse_with, names={NAME: "127.0.0.1"}) as ep:
        monkeypatch.setenv("HTTPS_PROXY", f"http://agent:{password}@127.0.0.1:{ep.port}")
        url = f"https://{NAME}:{mtls_port}/mcp"
        up = HttpUpstream(url, ssl_context=mtls(pki), proxy=egress.route_for(url))
        try:
            failure = await check_fails(up)
            assert failure.kind is FailureKind.CONNECT_FAILED and failure.dispatched is Dispatch.NO
            assert f"refused the tunnel to {NAME}:{mtls_port}: {expected}" in failure.detail, failure.detail
            assert password not in failure.detail and password not in (up.health.why or "")
            assert up.health.up is False
            assert ep.tunnels and not ep.opened
        finally:
            await up.aclose()


async def test_missing_proxy_credentials_are_named_as_missing(
    pki: Pki, mtls_port: int, egress_proxy: EgressProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{egress_proxy.port}")
    url = f"https://{NAME}:{mtls_port}/mcp"
    up = HttpUpstream(url, ssl_context=mtls(pki), proxy=egress.route_for(url))
    try:
        failure = await check_fails(up)
        assert "407" in failure.detail and "credentials are missing" in failure.detail, failure.detail
        assert egress_proxy.tunnels[0].authorization is None
    finally:
        await up.aclose()


async def test_no_proxy_bypasses_the_proxy(
    pki: Pki, mtls_port: int, egress_proxy: EgressProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", egress_proxy.url)
    monkeypatch.setenv("NO_PROXY", "example.org,127.0.0.1")
    url = f"https://127.0.0.1:{mtls_port}/mcp"
    assert egress.route_for(url) is None
    up = HttpUpstream(url, ssl_context=mtls(pki), proxy=egress.route_for(url))
    try:
        assert await legacy_echo(up, ["direct"]) == ["direct"]
        assert egress_proxy.tunnels == []
    finally:
        await up.aclose()


# --- the environment's rules (urllib's) -----------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "url", "expected"),
    [
        ({}, "https://api.internal/mcp", None),
        ({"HTTPS_PROXY": "http://p:3128"}, "https://api.internal/mcp", ("p", 3128)),
        ({"HTTPS_PROXY": "p:3128"}, "https://api.internal/mcp", ("p", 3128)),  # scheme-less: http
        ({"HTTPS_PROXY": "http://p"}, "https://api.internal/mcp", ("p", 80)),
        ({"HTTP_PROXY": "http://p:3128"}, "https://api.internal/mcp", None),  # the other scheme's
        ({"HTTP_PROXY": "http://p:3128"}, "http://api.internal/mcp", ("p", 3128)),
        ({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"}, "https://a.b/", ("lower", 2)),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, "https://api.internal/mcp", None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".internal"}, "https://api.internal/mcp", None),
        ({"HTTPS_PROXY": "http://p:1", "no_proxy": "internal"}, "https://api.internal/mcp", None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "ternal"}, "https://api.internal/mcp", ("p", 1)),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.internal:8443"}, "https://api.internal:8443/", None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.internal:8443"}, "https://api.internal/", ("p", 1)),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "::1"}, "https://[::1]:9/", None),
        ({"HTTPS_PROXY": "http://p:1"}, "sse+https://api.internal/sse", ("p", 1)),
    ],
)
def test_the_route_follows_the_standard_library_rules(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str, expected: tuple[str, int] | None
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    route = egress.route_for(url)
    assert (None if route is None else (route.host, route.port)) == expected


def test_proxy_credentials_become_a_basic_header_and_registered_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://ag%40ent:p%3Ass-word@proxy.corp:3128")
    route = egress.route_for("https://api.internal/mcp")
    assert route is not None
    assert route.authorization == "Basic YWdAZW50OnA6c3Mtd29yZA=="  # base64("ag@ent:p:ss-word")
    assert {"p:ss-word", "p%3Ass-word", "YWdAZW50OnA6c3Mtd29yZA=="} <= set(route.secret_values)
    assert "ss-word" not in route.shown and "ag@ent@proxy.corp:3128" in route.shown and "HTTPS_PROXY" in route.shown


@pytest.mark.parametrize("value", ["socks5://p:1080", "https://p:3128", "http://p:notaport"])
def test_an_unusable_proxy_url_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HTTPS_PROXY", value)
    with pytest.raises(ValueError, match="HTTPS_PROXY"):
        egress.route_for("https://api.internal/mcp")


# --- the TLS settings' files --------------------------------------------------------------------
def test_bad_tls_files_refuse_to_start_naming_the_setting_never_the_key(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    key_text = pki.client_key.read_text()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"ca": missing}, "--upstream-ca"),
        ({"ca": pki.client_key}, "--upstream-ca"),  # a key where the CA should be
        ({"cert": missing, "key": pki.client_key}, "--upstream-client-cert"),
        ({"cert": pki.client_cert, "key": missing}, "--upstream-client-key"),
        ({"cert": pki.client_cert, "key": pki.server_key}, "does not belong to the certificate"),
        ({"cert": pki.client_cert}, "--upstream-client-cert"),  # no key anywhere
        ({"key": pki.client_key}, "needs --upstream-client-cert"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(TlsConfigError) as info:
            client_context(**kwargs)
        message = str(info.value)
        assert expected in message, (kwargs, message)
        assert "PRIVATE KEY" not in message and key_text[40:80] not in message


def test_an_encrypted_client_key_needs_its_passphrase_and_never_shows_it(tmp_path: Path) -> None:
    secret = "passphrase-canary-9Qe"
    pki = make_pki(tmp_path / "enc", client_key_password=secret)
    with pytest.raises(TlsConfigError, match="encrypted"):
        client_context(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    with pytest.raises(TlsConfigError) as info:
        client_context(ca=pki.ca, cert=pki.client_cert, key=pki.client_key, key_password="wrong-passphrase")
    assert "passphrase" in str(info.value) and "wrong-passphrase" not in str(info.value)
    context = client_context(ca=pki.ca, cert=pki.client_cert, key=pki.client_key, key_password=secret)
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname


def test_the_ca_replaces_the_system_roots(pki: Pki) -> None:
    with_ca = client_context(ca=pki.ca)
    assert [c["subject"] for c in with_ca.get_ca_certs()] == [((("commonName", "mcp-recovery-proxy test CA"),),)]


def test_the_command_refuses_to_start_on_a_bad_tls_setting_from_flag_or_environment(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.cli import main

    missing = str(tmp_path / "missing-ca.pem")
    assert main(["serve", "--upstream", "https://127.0.0.1:9/mcp", "--upstream-ca", missing]) == 2
    assert f"--upstream-ca {missing}: cannot be read" in capsys.readouterr().err
    monkeypatch.setenv("MCP_RECOVERY_UPSTREAM_CLIENT_CERT", str(pki.client_cert))
    monkeypatch.setenv("MCP_RECOVERY_UPSTREAM_CLIENT_KEY", str(pki.server_key))
    assert main(["serve", "--upstream", "https://127.0.0.1:9/mcp"]) == 2
    assert "the key does not belong to the certificate" in capsys.readouterr().err
    # A TLS flag for an upstream without TLS is refused, not ignored.
    assert main(["serve", "--upstream", "http://127.0.0.1:9/mcp"]) == 2
    assert "only for an https:// upstream" in capsys.readouterr().err
