"""Progress through the engine, over an in-memory link (no sockets): the idle timer, relaying, and
progress in the unresolved result (docs/recovery.md).

- The policy's `idle_timeout` stops an attempt that sent no progress for that long; progress
  extends it, but never the hard cap (the attempt timeout) nor the deadline.
- Progress is relayed under the caller's token, its values increasing across attempts: a retried
  attempt that starts counting again is not relayed until it passes what the caller last saw.
- The `message` texts of progress (bounded in number) are kept as `partialResults` of an
  unresolved result.

The upstream's progress reaches the engine the way a real link routes it: by the attempt's
progress token (its upstream request id) through the link's `PendingTable`. The timed tests keep
wide margins (progress every 50 ms against an idle timeout of 300 ms; bounds of a second or so
above the expected stop), since the machine's cores are shared.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from proxy.core.engine import Engine
from proxy.core.outbox import PROGRESS_NOTES
from proxy.core.relay import Relay, ToolCatalog
from proxy.policy.compile import load_policy_dir
from proxy.upstream.base import Exchange, OnMessage
from tests.core.memory_link import MemoryLink, RecordingOutbox

pytestmark = pytest.mark.anyio

TRANSIENT = {
    "isError": True,
    "content": [{"type": "text", "text": "busy"}],
    "structuredContent": {"errorCategory": "transient", "isRetryable": True},
}
OK = {"content": [{"type": "text", "text": "done"}]}
CALLER_TOKEN = "caller-token-7"
SCHEMA = Path(__file__).resolve().parents[2] / "proxy" / "schemas" / "unresolved-result.schema.json"


class Attempt:
    """What a scripted upstream can do with one request it received: report progress for it (by
    the progress token the proxy put in the request) and answer it."""

    def __init__(self, link: ProgressLink, message: dict[str, Any], exchange: Exchange) -> None:
        self.link = link
        self.message = message
        self.exchange = exchange

    @property
    def token(self) -> Any:
        return self.message["params"].get("_meta", {}).get("progressToken")

    def progress(self, value: float, total: float | None = None, message: str | None = None) -> bool:
        """Send `notifications/progress` as the upstream would; True if the link routed it."""
        params: dict[str, Any] = {"progressToken": self.token, "progress": value}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        return self.link.pending.route_related({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    def answer(self, result: dict[str, Any]) -> None:
        self.link.answer(self.exchange, result)


Script = Callable[[Attempt], Awaitable[None]]


class ProgressLink(MemoryLink):
    """Runs the next script (the last one repeats) for each request, as a task of its own."""

    def __init__(self, scripts: list[Script]) -> None:
        super().__init__()
        self.scripts = scripts
        self.tasks: list[asyncio.Task[None]] = []

    async def send_request(
        self,
        message: dict[str, Any],
        *,
        on_message: OnMessage | None = None,
        headers: Mapping[str, str] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> Exchange:
        ex = await super().send_request(message, on_message=on_message, headers=headers, on_write=on_write)
        script = self.scripts[min(len(self.sent), len(self.scripts)) - 1]
        self.tasks.append(asyncio.get_running_loop().create_task(script(Attempt(self, message, ex))))
        return ex

    async def cancel(self, exchange: Exchange, reason: str | None = None) -> None:
        await super().cancel(exchange, reason)
        self.pending.discard(exchange)  # as the real links do: its late progress is routed nowhere

    async def aclose(self) -> None:
        """Stop the scripts still running; an assertion that failed in one fails the test."""
        for task in self.tasks:
            task.cancel()
        for outcome in await asyncio.gather(*self.tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                raise outcome


def answers(*steps: tuple[float, str | None], then: dict[str, Any]) -> Script:
    """An attempt that reports `steps` (progress value, message) of a total of 10, then answers."""

    async def script(up: Attempt) -> None:
        for value, text in steps:
            assert up.progress(value, 10, text), "routed by the token the proxy sent"
        up.answer(then)

    return script


def reports_every(interval_s: float, *, for_s: float | None = None) -> Script:
    """An attempt that never answers and reports progress every `interval_s` (for `for_s`, if set)."""

    async def script(up: Attempt) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        n = 0
        while for_s is None or loop.time() - began < for_s:
            n += 1
            up.progress(n, None, f"step {n}")
            await asyncio.sleep(interval_s)

    return script


async def silent(up: Attempt) -> None:
    """An attempt that never answers and never reports progress."""


def request(token: Any = CALLER_TOKEN) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "read", "arguments": {"q": 1}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}


async def call(
    tmp_path: Path, policy_yaml: str, link: ProgressLink, req: dict[str, Any]
) -> tuple[RecordingOutbox, float]:
    """Run one tools/call of the read-only tool `read` under `policy_yaml`: (what the caller got,
    seconds it took), bounded by 10 s. Backoffs are 0 s (full jitter, rand 0)."""
    (tmp_path / "read.yaml").write_text("tools: [read]\n" + policy_yaml)
    policies = load_policy_dir(tmp_path)
    catalog = ToolCatalog()
    catalog.observe(
        {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]}
    )
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0)
    relay = Relay(link, catalog=catalog, tool_calls=engine)  # type: ignore[arg-type]
    outbox = RecordingOutbox()
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        async with asyncio.timeout(10):
            await relay.handle_request(req, outbox)
    finally:
        await link.aclose()
    return outbox, loop.time() - began


def split(outbox: RecordingOutbox) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(progress notifications the caller got, the final answer), checking the answer came last."""
    *notes, answer = outbox.messages
    assert answer.get("id") == 9, outbox.messages
    assert all(m.get("method") == "notifications/progress" for m in notes), notes
    return notes, answer


