"""The admin endpoint (`--admin HOST:PORT`), apart from the MCP port: health, readiness, metrics,
and the active policy set.

- `/healthz`: the process is alive and its event loop answers (always 200 when it answers at all).
- `/readyz`: 200 while the upstream answers, a policy set is loaded and a 2025 session slot is
  free or can be made free by closing an idle session (when the upstream speaks the handshake);
  503 with the reason otherwise. "Answers" is
  the upstream's health, the same verdict as `mcp_recovery_upstream_up`
  (proxy/core/service.py): kept from the traffic, re-checked while down, and for an HTTP or SSE
  upstream also re-probed here every `--ready-check-interval-s`. Kubernetes readiness probes and
  the Docker HEALTHCHECK use it.
- `/readyz` says, when ready, which eras the upstream speaks (`eras`) and how each era's clients
  are served (`served`: `native`, `bridged`: 2026 clients over a 2025 session of the proxy's, or
  `refused`).
- `/readyz` also carries `state`: `{"store": "memory"}`, or the shared store's description (no
  credentials), whether it answers, and while it does not, the fallback in use. An unreachable
  store fails `/readyz` only with `--state-required-for-ready` (docs/state.md, the trade-off).
- `/readyz` carries `auth` with `--auth jwt`: whether the issuer's signing keys can be had
  (`ok`, `stale`: the last refresh failed, `unavailable`: none yet) and the last fetch's problem.
  It never fails readiness: tokens already verified (cached) and tokens of keys already held are
  still accepted, so taking the replica out would refuse callers it can serve; and every replica
  shares the issuer, so readiness could not send them anywhere better (docs/security.md).
- `/metrics`: Prometheus text exposition of the proxy's registry.
- `/policies`: the active policy set, its version, and the last reload error.
- `/`: the status page (proxy/admin/statuspage.py), fed by `/status.json` (recent and problem calls,
  circuits, retry budgets, ledger entries, policy version and reload error, upstream health and
  eras, per-tool rates and latency, and under `observed` what `policies suggest` reads, with the
  advice against the active policy set) and `/status/explain?tool=NAME` (`policies explain` for a tool
  the upstream listed). The HTML carries a per-response CSP nonce and may not be framed.

Admin authentication (`--admin-token-file`): every path but `/healthz` and `/readyz` (open for
probes) then needs `Authorization: Bearer <token>`, or Basic credentials whose password is the
token (what a browser sends after its own prompt: the status page's challenge is `Basic`, the
others' `Bearer realm="mcp-recovery-proxy admin"`); compared in constant time; anything else is
401, counted in `mcp_recovery_auth_failures_total{reason="admin"}`.

The admin port is as closed as the MCP port (`admin_access`): with `--auth` other than `none`,
what the admin port tells about calls (the status page and `/status.json`, `/status/explain`,
`/policies`, `/metrics`: principal ids, tools, outcomes, budget ids, upstream error texts) needs
the admin token, or is served only when the admin port binds loopback; bound elsewhere without a
token, those paths answer 403 naming `--admin-token-file`. `/healthz` and `/readyz` stay open
for probes and carry no principal. The start-up log says which of the three applies.

Safety: the Host header is checked like the MCP port's (proxy/frontend/hostcheck.py), so a DNS-rebinding
page cannot read `/readyz` or `/policies`: loopback names, any IP literal (what Kubernetes probes
and Prometheus scrapes send; a rebinding page always sends its own domain name) and the
`--allowed-host` entries are accepted, anything else gets 421. Every answer is passed through the
secret registry (proxy/secret_values.py): an upstream error echoed into a readiness reason, a
policy problem or a metric label never carries the proxy's credentials.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.admin.statuspage import explain_document, page, status_document
from proxy.core.service import Service
from proxy.frontend.hostcheck import LOOPBACK_HOST_PATTERNS, HostAllowList, duplicated
from proxy.secret_values import SECRETS
from proxy.telemetry.observed import ObservedTools
from proxy.telemetry.shed import SHED
from proxy.telemetry.status import StatusObserver


class _ScrubbedJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return SECRETS.scrub_bytes(super().render(content))


class _HostCheck:
    """The admin app behind the Host allow-list: 421 for a Host it does not allow, 400 for two."""

    def __init__(self, app: ASGIApp, allowed: HostAllowList) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope["headers"]
            status, reason = 0, b""
            if duplicated(raw, b"host"):
                status, reason = 400, b"Duplicate Host header"
            else:
                host = next((v.decode("latin-1").strip() for k, v in raw if k == b"host"), "")
                if not self.allowed(host):
                    status, reason = 421, b"Invalid Host header"
            if status:
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(reason)).encode())],
                    }
                )
                await send({"type": "http.response.body", "body": reason})
                return
        await self.app(scope, receive, send)


def admin_access(auth: str, bind_host: str, token: bool) -> tuple[bool, str]:
    """Whether the admin port serves call data without a token, and the start-up log line that
    says why (see the module docstring)."""
    if token:
        return False, "admin port: call data (status page, /metrics, /policies) requires the admin token"
    if auth == "none":
        return True, "admin port: call data served to anyone who reaches it (--auth none, no --admin-token-file)"
    if bind_host in ("127.0.0.1", "localhost", "::1", "[::1]") or bind_host.startswith("127."):
        return True, (
            f"admin port: call data served on the loopback bind {bind_host} only (--auth {auth}: give "
            "--admin-token-file to serve it on another address)"
        )
    return False, (
        f"admin port on {bind_host}: call data (status page, /metrics, /policies) refused (403) — --auth {auth} "
        "protects the MCP port, so it needs --admin-token-file; /healthz and /readyz stay open"
    )


class _ProbesOnly:
    """Every path but the probes' refused (403): `--auth` is on, no admin token, not loopback."""

    BODY = (
        b'{"error":"forbidden","error_description":"the admin port serves call data only with '
        b'--admin-token-file (or bound to loopback) while --auth protects the MCP port"}'
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].rstrip("/") if scope["type"] == "http" else ""
        if scope["type"] == "http" and path not in _AdminToken.OPEN:
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(self.BODY))]
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": self.BODY})
            return
        await self.app(scope, receive, send)


