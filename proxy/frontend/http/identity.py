"""Who may use the MCP endpoint, and the OAuth documents that tell a client how to become one.

Contract:
- `Identity.refuse` answers a refused credential: 401/403 with its `WWW-Authenticate` challenge
  pointing at the proxy's protected-resource metadata, 404 as for an unknown session, 503 with
  `Retry-After` when the issuer's keys cannot be had; counted and logged, never with the credential.
- Refusal lines (`refuse`, a session of another principal, vouching's 429 and 502) come at the
  callers' pace, so they share one `TokenBucket` (proxy/telemetry/budget.py): `REFUSAL_LOG_BURST`
  lines at once, then `REFUSAL_LOG_PER_S` a second; the next line let through says how many were
  not logged. Every refusal is still counted in the metrics.
- `Identity.session` finds a 2025 session only for the principal that opened it (jwt, tokens).
- `Identity.vouched` (passthrough) asks the upstream whether the caller's credential may act on
  the session, bounded per session (proxy/auth/vouch.py).
- `Identity.scopes_suffice` refuses a tools/call whose policy's `required_scopes` the principal
  lacks (403 insufficient_scope).
- `Identity.metadata` serves RFC 9728 protected-resource metadata: the proxy's own (jwt, tokens) or
  the upstream's rewritten to the public URL (passthrough), fetched only from the upstream's own
  origin and kept for the lifetime the upstream gives; its `Cache-Control` is what is left of that
  lifetime (`no-store` when it is not kept).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from proxy import jsonrpc
from proxy.auth.base import Authenticator, AuthRefused, Principal
from proxy.auth.challenge import (
    WELL_KNOWN,
    challenge,
    metadata_paths,
    metadata_url,
    resource_metadata_of,
    rewrite_challenge,
    rewrite_metadata,
)
from proxy.auth.metadata_cache import MISSING_AGE_S, MetadataCache, max_age
from proxy.auth.vouch import VouchLimited
from proxy.core.relay import Relay
from proxy.core.service import Service
from proxy.errors import UpstreamFailure
from proxy.frontend.http.checks import forwarded_headers, url_host
from proxy.frontend.http.outbox import Send
from proxy.frontend.http.respond import JSON, respond, respond_error, respond_json
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.telemetry.budget import TokenBucket
from proxy.telemetry.shed import SHED

log = logging.getLogger("proxy.frontend.http")

# jwt, tokens: an open listen stream's credential is checked again this often; a revoked token or
# an expired JWT ends the stream (its POSTs already get 401)
CREDENTIAL_RECHECK_S = 5.0
METADATA_BYTES = 64 * 1024
# One line per refused request was 2000 lines for 2000 POSTs with a wrong token: enough at once to
# see what is refused and why, then one a second (the metrics count every refusal).
REFUSAL_LOG_BURST = 20
REFUSAL_LOG_PER_S = 1.0


class Identity:
    """The MCP endpoint's authentication mode and what follows from it (`auth` None: `--auth none`)."""

    def __init__(self, service: Service, settings: Settings, path: str, auth: Authenticator | None) -> None:
        self.service = service
        self.auth = auth
        mode = auth.mode if auth is not None else "none"
        # passthrough: the caller's credential goes upstream, which judges it
        self.forward_credentials = mode == "passthrough"
        # jwt, tokens: a session belongs to the principal that opened it
        self.binds_sessions = mode in ("jwt", "tokens")
        self.public_url = settings.public_url or (
            f"http://{url_host(settings.listen_host)}:{settings.listen_port}{settings.listen_path}"
        )
        self.metadata_url = metadata_url(self.public_url)
        self.metadata_paths = metadata_paths(path) if auth is not None else frozenset()
        self._issuer = settings.auth_issuer if mode == "jwt" else None
        self._upstream_metadata_target: str | None = None  # passthrough: see _note_upstream_metadata
        self._metadata_cache = MetadataCache()
        self._refusal_lines = TokenBucket(REFUSAL_LOG_BURST, REFUSAL_LOG_PER_S)

    def _log_refusal(self, text: str, *args: object) -> None:
        """Log one refusal line at INFO within the shared budget (see the module contract)."""
        if not log.isEnabledFor(logging.INFO):
            return
        lines = self._refusal_lines
        if not lines.allow():
            return
        dropped = lines.take_dropped()
        if dropped:
            log.info(f"{text} ({dropped} more refusals were not logged before this one)", *args)
        else:
            log.info(text, *args)

    async def refuse(self, send: Send, refused: AuthRefused, method: str, request_id: Any = None) -> None:
        """A 401/403 with its `WWW-Authenticate` challenge (a 404 as for an unknown session);
        counted and logged, never with the credential (the refusal's text never holds one)."""
        SHED.count("auth_failures", refused.reason)
        self._log_refusal("refused %s: HTTP %d %s (%s)", method, refused.status, refused.reason, refused.description)
        if refused.status == 404:  # passthrough: the upstream refused this caller on the session named
            await respond_error(send, 404, request_id, jsonrpc.INVALID_REQUEST, "Session not found")
            return
        if refused.status == 503:  # jwt: the issuer's keys cannot be had; the caller's token is not at fault
            body = {"error": "temporarily_unavailable", "error_description": refused.description}
            retry = str(max(1, round(refused.retry_after_s or 1))).encode()
            await respond(send, 503, jsonrpc.dumps_out(body), [JSON, (b"retry-after", retry)])
            return
        if refused.challenge is not None:  # passthrough: the upstream's own, pointed at our metadata
            self._note_upstream_metadata(refused.challenge)
            value = rewrite_challenge(refused.challenge, self.metadata_url)
        else:
            value = challenge(refused, self.metadata_url)
        body = {"error": refused.error or "unauthorized", "error_description": refused.description}
        await respond(
            send,
            refused.status,
            jsonrpc.dumps_out(body),
            [JSON, (b"www-authenticate", value.encode("latin-1", "replace"))],
        )

    def session(self, session_id: str | None, principal: Principal | None) -> Relay | None:
        """The 2025 session named, if it is this principal's (jwt, tokens: a session belongs to the
        principal that opened it; another principal gets "not found", as for an unknown id)."""
        relay = self.service.sessions.get(session_id) if session_id is not None else None
        if relay is not None and relay.owner is not None and (principal is None or principal.id != relay.owner):
            SHED.count("auth_failures", "session_owner")
            self._log_refusal("refused session %s…: opened by another principal", (session_id or "")[:8])
            return None
        return relay

    async def vouched(
        self,
        send: Send,
        relay: Relay,
        headers: dict[str, str],
        method: str,
        principal: Principal | None,
        request_id: Any = None,
    ) -> bool:
        """passthrough: the caller may act on the session without a request the upstream judges
        (`Relay.vouch`: the listen stream, a resumed answer, DELETE, a cancellation, an answer to
        the server's request). False once the refusal was answered: the upstream's 404 (another
        principal's session), 401 or 403 (remembered a while per principal: a repeat is answered
        the same without asking again), 429 with `Retry-After` when the session's budget of such
        questions is spent (proxy/auth/vouch.py), or 502 when the upstream could not be asked.
        Without passthrough, the session lookup (`_session`) already decided."""
        if not self.forward_credentials:
            return True
        try:
            await relay.vouch(forwarded_headers(headers, True), principal.id if principal is not None else None)
        except AuthRefused as refused:
            await self.refuse(send, refused, method, request_id)
            return False
        except VouchLimited as limited:
            # 429, not 503: the caller's credential is what is unverified, not the proxy that is
            # unwell; the owner's accepted credential never gets here.
            SHED.count("http_refused", "vouch_rate")
            self._log_refusal("%s refused: too many credentials the upstream has not accepted on the session", method)
            body = jsonrpc.error(
                request_id,
                jsonrpc.INTERNAL_ERROR,
                "too many credentials the upstream has not accepted were put to it on this session; retry later",
            )
            await respond_json(send, 429, body, [(b"retry-after", limited.retry_after_header.encode())])
            return False
        except (UpstreamFailure, TimeoutError):
            self._log_refusal(
                "%s refused: the upstream could not be asked whether the credential holds the session", method
            )
            await respond_error(
                send,
                502,
                request_id,
                jsonrpc.INTERNAL_ERROR,
                "the upstream could not be asked whether this credential may use the session",
            )
            return False
        return True

    async def scopes_suffice(self, send: Send, relay: Relay, message: Message, principal: Principal) -> bool:
        """A tools/call whose policy names `required_scopes` the principal lacks: 403
        insufficient_scope (where the proxy knows the principal's scopes: jwt, tokens)."""
        if message.get("method") != "tools/call" or not principal.scopes_known:
            return True
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        policy_for = getattr(self.service.tool_calls, "policy_for", None)
        if not isinstance(name, str) or policy_for is None:
            return True
        required = policy_for(name, relay.catalog.annotations(name)).required_scopes
        missing = principal.lacks(required)
        if not missing:
            return True
        refused = AuthRefused(
            403,
            "insufficient_scope",
            f"this tool requires the scopes: {' '.join(sorted(required))}",
            error="insufficient_scope",
            scope=required,
        )
        await self.refuse(send, refused, "POST")
        return False

    async def metadata(self, send: Send, method: str) -> None:
        """The protected-resource metadata (RFC 9728), at every path a client probes. jwt and
        tokens: the proxy's own. passthrough: the upstream's, with `resource` set to the public URL."""
        if method not in ("GET", "HEAD"):
            await respond(send, 405, b"", [(b"allow", b"GET")])
            return
        cache_control = b"max-age=300"  # the proxy's own document
        if self.forward_credentials:
            document = await self._upstream_metadata()
            if document is None:
                await respond(send, 404, b"Not Found", [(b"content-type", b"text/plain")])
                return
            cache_control = self._metadata_cache.cache_control()  # no longer than the proxy keeps it
        else:
            document = {"resource": self.public_url, "bearer_methods_supported": ["header"]}
            if self._issuer:
                document["authorization_servers"] = [self._issuer]
            scopes = self._policy_scopes()
            if scopes:
                document["scopes_supported"] = scopes
        await respond(send, 200, jsonrpc.dumps_out(document), [JSON, (b"cache-control", cache_control)])

    def _policy_scopes(self) -> list[str]:
        policies = getattr(self.service.tool_calls, "policies", None)
        if policies is None:
            return []
        current = policies()
        layers = [*current.exact.values(), *(layer for _, layer in current.globs)]
        if current.defaults is not None:
            layers.append(current.defaults)
        return sorted({s for layer in layers for s in layer.values.get("required_scopes", ())})

    def _note_upstream_metadata(self, upstream_challenge: str | None) -> None:
        """Remember where the upstream's challenge says its metadata lives, if that is on the
        upstream's own origin (a URL elsewhere is not fetched: the proxy is no open fetcher)."""
        named = resource_metadata_of(upstream_challenge)
        url = getattr(self.service.upstream, "url", None)
        if named is None or not isinstance(url, str):
            return
        try:
            there, home = urlsplit(named), urlsplit(url)
            same = (there.scheme, there.hostname, there.port) == (home.scheme, home.hostname, home.port)
        except ValueError:
            return
        if same and there.path.startswith("/") and not there.fragment:
            self._upstream_metadata_target = there.path + (f"?{there.query}" if there.query else "")

    async def _upstream_metadata(self) -> dict[str, Any] | None:
        """The upstream's metadata document, fetched once per its max-age (proxy/auth/metadata_cache.py)."""
        return await self._metadata_cache.get(self._fetch_upstream_metadata)

    async def _fetch_upstream_metadata(self) -> tuple[dict[str, Any] | None, float]:
        """The upstream's metadata document and how long it may be kept: where its challenge said
        (on its own origin), else at the well-known path followed by the upstream's own path, else
        the bare well-known path (RFC 9728 §3.1, what clients try)."""
        fetch = getattr(self.service.upstream, "get_document", None)
        url = getattr(self.service.upstream, "url", None)
        if fetch is None or not isinstance(url, str):
            return None, 0.0
        if self._upstream_metadata_target is None and self.service.probe_refusal is not None:
            self._note_upstream_metadata(self.service.probe_refusal.challenge)
        upstream_path = urlsplit(url).path.rstrip("/")
        targets = (self._upstream_metadata_target, WELL_KNOWN + upstream_path, WELL_KNOWN)
        for target in dict.fromkeys(t for t in targets if t is not None):
            try:
                status, raw, cache_control = await fetch(target, METADATA_BYTES)
            except UpstreamFailure as failure:
                log.info("the upstream's protected-resource metadata could not be fetched: %s", failure.detail)
                return None, 0.0
            if status != 200:
                continue
            try:
                document = rewrite_metadata(jsonrpc.loads(raw), url, self.public_url)
            except ValueError:
                document = None
            if document is not None:
                return document, max_age(cache_control)
        return None, MISSING_AGE_S

    async def still_valid(self, headers: dict[str, str]) -> bool:
        """Whether a listen stream's credential still authenticates (jwt, tokens)."""
        assert self.auth is not None
        try:
            await self.auth.authenticate(headers)
        except AuthRefused as refused:
            log.info("closing a listen stream: its credential no longer authenticates (%s)", refused.reason)
            return False
        return True
