"""Assembles and runs the proxy from its settings: upstream, service, frontend, admin endpoint.

The HTTP frontend and the admin endpoint run as two uvicorn servers in one event loop; when
either stops (a signal reaches whichever installed its handlers last) the other is told to stop,
and the service's shutdown stops every upstream child.

SIGTERM and SIGINT are a graceful shutdown and the process then exits 0, in both listen modes
(docs/reliability.md): `/readyz` turns 503 and new sessions and requests are refused (HTTP 503
with a JSON-RPC error) while the listeners stay open; requests in flight may finish within
`--shutdown-grace-s`; the rest end (a `tools/call` as an unresolved `shutdown` result, its attempt
cancelled upstream); then the servers stop, and the service stops every upstream child. A second
signal ends the grace period at once. uvicorn's own signal handling is replaced for this
(`_Server.handle_exit`): it would close the listeners at once and cancel what still runs after
its own few seconds; and since it does not capture the signal, it raises none again on exit
(a re-raised SIGTERM would kill the finished process, status 143). `run` installs a handler of its
own first, for a signal that comes before uvicorn's are in place. With `--listen stdio`, stdin
closing is a shutdown too (proxy/frontend/stdio.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry

from proxy.auth import Authenticator, build_authenticator
from proxy.auth.tokens import read_secret_file
from proxy.core.engine import Engine
from proxy.core.resend import Resends
from proxy.core.service import Service
from proxy.core.upstreams import build_upstream, upstream_secrets
from proxy.policy.store import PolicyStore
from proxy.secret_values import SECRETS
from proxy.settings import LOOPBACK_HOSTS, Settings
from proxy.state import build_state

if TYPE_CHECKING:
    import uvicorn

    from proxy.frontend.uvicorn_h1 import HttpLimits
    from proxy.net.tls import TlsWatcher
from proxy.telemetry.events import Telemetry
from proxy.telemetry.observed import ObservedTools
from proxy.telemetry.setup import build_telemetry
from proxy.telemetry.status import StatusObserver

log = logging.getLogger("proxy.server")


def build_service(settings: Settings, policies: PolicyStore, telemetry: Telemetry | None = None) -> Service:
    upstream = build_upstream(settings)
    state = build_state(settings, upstream_name=upstream.description)
    engine = Engine(
        policies=lambda: policies.current,
        telemetry=telemetry,
        upstream_name=upstream.description,
        max_concurrent_calls=settings.max_concurrent_calls,
        shared=state,
        resends=Resends(
            keep_s=settings.resend_window_s,
            max_total_bytes=settings.resend_total_bytes,
            max_answer_bytes=settings.resend_total_bytes // 16,
        )
        if settings.resend_window_s > 0
        else None,
    )
    return Service(settings, upstream, tool_calls=engine, telemetry=telemetry, state=state)


def http_limits(settings: Settings) -> HttpLimits:
    from proxy.frontend.uvicorn_h1 import HttpLimits

    return HttpLimits(
        max_head_bytes=settings.max_head_bytes,
        head_timeout_s=settings.head_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_connections=settings.max_connections,
        max_connections_per_client=settings.max_connections_per_client,
        trusted_peers=tuple(settings.forwarded_allow_ips),
    )


def _server(
    config: uvicorn.Config,
    on_shutdown: Callable[[], None] | None = None,
    on_signal: Callable[[], None] | None = None,
) -> uvicorn.Server:
    """A uvicorn server that tells the app when shutdown starts: uvicorn waits for open responses
    and then cancels them, and a 2025 listen stream never ends by itself (uvicorn would log its
    cancellation as "Exception in ASGI application"). A stop signal goes to `on_signal` (the proxy's
    graceful shutdown, which then tells the servers to exit) instead of stopping the server at
    once. uvicorn is imported only here and in `_uvicorn_config`: `--listen stdio` without
    `--admin` never needs it, and its ~50 ms of imports would delay a stdio client's first
    answer."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            if on_signal is None:
                super().handle_exit(sig, frame)  # type: ignore[arg-type]
            else:
                on_signal()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if on_shutdown is not None:
                on_shutdown()
            await super().shutdown(sockets)

    return _Server(config)


