"""The pure parts of the auth modes: the tokens file, challenges and metadata, required_scopes."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.auth.base import AuthConfigError, AuthRefused
from proxy.auth.challenge import (
    challenge,
    challenge_params,
    metadata_paths,
    metadata_url,
    rewrite_challenge,
    rewrite_metadata,
    upstream_refusal,
)
from proxy.auth.tokens import TokensAuthenticator, parse_tokens, read_secret_file
from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.policy.compile import load_policy_dir
from proxy.policy.render import policy_rows

GOOD = "0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f"alice {GOOD} extra\n", "f:1: expected 'NAME TOKEN' (two fields), found 3"),
        (f"al/ice {GOOD}\n", "f:1: a name is 1-64 of A-Za-z0-9._-"),
        (
            "alice short\n",
            "f:1: the token must be 16-512 visible ASCII characters (the line is 'NAME TOKEN', in that order)",
        ),
        (f"alice {GOOD}\nalice {GOOD}x\n", "f:2: the name is already given on line 1"),
        (f"alice {GOOD}\n# c\nbob {GOOD}\n", "f:3: the token is already line 1's token"),
        ("# nothing\n\n", "f: no tokens (every caller would be refused)"),
    ],
)
def test_a_bad_tokens_file_names_the_line_and_never_the_token(text: str, problem: str) -> None:
    _, problems = parse_tokens(text, "f")
    assert problems == [problem]
    assert all(GOOD not in p for p in problems)


CANARY = "canary-7f3e9b21c4d8a6"  # a secret that also passes as a NAME (1-64 of A-Za-z0-9._-)


@pytest.mark.parametrize(
    "text",
    [
        f"{CANARY} alice\n",  # written the wrong way round: the secret in the name's place
        f"{CANARY} alice\n{CANARY} bob\n",  # ... twice: a duplicate "name"
        f"alice {GOOD}\n{CANARY} {GOOD}\n",  # ... beside another entry's token
    ],
    ids=["swapped", "swapped-twice", "swapped-duplicate-token"],
)
@pytest.mark.anyio
async def test_a_tokens_file_written_token_first_never_echoes_the_token(
    text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, problems = parse_tokens(text, "f")
    assert problems and all(CANARY not in p for p in problems), problems
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(AuthConfigError) as refused:
        TokensAuthenticator(path)
    assert CANARY not in str(refused.value)
    path.write_text(f"alice {GOOD}\n")
    auth = TokensAuthenticator(path)
    path.write_text(text)
    with caplog.at_level("DEBUG"):
        assert await auth.reload() is False
    assert caplog.records and CANARY not in caplog.text and CANARY not in (auth.last_error or "")


def test_a_bad_tokens_file_at_start_refuses_the_start(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("alice short\n")
    with pytest.raises(AuthConfigError, match="tokens:1"):
        TokensAuthenticator(path)
    with pytest.raises(AuthConfigError, match="cannot be read"):
        TokensAuthenticator(tmp_path / "missing")


@pytest.mark.anyio
async def test_tokens_are_looked_up_by_keyed_digest_and_a_bad_reload_keeps_the_last_good_set(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"alice {GOOD}\n")
    auth = TokensAuthenticator(path)
    assert (await auth.authenticate({"authorization": f"Bearer {GOOD}"})).id == "token:alice"
    with pytest.raises(AuthRefused) as caught:
        await auth.authenticate({"authorization": f"Bearer {GOOD}0"})
    assert (caught.value.status, caught.value.reason) == (401, "unknown_token")
    assert GOOD not in repr(auth.__dict__.get("_by_digest"))
    path.write_text("garbage\n")
    assert await auth.reload() is False and auth.reloads_error == 1 and auth.last_error
    assert (await auth.authenticate({"authorization": f"Bearer {GOOD}"})).id == "token:alice"


def test_the_admin_token_file_holds_one_token(tmp_path: Path) -> None:
    path = tmp_path / "admin"
    path.write_text(f"\n{GOOD}\n")
    assert read_secret_file(path, "--admin-token-file") == GOOD
    path.write_text(f"{GOOD}\n{GOOD}\n")
    with pytest.raises(AuthConfigError, match="one token"):
        read_secret_file(path, "--admin-token-file")


def test_metadata_url_inserts_the_well_known_path_before_the_endpoint_path() -> None:
    assert metadata_url("https://h.example/mcp") == "https://h.example/.well-known/oauth-protected-resource/mcp"
    assert metadata_url("http://127.0.0.1:8/") == "http://127.0.0.1:8/.well-known/oauth-protected-resource"
    assert metadata_paths("/mcp") == {
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    }


def test_the_proxys_own_challenges() -> None:
    meta = "https://h/.well-known/oauth-protected-resource/mcp"
    missing = AuthRefused(401, "missing", "authentication required", error=None)
    assert challenge(missing, meta) == f'Bearer resource_metadata="{meta}"'
    scope = AuthRefused(403, "insufficient_scope", "x", error="insufficient_scope", scope=frozenset({"b", "a"}))
    assert challenge(scope, meta) == (
        f'Bearer error="insufficient_scope", error_description="x", scope="a b", resource_metadata="{meta}"'
    )


def test_an_upstream_challenge_points_at_the_proxys_metadata_and_keeps_the_rest() -> None:
    ours = "https://proxy/.well-known/oauth-protected-resource/mcp"
    upstream = (
        'Bearer realm="r", error="insufficient_scope", scope="a b", resource_metadata="http://up:1/.well-known/x"'
    )
    assert rewrite_challenge(upstream, ours) == (
        f'Bearer realm="r", error="insufficient_scope", scope="a b", resource_metadata="{ours}"'
    )
    assert rewrite_challenge('Bearer resource_metadata=http://up/x, DPoP algs="ES256"', ours) == (
        f'Bearer resource_metadata="{ours}", DPoP algs="ES256"'
    )
    assert rewrite_challenge('Bearer realm="r"', ours) == 'Bearer realm="r"'
    assert challenge_params(upstream) == {"error": "insufficient_scope", "scope": "a b"}


def test_an_upstream_refusal_keeps_its_status_challenge_and_error() -> None:
    failure = UpstreamFailure(
        FailureKind.HTTP_STATUS,
        Dispatch.NO,
        "upstream answered HTTP 403",
        http_status=403,
        challenge='Bearer error="insufficient_scope", error_description="need write"',
    )
    refused = upstream_refusal(failure)
    assert (refused.status, refused.reason, refused.error, refused.description) == (
        403,
        "upstream_403",
        "insufficient_scope",
        "need write",
    )
    assert refused.challenge == failure.challenge


def test_metadata_naming_the_upstream_gets_the_proxys_resource_and_a_mismatch_stays() -> None:
    up, public = "http://up:1/mcp", "https://p/mcp"
    assert rewrite_metadata({"resource": "http://up:1/mcp", "x": 1}, up, public) == {"resource": public, "x": 1}
    assert rewrite_metadata({"resource": "http://up:1"}, up, public) == {"resource": "https://p"}
    assert rewrite_metadata({"resource": "http://up:1/"}, up, "https://p/tenant/mcp") == {
        "resource": "https://p/tenant"
    }
    mismatch = {"resource": "https://elsewhere.example/mcp"}
    assert rewrite_metadata(mismatch, up, public) == mismatch
    assert rewrite_metadata(["not", "an", "object"], up, public) is None


def test_required_scopes_compile_and_explain_shows_them(tmp_path: Path) -> None:
    (tmp_path / "pay.yaml").write_text("tools: [pay]\nrequired_scopes: [payments, 'orders:write']\n")
    policies = load_policy_dir(tmp_path)
    assert policies.resolve("pay").required_scopes == frozenset({"payments", "orders:write"})
    assert policies.resolve("other").required_scopes == frozenset()
    rows = {key: (value, source) for key, value, source in policy_rows(policies.resolve("pay"))}
    assert rows["required_scopes"] == ("[orders:write, payments]", f"{tmp_path}/pay.yaml:required_scopes")


def test_a_scope_that_cannot_go_in_a_challenge_is_a_policy_problem(tmp_path: Path) -> None:
    from proxy.errors import PolicyError

    (tmp_path / "pay.yaml").write_text("tools: [pay]\nrequired_scopes: ['a\"b']\n")
    with pytest.raises(PolicyError, match="required_scopes"):
        load_policy_dir(tmp_path)


def test_the_metadata_url_an_upstream_challenge_names_is_read_back() -> None:
    from proxy.auth.challenge import resource_metadata_of

    assert resource_metadata_of('Bearer error="x", resource_metadata="http://up:1/custom/m.json"') == (
        "http://up:1/custom/m.json"
    )
    assert resource_metadata_of("Bearer resource_metadata=http://up:1/m") == "http://up:1/m"
    assert resource_metadata_of('Bearer realm="r"') is None


@pytest.mark.parametrize(
    ("cache_control", "keep_s"),
    [
        (None, 0.0),  # no lifetime given: not kept (an authorization server migration shows at once)
        ("", 0.0),
        ("public, max-age=300", 300.0),
        ("max-age=99999", 3600.0),  # capped
        ("no-store", 0.0),
        ("max-age=300, no-cache", 0.0),
        ("public", 0.0),
    ],
)
def test_passthrough_metadata_is_kept_only_for_the_lifetime_the_upstream_gives(
    cache_control: str | None, keep_s: float
) -> None:
    from proxy.auth.metadata_cache import max_age

    assert max_age(cache_control) == keep_s


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("keep_s", "answered"),
    [(0.0, b"no-store"), (0.5, b"no-store"), (10.0, b"max-age=9"), (3600.0, b"max-age=3599")],
)
async def test_the_metadata_is_answered_with_no_longer_a_lifetime_than_the_proxy_keeps_it(
    keep_s: float, answered: bytes
) -> None:
    """A fixed `max-age=300` let clients keep for five minutes a document the upstream said not to
    keep at all: the answer's lifetime is what is left of the proxy's own (whole seconds, cut down)."""
    from proxy.auth.metadata_cache import MetadataCache

    cache = MetadataCache()
    assert cache.cache_control() == b"no-store", "nothing fetched yet"

    async def fetch() -> tuple[dict[str, str], float]:
        return {"resource": "x"}, keep_s

    assert await cache.get(fetch) == {"resource": "x"}
    assert cache.cache_control() == answered


@pytest.mark.anyio
async def test_refusal_lines_are_bounded_and_the_next_one_counts_those_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One INFO line per refused request was 2000 lines for 2000 POSTs with a wrong token. The
    refusal lines share one budget: its burst at once, then one a second; the next line let
    through says how many were not logged, and every refusal is still answered."""
    import logging
    from types import SimpleNamespace
    from typing import Any

    from proxy.frontend.http.identity import REFUSAL_LOG_BURST, Identity
    from proxy.settings import Settings

    identity = Identity(SimpleNamespace(sessions={}), Settings(upstream="http://127.0.0.1:1/mcp"), "/mcp", None)  # type: ignore[arg-type]
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    refused = AuthRefused(401, "unknown_token", "no such token")
    with caplog.at_level(logging.INFO, logger="proxy.frontend.http"):
        for _ in range(2000):
            await identity.refuse(send, refused, "POST")
        identity.session("s" * 16, None)  # nothing by that id: no refusal, no line
        lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert statuses == [401] * 2000, "every refusal is answered"
        assert REFUSAL_LOG_BURST <= len(lines) <= REFUSAL_LOG_BURST + 2, len(lines)
        logged_at_once = len(lines)
        identity._refusal_lines.at -= 1.0  # a second later, one more line is let through
        await identity.refuse(send, refused, "POST")
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == logged_at_once + 1
    assert lines[-1] == (
        f"refused POST: HTTP 401 unknown_token (no such token) ({2000 - logged_at_once} more refusals were"
        " not logged before this one)"
    )
