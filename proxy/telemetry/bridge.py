"""The era bridge on /metrics: what its parts hold now, read at scrape time, and what they did,
counted.

Contract:
- `BRIDGE` is process-wide, as `SHED` is (proxy/telemetry/shed.py): the bridge's parts live in
  the upstream adapters, which have no telemetry handle. A part registers itself once
  (`watch_interactive`, `watch_legacy`) and is held weakly: a closed bridge's part drops out when
  it is collected, and one closed but not yet collected reports zeros (its own counts are zero
  once closed).
- Nothing is updated per request for the gauges: they are summed from the live parts at scrape
  time. The counters (`count_round`, `count_fallback`) never raise and take no lock (the event
  loop's thread is the only writer and reader). Label values are closed sets; anything else is
  counted as "other".
- `BridgeCollector` exports, with the prefix `mcp_recovery_`:
  - `era_bridge_sessions{state}` (gauge): the 2025 sessions the bridge holds for 2026 requests
    whose server may ask their client: `busy` (running a request, or holding one parked),
    `idle` (kept for the next request declaring the same capabilities), `reserved` (a process
    started ahead that has booted, not initialized yet), `opening` (being initialized, or started
    ahead and still booting).
  - `era_bridge_awaiting_input{client}` (gauge): requests held while their client is asked:
    `2026` (a 2026 client's request parked after an input-required result, until its retry),
    `2025` (a 2025 client's request whose 2026 server asked for input, while the client answers
    the server-to-client requests).
  - `era_bridge_input_rounds_total{client}` (counter): input-required rounds, by the client that
    was asked (the same two values).
  - `era_bridge_fallbacks_total{reason}` (counter): 2026 requests declaring sampling, elicitation
    or roots that went over the bridge's shared session, where the server cannot ask their client:
    `busy` (every interactive session allowed was in use), `unavailable` (none could be opened).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Final, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

SESSION_STATES: Final = ("busy", "idle", "reserved", "opening")
CLIENTS: Final = ("2026", "2025")
FALLBACK_REASONS: Final = ("busy", "unavailable")
OTHER: Final = "other"


class InteractivePart(Protocol):
    """What the interactive sessions of a bridge (2026 clients over 2025 sessions) report."""

    def session_states(self) -> Mapping[str, int]: ...

    @property
    def parked(self) -> int: ...


class LegacyPart(Protocol):
    """What a 2025 session over a 2026 link reports."""

    @property
    def awaiting_input(self) -> int: ...


class BridgeWatch:
    def __init__(self) -> None:
        self._interactive: weakref.WeakSet[InteractivePart] = weakref.WeakSet()
        self._legacy: weakref.WeakSet[LegacyPart] = weakref.WeakSet()
        self.rounds: dict[str, int] = dict.fromkeys(CLIENTS, 0)
        self.fallbacks: dict[str, int] = dict.fromkeys(FALLBACK_REASONS, 0)

    def watch_interactive(self, part: InteractivePart) -> None:
        self._interactive.add(part)

    def watch_legacy(self, part: LegacyPart) -> None:
        self._legacy.add(part)

    def count_round(self, client: str) -> None:
        key = client if client in self.rounds else OTHER
        self.rounds[key] = self.rounds.get(key, 0) + 1

    def count_fallback(self, reason: str) -> None:
        key = reason if reason in self.fallbacks else OTHER
        self.fallbacks[key] = self.fallbacks.get(key, 0) + 1

    def sessions(self) -> dict[str, int]:
        totals = dict.fromkeys(SESSION_STATES, 0)
        for part in list(self._interactive):
            for state, n in part.session_states().items():
                key = state if state in totals else OTHER
                totals[key] = totals.get(key, 0) + n
        return totals

    def awaiting(self) -> dict[str, int]:
        return {
            "2026": sum(part.parked for part in list(self._interactive)),
            "2025": sum(part.awaiting_input for part in list(self._legacy)),
        }


BRIDGE = BridgeWatch()


class BridgeCollector:
    def __init__(self, watch: BridgeWatch = BRIDGE, prefix: str = "mcp_recovery_") -> None:
        self.watch = watch
        self.prefix = prefix

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        p = self.prefix
        return (
            GaugeMetricFamily(
                p + "era_bridge_sessions",
                "2025 sessions the era bridge holds for 2026 requests whose server may ask their client, by state.",
                labels=("state",),
            ),
            GaugeMetricFamily(
                p + "era_bridge_awaiting_input",
                "Bridged requests held while their client is asked for input, by the client's era.",
                labels=("client",),
            ),
            CounterMetricFamily(
                p + "era_bridge_input_rounds",
                "Input-required rounds across the era bridge, by the era of the client that was asked.",
                labels=("client",),
            ),
            CounterMetricFamily(
                p + "era_bridge_fallbacks",
                "2026 requests declaring client capabilities served over the bridge's shared session, by reason.",
                labels=("reason",),
            ),
        )

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        sessions, awaiting, rounds, fallbacks = self._families()
        for state, n in self.watch.sessions().items():
            sessions.add_metric([state], n)
        for client, n in self.watch.awaiting().items():
            awaiting.add_metric([client], n)
        for client, n in self.watch.rounds.items():
            rounds.add_metric([client], n)
        for reason, n in self.watch.fallbacks.items():
            fallbacks.add_metric([reason], n)
        yield from (sessions, awaiting, rounds, fallbacks)