def _uvicorn_config(
    app: object,
    host: str,
    port: int,
    *,
    lifespan: Literal["auto", "on", "off"],
    limits: HttpLimits,
    forwarded_allow_ips: list[str] | None = None,
) -> uvicorn.Config:
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
        # No WebSockets: MCP has no WebSocket transport, and with uvicorn's default ("auto", which
        # uvicorn[standard]'s `websockets` turns on) an upgrade request left the protocol above
        # for uvicorn's WebSocket one: outside the connection bounds, still counted against its
        # client address once gone (`--max-connections-per-client` upgrades refused the address
        # for good), and answered 500 with an error line. Refused, it is an ordinary request.
        ws="none",
        # Per-client limits count the client's address (proxy.frontend.clients). X-Forwarded-For is read
        # only from the proxies `--forwarded-allow-ips` names, by uvicorn's ProxyHeadersMiddleware;
        # with none named it is not read at all (uvicorn would otherwise trust 127.0.0.1 and ::1,
        # or whatever FORWARDED_ALLOW_IPS holds, by default).
        proxy_headers=bool(forwarded_allow_ips),
        forwarded_allow_ips=list(forwarded_allow_ips) if forwarded_allow_ips else [],
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
    secrets = upstream_secrets(settings)
    if settings.state != "memory":
        from proxy.state.connect import url_secrets

        secrets = [*secrets, *url_secrets(settings.state)]  # the store's password, if its URL carries one
    SECRETS.set([*secrets, *([admin_token] if admin_token else [])])
    if settings.auth == "none" and settings.listen != "stdio" and settings.listen_host not in LOOPBACK_HOSTS:
        log.warning(
            "--auth none on %s: anyone who reaches this address may call every tool (see docs/security.md)",
            settings.listen,
        )
    if settings.listen != "stdio":
        from proxy.core.capacity import open_files_for

        pool = settings.upstream_pool if settings.upstream else 0
        open_files_for(connections=settings.max_connections, sessions=settings.sessions_cap, upstream=pool)
    bundle = build_telemetry(settings)
    # A bad folder stops the start with every problem named (cli.py prints them).
    policies = PolicyStore(settings.policies, on_reload=bundle.on_policy_reload)
    service = build_service(settings, policies, bundle.telemetry)
    bundle.metrics.set_policy_version(policies.current.version)
    if isinstance(service.tool_calls, Engine):
        bundle.metrics.watch_circuits(service.tool_calls.antistorm.circuits)
        bundle.metrics.watch_in_flight(service.tool_calls.in_flight_by_tool)
    if service.state is not None:
        from proxy.state.metrics import StateCollector
        from proxy.state.shared import RedisState

        assert isinstance(service.state, RedisState)  # the one shared store there is
        bundle.registry.register(StateCollector(service.state))
    if settings.policies is not None:
        await policies.start()
        policies.install_sighup(asyncio.get_running_loop())
    tls_watcher = _tls_watcher(settings, service)
    if tls_watcher is not None:
        await tls_watcher.start()
    if auth is not None:
        if auth.mode == "jwt":
            from proxy.auth.jwt import JwtAuthenticator, KeysCollector

            assert isinstance(auth, JwtAuthenticator)
            bundle.registry.register(KeysCollector(auth))
        await auth.start()
    if service.state is not None:
        # A store that answers and refuses us (its certificate does not verify against --state-ca,
        # wrong password) stops the start here, named (cli.py prints it), instead of failing
        # every later call; one that does not answer yet leaves the proxy on local state.
        await service.state.check()
    stop = asyncio.Event()
    on_signal = _stop_signal(stop, service)
    restore = _on_stop_signals(on_signal)
    loop_lag = bundle.metrics.loop_lag  # the loop's lateness and its wait for a CPU
    loop_lag.start()
    try:
        return await _serve(
            settings,
            service,
            policies,
            bundle.registry,
            stop,
            on_signal,
            auth=auth,
            admin_token=admin_token,
            status=bundle.status,
            observed=bundle.observed,
        )
    finally:
        restore()
        loop_lag.stop()
        if tls_watcher is not None:
            await tls_watcher.aclose()
        if auth is not None:
            await auth.aclose()
        await policies.aclose()
        await bundle.shutdown()


def _tls_watcher(settings: Settings, service: Service) -> TlsWatcher | None:
    """An https upstream's TLS files are watched and reloaded (proxy/net/tls.py)."""
    replace = getattr(service.upstream, "replace_ssl_context", None)
    if replace is None or not (settings.upstream or "").removeprefix("sse+").startswith("https://"):
        return None
    from proxy.net.tls import TlsFiles, TlsWatcher

    files = TlsFiles(
        ca=settings.upstream_ca,
        cert=settings.upstream_client_cert,
        key=settings.upstream_client_key,
        password_file=settings.upstream_client_key_password_file,
    )
    return TlsWatcher(files, replace) if files.paths else None


