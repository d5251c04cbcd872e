"""Assembles and runs the proxy from its settings: upstream, service, frontend, admin endpoint.

The HTTP frontend and the admin endpoint run as two uvicorn servers in one event loop; when
either stops (a signal reaches whichever installed its handlers last) the other is told to stop,
and the service's shutdown stops every upstream child.

SIGTERM is a graceful stop and the process then exits 0, in both listen modes. uvicorn restores
the handler it found after its own graceful shutdown and raises the signal again; with the
default handler in place that killed the finished process (status 143), so `run` installs one of
its own first: it stops whatever still runs, and the re-raised signal finds nothing left to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from proxy.auth import Authenticator, build_authenticator
from proxy.auth.tokens import read_secret_file
from proxy.engine import Engine
from proxy.policy.store import PolicyStore
from proxy.secret_values import SECRETS
from proxy.service import Service, build_upstream, upstream_secrets
from proxy.settings import LOOPBACK_HOSTS, Settings

if TYPE_CHECKING:
    import uvicorn

    from proxy.frontend.uvicorn_h1 import HttpLimits
from proxy.telemetry.events import Telemetry
from proxy.telemetry.setup import build_telemetry
from proxy.telemetry.status import StatusObserver

log = logging.getLogger("proxy.server")


def build_service(settings: Settings, policies: PolicyStore, telemetry: Telemetry | None = None) -> Service:
    upstream = build_upstream(settings)
    engine = Engine(
        policies=lambda: policies.current,
        telemetry=telemetry,
        upstream_name=upstream.description,
        max_concurrent_calls=settings.max_concurrent_calls,
    )
    return Service(settings, upstream, tool_calls=engine, telemetry=telemetry)


def http_limits(settings: Settings) -> HttpLimits:
    from proxy.frontend.uvicorn_h1 import HttpLimits

    return HttpLimits(
        max_head_bytes=settings.max_head_bytes,
        head_timeout_s=settings.head_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_connections=settings.max_connections,
    )


def _server(config: uvicorn.Config, on_shutdown: Callable[[], None] | None = None) -> uvicorn.Server:
    """A uvicorn server that tells the app when shutdown starts: uvicorn waits for open responses
    and then cancels them, and a 2025 listen stream never ends by itself (its cancellation was
    logged as "Exception in ASGI application"). uvicorn is imported only here and in
    `_uvicorn_config`: `--listen stdio` without `--admin` never needs it, and its ~50 ms of imports
    were on the way to a stdio client's first answer (issue 12)."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if on_shutdown is not None:
                on_shutdown()
            await super().shutdown(sockets)

    return _Server(config)


def _uvicorn_config(app: object, host: str, port: int, *, lifespan: str, limits: HttpLimits) -> uvicorn.Config:
    import uvicorn

    from proxy.frontend.uvicorn_h1 import LimitedHttpToolsProtocol

    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        lifespan=lifespan,
        log_level="warning",
        # uvicorn's own handlers would write its lines ("Exception in ASGI application" with a
        # traceback) past the proxy's formatter and its secret removal: let them reach the root's.
        log_config=None,
        access_log=False,
        loop="auto",
        # uvicorn's httptools protocol with the response head and body in one write, and bounds on
        # request heads, slow peers and connections (see there).
        http=LimitedHttpToolsProtocol.with_limits(limits),
        # Per-client limits count the TCP peer's address; X-Forwarded-* is not parsed (any caller
        # could write it, and trusting it is a deployment decision the proxy does not need).
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )


