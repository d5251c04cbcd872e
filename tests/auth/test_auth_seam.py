"""The seam every auth mode plugs into (proxy/auth/base.py) and the settings' cross-checks."""

from __future__ import annotations

import pytest

from proxy.auth import (
    ANONYMOUS,
    AuthConfigError,
    Authenticator,
    AuthRefused,
    Principal,
    bearer_token,
    build_authenticator,
    check_settings,
)
from proxy.auth.passthrough import PassthroughAuthenticator
from proxy.settings import Settings


def test_a_refusal_with_an_unknown_reason_is_counted_as_other() -> None:
    refused = AuthRefused(401, "whatever-a-mode-made-up", "no")
    assert refused.reason == "other"


def test_a_refusal_description_is_bounded_and_fit_for_a_header() -> None:
    refused = AuthRefused(401, "malformed", 'bad "quote"\r\nInjected: yes ' + "x" * 500)
    assert '"' not in refused.description and "\r" not in refused.description and "\n" not in refused.description
    assert len(refused.description) <= 200


@pytest.mark.parametrize(
    ("value", "reason", "error"),
    [
        (None, "missing", None),
        ("Basic dXNlcjpwYXNz", "missing", None),
        ("Bearer", "malformed", "invalid_request"),
        ("Bearer two words", "malformed", "invalid_request"),
    ],
)
def test_bearer_token_refuses_what_is_not_one_bearer_token(value: str | None, reason: str, error: str | None) -> None:
    headers = {} if value is None else {"authorization": value}
    with pytest.raises(AuthRefused) as caught:
        bearer_token(headers)
    assert (caught.value.status, caught.value.reason, caught.value.error) == (401, reason, error)


def test_bearer_token_reads_the_scheme_case_insensitively() -> None:
    assert bearer_token({"authorization": "bearer abc.def"}) == "abc.def"


def test_unknown_scopes_lack_nothing_known_scopes_are_checked() -> None:
    assert ANONYMOUS.lacks(frozenset({"a"})) == frozenset()
    assert Principal("token:x").lacks(frozenset({"a"})) == frozenset({"a"})
    assert Principal("jwt:i#s", frozenset({"a", "b"})).lacks(frozenset({"a"})) == frozenset()


