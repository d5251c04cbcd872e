"""The status page's observer: a bounded memory of recent calls and per-tool rates, built from events.

Contract:
- `StatusObserver` takes finished calls (`CallSucceeded`, `CallFinished`), the attempts of calls
  that needed more than one answer (`AttemptFinished`) and unresolved reports (`CallReported`).
  It observes and never decides (DESIGN.md principle 5): nothing the engine does reads it.
- Bounded in every dimension: `recent` holds the last `ring` finished calls, `problems` the last
  `ring` that did not end in success or recovery (so a burst of successes cannot push the
  unresolved calls out of sight); attempts are kept for at most `MAX_OPEN` calls in flight (the
  oldest forgotten), reports for at most `MAX_OPEN` calls not yet finished; per-tool counters
  for `BUCKETS` buckets of `bucket_s` seconds and at most `MAX_TOOLS` tools per bucket (the rest
  counted under "other").
- What it keeps is what the events carry: tool label (a name the upstream listed, or "other"),
  principal id where authentication is on, outcome, stop reason, category, attempts with their
  result, category, dispatch and evidence, durations, and the unresolved report exactly as the
  caller got it (already redacted and bounded by proxy/recovery/report.py: no argument values,
  no credentials). Arguments never reach an event, so they cannot reach this ring. The admin
  page passes everything through the secret registry again on the way out.
- Cost on the hot path: a first-attempt success is one tuple appended to a deque and one counter
  row updated (`_succeeded`); `needs_starts` and `needs_call_ids` are False, so the engine builds
  no extra event and formats no call id for it.
- `snapshot(now_wall_s)` returns JSON-able lists, newest first, for `/status.json`; called on the
  event loop (the observer is not thread-safe, and needs not be: events and reads share the loop).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from proxy.jsonrpc import bounded
from proxy.telemetry.events import AttemptFinished, CallFinished, CallReported, CallSucceeded, Event

MAX_OPEN = 1024
MAX_TOOLS = 200
BUCKETS = 60
LABEL_LIMIT = 128
REPORT_LIMIT = 16_000  # characters of a report's JSON kept for the page

_OK_OUTCOMES = frozenset({"success", "recovered"})


class StatusObserver:
    needs_starts = False  # nothing here is read from CallStarted or a first AttemptStarted
    needs_call_ids = False  # a first-attempt success is shown without its id (formatting it costs)

    def __init__(
        self,
        *,
        ring: int = 200,
        bucket_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if ring < 1 or bucket_s <= 0:
            raise ValueError("ring must be at least 1 and bucket_s positive")
        self.bucket_s = bucket_s
        self._per_s = 1.0 / bucket_s
        self._clock = clock
        self._wall = wall
        # (monotonic instant, event, attempts, report): the event itself for a first-attempt success
        self.recent: deque[tuple[float, Event, tuple[Any, ...], Any]] = deque(maxlen=ring)
        self.problems: deque[tuple[float, Event, tuple[Any, ...], Any]] = deque(maxlen=ring)
        self._attempts: OrderedDict[str, list[AttemptFinished]] = OrderedDict()
        self._reports: OrderedDict[str, Any] = OrderedDict()
        # per bucket: {tool: [calls, failed, seconds summed, slowest, retries]}
        self._bucket = -1
        self._current: dict[str, list[float]] = {}
        self._history: deque[tuple[int, dict[str, list[float]]]] = deque(maxlen=BUCKETS)
        self.totals: dict[str, list[float]] = {}

    # ------------------------------------------------------------------------------ events

    def handler_for(self, event_type: type) -> Callable[[Any], None] | None:
        if event_type is CallSucceeded:
            return self._succeeded
        if event_type is CallFinished:
            return self._finished
        if event_type is AttemptFinished:
            return self._attempt
        if event_type is CallReported:
            return self._reported
        return None

    def on_event(self, event: Event) -> None:
        handler = self.handler_for(type(event))
        if handler is not None:
            handler(event)

    def _succeeded(self, event: CallSucceeded) -> None:
        now = self._clock()
        self.recent.append((now, event, (), None))
        self._count(now, event.tool, event.duration_s, 0.0, 0)

    def _attempt(self, event: AttemptFinished) -> None:
        attempts = self._attempts.get(event.call_id)
        if attempts is None:
            if len(self._attempts) >= MAX_OPEN:
                self._attempts.popitem(last=False)
            attempts = self._attempts[event.call_id] = []
        attempts.append(event)

    def _reported(self, event: CallReported) -> None:
        if len(self._reports) >= MAX_OPEN:
            self._reports.popitem(last=False)
        # A copy, bounded: the report is the caller's result, which the observer must not hold.
        text = orjson.dumps(event.report, default=str).decode()
        self._reports[event.call_id] = orjson.loads(text) if len(text) <= REPORT_LIMIT else bounded(text, REPORT_LIMIT)

    def _finished(self, event: CallFinished) -> None:
        now = self._clock()
        attempts = tuple(self._attempts.pop(event.call_id, ()))
        report = self._reports.pop(event.call_id, None)
        entry = (now, event, attempts, report)
        self.recent.append(entry)
        failed = event.outcome not in _OK_OUTCOMES
        if failed:
            self.problems.append(entry)
        self._count(now, event.tool, event.duration_s, 1.0 if failed else 0.0, max(0, event.attempts - 1))

    def _count(self, now: float, tool: str, duration_s: float, failed: float, retries: int) -> None:
        bucket = int(now * self._per_s)
        if bucket != self._bucket:
            self._roll(bucket)
        current = self._current
        row = current.get(tool)
        if row is None:
            if len(current) >= MAX_TOOLS:
                tool = "other"
                row = current.get(tool)
            if row is None:
                row = current[tool] = [0.0, 0.0, 0.0, 0.0, 0.0]
        row[0] += 1.0
        row[1] += failed
        row[2] += duration_s
        if duration_s > row[3]:
            row[3] = duration_s
        row[4] += retries

    def _roll(self, bucket: int) -> None:
        if self._bucket >= 0:
            self._fold(self._current)
        self._bucket = bucket
        self._current = {}
        self._history.append((bucket, self._current))

    def _fold(self, rows: Mapping[str, list[float]]) -> None:
        totals = self.totals
        for tool, row in rows.items():
            total = totals.get(tool)
            if total is None:
                if len(totals) >= MAX_TOOLS and "other" in totals:
                    total = totals["other"]
                else:
                    total = totals[tool] = [0.0, 0.0, 0.0, 0.0, 0.0]
            total[0] += row[0]
            total[1] += row[1]
            total[2] += row[2]
            total[3] = max(total[3], row[3])
            total[4] += row[4]

    # ------------------------------------------------------------------------------ reads

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        offset = self._wall() - now
        return {
            "bucket_s": self.bucket_s,
            "recent": [_call(entry, offset) for entry in reversed(self.recent)],
            "problems": [_call(entry, offset) for entry in reversed(self.problems)],
            "tools": self._series(now),
        }

    def _series(self, now: float) -> list[dict[str, Any]]:
        """Per tool, one point per bucket of the last `BUCKETS` (oldest first): calls per second,
        failed calls per second, mean and slowest duration in ms, retries per second."""
        last = int(now * self._per_s)
        first = last - BUCKETS + 1
        by_bucket = {bucket: rows for bucket, rows in self._history if bucket >= first}
        tools: set[str] = set()
        for rows in by_bucket.values():
            tools.update(rows)
        out = []
        for tool in sorted(tools):
            calls: list[float] = []
            failed: list[float] = []
            mean_ms: list[float | None] = []
            max_ms: list[float | None] = []
            retries: list[float] = []
            for bucket in range(first, last + 1):
                row = by_bucket.get(bucket, {}).get(tool)
                if row is None:
                    calls.append(0.0)
                    failed.append(0.0)
                    mean_ms.append(None)
                    max_ms.append(None)
                    retries.append(0.0)
                    continue
                calls.append(round(row[0] * self._per_s, 3))
                failed.append(round(row[1] * self._per_s, 3))
                mean_ms.append(round(row[2] / row[0] * 1000.0, 2) if row[0] else None)
                max_ms.append(round(row[3] * 1000.0, 2))
                retries.append(round(row[4] * self._per_s, 3))
            window = [by_bucket[b][tool] for b in by_bucket if tool in by_bucket[b]]
            n = sum(r[0] for r in window)
            out.append(
                {
                    "tool": bounded(tool, LABEL_LIMIT),
                    "calls": int(n),
                    "failed": int(sum(r[1] for r in window)),
                    "retries": int(sum(r[4] for r in window)),
                    "mean_ms": round(sum(r[2] for r in window) / n * 1000.0, 2) if n else None,
                    "calls_per_s": calls,
                    "failed_per_s": failed,
                    "retries_per_s": retries,
                    "mean_ms_series": mean_ms,
                    "max_ms_series": max_ms,
                }
            )
        return out


def _call(entry: tuple[float, Event, tuple[Any, ...], Any], offset: float) -> dict[str, Any]:
    at, event, attempts, report = entry
    if isinstance(event, CallSucceeded):
        attempt, finished = event.as_finished()
        attempts = (attempt,)
        event = finished
    assert isinstance(event, CallFinished)
    return {
        "at": round(at + offset, 3),
        "call_id": event.call_id or None,
        "tool": bounded(event.tool, LABEL_LIMIT),
        "principal": bounded(event.principal, LABEL_LIMIT) if event.principal is not None else None,
        "outcome": event.outcome,
        "stop_reason": event.stop_reason,
        "category": event.category,
        "outcome_unknown": event.outcome_unknown,
        "attempt_count": event.attempts,
        "duration_ms": round(event.duration_s * 1000.0, 2),
        "backoff_ms": round(event.backoff_s * 1000.0, 2),
        "attempts": [
            {
                "number": a.number,
                "result": a.result,
                "category": a.category,
                "dispatched": a.dispatched,
                "evidence": a.evidence,
                "duration_ms": round(a.duration_s * 1000.0, 2),
            }
            for a in attempts
        ],
        "report": report,
    }