class _AdminToken:
    """Every path but the probes' behind the admin token; `/healthz` and `/readyz` pass."""

    OPEN = frozenset({"/healthz", "/readyz"})
    PAGES = frozenset({"", "/status.json", "/status/explain"})  # the status page: a browser asks
    CHALLENGE = b'Bearer realm="mcp-recovery-proxy admin"'
    # A browser prompts for Basic credentials by itself and then sends them with the page's own
    # requests; the password is the token (the user name is ignored).
    PAGE_CHALLENGE = b'Basic realm="mcp-recovery-proxy admin", charset="UTF-8"'

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode("latin-1")
        self._token = token.encode("utf-8")

    def _allowed(self, given: bytes) -> bool:
        # compare_digest: the time taken does not depend on how much of the token matched
        if given[:6].lower() == b"basic ":
            try:
                _, _, password = base64.b64decode(given[6:].strip(), validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(password, self._token)
        return hmac.compare_digest(given, self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].rstrip("/") if scope["type"] == "http" else ""
        if scope["type"] == "http" and path not in self.OPEN:
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not self._allowed(given):
                SHED.count("auth_failures", "admin")
                body = b'{"error":"unauthorized","error_description":"this admin page needs the admin token"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", self.PAGE_CHALLENGE if path in self.PAGES else self.CHALLENGE),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def build_admin_app(
    service: Service,
    *,
    registry: CollectorRegistry | None = None,
    policies: Callable[[], dict[str, Any]] | None = None,
    allowed_hosts: list[str] | tuple[str, ...] = (),
    admin_token: str | None = None,
    status: StatusObserver | None = None,
    observed: ObservedTools | None = None,
    auth: Any = None,
    listening: Callable[[], bool] | None = None,
    call_data: bool = True,
) -> ASGIApp:
    """`listening` says whether the MCP listener accepts connections: the admin server starts
    beside it, and without this would answer /readyz 200 while the main one is still between its
    start-up and its bind, so a client (or a Kubernetes probe) told "ready" would get a refused
    connection. `call_data`
    False (and no `admin_token`): only the probes are served (`admin_access`)."""
    # --auth jwt: the issuer's keys, reported by /readyz (proxy/auth/jwt.py, keys_status)
    keys_status: Callable[[], dict[str, Any]] | None = getattr(auth, "keys_status", None)

    async def healthz(_: Request) -> Response:
        return _ScrubbedJSON({"status": "ok"})

    async def readyz(_: Request) -> Response:
        reasons = []
        ok, why = await service.readiness()
        if not ok:
            reasons.append(why or "upstream not ready")
        if listening is not None and not listening():
            reasons.append("MCP listener not accepting connections yet")
        if policies is not None:
            snapshot = policies()
            if not snapshot.get("version"):
                reasons.append("no policy set loaded")
        state = service.state.status() if service.state is not None else {"store": "memory"}
        extra = {"auth": keys_status()} if keys_status is not None else {}
        if reasons:
            return _ScrubbedJSON({"status": "not ready", "reasons": reasons, "state": state, **extra}, status_code=503)
        caps = service.capabilities
        return _ScrubbedJSON(
            {
                "status": "ready",
                "upstream": service.upstream.description,
                "eras": {"legacy": bool(caps and caps.legacy), "modern": bool(caps and caps.modern)},
                "served": service.served_eras(),  # per era: native, bridged or refused
                "sessions": len(service.sessions),
                "state": state,
                **extra,
            }
        )

    async def metrics(_: Request) -> Response:
        if registry is None:
            return PlainTextResponse("", media_type=CONTENT_TYPE_LATEST)
        return Response(SECRETS.scrub_bytes(generate_latest(registry)), media_type=CONTENT_TYPE_LATEST)

    async def show_policies(_: Request) -> Response:
        if policies is None:
            return _ScrubbedJSON({"error": "no policy store"}, status_code=404)
        return _ScrubbedJSON(policies())

    async def status_page(_: Request) -> Response:
        nonce = secrets.token_urlsafe(16)
        return HTMLResponse(
            page(nonce),
            headers={
                # Nothing but the inline parts this response carries, and fetches to this origin.
                "content-security-policy": (
                    f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                    "frame-ancestors 'none'"
                ),
                "x-frame-options": "DENY",
                "x-content-type-options": "nosniff",
                "referrer-policy": "no-referrer",
                "cache-control": "no-store",
            },
        )

    async def status_json(_: Request) -> Response:
        return _ScrubbedJSON(
            status_document(service, policies, status, observed),
            headers={"cache-control": "no-store", "x-content-type-options": "nosniff"},
        )

    async def status_explain(request: Request) -> Response:
        doc = explain_document(service, request.query_params.get("tool", ""))
        if doc is None:
            return _ScrubbedJSON({"error": "not a tool the upstream listed"}, status_code=404)
        return _ScrubbedJSON(doc, headers={"cache-control": "no-store"})

    app = Starlette(
        routes=[
            Route("/", status_page),
            Route("/status.json", status_json),
            Route("/status/explain", status_explain),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/policies", show_policies),
        ]
    )
    guarded: ASGIApp = app
    if admin_token is not None:
        guarded = _AdminToken(app, admin_token)
    elif not call_data:
        guarded = _ProbesOnly(app)
    return _HostCheck(guarded, HostAllowList([*LOOPBACK_HOST_PATTERNS, *allowed_hosts], ip_literals=True))
