"""The engine scripted over an in-memory link (no sockets): the rules that are awkward to provoke
through real peers. The link stands in for a transport; what is tested is the engine's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from proxy.core.engine import Engine
from proxy.core.relay import Relay, ToolCatalog
from proxy.policy.compile import load_policy_dir
from proxy.policy.compiled import PolicySet
from proxy.upstream.base import Exchange, OnMessage
from tests.core.memory_link import MemoryLink, RecordingOutbox

pytestmark = pytest.mark.anyio

TRANSIENT = {
    "isError": True,
    "content": [{"type": "text", "text": "busy"}],
    "structuredContent": {"errorCategory": "transient", "isRetryable": True},
}


class ScriptedLink(MemoryLink):
    """Answers each request with the next scripted result (the last one repeats)."""

    def __init__(self, results: list[dict[str, Any]], on_send: Any = None) -> None:
        super().__init__()
        self.results = results
        self.on_send = on_send

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        ex = await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        result = self.results[min(len(self.sent), len(self.results)) - 1]
        asyncio.get_running_loop().call_soon(self.answer, ex, result)
        if self.on_send is not None:
            self.on_send(len(self.sent))
        return ex


Outbox = RecordingOutbox


def relay_for(link: ScriptedLink, rand: float = 0.0) -> Relay:
    catalog = ToolCatalog()
    catalog.observe(
        {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    )
    engine = Engine(policies=lambda: PolicySet(version="test"), rand=lambda: rand)
    return Relay(link, catalog=catalog, tool_calls=engine)  # type: ignore[arg-type]


REQUEST = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "read", "arguments": {"q": 1}}}


async def test_a_legacy_client_that_disconnected_gets_no_new_attempt() -> None:
    outbox = Outbox()

    def disconnect_after_first(count: int) -> None:
        outbox.closed = True  # the client went away while attempt 1 was in flight

    link = ScriptedLink([TRANSIENT, {"content": []}], on_send=disconnect_after_first)
    await relay_for(link).handle_request(REQUEST, outbox)
    assert len(link.sent) == 1, "the attempt in flight finished; no new one started"


async def test_a_legacy_client_that_disconnected_during_the_backoff_gets_no_new_attempt() -> None:
    outbox = Outbox()
    loop = asyncio.get_running_loop()

    def disconnect_soon(count: int) -> None:
        if count == 1:  # attempt 1 is answered at once; the backoff (0.2 s, rand 1.0) is running then
            loop.call_later(0.05, setattr, outbox, "closed", True)

    link = ScriptedLink([TRANSIENT, {"content": []}], on_send=disconnect_soon)
    catalog = ToolCatalog()
    catalog.observe(
        {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    )
    engine = Engine(policies=lambda: PolicySet(version="test"), rand=lambda: 1.0)
    relay = Relay(link, catalog=catalog, tool_calls=engine)  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        await relay.handle_request(REQUEST, outbox)
    assert len(link.sent) == 1, "the backoff ended with the client gone: no attempt 2"
    (answer,) = outbox.messages  # kept for a client that resumes the stream
    report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    assert report["stopReason"] == "cancelled", report
    text = answer["result"]["content"][-1]["text"]
    assert "disconnected" in text and "Cancelled by the caller" not in text


async def test_every_attempt_has_a_fresh_upstream_id_and_the_answer_keeps_the_callers_id() -> None:
    outbox = Outbox()
    link = ScriptedLink([TRANSIENT, TRANSIENT, {"content": [{"type": "text", "text": "ok"}]}])
    await relay_for(link).handle_request(REQUEST, outbox)
    ids = [m["id"] for m in link.sent]
    assert len(ids) == 3 and len(set(ids)) == 3
    (answer,) = outbox.messages
    assert answer["id"] == 9 and answer["result"]["_meta"]["io.mcp-recovery-proxy/attempts"] == 3


async def test_our_meta_keys_never_reach_the_upstream() -> None:
    request = {
        **REQUEST,
        "params": {**REQUEST["params"], "_meta": {"io.mcp-recovery-proxy/deadlineMs": 5000, "traceparent": "00-x"}},
    }
    link = ScriptedLink([{"content": []}])
    await relay_for(link).handle_request(request, Outbox())
    meta = link.sent[0]["params"]["_meta"]
    assert not [k for k in meta if k.startswith("io.mcp-recovery-proxy/")]
    assert meta["traceparent"] == "00-x", "the caller's trace context passes unchanged"
    # nothing added: the shipped defaults have no idle timer, so the proxy needs no progress token
    # of its own (a policy's idle_timeout adds one: tests/core/test_engine_progress.py)
    assert meta.keys() == {"traceparent"}


async def test_malformed_ids_from_either_peer_are_dropped_not_raised() -> None:
    link = ScriptedLink([{"content": []}])
    relay = relay_for(link)
    relay.server_messages.unsolicited({"jsonrpc": "2.0", "id": [1], "method": "sampling/createMessage"})
    relay.server_messages.unsolicited(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {"a": 1}}}
    )
    await relay.handle_notification(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [2]}}
    )
    await relay.handle_response({"jsonrpc": "2.0", "id": [3], "result": {}})
    assert link.pending.resolve({"jsonrpc": "2.0", "id": {"x": 1}, "result": {}}) is False
    outbox = Outbox()
    await relay.handle_request(REQUEST, outbox)
    assert outbox.messages and outbox.messages[0]["id"] == 9, "the relay still serves"


# -- anti-storm admission (docs/recovery.md, "Decision": retry_budget, circuit_open), through the engine


def _unresolved_validator() -> Any:
    import json
    from pathlib import Path

    import jsonschema

    schema = Path(__file__).resolve().parents[2] / "proxy" / "schemas" / "unresolved-result.schema.json"
    return jsonschema.Draft202012Validator(json.loads(schema.read_text(encoding="utf-8")))


def _relay_with(link: ScriptedLink, policy_yaml: str) -> Relay:
    from proxy.policy.compile import compile_files

    policies = compile_files([("read.yaml", "read.yaml", policy_yaml.encode())])
    catalog = ToolCatalog()
    catalog.observe(
        {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    )
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0)
    return Relay(link, catalog=catalog, tool_calls=engine)  # type: ignore[arg-type]


async def test_an_open_circuit_refuses_the_next_call_before_any_attempt() -> None:
    link = ScriptedLink([TRANSIENT])
    relay = _relay_with(
        link,
        "tools: [read]\nattempts: 3\nbackoff: {initial: 1ms, max: 1ms}\n"
        "anti_storm: {breaker_failures: 2, breaker_cooldown: 30s}\n",
    )
    first = Outbox()
    await relay.handle_request(REQUEST, first)
    assert len(link.sent) == 2, "the second transient failure opened the circuit: no third attempt"
    stopped = first.messages[0]["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    assert stopped["stopReason"] == "circuit_open"
    second = Outbox()
    await relay.handle_request({**REQUEST, "id": 10}, second)
    assert len(link.sent) == 2, "refused before attempt 1"
    result = second.messages[0]["result"]
    structured = result["_meta"]["io.mcp-recovery-proxy/unresolved"]
    assert structured["stopReason"] == "circuit_open" and structured["attemptCount"] == 0
    assert 0 < structured["retryAfterMs"] <= 30_000
    assert not list(_unresolved_validator().iter_errors(structured))


async def test_a_spent_retry_budget_stops_retrying_with_retry_budget() -> None:
    link = ScriptedLink([TRANSIENT])
    relay = _relay_with(
        link,
        "tools: [read]\nattempts: 5\nbackoff: {initial: 1ms, max: 1ms}\n"
        "anti_storm: {retry_budget_ratio: 0, retry_budget_min_per_s: 0.2}\n",
    )
    outbox = Outbox()
    await relay.handle_request(REQUEST, outbox)
    assert len(link.sent) == 3, "a budget of 0.2/s over 10 s: two retries"
    structured = outbox.messages[0]["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    assert structured["stopReason"] == "retry_budget" and structured["attemptCount"] == 3
    assert not list(_unresolved_validator().iter_errors(structured))


# -- what the engine tells its observers -------------------------------------------------------


class _Recorder:
    """An observer that declares nothing, so it gets every event (as tracing does)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_event(self, event: Any) -> None:
        self.events.append(event)


