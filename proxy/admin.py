"""The admin endpoint (`--admin HOST:PORT`), apart from the MCP port: health, readiness, metrics,
and the active policy set.

- `/healthz`: the process is alive and its event loop answers (always 200 when it answers at all).
- `/readyz`: 200 while the upstream answers, a policy set is loaded and a 2025 session slot is
  free (when the upstream speaks the handshake); 503 with the reason otherwise. "Answers" is
  the upstream's health, the same verdict as `mcp_recovery_upstream_up`
  (proxy/service.py): kept from the traffic, re-checked while down, and for an HTTP or SSE
  upstream also re-probed here every `--ready-check-interval-s`. Kubernetes readiness probes and
  the Docker HEALTHCHECK use it.
- `/metrics`: Prometheus text exposition of the proxy's registry.
- `/policies`: the active policy set, its version, and the last reload error.

Admin authentication (`--admin-token-file`): `/metrics` and `/policies` then need
`Authorization: Bearer <token>` (compared in constant time); anything else is 401 with a
`WWW-Authenticate: Bearer realm="mcp-recovery-proxy admin"` challenge, counted in
`mcp_recovery_auth_failures_total{reason="admin"}`. `/healthz` and `/readyz` stay open for probes.

Safety: the Host header is checked like the MCP port's (proxy/hostcheck.py), so a DNS-rebinding
page cannot read `/readyz` or `/policies`: loopback names, any IP literal (what Kubernetes probes
and Prometheus scrapes send; a rebinding page always sends its own domain name) and the
`--allowed-host` entries are accepted, anything else gets 421. Every answer is passed through the
secret registry (proxy/secret_values.py): an upstream error echoed into a readiness reason, a
policy problem or a metric label never carries the proxy's credentials.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.hostcheck import LOOPBACK_HOST_PATTERNS, HostAllowList, duplicated
from proxy.secret_values import SECRETS
from proxy.service import Service
from proxy.telemetry.shed import SHED


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


class _AdminToken:
    """`/metrics` and `/policies` behind a bearer token; every other path passes."""

    PROTECTED = frozenset({"/metrics", "/policies"})
    CHALLENGE = b'Bearer realm="mcp-recovery-proxy admin"'

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") in self.PROTECTED:
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            # compare_digest: the time taken does not depend on how much of the token matched
            if not hmac.compare_digest(given, self._expected):
                SHED.count("auth_failures", "admin")
                body = b'{"error":"unauthorized","error_description":"this admin page needs the admin token"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", self.CHALLENGE),
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
) -> ASGIApp:
    async def healthz(_: Request) -> Response:
        return _ScrubbedJSON({"status": "ok"})

    async def readyz(_: Request) -> Response:
        reasons = []
        ok, why = await service.readiness()
        if not ok:
            reasons.append(why or "upstream not ready")
        if policies is not None:
            snapshot = policies()
            if not snapshot.get("version"):
                reasons.append("no policy set loaded")
        if reasons:
            return _ScrubbedJSON({"status": "not ready", "reasons": reasons}, status_code=503)
        caps = service.capabilities
        return _ScrubbedJSON(
            {
                "status": "ready",
                "upstream": service.upstream.description,
                "eras": {"legacy": bool(caps and caps.legacy), "modern": bool(caps and caps.modern)},
                "sessions": len(service.sessions),
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

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/policies", show_policies),
        ]
    )
    guarded: ASGIApp = _AdminToken(app, admin_token) if admin_token is not None else app
    return _HostCheck(guarded, HostAllowList([*LOOPBACK_HOST_PATTERNS, *allowed_hosts], ip_literals=True))
