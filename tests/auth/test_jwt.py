"""The `--auth jwt` verifier (proxy/auth/jwt.py) against our real authorization server over loopback.

Each refusal is checked for its status, its RFC 6750 error code and its counted reason; the HTTP
rendering of those (status and `WWW-Authenticate`) is checked end to end in test_jwt_e2e.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

import proxy.auth.jwt as jwt_module
from proxy.auth.base import AuthConfigError, AuthRefused, Principal
from proxy.auth.jwt import JwtAuthenticator, metadata_urls, scopes_of
from tests.fixtures.authserver import AuthServer

pytestmark = pytest.mark.anyio
AUDIENCE = "http://127.0.0.1:8080/mcp"
BOUND_S = 20.0


@pytest.fixture
def auth() -> Iterator[AuthServer]:
    with AuthServer() as server:
        yield server


def make(auth: AuthServer, **kw: Any) -> JwtAuthenticator:
    return JwtAuthenticator(auth.issuer, AUDIENCE, **kw)


@pytest.fixture
async def verifier(auth: AuthServer) -> AsyncIterator[JwtAuthenticator]:
    v = make(auth)
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        yield v
    finally:
        await v.aclose()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def refused(v: JwtAuthenticator, headers: dict[str, str]) -> AuthRefused:
    with anyio.fail_after(BOUND_S), pytest.raises(AuthRefused) as caught:
        await v.authenticate(headers)
    return caught.value


async def test_a_valid_token_gives_the_issuer_and_subject_principal_with_its_scopes(
    auth: AuthServer, verifier: JwtAuthenticator
) -> None:
    token = auth.issue(aud=AUDIENCE, scope="tools.read tools.write")
    principal = await verifier.authenticate(bearer(token))
    assert principal == Principal(f"jwt:{auth.issuer}#user-1", frozenset({"tools.read", "tools.write"}))


async def test_an_expiry_past_a_floats_range_is_a_token_that_does_not_expire_not_a_500(
    auth: AuthServer, verifier: JwtAuthenticator
) -> None:
    """PyJWT takes any integer `exp`; the cache's deadline was `float(exp)`, which raised
    OverflowError past the verifier's error handling for an exp of 10**400 (one only the issuer
    can sign)."""
    token = auth.issue(aud=AUDIENCE, exp=10**400)
    assert (await verifier.authenticate(bearer(token))).id.endswith("#user-1")
    assert (await verifier.authenticate(bearer(token))).id.endswith("#user-1")  # from the cache


async def test_an_audience_list_that_contains_the_resource_is_accepted(
    auth: AuthServer, verifier: JwtAuthenticator
) -> None:
    principal = await verifier.authenticate(bearer(auth.issue(aud=["https://other.example", AUDIENCE])))
    assert principal.id.endswith("#user-1")


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"scope": "a b  c"}, {"a", "b", "c"}),
        ({"scp": ["a", "b"]}, {"a", "b"}),
        ({"scp": "a b"}, {"a", "b"}),
        ({"scp": ["a", 3, "has space"]}, {"a"}),
        ({}, set()),
    ],
)
def test_scopes_come_from_scope_or_scp(claims: dict[str, Any], expected: set[str]) -> None:
    assert scopes_of(claims) == frozenset(expected)


async def test_no_token_is_401_without_an_error_code(verifier: JwtAuthenticator) -> None:
    r = await refused(verifier, {})
    assert (r.status, r.error, r.reason) == (401, None, "missing")


@pytest.mark.parametrize(
    ("make_token", "reason"),
    [
        (lambda a: a.issue(aud=AUDIENCE, exp=int(time.time()) - 120), "expired"),
        (lambda a: a.issue(aud=AUDIENCE, nbf=int(time.time()) + 600), "expired"),
        (lambda a: a.issue(aud="http://127.0.0.1:9/other"), "wrong_audience"),
        (lambda a: a.issue(), "invalid_token"),  # no aud at all
        (lambda a: a.issue(aud=AUDIENCE, iss="http://127.0.0.1:1"), "wrong_issuer"),
        (lambda a: a.issue(aud=AUDIENCE, drop=["exp"]), "invalid_token"),
        (lambda a: a.issue(aud=AUDIENCE, drop=["sub"]), "invalid_token"),
        (lambda a: a.issue(aud=AUDIENCE, sub="line\nbreak"), "invalid_token"),
        # a key of ours that is not published, under the published key's kid: the signature fails
        (lambda a: a.issue(aud=AUDIENCE, key=_impostor(a)), "invalid_token"),
        (lambda a: a.forge_alg_none(aud=AUDIENCE), "invalid_token"),
        (lambda a: a.forge_hmac_with_public_key(aud=AUDIENCE), "invalid_token"),
        (lambda a: "not.a.jwt", "invalid_token"),
    ],
    ids=[
        "expired",
        "not-yet-valid",
        "wrong-audience",
        "no-audience",
        "wrong-issuer",
        "no-exp",
        "no-sub",
        "control-char-sub",
        "bad-signature",
        "alg-none",
        "hs256-with-public-key",
        "garbage",
    ],
)
async def test_a_bad_token_is_refused_401_invalid_token(
    auth: AuthServer, verifier: JwtAuthenticator, make_token: Any, reason: str
) -> None:
    r = await refused(verifier, bearer(make_token(auth)))
    assert (r.status, r.error, r.reason) == (401, "invalid_token", reason)


def _impostor(auth: AuthServer) -> Any:
    assert auth.signing is not None
    return auth.new_key(kid=auth.signing.kid)


async def test_refusals_never_carry_the_token(auth: AuthServer, verifier: JwtAuthenticator) -> None:
    impostor = _impostor(auth)
    for token in (auth.issue(aud="x"), auth.forge_alg_none(aud=AUDIENCE), auth.issue(aud=AUDIENCE, key=impostor)):
        r = await refused(verifier, bearer(token))
        for part in token.split("."):
            if part:
                assert part not in str(r) and part not in r.description


async def test_an_unknown_kid_costs_one_jwks_refresh_per_interval_then_401(
    auth: AuthServer, verifier: JwtAuthenticator
) -> None:
    hits = auth.jwks_hits
    r = await refused(verifier, bearer(auth.issue(aud=AUDIENCE, key=auth.new_key())))
    assert (r.status, r.error, r.reason) == (401, "invalid_token", "unknown_key")
    assert auth.jwks_hits == hits + 1, "one refresh for the unknown kid"
    for _ in range(5):
        r = await refused(verifier, bearer(auth.issue(aud=AUDIENCE, key=auth.new_key())))
        assert r.reason == "unknown_key"
    assert auth.jwks_hits == hits + 1, "no more refreshes within the interval"


async def test_concurrent_unknown_kids_share_one_fetch(auth: AuthServer, verifier: JwtAuthenticator) -> None:
    hits = auth.jwks_hits
    auth.rotate()
    tokens = [auth.issue(aud=AUDIENCE, sub=f"user-{i}") for i in range(20)]
    results: list[Principal] = []

    async def one(token: str) -> None:
        results.append(await verifier.authenticate(bearer(token)))

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            for token in tokens:
                tg.start_soon(one, token)
    assert len(results) == 20
    assert auth.jwks_hits == hits + 1


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_a_rotated_key_is_accepted_after_the_refresh(
    auth: AuthServer, verifier: JwtAuthenticator, alg: Any
) -> None:
    old = auth.issue(aud=AUDIENCE)
    await verifier.authenticate(bearer(old))
    hits = auth.jwks_hits
    auth.rotate(alg, keep_old=False)
    principal = await verifier.authenticate(bearer(auth.issue(aud=AUDIENCE, sub="after")))
    assert principal.id == f"jwt:{auth.issuer}#after"
    assert auth.jwks_hits == hits + 1


@pytest.mark.parametrize("mode", ["hang", "error"])
async def test_a_jwks_that_is_down_gets_a_bounded_wait_then_503(auth: AuthServer, mode: Any) -> None:
    v = make(auth, fetch_timeout_s=1.0)
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        known = auth.issue(aud=AUDIENCE)
        auth.jwks_mode = mode
        # A token whose key is already held needs no fetch: it is still accepted.
        assert (await v.authenticate(bearer(known))).id.endswith("#user-1")
        auth.rotate()
        with anyio.fail_after(BOUND_S):  # the bound under test is fetch_timeout_s; this one only stops a hang
            r = await refused(v, bearer(auth.issue(aud=AUDIENCE, sub="new")))
        assert (r.status, r.reason, r.error) == (503, "keys_unavailable", None)
        assert r.retry_after_s == v.retry_after_s
        # Within retry_after_s the next one is answered without another fetch.
        hits = auth.jwks_hits
        r = await refused(v, bearer(auth.issue(aud=AUDIENCE, sub="newer")))
        assert r.status == 503 and auth.jwks_hits == hits
    finally:
        auth.jwks_mode = "ok"
        await v.aclose()


async def test_an_issuer_down_at_start_is_not_fatal_and_its_keys_are_used_once_up(auth: AuthServer) -> None:
    auth.jwks_mode = "error"
    v = make(auth, fetch_timeout_s=1.0, retry_after_s=0.0)
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        token = auth.issue(aud=AUDIENCE)
        r = await refused(v, bearer(token))
        assert (r.status, r.reason) == (503, "keys_unavailable")
        auth.jwks_mode = "ok"
        with anyio.fail_after(BOUND_S):
            assert (await v.authenticate(bearer(token))).id.endswith("#user-1")
    finally:
        await v.aclose()


async def test_a_verified_token_is_served_from_the_cache_not_a_signature_check(
    auth: AuthServer, verifier: JwtAuthenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    real = jwt_module.jwt.decode

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kw)

    monkeypatch.setattr(jwt_module.jwt, "decode", counting)
    token = auth.issue(aud=AUDIENCE)
    for _ in range(50):
        await verifier.authenticate(bearer(token))
    assert calls == 1


async def test_a_cached_token_is_verified_again_once_past_its_exp(
    auth: AuthServer, verifier: JwtAuthenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = auth.issue(aud=AUDIENCE, exp=int(time.time()) + 60)
    await verifier.authenticate(bearer(token))
    later = time.time() + 3600

    class Clock:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def time() -> float:
            return later

    monkeypatch.setattr(jwt_module, "time", Clock)
    calls = 0
    real = jwt_module.jwt.decode

    def expired(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **{**kw, "leeway": -3600})  # PyJWT reads the real clock: an hour on

    monkeypatch.setattr(jwt_module.jwt, "decode", expired)
    r = await refused(verifier, bearer(token))
    assert (r.status, r.reason) == (401, "expired") and calls == 1


async def test_the_cache_is_bounded(auth: AuthServer) -> None:
    v = make(auth, cache_size=3)
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        for i in range(10):
            await v.authenticate(bearer(auth.issue(aud=AUDIENCE, sub=f"u{i}")))
        assert len(v._verified) == 3
    finally:
        await v.aclose()


def test_metadata_urls_follow_rfc_8414_for_issuers_with_and_without_a_path() -> None:
    assert metadata_urls("https://as.example") == [
        "https://as.example/.well-known/oauth-authorization-server",
        "https://as.example/.well-known/openid-configuration",
    ]
    assert metadata_urls("https://as.example/tenant/1/") == [
        "https://as.example/.well-known/oauth-authorization-server/tenant/1",
        "https://as.example/.well-known/openid-configuration/tenant/1",
        "https://as.example/tenant/1/.well-known/openid-configuration",
    ]


@pytest.mark.parametrize(("path", "style"), [("/tenant", "oauth"), ("/realms/x", "oidc"), ("", "oidc")])
async def test_keys_are_found_through_either_metadata_document(path: str, style: Any) -> None:
    with AuthServer(issuer_path=path, metadata=style, alg="ES256") as auth:
        v = make(auth)
        with anyio.fail_after(BOUND_S):
            await v.start()
        try:
            assert (await v.authenticate(bearer(auth.issue(aud=AUDIENCE)))).id == f"jwt:{auth.issuer}#user-1"
        finally:
            await v.aclose()


async def test_metadata_that_names_another_issuer_is_not_used(auth: AuthServer) -> None:
    v = JwtAuthenticator(auth.issuer + "/", AUDIENCE, fetch_timeout_s=2.0)  # the metadata says without the slash
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        r = await refused(v, bearer(auth.issue(aud=AUDIENCE, iss=auth.issuer + "/")))
        assert (r.status, r.reason) == (503, "keys_unavailable")
    finally:
        await v.aclose()


async def test_a_withdrawn_key_stops_being_trusted_once_the_keys_are_refreshed_for_age(auth: AuthServer) -> None:
    v = make(auth, max_key_age_s=0.0, retry_after_s=0.0)
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        old = auth.signing
        auth.rotate(keep_old=False)  # the issuer withdraws the old key
        # Still held: accepted, and the keys being old, a refresh starts in the background.
        assert (await v.authenticate(bearer(auth.issue(aud=AUDIENCE, key=old, sub="a")))).id.endswith("#a")
        refresh = v._refresh
        assert refresh is not None
        with anyio.fail_after(BOUND_S):
            await refresh
        assert v.fetches == 2, "the start's fetch, then the one for age"
        r = await refused(v, bearer(auth.issue(aud=AUDIENCE, key=old, sub="b")))
        assert (r.status, r.reason) == (401, "unknown_key")
    finally:
        await v.aclose()


@pytest.mark.parametrize(
    ("typ", "accepted_by_default", "accepted_by_at_jwt"),
    [
        ("at+jwt", True, True),
        ("application/at+jwt", True, True),
        ("AT+JWT", True, True),  # a media type: compared case-insensitively
        ("JWT", True, False),  # what Entra ID, Okta, Keycloak and PyJWT's default send
        (None, True, False),  # no typ at all
        ("dpop+jwt", True, False),
    ],
)
async def test_typ_is_checked_only_with_auth_jwt_typ_at_jwt(
    auth: AuthServer, typ: str | None, accepted_by_default: bool, accepted_by_at_jwt: bool
) -> None:
    for setting, accepted in (("any", accepted_by_default), ("at+jwt", accepted_by_at_jwt)):
        v = make(auth, typ=setting)
        with anyio.fail_after(BOUND_S):
            await v.start()
        try:
            # PyJWT writes typ JWT unless told otherwise; None removes it from the header
            token = auth.issue(aud=AUDIENCE, headers={"typ": typ})
            if accepted:
                assert (await v.authenticate(bearer(token))).id.endswith("#user-1"), setting
            else:
                r = await refused(v, bearer(token))
                assert (r.status, r.error, r.reason) == (401, "invalid_token", "invalid_token"), setting
                assert "at+jwt" in r.description
        finally:
            await v.aclose()


async def test_keys_status_says_ok_stale_or_unavailable_and_the_gauge_follows(auth: AuthServer) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from proxy.auth.jwt import KeysCollector

    auth.jwks_mode = "error"
    v = make(auth, fetch_timeout_s=1.0, retry_after_s=0.0)
    registry = CollectorRegistry()
    registry.register(KeysCollector(v))
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        status = v.keys_status()
        assert status["keys"] == "unavailable" and "HTTP 503" in status["last_error"], status
        assert b"mcp_recovery_auth_keys_up 0.0" in generate_latest(registry)
        auth.jwks_mode = "ok"
        with anyio.fail_after(BOUND_S):
            await v._await_refresh()
        status = v.keys_status()
        assert status["keys"] == "ok" and status["key_ids"] == 1 and "last_error" not in status, status
        assert b"mcp_recovery_auth_keys_up 1.0" in generate_latest(registry)
        assert b"mcp_recovery_auth_keys_age_seconds " in generate_latest(registry)
        auth.jwks_mode = "error"
        with anyio.fail_after(BOUND_S):
            await v._await_refresh()
        assert v.keys_status()["keys"] == "stale"
        assert b"mcp_recovery_auth_keys_up 0.0" in generate_latest(registry)
    finally:
        auth.jwks_mode = "ok"
        await v.aclose()


# -- the bounds on what a caller or the issuer's documents can make the verifier read -------------


async def test_a_token_over_8_kib_is_refused_even_one_the_issuer_signed(
    auth: AuthServer, verifier: JwtAuthenticator
) -> None:
    """The token's size is the caller's choice and every byte of it is decoded and hashed: past
    `MAX_TOKEN_CHARS` (8 KiB) it is refused unread, signed or not."""
    within = auth.issue(aud=AUDIENCE, pad="x" * 5000)
    over = auth.issue(aud=AUDIENCE, pad="x" * 7000)
    assert len(within) <= jwt_module.MAX_TOKEN_CHARS == 8192 < len(over)
    assert (await verifier.authenticate(bearer(within))).id.endswith("#user-1")
    r = await refused(verifier, bearer(over))
    assert (r.status, r.error, r.reason) == (401, "invalid_token", "invalid_token")
    assert "too long" in r.description


async def test_a_subject_over_256_characters_is_refused(auth: AuthServer, verifier: JwtAuthenticator) -> None:
    """The subject becomes the principal (`jwt:<iss>#<sub>`), which keys budgets and reaches log
    lines: at most `MAX_SUB_CHARS` (256) characters, even in a token the issuer signed."""
    assert (await verifier.authenticate(bearer(auth.issue(aud=AUDIENCE, sub="s" * 256)))).id.endswith("#" + "s" * 256)
    r = await refused(verifier, bearer(auth.issue(aud=AUDIENCE, sub="s" * 257)))
    assert (r.status, r.error, r.reason) == (401, "invalid_token", "invalid_token")
    assert "subject" in r.description


async def test_the_jwks_is_read_to_its_first_64_keys() -> None:
    """A JWKS of thousands of keys would be parsed on every refresh and tried against every token
    without a kid: the first `MAX_KEYS` (64) are read, the rest ignored (a token signed by the
    65th is refused as of an unknown key)."""
    with AuthServer(alg="ES256") as auth:
        keys = [auth.new_key() for _ in range(65)]
        auth.keys = keys
        v = make(auth)
        with anyio.fail_after(BOUND_S):
            await v.start()
        try:
            assert v.keys_status()["key_ids"] == jwt_module.MAX_KEYS == 64
            assert (await v.authenticate(bearer(auth.issue(aud=AUDIENCE, key=keys[63])))).id.endswith("#user-1")
            r = await refused(v, bearer(auth.issue(aud=AUDIENCE, key=keys[64])))
            assert (r.status, r.reason) == (401, "unknown_key")
        finally:
            await v.aclose()


@pytest.mark.parametrize("document", ["metadata", "jwks"])
async def test_a_metadata_or_jwks_document_over_512_kib_is_not_read(document: str) -> None:
    """The issuer's documents are read into memory: each is bounded to `MAX_DOCUMENT_BYTES`
    (512 KiB); a larger one is a failed fetch (503 keys_unavailable, the reason in keys_status),
    one just within is used."""
    assert jwt_module.MAX_DOCUMENT_BYTES == 512 * 1024
    for padding, usable in ((500 * 1024, True), (520 * 1024, False)):
        with AuthServer() as auth:
            extra = {"padding": "x" * padding}
            if document == "metadata":
                auth.metadata_extra = extra
            else:
                auth.jwks_extra = extra
            v = make(auth, fetch_timeout_s=5.0)
            with anyio.fail_after(BOUND_S):
                await v.start()
            try:
                token = auth.issue(aud=AUDIENCE)
                if usable:
                    assert (await v.authenticate(bearer(token))).id.endswith("#user-1"), document
                else:
                    r = await refused(v, bearer(token))
                    assert (r.status, r.reason) == (503, "keys_unavailable"), document
                    status = v.keys_status()
                    assert status["keys"] == "unavailable" and "larger than" in status["last_error"], status
            finally:
                await v.aclose()


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:9000", True),
        ("http://[::1]:9000/tenant", True),
        ("http://localhost", True),
        ("https://as.example", True),
        ("http://as.example", False),
        ("http://10.0.0.5:8080", False),
        ("http://127.0.0.1.evil.example", False),
        ("http://localhost.evil.example", False),
        ("ftp://127.0.0.1", False),
    ],
)
def test_an_http_issuer_is_accepted_only_on_loopback(url: str, allowed: bool) -> None:
    """Keys fetched over plain HTTP can be swapped on the way: `--auth-issuer` must be https://
    unless its host is loopback (refused at construction, so at the proxy's start)."""
    if allowed:
        assert JwtAuthenticator(url, AUDIENCE).issuer == url
    else:
        with pytest.raises(AuthConfigError, match="https://"):
            JwtAuthenticator(url, AUDIENCE)


@pytest.mark.parametrize(
    ("jwks_host", "usable"), [("127.0.0.1", True), ("as.example", False), ("10.0.0.5", False)]
)  # (not `localhost`: whether it reaches the test server's 127.0.0.1 depends on the machine's resolver)
async def test_an_http_jwks_uri_is_followed_only_on_loopback(auth: AuthServer, jwks_host: str, usable: bool) -> None:
    """The metadata's `jwks_uri` is held to the issuer's rule: an http:// one off loopback is not
    fetched (the keys stay unavailable, the reason in keys_status), a loopback one is."""
    auth.metadata_extra = {"jwks_uri": f"http://{jwks_host}:{auth.port}/jwks"}
    v = make(auth, fetch_timeout_s=2.0)
    with anyio.fail_after(BOUND_S):
        await v.start()
    try:
        token = auth.issue(aud=AUDIENCE)
        if usable:
            assert (await v.authenticate(bearer(token))).id.endswith("#user-1")
        else:
            assert auth.jwks_hits == 0
            r = await refused(v, bearer(token))
            assert (r.status, r.reason) == (503, "keys_unavailable")
            assert "https://" in v.keys_status()["last_error"]
    finally:
        await v.aclose()