class _FinishedOnly(_Recorder):
    needs_starts = False  # as the metrics and the call log declare


def _relay_observed(link: MemoryLink, *observers: Any, policies: PolicySet | None = None) -> tuple[Relay, Engine]:
    from proxy.telemetry.events import Telemetry

    catalog = ToolCatalog()
    catalog.observe(
        {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    )
    chosen = policies if policies is not None else PolicySet(version="test")
    engine = Engine(policies=lambda: chosen, rand=lambda: 0.0, telemetry=Telemetry(list(observers)))
    return Relay(link, catalog=catalog, tool_calls=engine), engine  # type: ignore[arg-type]


async def test_a_first_attempt_success_is_one_event_and_start_events_are_built_only_when_needed() -> None:
    everything = _Recorder()
    relay, _ = _relay_observed(ScriptedLink([{"content": []}]), everything)
    await relay.handle_request(REQUEST, Outbox())
    assert [type(e).__name__ for e in everything.events] == ["CallStarted", "AttemptStarted", "CallSucceeded"]
    finished_only = _FinishedOnly()
    relay, _ = _relay_observed(ScriptedLink([{"content": []}]), finished_only)
    await relay.handle_request(REQUEST, Outbox())
    (succeeded,) = finished_only.events
    assert type(succeeded).__name__ == "CallSucceeded" and succeeded.tool == "read"
    assert 0 <= succeeded.attempt_s <= succeeded.duration_s
    assert succeeded.call_id, "an observer that does not declare otherwise reads call ids"


class _NoCallIds(_FinishedOnly):
    needs_call_ids = False  # as the metrics declare


async def test_a_success_carries_a_call_id_only_when_an_observer_reads_it_and_ids_keep_counting() -> None:
    relay, engine = _relay_observed(ScriptedLink([{"content": []}, {"content": []}]), _NoCallIds())
    await relay.handle_request(REQUEST, Outbox())
    assert engine.telemetry.success_ids is False and engine.telemetry.observers[0].events[0].call_id == ""
    assert engine.new_call_id().endswith("-2"), "the success took its number all the same"
    both = _NoCallIds(), _FinishedOnly()
    relay, engine = _relay_observed(ScriptedLink([{"content": []}]), *both)
    await relay.handle_request(REQUEST, Outbox())
    assert engine.telemetry.success_ids and both[0].events[0].call_id == both[1].events[0].call_id != ""


async def test_without_start_listeners_a_recovered_call_still_reports_its_retries_and_attempts() -> None:
    finished_only = _FinishedOnly()
    relay, _ = _relay_observed(ScriptedLink([TRANSIENT, {"content": []}]), finished_only)
    await relay.handle_request(REQUEST, Outbox())
    names = [(type(e).__name__, getattr(e, "number", None)) for e in finished_only.events]
    assert names == [
        ("AttemptFinished", 1),
        ("BackoffStarted", None),
        ("AttemptStarted", 2),  # a retry's start is always told (the retries counter)
        ("AttemptFinished", 2),
        ("CallFinished", None),
    ]
    assert finished_only.events[-1].outcome == "recovered"


class _RawLink(MemoryLink):
    """Answers every request with `answer` (a whole JSON-RPC message, its id filled in)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__()
        self.answer_with = answer

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        ex = await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        reply = {**self.answer_with, "id": message["id"]}
        asyncio.get_running_loop().call_soon(self.pending.resolve, reply)
        return ex


@pytest.mark.parametrize(
    "answer",
    [
        {"jsonrpc": "2.0", "result": {"isError": True, "content": []}},
        {"jsonrpc": "2.0", "error": {"code": -32603, "message": "boom"}, "result": {"content": []}},
        {"jsonrpc": "2.0", "result": ["not", "an", "object"]},
    ],
)
async def test_only_a_real_success_takes_the_short_way(answer: dict[str, Any]) -> None:
    finished_only = _FinishedOnly()
    relay, _ = _relay_observed(_RawLink(answer), finished_only)
    await relay.handle_request(REQUEST, Outbox())
    kinds = [type(e).__name__ for e in finished_only.events]
    assert kinds[0] == "AttemptFinished" and kinds[-1] == "CallFinished" and "CallSucceeded" not in kinds
    assert finished_only.events[0].result != "success" and finished_only.events[-1].outcome != "success"


async def test_calls_in_flight_per_tool_count_a_hanging_call_until_it_is_cancelled() -> None:
    sent = asyncio.Event()

    class Silent(MemoryLink):
        async def send_request(self, message: dict[str, Any], **kw: Any) -> Exchange:
            ex = await super().send_request(message, **kw)
            sent.set()
            return ex  # and never answers

    link = Silent()
    finished_only = _FinishedOnly()
    relay, engine = _relay_observed(link, finished_only)
    task = asyncio.get_running_loop().create_task(relay.handle_request(REQUEST, Outbox()))
    await sent.wait()
    assert engine.in_flight_by_tool() == [("read", 1)] and engine.in_flight == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert engine.in_flight_by_tool() == [("read", 0)] and engine.in_flight == 0
    assert link.cancelled, "the attempt the proxy stopped waiting for was cancelled upstream"
    (finished,) = finished_only.events
    # the attempt the cancellation stopped counts (the call log line said attempts=0)
    assert (finished.outcome, finished.stop_reason, finished.attempts) == ("cancelled", "cancelled", 1)


async def test_calls_that_need_the_whole_engine_get_the_same_answers_and_events() -> None:
    """The direct path (no ledger entry, no own _meta keys, ...) and the full one agree."""
    answers = [TRANSIENT, {"content": [{"type": "text", "text": "ok"}]}]
    direct_seen, full_seen = _FinishedOnly(), _FinishedOnly()
    relay, _ = _relay_observed(ScriptedLink(answers), direct_seen)
    direct_out = Outbox()
    await relay.handle_request(REQUEST, direct_out)
    relay, _ = _relay_observed(ScriptedLink(answers), full_seen)
    full_out = Outbox()
    with_deadline = {**REQUEST, "params": {**REQUEST["params"], "_meta": {"io.mcp-recovery-proxy/deadlineMs": 49000}}}
    await relay.handle_request(with_deadline, full_out)  # an own _meta key: the full path
    assert direct_out.messages == full_out.messages
    kinds = [(type(e).__name__, getattr(e, "number", None)) for e in direct_seen.events]
    assert kinds == [(type(e).__name__, getattr(e, "number", None)) for e in full_seen.events]


class ErrorLink(MemoryLink):
    """Answers every request with the same JSON-RPC error."""

    def __init__(self, code: int) -> None:
        super().__init__()
        self.code = code

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        ex = await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        error = {"jsonrpc": "2.0", "id": ex.upstream_id, "error": {"code": self.code, "message": "upstream broke"}}
        asyncio.get_running_loop().call_soon(self.pending.resolve, error)
        return ex


@pytest.mark.parametrize(
    ("annotations", "sent", "reason"),
    [
        ({"readOnlyHint": True}, 3, "attempts_exhausted"),  # retried, budget spent
        ({}, 1, "outcome_unknown"),  # state-changing: never repeated
    ],
)
async def test_jsonrpc_errors_as_results_off_forwards_the_error_as_it_came_whatever_stopped_the_call(
    tmp_path: Path, annotations: dict[str, Any], sent: int, reason: str
) -> None:
    (tmp_path / "t.yaml").write_text("tools: [t]\njsonrpc_errors_as_results: false\nbackoff:\n  initial: 1ms\n")
    policies = load_policy_dir(tmp_path)
    catalog = ToolCatalog()
    catalog.observe({"tools": [{"name": "t", "inputSchema": {"type": "object"}, "annotations": annotations}]})
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0)  # backoffs of 0 s
    link = ErrorLink(-32603)
    request = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    outbox = Outbox()
    await Relay(link, catalog=catalog, tool_calls=engine).handle_request(request, outbox)  # type: ignore[arg-type]
    assert len(link.sent) == sent
    (answer,) = outbox.messages
    assert answer == {"jsonrpc": "2.0", "id": 4, "error": {"code": -32603, "message": "upstream broke"}}
    if reason == "attempts_exhausted":
        # The spent budget is still in the ledger: the same call is refused without an attempt.
        again = Outbox()
        await Relay(link, catalog=catalog, tool_calls=engine).handle_request(request, again)  # type: ignore[arg-type]
        assert len(link.sent) == sent, "refused by the ledger"
        assert (
            again.messages[0]["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]["stopReason"] == "ledger_exhausted"
        )


@pytest.mark.parametrize("code", [-32603, -32000, -32602])
@pytest.mark.parametrize("continuation", [{"requestState": "opaque"}, {"inputResponses": {"ask": {"ok": True}}}])
async def test_a_jsonrpc_error_answering_an_input_required_continuation_is_neither_retried_nor_wrapped(
    code: int, continuation: dict[str, Any]
) -> None:
    """The continuation's error is the client's protocol machinery's (restart the rounds): it comes
    back as it came, after one attempt, even for a code that is transient elsewhere (a read-only
    tool, the shipped policy: -32603 alone would be retried three times and wrapped)."""
    link = ErrorLink(code)
    request = {**REQUEST, "params": {**REQUEST["params"], **continuation}}
    outbox = Outbox()
    await relay_for(link).handle_request(request, outbox)  # type: ignore[arg-type]
    assert len(link.sent) == 1
    assert [m["params"].keys() & continuation.keys() for m in link.sent] == [continuation.keys()]
    assert outbox.messages == [{"jsonrpc": "2.0", "id": 9, "error": {"code": code, "message": "upstream broke"}}]
    # the same error without a continuation: transient codes retried and wrapped, as the policy says
    plain = ErrorLink(code)
    outbox = Outbox()
    await relay_for(plain).handle_request(REQUEST, outbox)  # type: ignore[arg-type]
    assert len(plain.sent) == (1 if code == -32602 else 3)
    assert outbox.messages[0]["result"]["isError"] is True


class SilentListLink(ScriptedLink):
    """Never answers tools/list (an upstream that hangs on it); tools/call as scripted, or never
    (`results` empty)."""

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        if message.get("method") == "tools/list" or not self.results:
            self.sent.append(message)
            return self.pending.add(message, on_message)
        return await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)


@pytest.mark.parametrize("answers", [True, False])
async def test_listing_tools_for_an_unlisted_tool_leaves_attempt_1_room_within_the_deadline(
    tmp_path: Path, answers: bool
) -> None:
    # deadline 400 ms, attempt timeout 300 ms: the minimum useful attempt is 75 ms, so the listing
    # may take 325 ms at most (it used to wait 5 s, outside the deadline)
    (tmp_path / "t.yaml").write_text("tools: [t]\ndeadline: 400ms\nattempt_timeout: 300ms\n")
    policies = load_policy_dir(tmp_path)
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0)
    link = SilentListLink([{"content": [{"type": "text", "text": "ok"}]}] if answers else [])
    relay = Relay(link, catalog=ToolCatalog(), tool_calls=engine)  # type: ignore[arg-type]
    request = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    outbox = Outbox()
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with asyncio.timeout(3):
        await relay.handle_request(request, outbox)
    took = loop.time() - began
    assert [m["method"] for m in link.sent] == ["tools/list", "tools/call"]
    (answer,) = outbox.messages
    if answers:
        assert 0.3 <= took < 0.6, took
        assert answer["result"]["content"][0]["text"] == "ok"
    else:
        assert 0.39 <= took < 0.7, f"attempt 1 ended with the deadline: {took:.2f}s"
        report = answer["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
        assert report["elapsedMs"] >= 390, "the listing's time is part of the call's"
        assert report["attemptCount"] == 1


async def test_a_success_under_an_approved_fresh_budget_says_which_budget_it_used() -> None:
    link = ScriptedLink([TRANSIENT, TRANSIENT, TRANSIENT, {"content": [{"type": "text", "text": "ok"}]}])
    relay = relay_for(link)
    first = Outbox()
    await relay.handle_request(REQUEST, first)
    spent = first.messages[0]["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    assert spent["stopReason"] == "attempts_exhausted" and len(link.sent) == 3
    approved = {
        **REQUEST,
        "params": {
            **REQUEST["params"],
            "_meta": {"io.mcp-recovery-proxy/approveBudget": spent["operation"]["budgetId"]},
        },
    }
    second = Outbox()
    await relay.handle_request(approved, second)
    (answer,) = second.messages
    assert answer["result"]["content"][0]["text"] == "ok" and len(link.sent) == 4
    assert answer["result"]["_meta"] == {
        "io.mcp-recovery-proxy/attempts": 1,
        "io.mcp-recovery-proxy/approvedBudgetId": spent["operation"]["budgetId"],
    }
    plain = Outbox()  # the approval was used up: the ledger entry is gone, a plain call just succeeds
    await relay.handle_request(REQUEST, plain)
    assert "_meta" not in plain.messages[0]["result"]


def test_progress_notes_kept_as_partial_results_are_bounded() -> None:
    from proxy.core.outbox import PROGRESS_NOTES, CallProgress

    progress = CallProgress("caller-token", 0.0)
    huge = {"progressToken": "up-1", "progress": 1, "total": ["x"] * 1000, "message": "m" * 100_000}
    progress.rewrite({"jsonrpc": "2.0", "method": "notifications/progress", "params": huge})
    odd = {"progressToken": "up-1", "progress": True, "message": {"nested": "x" * 1000}}
    progress.rewrite({"jsonrpc": "2.0", "method": "notifications/progress", "params": odd})
    first, second = (note.content for note in progress.notes)
    assert first == {"progress": 1, "message": "m" * 999 + "…"}, "numbers only, the message cut at 1,000"
    assert set(second) == {"message"} and len(second["message"]) <= 80
    for _ in range(2 * PROGRESS_NOTES):
        progress.rewrite(
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 2, "message": "m"}}
        )
    assert len(progress.notes) == PROGRESS_NOTES


@pytest.mark.parametrize(
    ("text", "category"),
    [("the frobnicator sulks", "unclassified"), ("read ECONNRESET", "transient"), ("Unknown tool: read", "validation")],
)
async def test_metrics_and_logs_count_an_unclassified_failure_as_unclassified_never_as_transient(
    text: str, category: str
) -> None:
    from prometheus_client import CollectorRegistry

    from proxy.telemetry.metrics import MetricsObserver

    registry = CollectorRegistry()
    finished_only = _FinishedOnly()
    answer = {"jsonrpc": "2.0", "result": {"isError": True, "content": [{"type": "text", "text": text}]}}
    relay, _ = _relay_observed(_RawLink(answer), finished_only, MetricsObserver(registry))
    outbox = Outbox()
    await relay.handle_request(REQUEST, outbox)
    attempts = [e for e in finished_only.events if type(e).__name__ == "AttemptFinished"]
    assert {e.category for e in attempts} == {category}
    assert finished_only.events[-1].category == category  # the call log's category
    counted = registry.get_sample_value(
        "mcp_recovery_attempts_total", {"tool": "read", "result": "tool_error", "category": category}
    )
    assert counted == len(attempts)
    report = outbox.messages[0]["result"]["_meta"]["io.mcp-recovery-proxy/unresolved"]
    if category == "unclassified":  # the report keeps one of the four, marked as defaulted
        assert report["errorCategory"] == "business" and report["classification"]["defaulted"] is True


async def test_a_jsonrpc_error_kept_as_it_came_is_counted_unclassified_when_nothing_classified_it(
    tmp_path: Path,
) -> None:
    """`jsonrpc_errors_as_results: false` and a code nothing classifies: the call's category in the
    call log is `unclassified`, as its attempt's is, not the label the policy gives it."""
    (tmp_path / "read.yaml").write_text("tools: [read]\njsonrpc_errors_as_results: false\n")
    finished_only = _FinishedOnly()
    answer = {"jsonrpc": "2.0", "error": {"code": -32099, "message": "the frobnicator sulks"}}
    relay, _ = _relay_observed(_RawLink(answer), finished_only, policies=load_policy_dir(tmp_path))
    outbox = Outbox()
    await relay.handle_request(REQUEST, outbox)
    assert outbox.messages[0]["error"]["code"] == -32099, "kept as it came"
    assert [(type(e).__name__, e.category) for e in finished_only.events] == [
        ("AttemptFinished", "unclassified"),
        ("CallFinished", "unclassified"),
    ]


async def test_the_tool_listing_made_for_a_call_carries_that_callers_credential_only() -> None:
    """A call of a tool the catalog lacks lists tools first (its annotations). With --auth
    passthrough that listing is the caller's request too: it goes with the caller's
    `Authorization` (an upstream that authenticates refuses it otherwise, and the call loses its
    annotations), and with nothing else of the call's headers. Before, it went with no headers,
    and a 2025 session's link lent it the session's last credential, whoever's that was."""
    seen: list[tuple[str, Mapping[str, str] | None]] = []

    class Recording(ScriptedLink):
        async def send_request(
            self,
            message: dict[str, Any],
            *,
            on_message: OnMessage | None = None,
            headers: Mapping[str, str] | None = None,
            on_write: Callable[[], None] | None = None,
        ) -> Exchange:
            seen.append((message["method"], headers))
            return await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)

    listing = {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    link = Recording([listing, {"content": []}])
    engine = Engine(policies=lambda: PolicySet(version="test"), rand=lambda: 0.0)
    relay = Relay(link, catalog=ToolCatalog(), tool_calls=engine)  # type: ignore[arg-type]
    headers = {"authorization": "Bearer caller-token", "mcp-param-q": "1"}
    await relay.handle_request(REQUEST, Outbox(), headers)
    assert seen == [("tools/list", {"authorization": "Bearer caller-token"}), ("tools/call", headers)]
