"""What the health tests read: the proxy's metrics observer on its own registry, plus an observer
that wakes waiters on every `UpstreamStatus` (the only events that change the series read here)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from proxy.telemetry.events import Telemetry, UpstreamStatus
from proxy.telemetry.metrics import MetricsObserver

WAIT_S = 10.0


class Gauges:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.registry = CollectorRegistry()
        self.changed = asyncio.Event()
        self.telemetry = Telemetry([MetricsObserver(self.registry), self])

    def on_event(self, event: object) -> None:
        if isinstance(event, UpstreamStatus):
            self.changed.set()

    def up(self) -> float | None:
        return self.registry.get_sample_value("mcp_recovery_upstream_up", {"upstream": self.upstream})

    def restarts(self) -> float | None:
        return self.registry.get_sample_value("mcp_recovery_upstream_restarts_total", {"upstream": self.upstream})

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Until `predicate` (which reads the metrics) holds, bounded."""
        async with asyncio.timeout(WAIT_S):
            while True:
                self.changed.clear()
                if predicate():
                    return
                await self.changed.wait()