def report_of(answer: dict[str, Any]) -> dict[str, Any]:
    result = answer["result"]
    assert result["isError"] is True, result
    structured: dict[str, Any] = result["_meta"]["io.mcp-recovery-proxy/unresolved"]
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    assert not list(validator.iter_errors(structured))
    return structured


def progress_partials(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in report["partialResults"] if p["source"] == "progress"]


# -- the idle timer: progress extends it, never the hard cap or the deadline ---------------------


async def test_progress_keeps_an_attempt_past_its_idle_timeout_but_not_past_its_attempt_timeout(
    tmp_path: Path,
) -> None:
    link = ProgressLink([reports_every(0.05)])
    outbox, took = await call(
        tmp_path, "idle_timeout: 300ms\nattempt_timeout: 1200ms\ndeadline: 5s\nattempts: 1\n", link, request()
    )
    assert 1.15 <= took < 2.2, (
        f"stopped by the attempt timeout (1.2 s), not the idle timer or the deadline: {took:.2f}s"
    )
    notes, answer = split(outbox)
    assert len(notes) >= 6, "progress came all along (every 50 ms) and was relayed"
    report = report_of(answer)
    assert (report["stopReason"], report["attemptCount"]) == ("attempts_exhausted", 1)
    (step,) = report["attemptedSteps"]
    assert step["outcome"] == "transport_error" and "no answer within 1.2s" in step["detail"], step
    assert 1150 <= step["durationMs"] < 2200, step
    assert link.cancelled == [link.sent[0]["id"]], "the attempt it stopped waiting for is cancelled upstream"
    kept = progress_partials(report)
    assert kept and all(p["attempt"] == 1 for p in kept), "its progress messages are kept as partial results"


async def test_an_attempt_that_reports_no_progress_stops_after_the_idle_timeout(tmp_path: Path) -> None:
    link = ProgressLink([silent])
    outbox, took = await call(
        tmp_path, "idle_timeout: 300ms\nattempt_timeout: 3s\ndeadline: 5s\nattempts: 1\n", link, request()
    )
    assert 0.28 <= took < 1.5, f"stopped by the idle timer (300 ms), long before the attempt timeout (3 s): {took:.2f}s"
    notes, answer = split(outbox)
    assert notes == []
    report = report_of(answer)
    (step,) = report["attemptedSteps"]
    assert step["outcome"] == "transport_error" and step["dispatched"] == "unknown", step
    assert step["durationMs"] < 1500, step
    assert link.cancelled == [link.sent[0]["id"]]
    # the timer that cut it, its value and the key (and file) that changes it: in the report and
    # in the answer's own words
    assert "cut by idle_timeout 0.3s" in step["detail"] and "read.yaml:idle_timeout" in step["detail"], step
    (text,) = [b["text"] for b in answer["result"]["content"]]
    assert "Cause: timeout: attempt 1: no answer and no progress for 0.3s: cut by idle_timeout 0.3s" in text, text


