"""What the proxy sheds to stay bounded, counted: process-wide counters with closed label sets.

Contract:
- `SHED.count(metric, label)` adds to one of the counters below; a label outside the metric's
  closed vocabulary is counted as "other", so no peer can grow a series set. Counting never
  raises and takes no lock (it runs on the event loop's thread, as every reader does).
- `ShedCollector` exports them on a Prometheus registry (`MetricsObserver` registers one):
  - `mcp_recovery_dropped_messages_total{reason}`: server messages that reached no client.
    `untied`: on a link several callers share, a message that cannot be tied to exactly one of
    them; `stream_full`: a request's response stream held its byte bound (the answer itself is
    never dropped); `listen_closed`: a listen stream reached its byte bound and was closed;
    `backlog_full`: the bounded backlog of a session without a listen stream.
  - `mcp_recovery_resumption_evictions_total{bound}`: events evicted from the buffers kept for
    SSE resumption, by the bound that evicted them (`stream` or `total`).
  - `mcp_recovery_upstream_read_pauses_total`: times a stdio child's output was paused because
    the client it feeds did not read.
  - `mcp_recovery_stderr_lines_dropped_total`: stdio children's stderr lines not logged (rate
    limit).
  - `mcp_recovery_http_refused_total{reason}`: connections and requests the limits refused or
    closed (docs/security.md "Limits"). `head_too_large` (431), `head_timeout` (408 before a
    complete head), `body_timeout` (408 on a stalled body), `connections` (503, the port's
    connection cap, every connection running a request), `connections_per_client` (503, the
    port's cap per client address), `head_pending` (a connection without a complete request head,
    or idle between requests, closed to make room for a new one at a connection cap), `pipelined`
    (a connection closed once it answered the requests queued behind a running one, past
    `MAX_PIPELINED` of them: proxy/frontend/uvicorn_h1.py), `sessions` (503: `initialize`
    refused, the proxy holds its maximum of sessions and every one is busy),
    `sessions_per_client` (429: the client holds its share and every one is busy),
    `session_starts` (503: `initialize` refused, its own stdio child did not start within the start
    wait, or the queue of child starts made no progress for as long), `upstream_share` (a
    request refused at once: its client has its whole share of the upstream in flight and as
    many requests waiting), `shutdown` (503: a new session, request or listen stream while the
    proxy shuts down), `vouch_rate` (429: passthrough, a session's budget of pings asking the
    upstream about credentials it has not accepted is spent; proxy/auth/vouch.py).
  - `mcp_recovery_relayed_timeouts_total`: relayed requests (not `tools/call`, which its policy
    bounds) the upstream did not answer within the request timeout, answered -32001. No method
    label: a method name is the caller's text, not a closed set.
  - `mcp_recovery_sessions_evicted_total`: idle 2025 sessions closed to make room for a new one
    at `--max-sessions` or `--max-sessions-per-client` (proxy/core/capacity.py).
  - `mcp_recovery_sessions_closed_uninitialized_total`: 2025 sessions closed because nothing
    followed their `initialize` within the session init timeout.
  - `mcp_recovery_resends_total{event}`: re-sends of a state-changing or idempotent `tools/call`
    whose first answer was not delivered (proxy/core/resend.py): `attached` (answered by the
    earlier call's execution, the tool not run again), `kept` (an undelivered answer kept for a
    re-send), `expired` (kept for the whole window, nobody came), `evicted` (dropped for the
    table's bounds), `too_large` (an answer above the per-answer bound, not kept).
  - `mcp_recovery_auth_failures_total{reason}`: requests refused for their credentials or
    scopes, by `proxy.auth.base.REASONS` (the MCP port's 401/403, passthrough's relayed upstream
    401/403, the admin port's bearer token).
Counters are process-wide because the parts that shed (frontends, relays, upstream adapters)
have no telemetry handle; a test reads the difference around what it does.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from proxy.auth.base import REASONS

_METRICS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "dropped_messages": (
        "Server messages that reached no client, by why they were dropped.",
        "reason",
        ("untied", "stream_full", "listen_closed", "backlog_full"),
    ),
    "resumption_evictions": (
        "Events evicted from SSE resumption buffers, by the bound that evicted them.",
        "bound",
        ("stream", "total"),
    ),
    "upstream_read_pauses": ("Times a stdio child's output was paused for a client that did not read.", None, ()),
    "stderr_lines_dropped": ("stdio children's stderr lines not logged (rate limit).", None, ()),
    "http_refused": (
        "HTTP connections and requests refused or closed by the proxy's limits, by which limit.",
        "reason",
        (
            "head_too_large",
            "head_timeout",
            "body_timeout",
            "connections",
            "connections_per_client",
            "head_pending",
            "pipelined",
            "sessions",
            "sessions_per_client",
            "session_starts",
            "upstream_share",
            "shutdown",
            "vouch_rate",
        ),
    ),
    "relayed_timeouts": ("Relayed requests the upstream did not answer within the request timeout.", None, ()),
    "sessions_evicted": (
        "Idle 2025 sessions closed to make room for a new one at the session cap (least recently used first).",
        None,
        (),
    ),
    "sessions_closed_uninitialized": (
        "2025 sessions closed because nothing followed their initialize in time.",
        None,
        (),
    ),
    "auth_failures": (
        "Requests refused for their credentials or scopes (HTTP 401/403), by reason.",
        "reason",
        tuple(sorted(REASONS - {"other"})),
    ),
    "resends": (
        "Re-sent tools/call answered by an earlier identical call's execution, and undelivered answers kept "
        "for them, by event.",
        "event",
        ("attached", "kept", "expired", "evicted", "too_large"),
    ),
}
OTHER = "other"


class Shed:
    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], int] = {}
        for name, (_, label, allowed) in _METRICS.items():
            for value in allowed if label else ("",):
                self.values[(name, value)] = 0

    def count(self, metric: str, label: str = "", n: int = 1) -> None:
        key = (metric, label)
        if key not in self.values:
            key = (metric, OTHER if label else "")
        self.values[key] = self.values.get(key, 0) + n

    def get(self, metric: str, label: str = "") -> int:
        return self.values.get((metric, label), 0)


SHED = Shed()


class ShedCollector:
    def __init__(self, shed: Shed = SHED, prefix: str = "mcp_recovery_") -> None:
        self.shed = shed
        self.prefix = prefix

    def describe(self) -> Iterator[Metric]:
        for name, (doc, label, _) in _METRICS.items():
            yield CounterMetricFamily(self.prefix + name, doc, labels=(label,) if label else ())

    def collect(self) -> Iterator[Metric]:
        for name, (doc, label, _) in _METRICS.items():
            family = CounterMetricFamily(self.prefix + name, doc, labels=(label,) if label else ())
            for (metric, value), n in self.shed.values.items():
                if metric == name:
                    family.add_metric([value] if label else [], n)
            yield family
