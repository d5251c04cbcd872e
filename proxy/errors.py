"""Our error tree. An upstream failure carries its kind and whether the request was dispatched.

Foreign exceptions (OSError, httpx errors, broken pipes) are translated into `UpstreamFailure` where
they enter, inside the upstream adapters; nothing above `proxy/upstream/` sees them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypeVar

from proxy.secret_values import SECRETS

E = TypeVar("E", bound=BaseException)


class Dispatch(StrEnum):
    """Whether the upstream may have started executing an attempt (docs/recovery.md "dispatched")."""

    NO = "no"  # provably not sent, or refused before processing
    UNKNOWN = "unknown"
    YES = "yes"


class FailureKind(StrEnum):
    SPAWN_FAILED = "spawn_failed"  # the stdio command could not be started
    CONNECT_FAILED = "connect_failed"  # connection refused / DNS / TLS before anything was sent
    NOT_RUNNING = "not_running"  # the upstream process is not running (crash-loop backoff)
    TIMEOUT = "timeout"  # the proxy stopped waiting
    CLOSED = "closed"  # the stream or process ended with the request in flight
    HTTP_STATUS = "http_status"  # a non-2xx HTTP answer
    PROTOCOL = "protocol"  # the upstream answered something that is not MCP
    SESSION_EXPIRED = "session_expired"  # 404 on a request that carried a session id
    # 404 to a credential other than the one that opened the session (passthrough, legacy SSE
    # upstream): the server's refusal of that caller on this session, not a forgotten session
    SESSION_REFUSED = "session_refused"
    OVERLOADED = "overloaded"  # the proxy's own limits refused the request


class ProxyError(Exception):
    """Base of the proxy's own errors."""


class UpstreamFailure(ProxyError):
    """An attempt produced no valid JSON-RPC response."""

    def __init__(
        self,
        kind: FailureKind,
        dispatched: Dispatch,
        detail: str,
        *,
        http_status: int | None = None,
        retry_after_s: float | None = None,
        body: dict[str, Any] | None = None,
        challenge: str | None = None,
        refusal_code: int | None = None,
    ) -> None:
        # Every failure is built here, and its detail and body reach /readyz, logs and callers:
        # the proxy's own credentials go now, whatever the upstream echoed (an upstream may answer
        # 401 with the request headers it received, credentials included).
        detail = SECRETS.scrub(detail)
        if body is not None:
            body = SECRETS.scrub_value(body)
        super().__init__(f"{kind.value}: {detail}")
        self.kind = kind
        self.dispatched = dispatched
        self.detail = detail
        self.http_status = http_status
        self.retry_after_s = retry_after_s
        self.body = body  # a JSON-RPC error message that came with an HTTP error status, if any
        # The WWW-Authenticate of an upstream 401/403 (bounded, one line): `--auth passthrough`
        # relays it to the caller, whose credential it is about.
        self.challenge = SECRETS.scrub(challenge) if challenge is not None else None
        # The JSON-RPC error code of a request the upstream refused on the proxy's behalf (a shared
        # stdio child's `initialize`): whether the refusal means "not this revision" is the caller's
        # to judge (proxy/upstream/bridge_proving.py).
        self.refusal_code = refusal_code


REFUSAL_RETRY_AFTER_S = 5  # what a refused new session is told to wait before it tries again


class Refusal(UpstreamFailure):
    """A new 2025 session refused at one of the proxy's limits: `limit` (the reason label of
    `mcp_recovery_http_refused_total`) and `flag` (what raises it). The HTTP frontend answers it
    with `http_status` and `Retry-After`; `data()` is the JSON-RPC error's `data`. Raised where the
    limit is (proxy/core/capacity.py: the session caps; the stdio upstream: a child's start), and
    counted and logged once, by `proxy.core.capacity.refused`."""

    def __init__(self, detail: str, *, limit: str, flag: str, http_status: int) -> None:
        super().__init__(
            FailureKind.OVERLOADED, Dispatch.NO, detail, http_status=http_status, retry_after_s=REFUSAL_RETRY_AFTER_S
        )
        self.limit = limit
        self.flag = flag

    def data(self) -> dict[str, Any]:
        """The JSON-RPC error's `data`: what a program can act on without parsing the message."""
        return {"limit": self.limit, "flag": self.flag, "retryAfterS": REFUSAL_RETRY_AFTER_S}


def refuses_the_caller(kind: FailureKind, http_status: int | None) -> bool:
    """The upstream refused the caller's own credential: a 401 or 403, or the session it named
    (`SESSION_REFUSED`). With `--auth passthrough` that is the caller's to answer (its OAuth flow,
    another session), so it reaches the caller as the upstream's HTTP status: never a retry, nor a
    tool result."""
    return http_status in (401, 403) or kind is FailureKind.SESSION_REFUSED


class PolicyError(ProxyError):
    """A policy folder failed validation; `problems` are printable, each naming file and key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def untraced(exc: E) -> E:
    """`exc` with the tracebacks of it and of the exceptions it was raised from or while handling
    cleared (the exceptions themselves stay, for their messages), returned for chaining.

    A traceback holds every frame the exception passed through, and each frame its locals: a
    failure stored in a future or an attribute, or caught by a frame that still holds the exchange
    it belongs to, forms a reference cycle (exception -> traceback -> frame -> exchange ->
    future -> exception) that only the cyclic garbage collector frees, in pauses that stop every
    call in flight. Called where a failure is stored (`Future.set_exception` keeps the traceback
    the exception has then) and where it is finally handled; the proxy never shows a
    traceback of an upstream failure (its kind and detail say what happened)."""
    todo: list[BaseException] = [exc]
    seen = 0
    while todo and seen < 16:  # bounded: a chain is short, but must not loop on a cycle of causes
        e = todo.pop()
        seen += 1
        e.__traceback__ = None
        if e.__cause__ is not None:
            todo.append(e.__cause__)
        if e.__context__ is not None and e.__context__ is not e.__cause__:
            todo.append(e.__context__)
    return exc
