"""`mcp_recovery_gc_pause_seconds{generation}`: the proxy's garbage-collection pauses on /metrics.

In process: a forced `gc.collect()` adds one full-collection observation. End to end: the real
proxy (`python -m proxy serve` in front of the scripted stdio upstream) gets a `sitecustomize` on
PYTHONPATH that runs `gc.collect()` on SIGUSR1 (the proxy has no such hook of its own); a real
scrape of the admin `/metrics` must then show one more generation-2 pause. Bounded waits only.
"""

from __future__ import annotations

import gc
import os
import signal
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from proxy.telemetry.gc_pauses import NAME, GcPauseCollector
from proxy.telemetry.metrics import MetricsObserver
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
BOUND_S = 30.0

SITECUSTOMIZE = textwrap.dedent(
    """
    import sys
    if "serve" in sys.argv:
        import gc, signal
        signal.signal(signal.SIGUSR1, lambda *_: gc.collect())
    """
)


def samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, generation) -> value of the pause histogram in an exposition text."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == NAME:
            for s in family.samples:
                if not s.name.endswith("_bucket"):
                    found[(s.name, s.labels["generation"])] = s.value
    return found


def test_a_forced_collection_is_observed_in_process() -> None:
    registry = CollectorRegistry()
    MetricsObserver(registry)  # registers the collector, as the proxy's telemetry does
    before_count = registry.get_sample_value(NAME + "_count", {"generation": "2"}) or 0.0
    before_sum = registry.get_sample_value(NAME + "_sum", {"generation": "2"}) or 0.0
    gc.collect()
    assert registry.get_sample_value(NAME + "_count", {"generation": "2"}) >= before_count + 1
    assert registry.get_sample_value(NAME + "_sum", {"generation": "2"}) > before_sum
    buckets = registry.get_sample_value(NAME + "_bucket", {"generation": "2", "le": "+Inf"})
    assert buckets == registry.get_sample_value(NAME + "_count", {"generation": "2"})


def test_the_collector_is_installed_once() -> None:
    GcPauseCollector()
    GcPauseCollector()
    assert sum(1 for cb in gc.callbacks if type(cb).__name__ == "_Pauses") == 1


def test_a_forced_collection_in_the_proxy_shows_on_a_real_scrape(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    journal = Journal(tmp_path / "journal.jsonl")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    with ProxyProcess(upstream=command, env=env, log_path=tmp_path / "proxy.log") as proxy:
        first = samples(httpx.get(proxy.admin + "/metrics", timeout=10).text)
        assert {g for _, g in first} == {"0", "1", "2"}, first
        before = first[(NAME + "_count", "2")]
        assert proxy.proc is not None
        os.kill(proxy.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + BOUND_S
        while True:
            now = samples(httpx.get(proxy.admin + "/metrics", timeout=10).text)
            if now[(NAME + "_count", "2")] >= before + 1:
                break
            assert time.monotonic() < deadline, f"no new generation-2 pause on /metrics: {now}"
            time.sleep(0.1)  # polling a scrape (bounded above), not waiting for time to pass
        assert now[(NAME + "_sum", "2")] > first[(NAME + "_sum", "2")]
