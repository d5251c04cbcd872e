"""OpenTelemetry traces from the engine's events, on the proxy's OWN TracerProvider.

Contract:
- One span per tools/call, `tools/call {tool}`, kind SERVER, whose parent is the caller's W3C
  context: `CallStarted.trace_meta` (`traceparent`/`tracestate` from `params._meta`, reserved for
  this by the 2026 spec) when it carries a traceparent, else `CallStarted.trace_headers`, else a
  new trace. One child span per attempt, kind CLIENT, with the OpenTelemetry MCP attributes
  (`mcp.method.name`, `gen_ai.tool.name`, `mcp.session.id`, `error.type`) and `mcp_recovery.*`.
  Backoffs are events on the call span; the call span carries stop reason, side-effect class,
  attempts and outcome.
- `attempt_context(call_id, number)` returns `{"traceparent": ..., ["tracestate": ...]}` for that
  attempt's span (created on demand, so the engine may ask before or after `AttemptStarted`), or
  None when the call is unknown: the caller's context then passes through untouched.
- The global tracer provider is never set: the mcp SDK opens spans and injects context itself
  whenever a global provider exists, which would duplicate or break our traces.
- Span state is bounded: at most `max_open_calls` calls are open; opening one more ends the oldest
  (marked `mcp_recovery.evicted`), so calls that never finish cannot leak.
- Every attribute, span name and status text passes `_set`/`_safe`, which remove the proxy's own
  credentials (proxy/secret_values.py) before the span can be exported.
- `build_tracing()` reads the standard `OTEL_*` variables and returns None (tracing off) when no
  exporter is configured; tests pass an `exporter` (or a `processor`) instead.
- A collector that does not answer is reported once, not per batch: the OTLP exporter is wrapped
  (`QuietWhileDown`) so that its first failed export logs (the exporter's own lines and one warning
  of ours), later failures only count dropped spans, and the first success after them logs that
  export resumed with how many spans were dropped meanwhile.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.jsonrpc import bounded
from proxy.secret_values import SECRETS
from proxy.telemetry.events import (
    AttemptFinished,
    AttemptStarted,
    BackoffStarted,
    CallFinished,
    CallStarted,
    CallSucceeded,
    Event,
)
from proxy.telemetry.status import LABEL_LIMIT

log = logging.getLogger("proxy.telemetry.tracing")

SERVICE_NAME = "mcp-recovery-proxy"
METHOD = "tools/call"
_PROPAGATOR = TraceContextTextMapPropagator()
_FAILED_OUTCOMES = frozenset({"unresolved", "tool_error"})
MAX_ATTEMPT_SPANS = 32  # per call; far above any sane max_attempts


@dataclass(slots=True)
class _OpenCall:
    span: Span
    context: Context
    tool: str
    session_id: str | None
    attempts: dict[int, Span] = field(default_factory=dict)


AttributeValue = str | int | float | bool


def _set(span: Span, key: str, value: AttributeValue) -> None:
    """The one attribute setter: text leaves the proxy in spans, so the proxy's own credentials
    are removed from it first (proxy/secret_values.py)."""
    span.set_attribute(key, SECRETS.scrub(value) if isinstance(value, str) else value)


def _safe(attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    return {k: SECRETS.scrub(v) if isinstance(v, str) else v for k, v in attributes.items()}


class TracingObserver:
    """Opens and ends spans as events arrive; hands out each attempt's W3C context."""

    def __init__(self, provider: TracerProvider, *, max_open_calls: int = 10_000) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("mcp_recovery_proxy", _package_version())
        self._max_open = max_open_calls
        self._calls: OrderedDict[str, _OpenCall] = OrderedDict()

    @property
    def open_calls(self) -> int:
        return len(self._calls)

    # ------------------------------------------------------------------------------ events

    def on_event(self, event: Event) -> None:
        match event:
            case CallStarted():
                self._call_started(event)
            case AttemptStarted():
                call = self._calls.get(event.call_id)
                if call is not None:
                    span = self._attempt_span(call, event.number)
                    if span is not None:
                        _set(span, "mcp_recovery.attempt_timeout_s", event.timeout_s)
            case AttemptFinished():
                self._attempt_finished(event)
            case BackoffStarted():
                call = self._calls.get(event.call_id)
                if call is not None:
                    call.span.add_event(
                        "mcp_recovery.backoff",
                        {"mcp_recovery.next_attempt": event.next_attempt, "mcp_recovery.delay_s": event.delay_s},
                    )
            case CallFinished():
                self._call_finished(event)
            case CallSucceeded():
                attempt, finished = event.as_finished()
                self._attempt_finished(attempt)
                self._call_finished(finished)
            case _:
                pass

    def _call_started(self, event: CallStarted) -> None:
        parent = _caller_context(event.trace_meta, event.trace_headers)
        tool = bounded(event.tool, LABEL_LIMIT)  # the upstream's text: cut as the logs and the status page cut it
        attributes: dict[str, str | int | float | bool] = {
            "mcp.method.name": METHOD,
            "gen_ai.tool.name": tool,
            "gen_ai.operation.name": "execute_tool",
            "mcp_recovery.side_effect": event.side_effect,
            "mcp_recovery.era": event.era,
            "mcp_recovery.policy_version": event.policy_version,
            "mcp_recovery.max_attempts": event.max_attempts,
            "mcp_recovery.deadline_s": event.deadline_s,
        }
        if event.session_id:
            attributes["mcp.session.id"] = event.session_id
        if event.principal is not None:
            attributes["mcp_recovery.principal"] = event.principal
        span = self._tracer.start_span(
            SECRETS.scrub(f"{METHOD} {tool}"), context=parent, kind=SpanKind.SERVER, attributes=_safe(attributes)
        )
        previous = self._calls.pop(event.call_id, None)
        if previous is not None:  # a reused call id: close the stale call rather than orphan it
            self._evict(previous)
        while len(self._calls) >= self._max_open:
            _, oldest = self._calls.popitem(last=False)
            self._evict(oldest)
        self._calls[event.call_id] = _OpenCall(span, trace.set_span_in_context(span), tool, event.session_id)

    def _attempt_span(self, call: _OpenCall, number: int) -> Span | None:
        span = call.attempts.get(number)
        if span is None:
            if len(call.attempts) >= MAX_ATTEMPT_SPANS:
                return None
            attributes: dict[str, str | int] = {
                "mcp.method.name": METHOD,
                "gen_ai.tool.name": call.tool,
                "gen_ai.operation.name": "execute_tool",
                "mcp_recovery.attempt": number,
            }
            if call.session_id:
                attributes["mcp.session.id"] = call.session_id
            span = self._tracer.start_span(
                SECRETS.scrub(f"{METHOD} {call.tool}"),
                context=call.context,
                kind=SpanKind.CLIENT,
                attributes=_safe(attributes),
            )
            call.attempts[number] = span
        return span

    def _attempt_finished(self, event: AttemptFinished) -> None:
        call = self._calls.get(event.call_id)
        if call is None:
            return
        span = self._attempt_span(call, event.number)
        if span is None:
            return
        call.attempts.pop(event.number, None)
        _set(span, "mcp_recovery.result", event.result)
        _set(span, "mcp_recovery.dispatched", event.dispatched)
        _set(span, "mcp_recovery.evidence", event.evidence)
        if event.category is not None:
            _set(span, "mcp_recovery.category", event.category)
        if event.result != "success":
            _set(span, "error.type", event.result)
            span.set_status(Status(StatusCode.ERROR, SECRETS.scrub(event.category or event.result)))
        span.end()

    def _call_finished(self, event: CallFinished) -> None:
        call = self._calls.pop(event.call_id, None)
        if call is None:
            return
        for number, attempt in sorted(call.attempts.items()):  # attempts the engine never reported finished
            _set(attempt, "mcp_recovery.result", "abandoned")
            _set(attempt, "mcp_recovery.attempt", number)
            attempt.end()
        span = call.span
        _set(span, "mcp_recovery.outcome", event.outcome)
        _set(span, "mcp_recovery.attempts", event.attempts)
        _set(span, "mcp_recovery.backoff_s", event.backoff_s)
        _set(span, "mcp_recovery.outcome_unknown", event.outcome_unknown)
        if event.stop_reason is not None:
            _set(span, "mcp_recovery.stop_reason", event.stop_reason)
        if event.category is not None:
            _set(span, "mcp_recovery.category", event.category)
        if event.outcome in _FAILED_OUTCOMES:
            # The MCP conventions name a tool result with isError=true `tool_error`.
            error_type = "tool_error" if event.outcome == "tool_error" else event.stop_reason or "unresolved"
            _set(span, "error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, SECRETS.scrub(event.stop_reason or event.outcome)))
        elif event.outcome == "cancelled":
            _set(span, "error.type", "cancelled")
        span.end()

    def _evict(self, call: _OpenCall) -> None:
        for attempt in call.attempts.values():
            attempt.end()
        _set(call.span, "mcp_recovery.evicted", True)
        call.span.end()

    # ------------------------------------------------------------------------------ context

    def attempt_context(self, call_id: str, number: int) -> dict[str, str] | None:
        call = self._calls.get(call_id)
        if call is None:
            return None
        span = self._attempt_span(call, number)
        if span is None:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier or None

    def trace_id(self, call_id: str) -> str | None:
        """The hex trace id of an open call (for log correlation), or None."""
        call = self._calls.get(call_id)
        if call is None:
            return None
        ctx = call.span.get_span_context()
        return format(ctx.trace_id, "032x") if ctx.is_valid else None

    # ------------------------------------------------------------------------------ lifecycle

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        for call in list(self._calls.values()):
            self._evict(call)
        self._calls.clear()
        self.provider.shutdown()


def _caller_context(meta: Mapping[str, str], headers: Mapping[str, str]) -> Context | None:
    """The caller's W3C context: `_meta` wins when it holds a traceparent, else the HTTP headers."""
    for carrier in (meta, headers):
        if carrier and _get(carrier, "traceparent"):
            entries = {"traceparent": _get(carrier, "traceparent") or ""}
            state = _get(carrier, "tracestate")
            if state:
                entries["tracestate"] = state
            ctx = _PROPAGATOR.extract(entries)
            if trace.get_current_span(ctx).get_span_context().is_valid:
                return ctx
    return None


def _get(carrier: Mapping[str, str], key: str) -> str | None:
    value = carrier.get(key)
    if value is None:  # HTTP header names arrive in any case
        for name, item in carrier.items():
            if name.lower() == key:
                value = item
                break
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------------------------- set-up


def build_tracing(
    environ: Mapping[str, str] | None = None,
    *,
    exporter: SpanExporter | None = None,
    processor: SpanProcessor | None = None,
    batch: bool = True,
    max_open_calls: int = 10_000,
) -> TracingObserver | None:
    """A tracing observer on a private TracerProvider, or None when tracing is off.

    With `processor` or `exporter` given, those are used (an exporter behind a BatchSpanProcessor,
    or a SimpleSpanProcessor with `batch=False`); otherwise the exporters come from the standard
    `OTEL_*` variables (see `exporters_from_env`).
    """
    env = os.environ if environ is None else environ
    if processor is not None:
        processors = [processor]
    elif exporter is not None:
        processors = [BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)]
    else:
        processors = [BatchSpanProcessor(e) for e in exporters_from_env(env)]
    if not processors:
        return None
    provider = TracerProvider(resource=_resource())
    for p in processors:
        provider.add_span_processor(p)
    return TracingObserver(provider, max_open_calls=max_open_calls)


