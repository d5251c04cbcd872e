"""`--auth jwt` end to end: the SDK's own OAuth client, the real proxy process, our authorization
server (real signed JWTs, tests/fixtures/authserver.py) and an SDK server upstream that accepts
only the proxy's own credential.

- The SDK's `OAuthClientProvider` completes the whole flow through the proxy, in both protocol
  eras: 401, protected-resource metadata discovered through the proxy, authorization-server
  metadata, registration, authorization with PKCE, token, the retried request.
- Every refusal over HTTP: its status and its `WWW-Authenticate` challenge naming the proxy's
  protected-resource metadata; a JWKS that is down: 503 with Retry-After within a bound.
- The upstream sees the proxy's credential on every request and never the caller's token.
- A tool whose policy has `required_scopes`: 403 `insufficient_scope` naming them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.types import TextContent
from starlette.types import Receive, Scope, Send

from tests.auth.rig import modern_call
from tests.fixtures.authserver import AuthServer, sdk_oauth_provider, serve_in_thread, stop_thread_server
from tests.fixtures.helpers import free_port
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
ERAS = ["legacy", "2026-07-28"]
BOUND_S = 40.0
CREDENTIAL = "proxy-own-credential-" + "c" * 24


class CredentialGate:
    """ASGI middleware: every HTTP request must carry the proxy's own credential; records what came."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[str | None] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            value = dict(scope["headers"]).get(b"authorization")
            self.seen.append(value.decode() if value is not None else None)
            if value != f"Bearer {CREDENTIAL}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await self.app(scope, receive, send)


@pytest.fixture
def auth() -> Iterator[AuthServer]:
    with AuthServer(issuer_path="/tenant") as server:
        yield server


@pytest.fixture
def upstream() -> Iterator[tuple[str, CredentialGate]]:
    server = MCPServer("upstream")

    @server.tool()
    def whoami() -> str:
        return "upstream says hello"

    @server.tool()
    def write_note(text: str) -> str:
        return f"noted: {text}"

    gate = CredentialGate(server.streamable_http_app())
    uv, thread, port = serve_in_thread(gate)
    try:
        yield f"http://127.0.0.1:{port}/mcp", gate
    finally:
        stop_thread_server(uv, thread)


