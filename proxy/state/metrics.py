"""The shared store's metrics, read at scrape time (closed label sets, no per-call work):

- `mcp_recovery_state_store_up`: 1 while the store answers, 0 while the proxy runs on local state.
- `mcp_recovery_state_store_errors_total{operation}`: store operations that failed or exceeded the
  store timeout (`ping`, `record`, `approve`, `clear`, `budget`, `subscribe`, `reconcile`,
  `resend`).
- `mcp_recovery_state_fallbacks_total{operation}`: what was done locally instead: `record` (an
  exhaustion kept for the store), `approve` (an approval refused: single use could not be
  checked), `clear`, `budget` (a sync of the retry budget's counts skipped).
- `mcp_recovery_state_reconciles_total`: completed reconciliations (each (re)subscription).
- `mcp_recovery_state_budget_syncs_total`: completed exchanges of the retry budget's counts (every
  `--state-sync-interval-s` while the store answers).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.state.shared import FALLBACKS, OPERATIONS, RedisState

PREFIX = "mcp_recovery_state_"


class StateCollector:
    def __init__(self, state: RedisState) -> None:
        self.state = state

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        state = self.state
        up = GaugeMetricFamily(PREFIX + "store_up", "Whether the shared state store answers (0: local state).")
        up.add_metric([], 1.0 if state.up else 0.0)
        yield up
        errors = CounterMetricFamily(
            PREFIX + "store_errors", "Shared store operations that failed or timed out.", labels=("operation",)
        )
        for op in OPERATIONS:
            errors.add_metric([op], state.errors.get(op, 0))
        yield errors
        fallbacks = CounterMetricFamily(
            PREFIX + "fallbacks", "Store operations done on local state instead.", labels=("operation",)
        )
        for op in FALLBACKS:
            fallbacks.add_metric([op], state.fallbacks.get(op, 0))
        yield fallbacks
        reconciles = CounterMetricFamily(PREFIX + "reconciles", "Reconciliations with the shared store.")
        reconciles.add_metric([], state.reconciles)
        yield reconciles
        syncs = CounterMetricFamily(PREFIX + "budget_syncs", "Exchanges of the retry budget's counts with the store.")
        syncs.add_metric([], state.budget_syncs)
        yield syncs
