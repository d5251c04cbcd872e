"""`--auth jwt`: the proxy is the OAuth resource server and verifies bearer JWTs itself.

Contract:
- Keys come from the issuer's JWKS, whose URL its metadata names: RFC 8414
  `/.well-known/oauth-authorization-server`, then OpenID Connect `/.well-known/openid-configuration`
  (for an issuer with a path, the well-known part goes between host and path, RFC 8414 §3.1, and
  the OIDC form that appends it to the path is tried last). The metadata's `issuer` must equal
  `--auth-issuer` exactly (RFC 8414 §3.3) and name a `jwks_uri`. Both are fetched with httpx,
  asynchronously, each fetch bounded by `fetch_timeout_s` in total and by `MAX_DOCUMENT_BYTES`.
  An issuer or JWKS URL must be https unless its host is loopback.
- A token is accepted when: its header's `alg` is on `ALLOWED_ALGORITHMS` (asymmetric only: `none`
  and every HMAC are refused before any key is looked at, so a public key can never be used as an
  HMAC secret); its `kid` names a key of the JWKS whose type fits the alg (and whose own `alg`
  and `use`, when present, agree); the signature verifies (PyJWT with cryptography); `iss` equals
  the issuer; `aud` is the audience or a list that contains it (RFC 7519 §4.1.3; the audience is
  `--auth-audience`, by default `--public-url`, RFC 8707); `exp` is present and `exp`/`nbf` hold
  within `leeway_s`; `sub` is present. Scopes: `scope` (space separated) or `scp` (a list or a
  string). The principal is `jwt:<iss>#<sub>`.
- The header's `typ` (`--auth-jwt-typ`): `any` (the default) does not look at it; `at+jwt` accepts
  only `at+jwt` or `application/at+jwt` (RFC 9068 §4; compared case-insensitively, as media types
  are), checked before any key is looked up. Why `any` by default is in docs/security.md: the
  audience check already refuses the token RFC 9068's `typ` guards against (an ID token, whose
  `aud` is a client id), and the common issuers send `typ: JWT`.
- Refusals (`AuthRefused`, reason in brackets): 401 `invalid_token` for an unreadable token, a
  refused alg or a bad signature [invalid_token], an expired or not yet valid one [expired], a
  wrong audience [wrong_audience] or issuer [wrong_issuer], a `kid` the JWKS does not hold after
  its refresh [unknown_key]; 503 with `retry_after_s` when the keys cannot be had [keys_unavailable]:
  the fault is the issuer's, not the caller's, and a 401 would send an OAuth client through a
  whole new authorization (a person at a browser, perhaps) for a token that would be refused the
  same way; 503 says "try again shortly", which is the truth.
- Key refresh: the JWKS is fetched at start (a failure there is logged, not fatal: requests get
  503 until it comes), again when a token names an unknown `kid` but at most once per
  `refresh_interval_s` (a flood of made-up kids costs one fetch per interval), at most every
  `retry_after_s` while fetches fail, and in the background once the keys are older than
  `max_key_age_s` (so a key the issuer withdrew stops being trusted). Concurrent refreshes are
  one fetch: every waiter awaits the same task, shielded, so a caller that goes away does not
  cancel it. A caller waits at most `fetch_timeout_s` (never a hang), then gets its answer.
- Per-call cost: a verified token's principal is cached, keyed by the SHA-256 of the token, until
  its `exp` (plus the leeway), at most `cache_size` entries (the oldest makes room; an expired
  one is dropped when looked up). A cached call costs one hash and one dict lookup, not a
  signature check. A token stays accepted until its `exp` even if its key is withdrawn
  meanwhile; keep access tokens short.
- `keys_status()` says whether the keys can be had, for `/readyz` and the metrics
  (`mcp_recovery_auth_keys_up`, `mcp_recovery_auth_keys_age_seconds`: `KeysCollector`): `ok` (keys
  held, the last fetch succeeded), `stale` (keys held, the last fetch failed: tokens of known
  keys and cached verdicts still work, an unknown `kid` gets 503), `unavailable` (no keys yet:
  every token not already verified gets 503). Readiness does not fail on it (docs/security.md).
- Nothing secret leaves this module: descriptions name what failed, never the token; the
  principal carries `iss` and `sub` only (bounded, control characters refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import jwt
import orjson
from jwt.exceptions import (
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidAudienceError,
    InvalidIssuerError,
    InvalidSignatureError,
    MissingRequiredClaimError,
    PyJWKError,
    PyJWTError,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from proxy.auth.base import AuthConfigError, AuthMode, AuthRefused, Principal, bearer_token

log = logging.getLogger("proxy.auth")

# Asymmetric algorithms only. Which key types each needs, so a JWK of another type is never tried.
ALLOWED_ALGORITHMS: Mapping[str, tuple[str, str | None]] = {
    "RS256": ("RSA", None),
    "RS384": ("RSA", None),
    "RS512": ("RSA", None),
    "PS256": ("RSA", None),
    "PS384": ("RSA", None),
    "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None),
}
MAX_TOKEN_CHARS = 8192
MAX_DOCUMENT_BYTES = 512 * 1024
MAX_KEYS = 64
MAX_SUB_CHARS = 256
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
JwtTyp = Literal["at+jwt", "any"]
AT_JWT_TYPES = frozenset({"at+jwt", "application/at+jwt"})  # RFC 9068 §2.1, §4


def metadata_urls(issuer: str) -> list[str]:
    """Where the issuer's metadata may be, in the order tried (RFC 8414 §3.1 and §5, OIDC Discovery)."""
    parts = urlsplit(issuer)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if not path:
        return [f"{origin}/.well-known/oauth-authorization-server", f"{origin}/.well-known/openid-configuration"]
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}/.well-known/openid-configuration{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


def check_fetch_url(url: str, what: str) -> None:
    """https, or http to a loopback host; anything else is refused (keys over plain HTTP can be swapped)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises for a port that is not a number
    except ValueError:
        raise AuthConfigError(f"{what} is not a URL: {url[:200]}") from None
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname in LOOPBACK:
        return
    raise AuthConfigError(f"{what} must be an https:// URL (http:// only for a loopback host): {url[:200]}")


class KeysUnavailable(Exception):
    """The issuer's metadata or JWKS could not be fetched or read; the text says why (no secret in it)."""


@dataclass(frozen=True, slots=True)
class Key:
    """One signing key of the JWKS: its JWK members that matter, and the parsed public key."""

    kty: str
    crv: str | None
    alg: str | None
    public: Any  # a cryptography public key, parsed once per fetch


@dataclass(frozen=True, slots=True)
class KeySet:
    """One fetched JWKS: the usable signing keys by kid (keys without a kid under "")."""

    by_kid: Mapping[str, tuple[Key, ...]]
    fetched_at: float  # monotonic


def _usable(jwk: dict[str, Any]) -> bool:
    # A symmetric key in a JWKS is never a verification key here, and an encryption key is not either.
    return jwk.get("kty") in ("RSA", "EC", "OKP") and jwk.get("use", "sig") == "sig"


def parse_jwks(document: Any) -> dict[str, tuple[Key, ...]]:
    """The JWKS's signing keys by kid; a key that cannot be read is skipped, not fatal."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise KeysUnavailable("the JWKS has no 'keys' list")
    grouped: dict[str, list[Key]] = {}
    for jwk in document["keys"][:MAX_KEYS]:
        if not isinstance(jwk, dict) or not _usable(jwk):
            continue
        try:
            public = jwt.PyJWK(jwk).key
        except (PyJWKError, ValueError, TypeError, KeyError):
            continue
        crv, alg, kid = jwk.get("crv"), jwk.get("alg"), jwk.get("kid")
        key = Key(jwk["kty"], crv if isinstance(crv, str) else None, alg if isinstance(alg, str) else None, public)
        grouped.setdefault(kid if isinstance(kid, str) else "", []).append(key)
    return {kid: tuple(keys) for kid, keys in grouped.items()}


def _key_fits(key: Key, alg: str) -> bool:
    kty, crv = ALLOWED_ALGORITHMS[alg]
    if key.kty != kty or (crv is not None and key.crv != crv):
        return False
    return key.alg is None or key.alg == alg


def scopes_of(claims: Mapping[str, Any]) -> frozenset[str]:
    """`scope` (RFC 8693/9068: space separated) or `scp` (a list, or a space-separated string)."""
    value = claims.get("scope", claims.get("scp"))
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(s for s in value if isinstance(s, str) and s and not any(c.isspace() for c in s))
    return frozenset()


class JwtAuthenticator:
    """Verifies bearer JWTs against one issuer's JWKS. See the module docstring."""

    mode: AuthMode = "jwt"

    def __init__(
        self,
        issuer: str,
        audience: str,
        *,
        leeway_s: float = 30.0,
        fetch_timeout_s: float = 5.0,
        refresh_interval_s: float = 30.0,
        retry_after_s: float = 5.0,
        max_key_age_s: float = 900.0,
        cache_size: int = 10_000,
        typ: JwtTyp = "any",
    ) -> None:
        check_fetch_url(issuer, "--auth-issuer")
        self.require_at_jwt = typ == "at+jwt"
        self.issuer = issuer
        self.audience = audience
        self.leeway_s = leeway_s
        self.fetch_timeout_s = fetch_timeout_s
        self.refresh_interval_s = refresh_interval_s
        self.retry_after_s = retry_after_s
        self.max_key_age_s = max_key_age_s
        self.cache_size = cache_size
        self._client: httpx.AsyncClient | None = None
        self._jwks_uri: str | None = None
        self._keys: KeySet | None = None
        self._last_error: str | None = None
        self._last_attempt_at = float("-inf")  # monotonic instant the last fetch started
        self._last_kid_refresh_at = float("-inf")  # ... and the last one an unknown kid started
        self._refresh: asyncio.Task[None] | None = None
        # sha256(token) -> (principal, the wall-clock instant it stops being accepted)
        self._verified: dict[bytes, tuple[Principal, float]] = {}
        self.fetches = 0  # JWKS fetches started (metadata included), for tests and the status page

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        # trust_env (httpx's default): HTTPS_PROXY/NO_PROXY reach an issuer through an egress proxy,
        # and SSL_CERT_FILE/SSL_CERT_DIR name a private CA.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.fetch_timeout_s),
            follow_redirects=False,
            headers={"accept": "application/json"},
        )
        # The first fetch is awaited (bounded) so the first requests need not wait; an issuer that
        # is down at start is not fatal: requests are answered 503 until its keys can be had.
        await self._await_refresh()
        if self._keys is None:
            log.warning(
                "jwt: no signing keys yet from %s (%s); requests get 503 until they come", self.issuer, self._last_error
            )

    async def aclose(self) -> None:
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refresh
        if self._client is not None:
            await self._client.aclose()

    # -- what /readyz and the metrics read ---------------------------------------------------------

    def keys_status(self) -> dict[str, Any]:
        """`keys`: ok | stale | unavailable (module docstring), with the keys' age and the last
        fetch's problem (issuer URLs and a status, no secret; bounded)."""
        keys = self._keys
        state = "unavailable" if keys is None else ("stale" if self._last_error is not None else "ok")
        out: dict[str, Any] = {"mode": "jwt", "keys": state, "issuer": self.issuer[:200]}
        if keys is not None:
            out["key_ids"] = len(keys.by_kid)
            out["keys_age_s"] = round(time.monotonic() - keys.fetched_at, 1)
        if self._last_error is not None:
            out["last_error"] = self._last_error[:300]
        return out

    # -- the request path ------------------------------------------------------------------------

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        token = bearer_token(headers)
        digest = hashlib.sha256(token.encode()).digest()
        hit = self._verified.get(digest)
        if hit is not None:
            principal, until = hit
            if time.time() < until:
                self._maybe_refresh_in_background()
                return principal
            del self._verified[digest]
        principal, until = await self._verify(token)
        self._remember(digest, principal, until)
        return principal

    def _remember(self, digest: bytes, principal: Principal, until: float) -> None:
        # The oldest entry makes room (O(1); tokens of one issuer share a lifetime, so the oldest is
        # also the first to expire, and an expired entry is dropped when it is looked up).
        while len(self._verified) >= self.cache_size:
            del self._verified[next(iter(self._verified))]
        self._verified[digest] = (principal, until)

    async def _verify(self, token: str) -> tuple[Principal, float]:
        if len(token) > MAX_TOKEN_CHARS:
            raise AuthRefused(401, "invalid_token", "the token is too long")
        try:
            header = jwt.get_unverified_header(token)
        except PyJWTError:
            raise AuthRefused(401, "invalid_token", "the token is not a readable JWT") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
            raise AuthRefused(401, "invalid_token", "the token's signing algorithm is not accepted")
        if self.require_at_jwt:
            typ = header.get("typ")
            if not isinstance(typ, str) or typ.lower() not in AT_JWT_TYPES:
                raise AuthRefused(401, "invalid_token", "the token is not an access token: its typ must be at+jwt")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthRefused(401, "invalid_token", "the token's key id is not a string")
        candidates = await self._keys_for(kid, alg)
        claims = self._decode(token, alg, candidates)
        iss, sub = claims.get("iss"), claims.get("sub")
        if not isinstance(sub, str) or not sub or len(sub) > MAX_SUB_CHARS or not sub.isprintable():
            raise AuthRefused(401, "invalid_token", "the token's subject is missing or unusable")
        principal = Principal(f"jwt:{iss}#{sub}", scopes_of(claims))
        try:
            until = float(claims["exp"]) + self.leeway_s
        except OverflowError:  # an integer past a float's range (PyJWT took it): no end in sight
            until = math.inf
        return principal, until

    def _decode(self, token: str, alg: str, candidates: tuple[Key, ...]) -> dict[str, Any]:
        bad_signature = False
        for key in candidates:
            try:
                return jwt.decode(
                    token,
                    key=key.public,
                    algorithms=[alg],
                    audience=self.audience,
                    issuer=self.issuer,
                    leeway=self.leeway_s,
                    options={"require": ["exp", "iss", "aud", "sub"]},
                )
            except InvalidSignatureError:
                bad_signature = True  # a key without a kid may be the wrong one: try the next
            except (ExpiredSignatureError, ImmatureSignatureError):
                raise AuthRefused(401, "expired", "the token has expired or is not valid yet") from None
            except InvalidAudienceError:
                raise AuthRefused(401, "wrong_audience", "the token was not issued for this resource") from None
            except InvalidIssuerError:
                raise AuthRefused(401, "wrong_issuer", "the token was not issued by the accepted issuer") from None
            except MissingRequiredClaimError as exc:
                raise AuthRefused(401, "invalid_token", f"the token lacks the {exc.claim} claim") from None
            except PyJWTError:
                raise AuthRefused(401, "invalid_token", "the token cannot be verified") from None
        if bad_signature:
            raise AuthRefused(401, "invalid_token", "the token's signature does not verify")
        raise AuthRefused(401, "unknown_key", "no key of the issuer fits the token")

    async def _keys_for(self, kid: str | None, alg: str) -> tuple[Key, ...]:
        """The issuer's keys that may have signed a token with this kid and alg, refreshing once if none."""
        found = self._fitting(kid, alg)
        if found:
            self._maybe_refresh_in_background()
            return found
        # A refresh in flight is joined. A new one is started at most once per refresh_interval_s for
        # unknown kids (counted from the last one an unknown kid started, so a rotation just after
        # start-up is still seen), and once per retry_after_s while there are no keys or fetches fail.
        now = time.monotonic()
        in_flight = self._refresh is not None and not self._refresh.done()
        if self._keys is None or self._last_error is not None:
            allowed = now - self._last_attempt_at >= self.retry_after_s
        else:
            allowed = now - self._last_kid_refresh_at >= self.refresh_interval_s
        if in_flight or allowed:
            if not in_flight:
                self._last_kid_refresh_at = now
            await self._await_refresh()
            found = self._fitting(kid, alg)
            if found:
                return found
        if self._keys is None or self._last_error is not None:
            raise AuthRefused(
                503,
                "keys_unavailable",
                "the issuer's signing keys cannot be fetched now; retry shortly",
                error=None,
                retry_after_s=self.retry_after_s,
            )
        raise AuthRefused(401, "unknown_key", "the token's key is not one of the issuer's keys")

    def _fitting(self, kid: str | None, alg: str) -> tuple[Key, ...]:
        if self._keys is None:
            return ()
        if kid is not None:
            pool: tuple[Key, ...] = self._keys.by_kid.get(kid, ())
        else:  # no kid: every key of the JWKS may have signed it (the JWKS is bounded to MAX_KEYS)
            pool = tuple(key for keys in self._keys.by_kid.values() for key in keys)
        return tuple(key for key in pool if _key_fits(key, alg))

    # -- fetching --------------------------------------------------------------------------------

    def _maybe_refresh_in_background(self) -> None:
        keys = self._keys
        if keys is None or time.monotonic() - keys.fetched_at < self.max_key_age_s:
            return
        if self._refresh is None or self._refresh.done():
            if time.monotonic() - self._last_attempt_at >= self.retry_after_s:
                self._refresh = asyncio.get_running_loop().create_task(self._fetch(), name="jwt-jwks-refresh")

    async def _await_refresh(self) -> None:
        """Join the refresh in flight, or start one; wait for it at most `fetch_timeout_s` (and a margin)."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._fetch(), name="jwt-jwks-refresh")
        with contextlib.suppress(TimeoutError):
            # shield: a caller that stops waiting (or is cancelled) leaves the fetch to the others.
            await asyncio.wait_for(asyncio.shield(self._refresh), self.fetch_timeout_s + 1.0)

    async def _fetch(self) -> None:
        self._last_attempt_at = time.monotonic()
        self.fetches += 1
        try:
            async with asyncio.timeout(self.fetch_timeout_s):
                if self._jwks_uri is None:
                    self._jwks_uri = await self._discover()
                by_kid = parse_jwks(await self._get_json(self._jwks_uri, "the JWKS"))
        except KeysUnavailable as exc:
            self._jwks_uri = None  # the next attempt rediscovers it, in case the issuer moved it
            self._last_error = str(exc)
            log.warning("jwt: cannot refresh the signing keys of %s: %s", self.issuer, exc)
            return
        except TimeoutError:
            self._last_error = f"no answer within {self.fetch_timeout_s:g} s"
            log.warning("jwt: cannot refresh the signing keys of %s: %s", self.issuer, self._last_error)
            return
        except Exception:
            # A background task has no caller to raise to: the failure is logged and the keys held
            # are kept (the request path then answers as for any failed fetch).
            self._last_error = "unexpected error"
            log.exception("jwt: cannot refresh the signing keys of %s", self.issuer)
            return
        self._keys = KeySet(by_kid, time.monotonic())
        self._last_error = None
        log.debug("jwt: %d signing key ids from %s", len(by_kid), self._jwks_uri)

    async def _discover(self) -> str:
        problems: list[str] = []
        for url in metadata_urls(self.issuer):
            try:
                document = await self._get_json(url, "the issuer's metadata")
            except KeysUnavailable as exc:
                problems.append(str(exc))
                continue
            if not isinstance(document, dict):
                problems.append(f"{url}: not a JSON object")
                continue
            if document.get("issuer") != self.issuer:
                # RFC 8414 §3.3: metadata naming another issuer must not be used (a mix-up defence).
                problems.append(f"{url}: names another issuer")
                continue
            jwks_uri = document.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                problems.append(f"{url}: has no jwks_uri")
                continue
            try:
                check_fetch_url(jwks_uri, "the issuer's jwks_uri")
            except AuthConfigError as exc:
                problems.append(str(exc))
                continue
            return jwks_uri
        raise KeysUnavailable("; ".join(problems) or "no metadata")

    async def _get_json(self, url: str, what: str) -> Any:
        assert self._client is not None, "start() was not awaited"
        try:
            async with self._client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise KeysUnavailable(f"{what} at {url[:200]} answered HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_DOCUMENT_BYTES:
                        raise KeysUnavailable(f"{what} at {url[:200]} is larger than {MAX_DOCUMENT_BYTES} bytes")
        except httpx.HTTPError as exc:
            raise KeysUnavailable(f"{what} at {url[:200]}: {type(exc).__name__}") from None
        try:
            return orjson.loads(body)
        except ValueError:
            raise KeysUnavailable(f"{what} at {url[:200]} is not JSON") from None


class KeysCollector:
    """`mcp_recovery_auth_keys_up` (1: keys held and the last fetch succeeded) and
    `mcp_recovery_auth_keys_age_seconds`, read at scrape time (no work on the request path)."""

    def __init__(self, auth: JwtAuthenticator) -> None:
        self.auth = auth

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        status = self.auth.keys_status()
        up = GaugeMetricFamily(
            "mcp_recovery_auth_keys_up", "Whether the jwt issuer's signing keys are held and were last fetched fine."
        )
        up.add_metric([], 1.0 if status["keys"] == "ok" else 0.0)
        yield up
        age = GaugeMetricFamily(
            "mcp_recovery_auth_keys_age_seconds", "Seconds since the signing keys held were fetched (absent: none)."
        )
        if "keys_age_s" in status:
            age.add_metric([], float(status["keys_age_s"]))
        yield age