@contextlib.contextmanager
def jwt_proxy(tmp_path: Path, auth: AuthServer, upstream_url: str, *extra: str) -> Iterator[ProxyProcess]:
    """The proxy in jwt mode; its start is bounded at 60 s (a loaded two-core machine needs more than 20)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    proxy = ProxyProcess(
        upstream_url=upstream_url,
        port=port,
        log_path=tmp_path / "proxy.log",
        extra=[
            "--auth",
            "jwt",
            "--public-url",
            url,
            "--auth-issuer",
            auth.issuer,
            "--upstream-header",
            f"Authorization: Bearer {CREDENTIAL}",
            "--call-log",
            "all",
            *extra,
        ],
    )
    proxy.start(timeout_s=60.0)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def proxy(tmp_path: Path, auth: AuthServer, upstream: tuple[str, CredentialGate]) -> Iterator[ProxyProcess]:
    with jwt_proxy(tmp_path, auth, upstream[0]) as p:
        yield p


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def metadata_url(proxy: ProxyProcess) -> str:
    return f"http://127.0.0.1:{proxy.port}/.well-known/oauth-protected-resource/mcp"


def post(proxy: ProxyProcess, token: str | None, name: str = "whoami", timeout_s: float = 20.0) -> httpx.Response:
    headers, body = modern_call(name, {"text": "x"} if name == "write_note" else {}, token)
    return httpx.post(proxy.url, content=body, headers=headers, timeout=timeout_s)


@pytest.mark.parametrize("mode", ERAS)
async def test_the_sdk_oauth_client_completes_the_flow_through_the_proxy(
    auth: AuthServer, upstream: tuple[str, CredentialGate], proxy: ProxyProcess, mode: str
) -> None:
    _, gate = upstream
    provider, storage = sdk_oauth_provider(proxy.url)
    with anyio.fail_after(BOUND_S):
        async with httpx2.AsyncClient(auth=provider, timeout=10.0) as http:
            async with Client(streamable_http_client(proxy.url, http_client=http), mode=mode) as client:
                assert text_of(await client.call_tool("whoami", {})) == "upstream says hello"
                assert text_of(await client.call_tool("whoami", {})) == "upstream says hello"
    assert len(auth.clients) == 1 and len(auth.issued) == 1, "one registration, one token"
    assert auth.issued[0]["aud"] == proxy.url, "the token was issued for the proxy's public URL"
    token = storage.tokens.access_token
    # The upstream got the proxy's own credential on every request, never the caller's token.
    assert gate.seen and all(seen == f"Bearer {CREDENTIAL}" for seen in gate.seen)
    assert token not in proxy.log_tail(1_000_000)
    assert f"jwt:{auth.issuer}#{auth.subject}" in proxy.log_tail(1_000_000), "the call log names the principal"


def test_the_protected_resource_metadata_names_the_issuer(auth: AuthServer, proxy: ProxyProcess) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        document = httpx.get(f"http://127.0.0.1:{proxy.port}{path}", timeout=10.0).json()
        assert document["resource"] == proxy.url
        assert document["authorization_servers"] == [auth.issuer]


def test_every_bad_token_is_refused_with_its_challenge(auth: AuthServer, proxy: ProxyProcess) -> None:
    now = int(time.time())
    impostor = auth.new_key(kid=auth.signing.kid if auth.signing else None)
    cases = {
        "expired": auth.issue(aud=proxy.url, exp=now - 120),
        "wrong audience": auth.issue(aud="http://127.0.0.1:1/mcp"),
        "wrong issuer": auth.issue(aud=proxy.url, iss=auth.origin),
        "bad signature": auth.issue(aud=proxy.url, key=impostor),
        "alg none": auth.forge_alg_none(aud=proxy.url),
        "HS256 with the public key": auth.forge_hmac_with_public_key(aud=proxy.url),
        "unknown kid": auth.issue(aud=proxy.url, key=auth.new_key()),
        "garbage": "abc.def.ghi",
    }
    resource_metadata = f'resource_metadata="{metadata_url(proxy)}"'
    missing = post(proxy, None)
    assert missing.status_code == 401
    assert (
        missing.headers["www-authenticate"].startswith("Bearer ")
        and "error=" not in missing.headers["www-authenticate"]
    )
    assert resource_metadata in missing.headers["www-authenticate"]
    for what, token in cases.items():
        answer = post(proxy, token)
        challenge = answer.headers.get("www-authenticate", "")
        assert answer.status_code == 401, what
        assert 'error="invalid_token"' in challenge and resource_metadata in challenge, (what, challenge)
        assert token not in challenge and token not in answer.text
    log = proxy.log_tail(1_000_000)
    for token in cases.values():
        assert token not in log
    metrics = httpx.get(proxy.admin + "/metrics", timeout=10.0).text
    for reason in ("missing", "expired", "wrong_audience", "wrong_issuer", "invalid_token", "unknown_key"):
        assert f'reason="{reason}"' in metrics, reason
    # and a good one goes through
    ok = post(proxy, auth.issue(aud=proxy.url))
    assert ok.status_code == 200 and "upstream says hello" in ok.text


def test_a_rotated_key_is_accepted_after_one_jwks_refresh(auth: AuthServer, proxy: ProxyProcess) -> None:
    assert post(proxy, auth.issue(aud=proxy.url)).status_code == 200
    hits = auth.jwks_hits
    auth.rotate(keep_old=False)
    answer = post(proxy, auth.issue(aud=proxy.url, sub="rotated"))
    assert answer.status_code == 200 and "upstream says hello" in answer.text
    assert auth.jwks_hits == hits + 1


def test_a_jwks_fetch_leaves_no_httpx_request_line_in_the_log(auth: AuthServer, proxy: ProxyProcess) -> None:
    """httpx logs each request at INFO; the proxy's log level is INFO, and its log keeps its own lines."""
    hits = auth.jwks_hits
    auth.rotate(keep_old=False)
    assert post(proxy, auth.issue(aud=proxy.url, sub="fresh-key")).status_code == 200
    assert auth.jwks_hits > hits >= 1, "the keys were fetched at start and again for the new key"
    log = proxy.log_tail(1_000_000)
    assert "jwt:" in log, "the call log line is there (the log is read at INFO)"
    assert " httpx: " not in log and "HTTP Request:" not in log, log[-2000:]


