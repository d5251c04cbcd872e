"""Identity: which mode authenticates callers, built from the settings.

`build_authenticator(settings)` checks the auth settings together (`check_settings`) and returns
the mode's `Authenticator` (proxy/auth/base.py), or None for `none` (the request path then does
no auth work at all). Refusals are `AuthConfigError` (a ValueError: the command line prints it and
exits 2) naming the flag to fix.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from proxy.auth.base import (
    ANONYMOUS,
    REASONS,
    AuthConfigError,
    Authenticator,
    AuthMode,
    AuthRefused,
    Principal,
    bearer_token,
)

if TYPE_CHECKING:
    from proxy.settings import Settings

__all__ = [
    "ANONYMOUS",
    "REASONS",
    "AuthConfigError",
    "AuthMode",
    "AuthRefused",
    "Authenticator",
    "Principal",
    "bearer_token",
    "build_authenticator",
    "check_settings",
]

log = logging.getLogger("proxy.auth")


def check_settings(settings: Settings) -> None:
    """Refuse auth settings that cannot work together, naming the flag to fix."""
    mode = settings.auth
    if mode != "none" and settings.listen == "stdio":
        raise AuthConfigError(
            f"--auth {mode} does not apply to --listen stdio: the client that launched the proxy is its only "
            "caller, and stdio carries no credential (use --auth none, or --listen http://…)"
        )
    if mode == "passthrough":
        if settings.upstream_argv or not settings.upstream:
            raise AuthConfigError(
                "--auth passthrough needs a network upstream (--upstream http(s)://… or sse+http(s)://…): a stdio "
                "server cannot receive the caller's Authorization"
            )
        if not settings.public_url:
            raise AuthConfigError(
                "--auth passthrough needs --public-url (the URL clients dial, with the endpoint path)"
            )
        if any(h.partition(":")[0].strip().lower() == "authorization" for h in settings.upstream_headers):
            raise AuthConfigError(
                "--auth passthrough forwards the caller's Authorization: drop the Authorization --upstream-header"
            )
    if mode == "tokens" and settings.auth_tokens_file is None:
        raise AuthConfigError("--auth tokens needs --auth-tokens-file (one 'NAME TOKEN' per line)")
    if mode == "jwt":
        if not settings.public_url:
            raise AuthConfigError("--auth jwt needs --public-url (the resource URL tokens are issued for)")
        if not settings.auth_issuer:
            raise AuthConfigError("--auth jwt needs --auth-issuer (the issuer whose metadata names its JWKS)")
    if settings.auth_hash_key_file is not None and mode != "passthrough":
        raise AuthConfigError("--auth-hash-key-file is only used with --auth passthrough")


def build_authenticator(settings: Settings) -> Authenticator | None:
    """The configured mode's authenticator (None for `none`); `AuthConfigError` when it cannot work."""
    check_settings(settings)
    mode = settings.auth
    if mode == "none":
        return None
    if mode == "tokens":
        from proxy.auth.tokens import TokensAuthenticator

        assert settings.auth_tokens_file is not None
        return TokensAuthenticator(settings.auth_tokens_file)
    if mode == "passthrough":
        from proxy.auth.passthrough import PassthroughAuthenticator, read_key_file

        key = read_key_file(settings.auth_hash_key_file) if settings.auth_hash_key_file is not None else None
        return PassthroughAuthenticator(key)
    from proxy.auth.jwt import JwtAuthenticator

    assert settings.auth_issuer is not None and settings.public_url is not None
    return JwtAuthenticator(
        settings.auth_issuer, settings.auth_audience or settings.public_url, typ=settings.auth_jwt_typ
    )
