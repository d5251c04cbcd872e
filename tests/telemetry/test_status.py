"""The status page's observer and the reads it shows, driven through the real engine over an
in-memory link (no sockets): what a call leaves in the rings, what the engine builds for it, and
the antistorm and ledger reads. The page itself, in a real browser: tests/e2e/test_status_page.py."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.engine import Engine
from proxy.core.relay import Relay, ToolCatalog
from proxy.policy.compile import compile_files
from proxy.policy.compiled import Category, PolicySet
from proxy.recovery.antistorm import AntiStorm
from proxy.recovery.ledger import InMemoryLedger
from proxy.recovery.reasons import StopReason
from proxy.telemetry.events import CallFinished, CallSucceeded, Telemetry
from proxy.telemetry.status import StatusObserver
from tests.core.memory_link import RecordingOutbox
from tests.core.test_engine_in_memory import TRANSIENT, ScriptedLink

pytestmark = pytest.mark.anyio

SECRET_ARG = "canary-argument-Zq81"
REQUEST = {
    "jsonrpc": "2.0",
    "id": 9,
    "method": "tools/call",
    "params": {"name": "read", "arguments": {"q": SECRET_ARG}},
}


def _relay(link: ScriptedLink, observer: StatusObserver, policy_yaml: str | None = None) -> tuple[Relay, Engine]:
    policies = (
        compile_files([("read.yaml", "read.yaml", policy_yaml.encode())]) if policy_yaml else PolicySet(version="test")
    )
    catalog = ToolCatalog()
    catalog.observe(
        {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    )
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0, telemetry=Telemetry([observer]))
    return Relay(link, catalog=catalog, tool_calls=engine), engine  # type: ignore[arg-type]


async def test_a_first_attempt_success_costs_no_start_event_and_no_call_id() -> None:
    observer = StatusObserver()
    relay, engine = _relay(ScriptedLink([{"content": []}]), observer)
    await relay.handle_request(REQUEST, RecordingOutbox())
    assert engine.telemetry.starts is False and engine.telemetry.success_ids is False
    ((_, event, attempts, report),) = observer.recent
    assert isinstance(event, CallSucceeded) and attempts == () and report is None
    assert not observer.problems
    (shown,) = observer.snapshot()["recent"]
    assert shown["outcome"] == "success" and shown["attempts"][0]["result"] == "success"


async def test_a_recovered_call_shows_each_attempt_with_its_category() -> None:
    observer = StatusObserver()
    relay, _ = _relay(ScriptedLink([TRANSIENT, {"content": []}]), observer)
    await relay.handle_request(REQUEST, RecordingOutbox())
    (shown,) = observer.snapshot()["recent"]
    assert shown["outcome"] == "recovered" and shown["attempt_count"] == 2
    assert [(a["number"], a["result"], a["category"]) for a in shown["attempts"]] == [
        (1, "tool_error", "transient"),
        (2, "success", None),
    ]
    assert not observer.problems, "a recovered call is not a problem"


async def test_an_unresolved_call_keeps_its_report_without_the_arguments() -> None:
    observer = StatusObserver()
    relay, _ = _relay(ScriptedLink([TRANSIENT]), observer, "tools: [read]\nattempts: 2\nbackoff: {initial: 1ms}\n")
    outbox = RecordingOutbox()
    await relay.handle_request(REQUEST, outbox)
    given = outbox.messages[0]["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    (problem,) = observer.snapshot()["problems"]
    assert problem["outcome"] == "unresolved" and problem["stop_reason"] == "attempts_exhausted"
    assert problem["report"] == given, "the report as the caller got it"
    assert problem["report"] is not given, "a copy: the observer holds nothing of the caller's result"
    assert SECRET_ARG not in repr(observer.snapshot())
    assert not observer._attempts and not observer._reports, "nothing left behind for a finished call"


async def test_successes_cannot_push_the_problems_out_of_sight() -> None:
    observer = StatusObserver(ring=3)
    relay, _ = _relay(ScriptedLink([TRANSIENT]), observer, "tools: [read]\nattempts: 1\n")
    await relay.handle_request(REQUEST, RecordingOutbox())
    link = ScriptedLink([{"content": []}])
    relay, _ = _relay(link, observer)
    for _ in range(5):
        await relay.handle_request(REQUEST, RecordingOutbox())
    assert len(observer.recent) == 3 and all(isinstance(e[1], CallSucceeded) for e in observer.recent)
    (problem,) = observer.snapshot()["problems"]
    assert problem["stop_reason"] == "attempts_exhausted"


async def test_the_engine_builds_no_report_event_when_nobody_takes_it() -> None:
    class FinishedOnly:
        needs_starts = False

        def __init__(self) -> None:
            self.events: list[Any] = []

        def handler_for(self, event_type: type) -> Any:
            return self.events.append if event_type is CallFinished else None

        def on_event(self, event: Any) -> None:
            self.events.append(event)

    telemetry = Telemetry([FinishedOnly()])
    assert telemetry.reports is False
    assert Telemetry([StatusObserver()]).reports is True


def test_rates_are_per_tool_per_bucket_and_bounded_in_time() -> None:
    now = [1000.0]
    observer = StatusObserver(bucket_s=5.0, clock=lambda: now[0], wall=lambda: 0.0)
    for duration in (0.010, 0.030):
        observer._succeeded(CallSucceeded("", "read", duration, duration))
    observer._finished(CallFinished("c1", "write", "unresolved", "attempts_exhausted", "transient", 3, 0.5, 0.1, False))
    now[0] += 5.0
    observer._succeeded(CallSucceeded("", "read", 0.02, 0.02))
    tools = {t["tool"]: t for t in observer.snapshot()["tools"]}
    read, write = tools["read"], tools["write"]
    assert read["calls_per_s"][-2:] == [0.4, 0.2] and read["mean_ms_series"][-2] == 20.0
    assert read["calls"] == 3 and read["failed"] == 0
    assert write["failed_per_s"][-2] == 0.2 and write["retries"] == 2
    assert len(read["calls_per_s"]) == 60
    now[0] += 5.0 * 61  # past the window: nothing shown, nothing kept beyond BUCKETS
    observer._succeeded(CallSucceeded("", "read", 0.02, 0.02))
    assert [t["tool"] for t in observer.snapshot()["tools"]] == ["read"]
    assert len(observer._history) <= 60


def test_the_antistorm_snapshot_shows_an_open_circuit_and_the_budget_use() -> None:
    policy = compile_files(
        [("r.yaml", "r.yaml", b"tools: [read]\nanti_storm: {breaker_failures: 2, breaker_cooldown: 30s}\n")]
    ).resolve("read", None)
    storm = AntiStorm()
    storm.admit_first("read", policy, 100.0)
    storm.record("read", policy, None, 100.0)
    storm.record("read", policy, Category.TRANSIENT, 100.1)
    storm.record("read", policy, Category.TRANSIENT, 100.2)
    (row,) = storm.snapshot(101.0)
    assert row["circuit"] == "open" and 28.0 < float(row["open_for_s"]) <= 30.0  # type: ignore[arg-type]
    assert row["window_calls"] == 1
    (row,) = storm.snapshot(131.0)
    assert row["circuit"] == "half_open"


def test_ledger_entries_are_the_live_ones_newest_first() -> None:
    ledger = InMemoryLedger()
    ledger.record_exhausted("a" * 64, "b1", StopReason.ATTEMPTS_EXHAUSTED, 10.0, 0.0)
    ledger.record_exhausted("b" * 64, "b2", StopReason.DEADLINE_EXHAUSTED, 100.0, 1.0)
    assert [e.budget_id for e in ledger.entries(5.0)] == ["b2", "b1"]
    assert [e.budget_id for e in ledger.entries(20.0)] == ["b2"]
    assert len(ledger) == 2, "a read removes nothing"
    assert [e.budget_id for e in ledger.entries(5.0, limit=1)] == ["b2"]
