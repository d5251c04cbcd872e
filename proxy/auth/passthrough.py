"""`--auth passthrough`: the sidecar in front of a server that does its own OAuth.

Contract:
- The proxy does not judge the credential: the upstream does. `authenticate` accepts every
  request; the HTTP frontend forwards the caller's `Authorization` unchanged on every request it
  relays for it (every attempt of a call included), and the upstream's 401/403 come back to the
  caller as the same HTTP status with the upstream's `WWW-Authenticate` (proxy/auth/challenge.py
  rewrites its `resource_metadata` to the proxy's public URL).
- The principal is `passthrough:<32 hex>`: HMAC-SHA256 of the `Authorization` value under a
  key, in its canonical form (`canonical_authorization`: the scheme, case-insensitive by RFC
  9110, lowercased, and the whitespace around and before the credentials dropped, so `Bearer T`
  and `bearer  T`, one credential to the upstream, are one principal and one budget owner),
  truncated to 128 bits, so a budget belongs to one credential and the id reveals nothing of it
  (a keyed hash: without the key, a leaked id cannot be tested against guessed tokens). The
  key is random per process unless `--auth-hash-key-file` names one: replicas sharing recovery
  state (`--state`, the shared store) must share the key, or one replica's ids mean nothing to
  another. A request without `Authorization` is `anonymous` (the upstream will refuse it).
- A refreshed token is a new credential and so a new principal: budgets spent under the old
  token are not the new token's to approve (the proxy cannot tell that two tokens name one user).
- The proxy knows no scopes here (`scopes_known=False`): `required_scopes` in a policy are not
  checked by the proxy in this mode; the upstream's own 403 `insufficient_scope` is relayed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from pathlib import Path

from proxy.auth.base import ANONYMOUS, AuthConfigError, AuthMode, Principal


def read_key_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(4097)
    except OSError as exc:
        raise AuthConfigError(
            f"--auth-hash-key-file {path} cannot be read ({exc.strerror or type(exc).__name__})"
        ) from None
    key = raw.strip()
    if len(raw) > 4096 or len(key) < 32:
        raise AuthConfigError(f"--auth-hash-key-file {path} must hold at least 32 bytes of key (and at most 4 KiB)")
    return key


def canonical_authorization(value: str) -> str:
    """`Authorization` as one credential: the scheme lowercased, one space, the credentials
    without surrounding whitespace (their own case and content kept: a token is case-sensitive)."""
    parts = value.split(None, 1)  # around and between: any run of whitespace
    if not parts:
        return ""
    return f"{parts[0].lower()} {parts[1].strip()}" if len(parts) == 2 else parts[0].lower()


class PassthroughAuthenticator:
    mode: AuthMode = "passthrough"

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        # One entry per credential seen (bounded): a client repeats its token on every request.
        self._ids: dict[str, Principal] = {}

    def principal_of(self, authorization: str) -> Principal:
        known = self._ids.get(authorization)
        if known is not None:
            return known
        canonical = canonical_authorization(authorization)
        digest = hmac.new(self._key, canonical.encode("utf-8", "surrogateescape"), hashlib.sha256)
        principal = Principal(f"passthrough:{digest.hexdigest()[:32]}", scopes_known=False)
        if len(self._ids) >= 4096:
            self._ids.clear()
        self._ids[authorization] = principal
        return principal

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        value = headers.get("authorization")
        return self.principal_of(value) if value else ANONYMOUS

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass
