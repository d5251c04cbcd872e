"""One structured log line per finished tools/call, on the logger `proxy.calls`.

Contract:
- Fields (as `extra`, so `--log-json` writes them as JSON keys): call_id, tool, outcome,
  stop_reason, category, attempts, duration_ms, outcome_unknown, principal when authentication
  is on (the principal's id, never its credential), and trace_id when tracing is on.
  Never arguments, results or secrets: the events carry none.
- The message repeats the fields as `key=value` so plain-text logs read the same.
- The tool name is the upstream's text: one longer than `LABEL_LIMIT` (128) characters is written
  cut to that (in the message and the field), as the status page shows it.
- Level: INFO for success, recovered, tool_error and cancelled; WARNING for unresolved calls
  (the proxy gave up while the caller wanted an answer).
- Which calls (`--call-log`): `problems` (the default) logs every call except a first-attempt
  success — those are counted by the metrics, and a line per healthy call is both noise and the
  costliest telemetry of the request path; `all` logs every call; `off` none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from proxy.jsonrpc import bounded
from proxy.telemetry.events import CallFinished, CallSucceeded, Event
from proxy.telemetry.status import LABEL_LIMIT

CALL_LOGGER = "proxy.calls"
CallLogMode = Literal["all", "problems", "off"]


class CallLogObserver:
    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        trace_id: Callable[[str], str | None] | None = None,
        mode: CallLogMode = "all",
    ) -> None:
        self.logger = logger or logging.getLogger(CALL_LOGGER)
        self._trace_id = trace_id
        self._off = mode == "off"
        self._skip_success = mode != "all"

    needs_starts = False  # it logs finished calls only

    def handler_for(self, event_type: type) -> Callable[[Event], None] | None:
        """`Telemetry`'s routing: only the events this mode logs reach the observer."""
        if self._off:
            return None
        if event_type is CallFinished or (event_type is CallSucceeded and not self._skip_success):
            return self.on_event
        return None

    def on_event(self, event: Event) -> None:
        if self._off:
            return
        if isinstance(event, CallSucceeded):
            if self._skip_success:
                return
            event = event.as_finished()[1]
        elif not isinstance(event, CallFinished):
            return
        if self._skip_success and event.outcome == "success":
            return
        level = logging.WARNING if event.outcome == "unresolved" else logging.INFO
        if not self.logger.isEnabledFor(level):
            return
        tool = bounded(event.tool, LABEL_LIMIT)
        fields: dict[str, object] = {
            "call_id": event.call_id,
            "tool": tool,
            "outcome": event.outcome,
            "stop_reason": event.stop_reason,
            "category": event.category,
            "attempts": event.attempts,
            "duration_ms": round(event.duration_s * 1000.0, 1),
            "outcome_unknown": event.outcome_unknown,
        }
        if event.principal is not None:
            fields["principal"] = event.principal
        if self._trace_id is not None:
            trace_id = self._trace_id(event.call_id)
            if trace_id:
                fields["trace_id"] = trace_id
        text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and k != "tool")
        # makeRecord + handle skips Logger.log's stack walk for the caller (findCaller), the
        # costliest part of a log line on this path; the record is otherwise the same.
        record = self.logger.makeRecord(
            self.logger.name, level, __file__, 0, "tools/call %s %s", (tool, text), None, extra=fields
        )
        self.logger.handle(record)