async def test_without_a_caller_token_progress_still_feeds_the_idle_timer_and_is_not_relayed(tmp_path: Path) -> None:
    # Progress every 50 ms for 0.6 s, then silence: the idle timer (300 ms) runs from the last one.
    link = ProgressLink([reports_every(0.05, for_s=0.6)])
    outbox, took = await call(
        tmp_path, "idle_timeout: 300ms\nattempt_timeout: 3s\ndeadline: 5s\nattempts: 1\n", link, request(token=None)
    )
    token = link.sent[0]["params"]["_meta"]["progressToken"]
    assert token == link.sent[0]["id"], "the proxy asks the upstream for progress to time the attempt by"
    assert 0.75 <= took < 2.0, f"stopped about 300 ms after the last progress (0.55-0.6 s): {took:.2f}s"
    notes, answer = split(outbox)
    assert notes == [], "the caller asked for no progress"
    assert report_of(answer)["attemptCount"] == 1


async def test_the_deadline_bounds_attempts_that_keep_reporting_progress(tmp_path: Path) -> None:
    # Attempt 1 runs to its attempt timeout (1.5 s); attempt 2 has only the 0.5 s of the deadline
    # left (2 s), progress or not; then the deadline is spent.
    link = ProgressLink([reports_every(0.05)])
    outbox, took = await call(
        tmp_path,
        "idle_timeout: 300ms\nattempt_timeout: 1500ms\ndeadline: 2s\nmin_attempt_time: 100ms\nattempts: 3\n"
        "backoff: {initial: 1ms, max: 1ms}\n",
        link,
        request(),
    )
    assert 1.95 <= took < 2.7, f"the call ended with its deadline (2 s): {took:.2f}s"
    _, answer = split(outbox)
    report = report_of(answer)
    assert (report["stopReason"], report["attemptCount"]) == ("deadline_exhausted", 2), report["attemptedSteps"]
    first, second = report["attemptedSteps"]
    assert 1450 <= first["durationMs"] < 2000, first
    assert second["durationMs"] < 900, f"attempt 2 got only what was left of the deadline: {second}"
    assert report["elapsedMs"] < 2700
    assert link.cancelled == [m["id"] for m in link.sent]


# -- relaying: token remapped, values kept increasing across attempts ------------------------------


@pytest.mark.parametrize("token", [CALLER_TOKEN, 0], ids=["string", "zero"])
async def test_progress_goes_back_under_the_callers_token_and_never_goes_backwards_across_attempts(
    tmp_path: Path, token: Any
) -> None:
    link = ProgressLink(
        [
            answers((1, "a1 s1"), (2, "a1 s2"), (3, "a1 s3"), then=TRANSIENT),
            # the retry starts counting again: 1..3 would go backwards (or stand still) for the caller
            answers((1, "a2 s1"), (2, "a2 s2"), (3, "a2 s3"), (4, "a2 s4"), (5, "a2 s5"), then=OK),
        ]
    )
    outbox, _ = await call(tmp_path, "attempts: 3\n", link, request(token))
    upstream_tokens = [m["params"]["_meta"]["progressToken"] for m in link.sent]
    assert upstream_tokens == [m["id"] for m in link.sent], "each attempt asks for progress under its own id"
    assert token not in upstream_tokens
    notes, answer = split(outbox)
    assert answer["result"]["content"] == OK["content"]
    assert answer["result"]["_meta"]["io.mcp-recovery-proxy/attempts"] == 2
    assert [n["params"]["progressToken"] for n in notes] == [token] * len(notes)
    assert [(n["params"]["progress"], n["params"]["message"]) for n in notes] == [
        (1, "a1 s1"),
        (2, "a1 s2"),
        (3, "a1 s3"),
        (4, "a2 s4"),
        (5, "a2 s5"),
    ], "attempt 2's 1..3 are dropped, not relayed as lower values"
    assert all(n["params"]["total"] == 10 for n in notes)


# -- progress notes in the unresolved result (`partialResults`) -----------------------------------


