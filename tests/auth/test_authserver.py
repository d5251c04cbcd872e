"""Our test authorization server (tests/fixtures/authserver.py) against the MCP SDK itself, no proxy.

The SDK's own `OAuthClientProvider` runs the whole flow (401, protected-resource metadata,
authorization-server metadata, dynamic registration, authorization with PKCE, token, retried
request) against an SDK `MCPServer` acting as resource server, in both protocol eras. That
server's token verifier is written here with PyJWT against the keys the authorization server
publishes, independently of the proxy's verifier, and the SDK's own middleware checks the
token's resource (`validate_token_resource`). So a later failure through the proxy is the
proxy's, not this fixture's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.types import TextContent

from tests.fixtures.authserver import AuthServer, sdk_oauth_provider, serve_in_thread, stop_thread_server
from tests.fixtures.helpers import free_port

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "2026-07-28"]
BOUND_S = 30.0


class PublishedKeyVerifier:
    """An SDK TokenVerifier that checks signature, issuer, audience and expiry with PyJWT."""

    def __init__(self, auth: AuthServer, audience: str) -> None:
        self.auth = auth
        self.audience = audience
        self.seen: list[str] = []

    async def verify_token(self, token: str) -> AccessToken | None:
        self.seen.append(token)
        keys = {k.kid: k for k in self.auth.keys}
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            key = keys[kid]
            claims = jwt.decode(
                token, key.private.public_key(), algorithms=[key.alg], audience=self.audience, issuer=self.auth.issuer
            )
        except (jwt.PyJWTError, KeyError):
            return None
        return AccessToken(
            token=token,
            client_id=claims.get("client_id", ""),
            scopes=claims.get("scope", "").split(),
            expires_at=claims["exp"],
            resource=claims["aud"],
            subject=claims["sub"],
        )


@pytest.fixture
def auth() -> Iterator[AuthServer]:
    with AuthServer(issuer_path="/tenant") as server:
        yield server


@pytest.fixture
def protected(auth: AuthServer) -> Iterator[tuple[str, PublishedKeyVerifier]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    verifier = PublishedKeyVerifier(auth, url)
    server = MCPServer(
        "protected",
        token_verifier=verifier,
        auth=AuthSettings(issuer_url=auth.issuer, resource_server_url=url, validate_token_resource=True),  # type: ignore[arg-type]
    )

    @server.tool()
    def whoami() -> str:
        return "ok"

    uv, thread, _ = serve_in_thread(server.streamable_http_app(), port)
    try:
        yield url, verifier
    finally:
        stop_thread_server(uv, thread)


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


@pytest.mark.parametrize("mode", ERAS)
async def test_the_sdk_oauth_client_completes_the_flow_against_our_server(
    auth: AuthServer, protected: tuple[str, PublishedKeyVerifier], mode: str
) -> None:
    url, verifier = protected
    provider, storage = sdk_oauth_provider(url)
    with anyio.fail_after(BOUND_S):
        async with httpx2.AsyncClient(auth=provider, timeout=10.0) as http:
            async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                assert text_of(await client.call_tool("whoami", {})) == "ok"
    assert len(auth.clients) == 1, "one dynamic registration"
    assert len(auth.issued) == 1 and auth.issued[0]["aud"] == url, "the resource parameter became aud"
    assert storage.tokens is not None and storage.tokens.refresh_token
    assert verifier.seen and verifier.seen[-1] == storage.tokens.access_token


def test_the_token_endpoint_refreshes_and_refuses_a_bad_pkce_verifier(auth: AuthServer) -> None:
    with httpx.Client(timeout=10.0) as http:
        client = http.post(auth.issuer + "/register", json={"redirect_uris": ["http://127.0.0.1:1/cb"]}).json()
        params = {
            "response_type": "code",
            "client_id": client["client_id"],
            "redirect_uri": "http://127.0.0.1:1/cb",
            "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",  # RFC 7636 appendix B
            "code_challenge_method": "S256",
            "state": "s",
            "resource": "http://127.0.0.1:9/mcp",
        }
        location = http.get(auth.issuer + "/authorize", params=params).headers["location"]
        code = httpx.URL(location).params["code"]
        assert httpx.URL(location).params["iss"] == auth.issuer
        form = {"grant_type": "authorization_code", "code": code, "client_id": client["client_id"]}
        form["redirect_uri"] = "http://127.0.0.1:1/cb"
        refused = http.post(auth.issuer + "/token", data={**form, "code_verifier": "x" * 43})
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant"

        code = httpx.URL(http.get(auth.issuer + "/authorize", params=params).headers["location"]).params["code"]
        verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"  # RFC 7636 appendix B
        granted = http.post(auth.issuer + "/token", data={**form, "code": code, "code_verifier": verifier}).json()
        refreshed = http.post(
            auth.issuer + "/token",
            data={
                "grant_type": "refresh_token",
                "refresh_token": granted["refresh_token"],
                "client_id": client["client_id"],
            },
        ).json()
        reused = http.post(
            auth.issuer + "/token",
            data={
                "grant_type": "refresh_token",
                "refresh_token": granted["refresh_token"],
                "client_id": client["client_id"],
            },
        )
    assert reused.status_code == 400, "refresh tokens rotate"
    for answer in (granted, refreshed):
        claims = jwt.decode(
            answer["access_token"],
            auth.keys[0].private.public_key(),
            algorithms=["RS256"],
            audience="http://127.0.0.1:9/mcp",
            issuer=auth.issuer,
        )
        assert claims["sub"] == auth.subject
