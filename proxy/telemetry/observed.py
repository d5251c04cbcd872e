"""What the proxy saw of each tool, kept for drafting better policies: the latency of successful
attempts, the error texts nothing classified, the attempts a timer cut, and the policy rules that
matched. `policies suggest` and the status page read it from `/status.json` ("observed").

Contract:
- `ObservedTools` is a telemetry observer (proxy/telemetry/events.py). It takes `CallSucceeded`
  (a first attempt's success), `AttemptFinished` (every other attempt) and `CallReported` (the
  unresolved report of a call the engine gave up on). It observes and never decides: nothing the
  engine does reads it.
- Per tool: a fixed histogram of successful attempt durations (`BUCKET_COUNT` buckets whose upper
  bounds grow by 2^(1/4), from 1 ms to about an hour, the last one open), their count, sum and
  slowest; the attempts cut by a timer (`result == "timeout"`); the attempts classified
  `unclassified`; the policy rules that matched, by name, with counts.
- The unclassified texts are the last attempt's `detail` of an unresolved report whose
  classification is `defaulted`: the text the caller got, already passed through the proxy's
  redaction (proxy/recovery/redact.py: no credentials, no argument values, one line) and bounded
  again here to `TEXT_LIMIT` characters with `jsonrpc.bounded`. Texts that differ only in their
  digits are one entry (an id in an error message does not make a new one); the first seen is
  kept as the sample.
- Bounded in every dimension, whatever callers or the upstream send: at most `MAX_TOOLS` tools
  (events of further tools are counted in `dropped_tools` and otherwise ignored), `MAX_TEXTS`
  texts per tool (further distinct texts counted in `texts_dropped`), `MAX_RULES` rule names per
  tool (`rules_dropped`), every string cut to its limit. The memory is therefore at most
  `MAX_TOOLS` * (`BUCKET_COUNT` counters + `MAX_TEXTS` * 2 * `TEXT_LIMIT` characters (a text's
  digit-free key and its sample) + `MAX_RULES` * `NAME_LIMIT` characters) plus a constant per
  entry, by construction. Arguments never reach an
  event, so they cannot reach this.
- `snapshot()` is JSON-able (`observed` of `/status.json`): tools sorted by name, texts most
  frequent first, durations in milliseconds, the histogram as `[upper_ms, count]` pairs of its
  non-empty buckets (`null` for the open last one). Called on the event loop, like the events.
- `quantile_ms(buckets, q)` estimates a quantile from those pairs: the upper bound of the bucket
  that holds it (at most 19% above the true value, never below it; the slowest seen for the open
  bucket).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from proxy.jsonrpc import bounded
from proxy.telemetry.events import AttemptFinished, CallReported, CallSucceeded, Event

MAX_TOOLS = 200
MAX_TEXTS = 10
MAX_RULES = 32
TEXT_LIMIT = 300
NAME_LIMIT = 128
FIRST_UPPER_S = 0.001
GROWTH = 2**0.25
BUCKET_COUNT = 90  # 89 bounded buckets up to 0.001 * 2^22 s (about 70 min), and one open
UPPERS_S: tuple[float, ...] = tuple(FIRST_UPPER_S * GROWTH**i for i in range(BUCKET_COUNT - 1))
_LOG_GROWTH = math.log(GROWTH)
_DIGITS = re.compile(r"\d+")


def bucket_of(seconds: float) -> int:
    """The index of the bucket that counts a duration of `seconds`."""
    if seconds <= FIRST_UPPER_S:
        return 0
    index = math.ceil(math.log(seconds / FIRST_UPPER_S) / _LOG_GROWTH - 1e-9)
    if index < len(UPPERS_S) and seconds > UPPERS_S[index]:
        index += 1  # float rounding at a bound
    return min(index, BUCKET_COUNT - 1)


class ToolSeen:
    """What was seen of one tool (see the module contract for the bounds)."""

    __slots__ = (
        "buckets",
        "rules",
        "rules_dropped",
        "slowest_s",
        "successes",
        "sum_s",
        "texts",
        "texts_dropped",
        "timeouts",
        "unclassified",
    )

    def __init__(self) -> None:
        self.buckets = [0] * BUCKET_COUNT
        self.successes = 0
        self.sum_s = 0.0
        self.slowest_s = 0.0
        self.timeouts = 0
        self.unclassified = 0
        # digit-free key -> [count, sample text, outcome, code]
        self.texts: dict[str, list[Any]] = {}
        self.texts_dropped = 0
        self.rules: dict[str, int] = {}
        self.rules_dropped = 0

    def success(self, seconds: float) -> None:
        self.buckets[bucket_of(seconds)] += 1
        self.successes += 1
        self.sum_s += seconds
        if seconds > self.slowest_s:
            self.slowest_s = seconds

    def text(self, text: str, outcome: str, code: Any) -> None:
        text = bounded(text, TEXT_LIMIT)
        key = _DIGITS.sub("0", text)
        entry = self.texts.get(key)
        if entry is not None:
            entry[0] += 1
        elif len(self.texts) < MAX_TEXTS:
            self.texts[key] = [1, text, outcome, code]
        else:
            self.texts_dropped += 1

    def rule(self, name: str) -> None:
        name = bounded(name, NAME_LIMIT)
        if name in self.rules:
            self.rules[name] += 1
        elif len(self.rules) < MAX_RULES:
            self.rules[name] = 1
        else:
            self.rules_dropped += 1

    def as_dict(self, tool: str) -> dict[str, Any]:
        pairs: list[list[Any]] = []
        for index, count in enumerate(self.buckets):
            if count:
                upper = round(UPPERS_S[index] * 1000.0, 3) if index < len(UPPERS_S) else None
                pairs.append([upper, count])
        slowest_ms = round(self.slowest_s * 1000.0, 3)
        texts = sorted(self.texts.values(), key=lambda e: (-e[0], e[1]))
        return {
            "tool": tool,
            "successes": self.successes,
            "mean_ms": round(self.sum_s / self.successes * 1000.0, 3) if self.successes else None,
            "p50_ms": quantile_ms(pairs, 0.5, slowest_ms),
            "p99_ms": quantile_ms(pairs, 0.99, slowest_ms),
            "slowest_ms": slowest_ms if self.successes else None,
            "latency_buckets": pairs,
            "timeouts": self.timeouts,
            "unclassified": self.unclassified,
            "texts": [{"text": e[1], "count": e[0], "outcome": e[2], "code": e[3]} for e in texts],
            "texts_dropped": self.texts_dropped,
            "rules_matched": dict(sorted(self.rules.items())),
            "rules_dropped": self.rules_dropped,
        }


def quantile_ms(pairs: Sequence[Sequence[Any]], q: float, slowest_ms: float | None = None) -> float | None:
    """The `q` quantile of a histogram given as `[upper_ms, count]` pairs (upper `None`: the
    open last bucket, whose estimate is `slowest_ms`); None when it counts nothing."""
    total = sum(int(count) for _, count in pairs)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for upper, count in pairs:
        seen += int(count)
        if seen >= rank:
            if upper is None:
                return slowest_ms
            # the bucket's bound, never above the slowest seen (which is in this bucket or later)
            return min(float(upper), slowest_ms) if slowest_ms else float(upper)
    return slowest_ms


class ObservedTools:
    needs_starts = False  # nothing is read from CallStarted or a first AttemptStarted
    needs_call_ids = False  # no call id is kept

    def __init__(self, *, wall: Callable[[], float] = time.time) -> None:
        self.tools: dict[str, ToolSeen] = {}
        self.dropped_tools = 0  # events of tools past MAX_TOOLS
        self.since = wall()

    def handler_for(self, event_type: type) -> Callable[[Any], None] | None:
        if event_type is CallSucceeded:
            return self._succeeded
        if event_type is AttemptFinished:
            return self._attempt
        if event_type is CallReported:
            return self._reported
        return None

    def on_event(self, event: Event) -> None:
        handler = self.handler_for(type(event))
        if handler is not None:
            handler(event)

    def _tool(self, tool: str) -> ToolSeen | None:
        seen = self.tools.get(tool)
        if seen is None:
            key = bounded(tool, NAME_LIMIT)  # labels are catalog names: a long one is rare
            seen = self.tools.get(key)
            if seen is None:
                if len(self.tools) >= MAX_TOOLS:
                    self.dropped_tools += 1
                    return None
                seen = self.tools[key] = ToolSeen()
        return seen

    def _succeeded(self, event: CallSucceeded) -> None:
        seen = self._tool(event.tool)
        if seen is not None:
            seen.success(event.attempt_s)

    def _attempt(self, event: AttemptFinished) -> None:
        seen = self._tool(event.tool)
        if seen is None:
            return
        if event.result == "success":
            seen.success(event.duration_s)
            return
        if event.result == "timeout":
            seen.timeouts += 1
        if event.category == "unclassified":
            seen.unclassified += 1
        if event.evidence == "rule" and event.rule:
            seen.rule(event.rule)

    def _reported(self, event: CallReported) -> None:
        report = event.report
        classification = report.get("classification")
        if not isinstance(classification, dict) or classification.get("defaulted") is not True:
            return
        steps = report.get("attemptedSteps")
        if not isinstance(steps, list) or not steps or not isinstance(steps[-1], dict):
            return  # refused before an attempt (the ledger): no text of this call's own
        last = steps[-1]
        detail = last.get("detail")
        if not isinstance(detail, str) or not detail:
            return
        seen = self._tool(event.tool)
        if seen is None:
            return
        code = classification.get("code")
        outcome = last.get("outcome")
        seen.text(
            detail,
            outcome if isinstance(outcome, str) else "unknown",
            code if isinstance(code, int) and not isinstance(code, bool) else None,
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "since": round(self.since, 3),
            "limits": {
                "tools": MAX_TOOLS,
                "texts_per_tool": MAX_TEXTS,
                "text_chars": TEXT_LIMIT,
                "rules_per_tool": MAX_RULES,
            },
            "dropped_tools": self.dropped_tools,
            "tools": [seen.as_dict(tool) for tool, seen in sorted(self.tools.items())],
        }
