"""The proxy without its recovery engine: `tools/call` relayed as plain pass-through.

    .venv/bin/python bench/_plain_relay.py serve --listen ... --admin ... -- UPSTREAM COMMAND

Used by bench/relay.py (`--relay`) and bench/faults.py as the yardstick of the engine's added
CPU per call. It runs the very same `proxy.cli.main` (same frontend, sessions, upstream
supervision and telemetry wiring) with one difference: the service is built with
`Service(tool_calls=None)`, which relays every `tools/call` as a single attempt exactly like any
other request. Nothing under proxy/ is changed; the switch lives here, in the bench.

`BENCH_RELAY=engine-quiet` builds the proxy as shipped with its engine's observers removed:
no call metrics, call log lines or spans, to tell the engine's own cost from its telemetry's;
`BENCH_RELAY=engine` is the proxy as shipped. `BENCH_CPROFILE=FILE` writes a cProfile at exit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import proxy.server as server
from proxy.core.engine import Engine
from proxy.core.service import Service
from proxy.core.upstreams import build_upstream
from proxy.policy.store import PolicyStore
from proxy.settings import Settings
from proxy.telemetry.events import Telemetry


def build_plain_service(settings: Settings, policies: PolicyStore, telemetry: Telemetry | None = None) -> Service:
    return Service(settings, build_upstream(settings), tool_calls=None, telemetry=telemetry)


def build_quiet_engine_service(
    settings: Settings, policies: PolicyStore, telemetry: Telemetry | None = None
) -> Service:
    """The proxy as shipped (state, re-send answers and all), its engine given a Telemetry with no
    observers: no call metrics, call log lines or spans."""
    service = _shipped(settings, policies, telemetry)
    assert isinstance(service.tool_calls, Engine)
    service.tool_calls.telemetry = Telemetry()
    return service


_shipped = server.build_service
_variant = os.environ.get("BENCH_RELAY", "plain")
if _variant == "engine-quiet":
    server.build_service = build_quiet_engine_service
elif _variant != "engine":
    server.build_service = build_plain_service

if __name__ == "__main__":
    from proxy.cli import main

    profile_to = os.environ.get("BENCH_CPROFILE")  # a cProfile of the whole run, written at exit
    if profile_to:
        import atexit
        import cProfile
        import signal

        profiler = cProfile.Profile()
        atexit.register(lambda: (profiler.disable(), profiler.dump_stats(profile_to)))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        profiler.enable()
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
