"""Which timer cut an attempt, said so that a person can change it.

Contract:
- `cut_by(policy, timeout_s, idle_s, deadline_s)` names the timer that ended an attempt the proxy
  stopped waiting for: the policy's `idle_timeout` (when the relay's idle timer fired, `idle_s`),
  its `attempt_timeout` (the attempt's hard timeout was the policy's, not what the deadline left),
  the policy's `deadline`, or the caller's own `io.mcp-recovery-proxy/deadlineMs` (a call deadline
  shorter than the policy's). It returns a `Cut`: the policy key, the value in seconds and where
  the value came from (`ToolPolicy.sources`: a file and key, `built-in`, or derived).
- `Cut.detail(number)` is the one-line account in an attempt's `detail` (bounded by the report):
  the timer, its value, the key that changes it and where it is set (the file's name, not its
  folder), e.g. "attempt 1: no answer and no progress for 30s: cut by idle_timeout 30s
  (search.yaml:idle_timeout); raise it, or set idle_timeout: null to let a silent tool run to the
  deadline".
Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.jsonrpc import META_DEADLINE_MS, bounded
from proxy.policy.compiled import ToolPolicy

_SLACK_S = 0.001  # float noise between a timer's value and the same value computed from instants

_HINTS = {
    "idle_timeout": "raise it, or set idle_timeout: null to let a silent tool run to the deadline",
    "attempt_timeout": "raise it (up to the deadline), or remove it to let an attempt use the whole deadline",
    "deadline": "raise it only for clients that wait longer than it (the MCP SDK clients give up after 60 s)",
    "caller_deadline": "the caller asked for this deadline; send a longer one, or none",
}


@dataclass(frozen=True, slots=True)
class Cut:
    key: str  # idle_timeout | attempt_timeout | deadline | caller_deadline
    value_s: float
    source: str  # where the value was set ("policies/defaults.yaml:idle_timeout", "built-in", ...)

    def detail(self, number: int) -> str:
        value = f"{self.value_s:.3g}s"
        if self.key == "idle_timeout":
            what = f"attempt {number}: no answer and no progress for {value}: cut by idle_timeout {value}"
        elif self.key == "caller_deadline":
            what = f"attempt {number} got no answer before the caller's deadline ({META_DEADLINE_MS}) of {value}"
        else:
            what = f"attempt {number} got no answer within {value}: cut by {self.key} {value}"
        where = f" ({bounded(_where(self.source), 120)})" if self.source else ""
        return f"{what}{where}; {_HINTS[self.key]}"


def _where(source: str) -> str:
    """A policy source as a person finds it: the file's name and key (a folder path says nothing a
    model needs, and can say too much); the shipped defaults as such."""
    if source.startswith("<built-in>/"):
        return "the shipped " + source.removeprefix("<built-in>/")
    return source.rsplit("/", 1)[-1]


def cut_by(policy: ToolPolicy, timeout_s: float, idle_s: float | None, deadline_s: float) -> Cut:
    """The timer that ended an attempt whose hard timeout was `timeout_s` (see the module contract).
    `deadline_s` is the call's effective deadline (the policy's, or the caller's shorter one)."""
    sources = policy.sources
    if idle_s is not None:
        return Cut("idle_timeout", idle_s, sources.get("idle_timeout_s", ""))
    if timeout_s >= policy.attempt_timeout_s - _SLACK_S and policy.attempt_timeout_s < deadline_s - _SLACK_S:
        return Cut("attempt_timeout", policy.attempt_timeout_s, sources.get("attempt_timeout_s", ""))
    if deadline_s < policy.deadline_s - _SLACK_S:
        return Cut("caller_deadline", deadline_s, "")
    return Cut("deadline", policy.deadline_s, sources.get("deadline_s", ""))
