"""The relay's attempt timers at a chosen moment, for the tests of an attempt cut while its link
is sending it: a 2025 session's relay with the engine, serving one state-changing tool, and the
timers it starts, which a server callback can fire the moment a request's bytes arrive (before
the caller's task resumes)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.deadlines import AttemptTimer, Deadlines
from proxy.core.engine import Engine
from proxy.core.relay import Relay, ToolCatalog
from proxy.policy.compile import compile_files
from proxy.upstream.base import UpstreamLink

# Its attempt timeout is its deadline: the attempt timer's one entry stands for the moment it is
# fired (`AttemptTimers.fire_latest`), whether or not the request was handed over by then.
POLICY = b"tools: [charge]\nattempts: 3\ndeadline: 20s\nattempt_timeout: 20s\n"


def state_changing_relay(link: UpstreamLink) -> Relay:
    """A 2025 session's relay, the engine handling its tool calls, that knows one tool: `charge`,
    unannotated, so state-changing (never retried once it may have run)."""
    catalog = ToolCatalog()
    catalog.observe({"tools": [{"name": "charge", "inputSchema": {"type": "object"}}]})
    policies = compile_files([("charge.yaml", "charge.yaml", POLICY)])
    engine = Engine(policies=lambda: policies, rand=lambda: 0.0)
    return Relay(link, catalog=catalog, tool_calls=engine, session_id="s1")  # type: ignore[arg-type]


CHARGE = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "charge", "arguments": {}}}


class AttemptTimers:
    """Every attempt timer started while it is installed (`Deadlines.start`, wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[tuple[Deadlines, AttemptTimer]] = []
        start = Deadlines.start

        def recording(deadlines: Deadlines, *args: Any, **kwargs: Any) -> AttemptTimer:
            timer = start(deadlines, *args, **kwargs)
            self.started.append((deadlines, timer))
            return timer

        monkeypatch.setattr(Deadlines, "start", recording)

    def fire_latest(self) -> None:
        """The latest attempt's timer comes due now: what the loop timer does at its moment."""
        deadlines, timer = self.started[-1]
        deadlines.fire(timer)