async def run(settings: Settings) -> int:
    # Before anything starts: auth settings that cannot work refuse the start (cli.py prints why).
    auth = build_authenticator(settings)
    admin_token = None
    if settings.admin_token_file is not None:
        admin_token = read_secret_file(settings.admin_token_file, "--admin-token-file")
    # Before anything can log, report or answer: the proxy's own credentials are known secrets.
    SECRETS.set([*upstream_secrets(settings), *([admin_token] if admin_token else [])])
    if settings.auth == "none" and settings.listen != "stdio" and settings.listen_host not in LOOPBACK_HOSTS:
        log.warning(
            "--auth none on %s: anyone who reaches this address may call every tool (see docs/security.md)",
            settings.listen,
        )
    bundle = build_telemetry(settings)
    # A bad folder stops the start with every problem named (cli.py prints them).
    policies = PolicyStore(settings.policies, on_reload=bundle.on_policy_reload)
    service = build_service(settings, policies, bundle.telemetry)
    bundle.metrics.set_policy_version(policies.current.version)
    if isinstance(service.tool_calls, Engine):
        bundle.metrics.watch_circuits(service.tool_calls.antistorm.circuits)
        bundle.metrics.watch_in_flight(service.tool_calls.in_flight_by_tool)
    if settings.policies is not None:
        await policies.start()
        policies.install_sighup(asyncio.get_running_loop())
    if auth is not None:
        await auth.start()
    stop = asyncio.Event()
    restore = _on_sigterm(stop)
    try:
        return await _serve(
            settings, service, policies, bundle.registry, stop, auth=auth, admin_token=admin_token, status=bundle.status
        )
    finally:
        restore()
        if auth is not None:
            await auth.aclose()
        await policies.aclose()
        await bundle.shutdown()


def _on_sigterm(stop: asyncio.Event) -> Callable[[], None]:
    """SIGTERM sets `stop` (from the signal handler, through the loop); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals reach the main thread only (an embedded or test run)
    loop = asyncio.get_running_loop()

    def handler(signum: int, frame: object) -> None:
        loop.call_soon_threadsafe(stop.set)

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


async def _serve(
    settings: Settings,
    service: Service,
    policies: PolicyStore,
    registry: CollectorRegistry,
    stop: asyncio.Event,
    *,
    auth: Authenticator | None = None,
    admin_token: str | None = None,
    status: StatusObserver | None = None,
) -> int:
    admin_server: uvicorn.Server | None = None
    if settings.admin:
        from proxy.admin import build_admin_app

        host, _, port = settings.admin.rpartition(":")
        admin_app = build_admin_app(
            service,
            registry=registry,
            policies=policies.snapshot,
            allowed_hosts=settings.allowed_hosts,
            admin_token=admin_token,
            status=status,
        )
        admin_server = _server(
            _uvicorn_config(admin_app, host or "127.0.0.1", int(port), lifespan="off", limits=http_limits(settings))
        )
    if settings.listen == "stdio":
        from proxy.frontend.stdio import serve_stdio

        admin_task = asyncio.create_task(admin_server.serve()) if admin_server else None
        serving = asyncio.create_task(serve_stdio(service))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not serving.done():
                log.info("SIGTERM: stopping")
                serving.cancel()  # serve_stdio closes the service (its children) on the way out
            await asyncio.gather(serving, return_exceptions=True)
        finally:
            stopping.cancel()
            if admin_server is not None and admin_task is not None:
                admin_server.should_exit = True
                with contextlib.suppress(Exception):
                    await admin_task
        return 0
    # Imported here: `--listen stdio` does not need the HTTP frontend, and its imports (the MCP
    # SDK's types above all) were most of a stdio proxy's start-up, which a local client waits
    # for (bench/stdio_startup.py).
    from proxy.frontend.http import McpHttpApp

    app = McpHttpApp(service, settings, auth=auth)
    main_server = _server(
        _uvicorn_config(app, settings.listen_host, settings.listen_port, lifespan="on", limits=http_limits(settings)),
        on_shutdown=app.close_streams,
    )
    servers = [main_server] + ([admin_server] if admin_server else [])
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    stopping = asyncio.create_task(stop.wait())  # a SIGTERM before uvicorn took the signal over
    log.info("listening on %s (upstream %s)", settings.listen, service.upstream.description)
    _, pending = await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    pending.discard(stopping)
    for server in servers:
        server.should_exit = True
    if pending:
        await asyncio.wait(pending, timeout=10)
    return 0 if main_server.started else 1