def _settings(**kw: object) -> Settings:
    return Settings(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"auth": "passthrough", "upstream_command": "server"}, "needs a network upstream"),
        ({"auth": "passthrough", "upstream": "http://127.0.0.1:1/mcp"}, "--public-url"),
        (
            {
                "auth": "passthrough",
                "upstream": "http://127.0.0.1:1/mcp",
                "public_url": "http://127.0.0.1:2/mcp",
                "upstream_headers": ["Authorization: Bearer own"],
            },
            "drop the Authorization",
        ),
        ({"auth": "tokens", "upstream": "http://127.0.0.1:1/mcp"}, "--auth-tokens-file"),
        ({"auth": "tokens", "listen": "stdio", "auth_tokens_file": "/x"}, "does not apply to --listen stdio"),
        ({"auth": "jwt", "upstream": "http://127.0.0.1:1/mcp"}, "--public-url"),
    ],
)
def test_auth_settings_that_cannot_work_refuse_the_start(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(AuthConfigError) as caught:
        check_settings(_settings(**kw))
    assert needle in str(caught.value)


def test_jwt_builds_the_verifier_with_the_public_url_as_default_audience() -> None:
    from proxy.auth.jwt import JwtAuthenticator

    settings = _settings(
        auth="jwt",
        upstream="http://127.0.0.1:1/mcp",
        public_url="https://mcp.example.com/mcp",
        auth_issuer="https://issuer.example.com/tenant",
    )
    built = build_authenticator(settings)
    assert isinstance(built, JwtAuthenticator)
    assert built.audience == "https://mcp.example.com/mcp" and built.issuer == "https://issuer.example.com/tenant"
    explicit = build_authenticator(settings.model_copy(update={"auth_audience": "api://orders"}))
    assert isinstance(explicit, JwtAuthenticator) and explicit.audience == "api://orders"


def test_jwt_refuses_a_plain_http_issuer_that_is_not_loopback() -> None:
    settings = _settings(
        auth="jwt", upstream="http://127.0.0.1:1/mcp", public_url="http://127.0.0.1:2/mcp", auth_issuer="http://i"
    )
    with pytest.raises(AuthConfigError, match="https"):
        build_authenticator(settings)


@pytest.mark.parametrize("url", ["http://[", "https://issuer.example.com:port/"])
def test_a_fetch_url_that_is_not_a_url_is_refused_as_such(url: str) -> None:
    """The issuer's metadata names the JWKS URL: one that urlsplit cannot read (an unclosed IPv6
    bracket, a port that is not a number) raised ValueError past the check, which the key refresh
    logged as "unexpected error" with a traceback; it is a problem with that URL, said so."""
    from proxy.auth.jwt import check_fetch_url

    with pytest.raises(AuthConfigError, match="the issuer's jwks_uri is not a URL"):
        check_fetch_url(url, "the issuer's jwks_uri")
    settings = _settings(
        auth="jwt", upstream="http://127.0.0.1:1/mcp", public_url="http://127.0.0.1:2/mcp", auth_issuer=url
    )
    with pytest.raises(AuthConfigError, match="--auth-issuer is not a URL"):
        build_authenticator(settings)


def test_none_builds_no_authenticator() -> None:
    assert build_authenticator(_settings()) is None


def test_the_public_url_must_be_an_http_url() -> None:
    with pytest.raises(ValueError, match="--public-url"):
        _settings(public_url="mcp.example.com/mcp")


@pytest.mark.anyio
async def test_passthrough_principal_is_a_keyed_hash_never_the_credential() -> None:
    auth = PassthroughAuthenticator(b"k" * 32)
    assert isinstance(auth, Authenticator)
    a = await auth.authenticate({"authorization": "Bearer secret-token-one"})
    again = await auth.authenticate({"authorization": "Bearer secret-token-one"})
    b = await auth.authenticate({"authorization": "Bearer secret-token-two"})
    other_key = await PassthroughAuthenticator(b"j" * 32).authenticate({"authorization": "Bearer secret-token-one"})
    assert a == again and a != b and a != other_key
    assert a.id.startswith("passthrough:") and "secret" not in a.id and not a.scopes_known
    assert await auth.authenticate({}) is ANONYMOUS


@pytest.mark.anyio
async def test_passthrough_principals_of_one_credential_written_two_ways_are_one_principal() -> None:
    """`Bearer T` and `bearer  T` are one credential (the scheme is case-insensitive; the
    upstream accepts both), so one principal and one budget owner; the token's own case counts."""
    auth = PassthroughAuthenticator(b"k" * 32)
    one = await auth.authenticate({"authorization": "Bearer secret-token-one"})
    for written in ("bearer  secret-token-one", "BEARER secret-token-one", " Bearer\tsecret-token-one "):
        assert await auth.authenticate({"authorization": written}) == one, written
    assert await auth.authenticate({"authorization": "Bearer SECRET-token-one"}) != one


def test_passthrough_key_file_is_shared_by_replicas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    key = tmp_path / "key"
    key.write_text("z" * 40 + "\n")
    settings = _settings(
        auth="passthrough",
        upstream="http://127.0.0.1:1/mcp",
        public_url="http://127.0.0.1:2/mcp",
        auth_hash_key_file=key,
    )
    one, two = build_authenticator(settings), build_authenticator(settings)
    assert isinstance(one, PassthroughAuthenticator) and isinstance(two, PassthroughAuthenticator)
    assert one.principal_of("Bearer t") == two.principal_of("Bearer t")
    key.write_text("short")
    with pytest.raises(AuthConfigError, match="at least 32 bytes"):
        build_authenticator(settings)