def _stop_signal(stop: asyncio.Event, service: Service) -> Callable[[], None]:
    """What a stop signal does, called in the loop's thread: the first sets `stop` (the graceful
    shutdown starts), a later one ends its grace period at once."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            loop.call_soon_threadsafe(service.cut_drain_short)
        else:
            loop.call_soon_threadsafe(stop.set)

    return on_signal


def _on_stop_signals(on_signal: Callable[[], None]) -> Callable[[], None]:
    """SIGTERM and SIGINT call `on_signal` (until uvicorn's handlers take over, which call it too;
    behind `--listen stdio` without `--admin` no uvicorn runs, and a Ctrl-C is a graceful shutdown
    all the same, not asyncio's cancellation of everything in flight); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals reach the main thread only (an embedded or test run)

    def handler(signum: int, frame: object) -> None:
        on_signal()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def undo() -> None:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)

    return undo


async def _serve(
    settings: Settings,
    service: Service,
    policies: PolicyStore,
    registry: CollectorRegistry,
    stop: asyncio.Event,
    on_signal: Callable[[], None] | None = None,
    *,
    auth: Authenticator | None = None,
    admin_token: str | None = None,
    status: StatusObserver | None = None,
    observed: ObservedTools | None = None,
) -> int:
    admin_server: uvicorn.Server | None = None
    listeners: list[uvicorn.Server] = []  # the MCP listener once built; stdio has none to wait for
    if settings.admin:
        from proxy.admin.app import admin_access, build_admin_app

        host, _, port = settings.admin.rpartition(":")
        call_data, why = admin_access(settings.auth, host or "127.0.0.1", admin_token is not None)
        (log.info if call_data or admin_token is not None or settings.auth == "none" else log.warning)("%s", why)
        admin_app = build_admin_app(
            service,
            registry=registry,
            policies=policies.snapshot,
            allowed_hosts=settings.allowed_hosts,
            admin_token=admin_token,
            status=status,
            observed=observed,
            auth=auth,
            listening=lambda: all(server.started for server in listeners),
            call_data=call_data,
        )
        admin_server = _server(
            _uvicorn_config(admin_app, host or "127.0.0.1", int(port), lifespan="off", limits=http_limits(settings)),
            on_signal=on_signal,
        )
    if settings.listen == "stdio":
        from proxy.frontend.stdio import serve_stdio

        admin_task = asyncio.create_task(admin_server.serve()) if admin_server else None
        try:
            # SIGTERM reads as stdin's end: serve_stdio drains, then closes the service (its children)
            await serve_stdio(service, stop)
        finally:
            if admin_server is not None and admin_task is not None:
                admin_server.should_exit = True
                with contextlib.suppress(Exception):
                    await admin_task
        return 0
    # Imported here: `--listen stdio` does not need the HTTP frontend, and its imports (the MCP
    # SDK's types above all) would be most of a stdio proxy's start-up, which a local client waits
    # for (bench/stdio_startup.py).
    from proxy.frontend.http.app import McpHttpApp

    app = McpHttpApp(service, settings, auth=auth)
    main_server = _server(
        _uvicorn_config(
            app,
            settings.listen_host,
            settings.listen_port,
            lifespan="on",
            limits=http_limits(settings),
            forwarded_allow_ips=settings.forwarded_allow_ips,
        ),
        on_shutdown=app.close_streams,
        on_signal=on_signal,
    )
    listeners.append(main_server)
    servers = [main_server] + ([admin_server] if admin_server else [])
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    stopping = asyncio.create_task(stop.wait())
    log.info("listening on %s (upstream %s)", settings.listen, service.upstream.description)
    done, pending = await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
    pending.discard(stopping)
    if stopping in done and main_server.started:
        # The graceful part: the listeners stay open (new work is answered 503) while what is in
        # flight finishes or, at the grace period's end, is ended.
        await service.drain(settings.shutdown_grace_s)
    stopping.cancel()
    for server in servers:
        server.should_exit = True
    if pending:
        await asyncio.wait(pending, timeout=10)
    return 0 if main_server.started else 1