async def test_progress_messages_of_failed_attempts_are_partial_results_with_their_attempt(tmp_path: Path) -> None:
    link = ProgressLink(
        [
            answers((1, "scanned 10%"), (2, None), (3, "scanned 30%"), then=TRANSIENT),
            answers((1, "rescanning"), then=TRANSIENT),  # not relayed (backwards), still evidence
        ]
    )
    outbox, _ = await call(tmp_path, "attempts: 2\n", link, request())
    notes, answer = split(outbox)
    assert [n["params"]["progress"] for n in notes] == [1, 2, 3]
    report = report_of(answer)
    assert report["stopReason"] == "attempts_exhausted"
    assert progress_partials(report) == [
        {"source": "progress", "attempt": 1, "content": {"progress": 1, "total": 10, "message": "scanned 10%"}},
        {"source": "progress", "attempt": 1, "content": {"progress": 3, "total": 10, "message": "scanned 30%"}},
        {"source": "progress", "attempt": 2, "content": {"progress": 1, "total": 10, "message": "rescanning"}},
    ], "a progress without a message is no note"
    assert "accept_partial" in [a["action"] for a in report["suggestedActions"]]


@pytest.mark.parametrize("meta", [None, {"io.mcp-recovery-proxy/deadlineMs": 50_000}])
async def test_without_a_caller_token_an_idle_timers_progress_notes_are_partial_results(
    tmp_path: Path, meta: dict[str, Any] | None
) -> None:
    """The idle timer asks the upstream for progress (the caller asked for none): its messages are
    evidence all the same, whether the call's first attempt took the engine's direct path (an
    empty ledger, nothing of the proxy's in `_meta`) or the whole call's."""
    link = ProgressLink(
        [answers((1, "scanned 10%"), (3, "scanned 30%"), then=TRANSIENT), answers((5, "a2"), then=TRANSIENT)]
    )
    params: dict[str, Any] = {"name": "read", "arguments": {"q": 1}}
    if meta is not None:
        params["_meta"] = meta
    outbox, _ = await call(
        tmp_path,
        "idle_timeout: 3s\nattempts: 2\n",
        link,
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params},
    )
    notes, answer = split(outbox)
    assert notes == [], "the caller asked for no progress"
    report = report_of(answer)
    assert [(p["attempt"], p["content"]["message"]) for p in progress_partials(report)] == [
        (1, "scanned 10%"),
        (1, "scanned 30%"),
        (2, "a2"),
    ]
    assert "accept_partial" in [a["action"] for a in report["suggestedActions"]]


async def test_progress_notes_kept_in_a_result_are_bounded_in_number(tmp_path: Path) -> None:
    sent_1 = [(n, f"a1 {n}") for n in range(1, PROGRESS_NOTES + 6)]
    sent_2 = [(n, f"a2 {n}") for n in range(100, 105)]
    link = ProgressLink([answers(*sent_1, then=TRANSIENT), answers(*sent_2, then=TRANSIENT)])
    outbox, _ = await call(tmp_path, "attempts: 2\n", link, request())
    notes, answer = split(outbox)
    assert len(notes) == len(sent_1) + len(sent_2), "relaying is not bounded, only what the result keeps"
    kept = progress_partials(report_of(answer))
    assert len(kept) == PROGRESS_NOTES, len(kept)
    sent = [(1, v, t) for v, t in sent_1] + [(2, v, t) for v, t in sent_2]
    kept_keys = [(p["attempt"], p["content"]["progress"], p["content"]["message"]) for p in kept]
    assert kept_keys == sent[-PROGRESS_NOTES:], "the latest notes (the furthest the call got), in their order"


async def test_progress_notes_kept_in_a_result_are_bounded_in_length(tmp_path: Path) -> None:
    """Cut to PARTIAL_TEXT_LIMIT, as a failed attempt's text in the same list is."""
    huge = "x" * 100_000
    link = ProgressLink([answers(*[(n, huge) for n in range(1, 4)], then=TRANSIENT)])
    outbox, _ = await call(tmp_path, "attempts: 1\n", link, request())
    _, answer = split(outbox)
    kept = progress_partials(report_of(answer))
    assert len(kept) == 3
    assert len(json.dumps(kept)) < 100_000, "three notes of 100 000 characters each, kept whole"
    assert all(len(note["content"]["message"]) == 1000 for note in kept)
