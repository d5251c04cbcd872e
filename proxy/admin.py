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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from proxy.service import Service


def build_admin_app(
    service: Service,
    *,
    registry: CollectorRegistry | None = None,
    policies: Callable[[], dict[str, Any]] | None = None,
) -> Starlette:
    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

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
            return JSONResponse({"status": "not ready", "reasons": reasons}, status_code=503)
        caps = service.capabilities
        return JSONResponse(
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
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def show_policies(_: Request) -> Response:
        if policies is None:
            return JSONResponse({"error": "no policy store"}, status_code=404)
        return JSONResponse(policies())

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/policies", show_policies),
        ]
    )