def test_a_jwks_that_is_down_is_a_bounded_503_and_held_keys_still_work(auth: AuthServer, proxy: ProxyProcess) -> None:
    known = auth.issue(aud=proxy.url)
    assert post(proxy, known).status_code == 200
    ready = httpx.get(proxy.admin + "/readyz", timeout=10.0)
    assert ready.status_code == 200 and ready.json()["auth"]["keys"] == "ok", ready.text
    assert "mcp_recovery_auth_keys_up 1.0" in httpx.get(proxy.admin + "/metrics", timeout=10.0).text
    auth.jwks_mode = "hang"
    auth.rotate()
    started = time.monotonic()
    answer = post(proxy, auth.issue(aud=proxy.url, sub="while-down"), timeout_s=30.0)
    waited = time.monotonic() - started
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5" and "www-authenticate" not in answer.headers
    assert waited < 25.0, "bounded by the proxy's fetch timeout (5 s), never a hang"
    assert post(proxy, known).status_code == 200, "a token whose key is held needs no fetch"
    metrics = httpx.get(proxy.admin + "/metrics", timeout=10.0).text
    assert 'reason="keys_unavailable"' in metrics
    # Readiness says so, and stays 200: held keys and cached verdicts still serve callers.
    assert "mcp_recovery_auth_keys_up 0.0" in metrics
    ready = httpx.get(proxy.admin + "/readyz", timeout=10.0)
    assert ready.status_code == 200, ready.text
    keys = ready.json()["auth"]
    assert keys["keys"] == "stale" and keys["key_ids"] >= 1 and "no answer" in keys["last_error"], keys


def test_a_tool_that_requires_a_scope_the_token_lacks_is_403_insufficient_scope(
    tmp_path: Path, auth: AuthServer, upstream: tuple[str, CredentialGate]
) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "notes.yaml").write_text("tools: [write_note]\nrequired_scopes: [tools.write]\n")
    with jwt_proxy(tmp_path, auth, upstream[0], "--policies", str(policies)) as proxy:
        reader = auth.issue(aud=proxy.url, scope="tools.read")
        refused = post(proxy, reader, "write_note")
        challenge = refused.headers.get("www-authenticate", "")
        assert refused.status_code == 403
        assert 'error="insufficient_scope"' in challenge and 'scope="tools.write"' in challenge
        assert f'resource_metadata="{metadata_url(proxy)}"' in challenge
        assert post(proxy, reader, "whoami").status_code == 200, "a tool without required_scopes"
        writer = auth.issue(aud=proxy.url, scope="tools.read tools.write")
        assert "noted: x" in post(proxy, writer, "write_note").text


@pytest.mark.parametrize("mode", ERAS)
async def test_the_sdk_client_steps_up_its_scopes_after_a_403_insufficient_scope(
    tmp_path: Path, auth: AuthServer, upstream: tuple[str, CredentialGate], mode: str
) -> None:
    from mcp.shared.auth import OAuthToken

    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "notes.yaml").write_text("tools: [write_note]\nrequired_scopes: [tools.write]\n")
    with jwt_proxy(tmp_path, auth, upstream[0], "--policies", str(policies)) as proxy:
        provider, storage = sdk_oauth_provider(proxy.url)
        # A client that already holds a token granting only tools.read (issued before this run).
        storage.tokens = OAuthToken(
            access_token=auth.issue(aud=proxy.url, scope="tools.read"), token_type="Bearer", scope="tools.read"
        )
        with anyio.fail_after(BOUND_S):
            async with httpx2.AsyncClient(auth=provider, timeout=10.0) as http:
                async with Client(streamable_http_client(proxy.url, http_client=http), mode=mode) as client:
                    assert text_of(await client.call_tool("whoami", {})) == "upstream says hello"
                    assert text_of(await client.call_tool("write_note", {"text": "up"})) == "noted: up"
    assert len(auth.issued) == 1, "one authorization: the step-up"
    assert "tools.write" in auth.issued[0]["scope"].split()
