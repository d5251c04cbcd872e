"""`mcp_recovery_upstream_up` and `/readyz` for HTTP and SSE upstreams, from the traffic itself:
an upstream whose connection is refused is down at once (not when someone next asks /readyz),
and the next answer, or the proxy's own re-check, brings it back up. Real servers on 127.0.0.1
(an SDK MCPServer under uvicorn), stopped and started again on the same port."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from proxy.core.service import Service
from proxy.errors import FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.upstream.base import Era
from proxy.upstream.sse.link import SseUpstream
from proxy.upstream.streamable.upstream import HttpUpstream

from .health import WAIT_S, Gauges
from .servers import Journal, free_socket, serve, sse_app, streamable_app

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*deprecated as of 2026-07-28")]


def same_port(port: int) -> socket.socket:
    """A listening socket on `port` again (the previous server's connections may be in TIME_WAIT)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def app_for(kind: str) -> Any:
    return streamable_app(Journal()) if kind == "http" else sse_app(Journal())


def upstream_for(kind: str, port: int) -> HttpUpstream | SseUpstream:
    if kind == "http":
        return HttpUpstream(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=2)
    return SseUpstream(f"http://127.0.0.1:{port}/sse", connect_timeout_s=2)


def service_for(upstream: HttpUpstream | SseUpstream, gauges: Gauges) -> Service:
    # /readyz never re-probes here by itself: what moves the gauge is the traffic (and the re-check).
    settings = Settings(listen="http://127.0.0.1:1/mcp", upstream="http://x/", ready_check_interval_s=600)
    return Service(settings, upstream, telemetry=gauges.telemetry)


async def initialize(link: Any) -> Message:
    message = {
        "jsonrpc": "2.0",
        "id": link.new_id(),
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    ex = await link.send_request(message)
    return await asyncio.wait_for(ex.response, WAIT_S)


@pytest.mark.parametrize("kind", ["http", "sse"])
async def test_a_refused_connection_is_down_at_once_and_the_next_answer_is_up(kind: str) -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    upstream = upstream_for(kind, port)
    gauges = Gauges(upstream.description)
    service = service_for(upstream, gauges)
    try:
        async with serve(app_for(kind), sock):
            await service.start()
            assert gauges.up() == 1
            assert "result" in await initialize(await upstream.open(Era.LEGACY))
        with pytest.raises(UpstreamFailure) as failure:
            await initialize(await upstream.open(Era.LEGACY))
        assert failure.value.kind is FailureKind.CONNECT_FAILED
        assert gauges.up() == 0, "nothing listens: down without waiting for /readyz"
        ready, why = await service.readiness()
        assert not ready and why is not None and "connect" in why
        async with serve(app_for(kind), same_port(port)):
            assert "result" in await initialize(await upstream.open(Era.LEGACY))
            assert gauges.up() == 1, "it answers again"
            assert await service.readiness() == (True, None)
    finally:
        await service.aclose()


async def test_a_down_http_upstream_is_rechecked_without_traffic() -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    upstream = upstream_for("http", port)
    gauges = Gauges(upstream.description)
    service = service_for(upstream, gauges)
    try:
        async with serve(app_for("http"), sock):
            await service.start()
        with pytest.raises(UpstreamFailure):
            await initialize(await upstream.open(Era.LEGACY))
        assert gauges.up() == 0
        async with serve(app_for("http"), same_port(port)):
            await gauges.wait_for(lambda: gauges.up() == 1)  # no call: the proxy's own re-check
            assert await service.readiness() == (True, None)
    finally:
        await service.aclose()


async def test_an_http_error_status_is_an_answer_of_sorts_and_changes_nothing() -> None:
    """A 503 or 500 comes from a reachable server: the gauge stays as it was (the attempts metrics
    count those failures), and /readyz, whose probe also takes such answers, agrees."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def busy(_: object) -> Response:
        return Response("busy", status_code=503)

    async with serve(Starlette(routes=[Route("/mcp", busy, methods=["POST", "GET", "DELETE"])])) as port:
        upstream = upstream_for("http", port)
        gauges = Gauges(upstream.description)
        service = service_for(upstream, gauges)
        try:
            await service.start()
            assert gauges.up() == 1, "the probe reached it"
            with pytest.raises(UpstreamFailure) as failure:
                await initialize(await upstream.open(Era.LEGACY))
            assert failure.value.kind is FailureKind.HTTP_STATUS
            assert gauges.up() == 1
            assert await service.readiness() == (True, None)
        finally:
            await service.aclose()
