"""docs/observability.md's metric table lists exactly the metrics the proxy exports."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from proxy.auth.jwt import JwtAuthenticator, KeysCollector
from proxy.state.metrics import StateCollector
from proxy.state.shared import RedisState
from proxy.telemetry.metrics import MetricsObserver
from tests.telemetry.promql import REPO


def test_the_metric_table_matches_the_registry() -> None:
    registry = CollectorRegistry()
    MetricsObserver(registry)
    # with a shared store (never connected here: the collector reads its counters only)
    registry.register(StateCollector(RedisState("redis://127.0.0.1:1/0")))
    # with --auth jwt (never started here: the collector reads the verifier's state only)
    registry.register(KeysCollector(JwtAuthenticator("https://issuer.example", "https://mcp.example/mcp")))
    exported = {}
    for metric in registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        exported[name] = metric.type
    text = (REPO / "docs" / "observability.md").read_text()
    documented = dict(re.findall(r"^\| `(mcp_recovery_[a-z_]+)` \| (\w+) \|", text, re.MULTILINE))
    assert documented == exported
