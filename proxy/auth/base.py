"""The authentication seam: who is calling, and how a refusal is told.

Contract (stable: `proxy/auth/jwt.py` and every other mode plug in here):
- An `Authenticator` turns the headers of one HTTP request on the MCP port into a `Principal`,
  or raises `AuthRefused`. `headers` is the request's headers with lower-case names (one value
  per name, as the HTTP frontend builds them). It is awaited on the request path, before anything
  else is done with the request (no session lookup, no body parsing beyond the size bound), so it
  must not block the event loop: I/O (a JWKS fetch) is awaited, bounded in time, and a verdict
  that needs none should be cached (a per-token cache, not a signature check per call).
- `start()` runs once before the first request (load a file, start a watcher, prefetch keys) and
  may raise `AuthConfigError` to refuse the start; `aclose()` stops what `start()` started.
- `Principal.id` is non-secret and stable for one identity: `anonymous` (`none`),
  `token:<name>` (`tokens`), `passthrough:<keyed hash of the credential>` (`passthrough`),
  `jwt:<iss>#<sub>` (`jwt`). It keys the recovery ledger (a budget belongs to the principal that
  spent it), and appears in the call log line and the `mcp_recovery.principal` span attribute,
  never as a metric label. It must never contain the credential itself, nor anything from which
  the credential can be recovered.
- `Principal.scopes` are the scopes the credential grants; `scopes_known` says whether the proxy
  knows them at all (in `passthrough` only the upstream does, so the proxy checks no
  `required_scopes` there and leaves that to the upstream's own 403).
- `AuthRefused(status, reason, description, error=..., scope=...)`: `status` 401 (no or bad
  credential) or 403 (valid but not enough); `error` the OAuth/RFC 6750 error code (`None` when the
  request carried no credential at all, as RFC 6750 §3.1 asks); `reason` one of `REASONS`, the
  bounded label of `mcp_recovery_auth_failures_total{reason}` (anything else is counted as
  `other`); `description` a short text for the caller with no secret in it (bounded to
  `DESCRIPTION_LIMIT` characters, quotes and control characters removed, since it is placed in a
  header); `scope` the scopes a 403 `insufficient_scope` asks for. The HTTP frontend renders it
  as the status with `WWW-Authenticate: Bearer error=…, error_description=…, scope=…,
  resource_metadata="<public URL's protected-resource metadata>"`.
  `status` 404 (reason `session_owner`, no challenge) refuses the 2025 session a request named to
  a principal it does not belong to, rendered as the frontend's "Session not found" (the proxy's
  own check in jwt and tokens; the upstream's, relayed, in passthrough).
  `status` 503 (with `retry_after_s`, rendered as `Retry-After` and without a challenge) is for a
  verdict the proxy cannot reach for a fault of its own side, not the caller's (jwt: the issuer's
  keys cannot be fetched): a 401 there would send an OAuth client through a new authorization for
  a token that is not at fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

AuthMode = Literal["none", "passthrough", "jwt", "tokens"]

# The bounded label set of mcp_recovery_auth_failures_total{reason}. Modes raise only these.
REASONS: frozenset[str] = frozenset(
    {
        "missing",  # no Authorization header, or not a Bearer one
        "malformed",  # a Bearer header whose token cannot be read
        "unknown_token",  # tokens: no entry matches
        "invalid_token",  # jwt: unreadable, bad signature, alg none, HMAC with a public key
        "expired",  # jwt: exp/nbf outside the leeway
        "wrong_audience",
        "wrong_issuer",
        "unknown_key",  # jwt: kid unknown after the one JWKS refresh
        "keys_unavailable",  # jwt: the issuer's metadata or JWKS could not be fetched in time
        "insufficient_scope",  # a policy's required_scopes are not all granted
        "upstream_401",  # passthrough: the upstream refused the credential
        "upstream_403",  # passthrough: the upstream refused the request
        "session_owner",  # a 2025 session named by another principal than the one that opened it
        "admin",  # the admin endpoint's bearer token was missing or wrong
        "other",
    }
)
DESCRIPTION_LIMIT = 200
_UNSAFE = re.compile(r'[\x00-\x1f\x7f"\\]')
# One regex scan: a per-character generator cost ~25 µs on a 600-character JWT, on every request.
_BLANK = re.compile(r"\s")


class AuthConfigError(ValueError):
    """The auth settings or files cannot work: the proxy refuses to start, with this text."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. `id` is non-secret and stable (see the module docstring)."""

    id: str
    scopes: frozenset[str] = field(default_factory=frozenset)
    scopes_known: bool = True

    def lacks(self, required: frozenset[str]) -> frozenset[str]:
        """The required scopes this principal was not granted (none when its scopes are unknown)."""
        if not required or not self.scopes_known:
            return frozenset()
        return required - self.scopes


ANONYMOUS = Principal("anonymous", scopes_known=False)


def safe_description(text: str) -> str:
    """A description fit for a header and a log line: no quotes or control characters, bounded."""
    cleaned = _UNSAFE.sub(" ", text)
    return cleaned if len(cleaned) <= DESCRIPTION_LIMIT else cleaned[: DESCRIPTION_LIMIT - 1] + "…"


class AuthRefused(Exception):
    """A request refused for its credential (401), its scopes (403) or the session it named (404)."""

    def __init__(
        self,
        status: Literal[401, 403, 404, 503],
        reason: str,
        description: str,
        *,
        error: str | None = "invalid_token",
        scope: frozenset[str] | None = None,
        challenge: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.status = status
        self.reason = reason if reason in REASONS else "other"
        self.description = safe_description(description)
        self.error = error
        self.scope = scope
        # passthrough: the upstream's own WWW-Authenticate (resource_metadata already rewritten),
        # relayed as it came instead of one the proxy builds
        self.challenge = challenge
        self.retry_after_s = retry_after_s
        super().__init__(f"{status} {self.reason}: {self.description}")


@runtime_checkable
class Authenticator(Protocol):
    """One authentication mode. See the module docstring for the contract."""

    mode: AuthMode

    async def start(self) -> None: ...

    async def authenticate(self, headers: Mapping[str, str]) -> Principal: ...

    async def aclose(self) -> None: ...


def bearer_token(headers: Mapping[str, str]) -> str:
    """The token of an `Authorization: Bearer <token>` header; `AuthRefused(401)` without one.

    No credential at all is refused without an error code (RFC 6750 §3.1), so a client learns
    only that it must authenticate; a header that is not a readable Bearer credential is
    `invalid_request`."""
    value = headers.get("authorization")
    if not value:
        raise AuthRefused(401, "missing", "authentication required", error=None)
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer":
        raise AuthRefused(401, "missing", "a Bearer token is required", error=None)
    if not token or _BLANK.search(token):
        raise AuthRefused(401, "malformed", "the Bearer token cannot be read", error="invalid_request")
    return token