def exporters_from_env(env: Mapping[str, str]) -> list[SpanExporter]:
    """Span exporters named by `OTEL_TRACES_EXPORTER` (otlp, console, none).

    Unlike the SDK's default (otlp), an unset `OTEL_TRACES_EXPORTER` means off unless an OTLP
    endpoint is configured: a proxy nobody pointed at a collector should not try to reach one.
    `OTEL_SDK_DISABLED=true` turns tracing off.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
    elif env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        names = ["otlp"]
    else:
        names = []
    out: list[SpanExporter] = []
    for name in names:
        if name == "none":
            return []
        if name == "otlp":
            exporter = _otlp_exporter(env)
            if exporter is not None:
                out.append(QuietWhileDown(exporter))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out.append(ConsoleSpanExporter(out=sys.stderr))  # stdout may carry MCP over stdio
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console, none); ignored", name)
    return out


# Where the OTLP exporters (HTTP and gRPC) log their failed exports.
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)


class QuietWhileDown(SpanExporter):
    """An exporter that reports an unreachable collector once rather than at every batch.

    Why: a proxy started with an endpoint whose collector is not running (the compose file's
    default without its `observability` profile, or a collector being redeployed) would otherwise
    log an error every few seconds under traffic. While down, the wrapped exporter's own log
    records are filtered out and the spans of each failed batch are counted; the first success
    says how many were dropped.
    """

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.down = False
        self.dropped = 0
        self._filtered = [logging.getLogger(name) for name in _EXPORTER_LOGGERS]
        for logger in self._filtered:
            logger.addFilter(self._filter)

    def _filter(self, record: logging.LogRecord) -> bool:
        return not self.down

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            if self.down:
                self.down = False
                log.info("span export resumed; %d spans were dropped while the collector did not answer", self.dropped)
                self.dropped = 0
            return result
        self.dropped += len(spans)
        if not self.down:
            self.down = True
            log.warning(
                "spans cannot be exported: the OTLP collector does not answer; its batches are "
                "dropped, and not logged again until an export succeeds"
            )
        return result

    def shutdown(self) -> None:
        for logger in self._filtered:
            logger.removeFilter(self._filter)
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter | None:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.error(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter, an optional extra: "
                "pip install 'mcp-recovery-proxy[otlp-grpc]'; tracing stays off"
            )
            return None
        # gRPC has no URL path: the endpoint is host and port (an http:// scheme means plaintext).
        grpc_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if env is not os.environ and grpc_endpoint:
            return GrpcExporter(endpoint=grpc_endpoint)  # type: ignore[no-any-return,unused-ignore]
        return GrpcExporter()  # type: ignore[no-any-return,unused-ignore]
    if protocol != "http/protobuf":
        log.error("OTLP protocol %r is not supported (http/protobuf, grpc); tracing stays off", protocol)
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The exporter reads the endpoint, headers, timeout, compression and certificates from OTEL_*
    # itself; pass the endpoint explicitly only when a non-process environment was given.
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if endpoint is None and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint) if env is not os.environ and endpoint else OTLPSpanExporter()


def _resource() -> Resource:
    resource = Resource.create({"service.version": _package_version()})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    return resource


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("mcp-recovery-proxy")
    except Exception:
        return "0.0.0"
