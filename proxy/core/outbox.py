"""What a relay hands back to its callers: the outbox a request's messages go to, progress
rewritten to the caller's token, and the JSON-RPC errors for a request that got no valid answer.

Contract:
- `Outbox.send` never blocks: it only enqueues (the frontends' streams implement it).
- `ProgressRelay` maps one call's upstream progress to the caller's token, keeping values
  increasing across attempts; `SilentProgress` gives the upstream a token a caller did not ask for;
  `CallProgress` (a tools/call's) also keeps the latest `PROGRESS_NOTES` notes as partial evidence
  of how far a failed call got.
- `failure_response` and `timeout_response` answer a relayed request (not a `tools/call`, whose
  answers the engine writes) with the upstream's own JSON-RPC error where it sent one, else an error
  whose `data` names the failure (`PROXY_FAILURE_KEY`), every echoed text bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from proxy.auth.base import Principal
from proxy.errors import UpstreamFailure
from proxy.jsonrpc import INTERNAL_ERROR, REQUEST_TIMEOUT, Message, RequestId, bounded, error
from proxy.recovery import PartialResult
from proxy.recovery.report import PARTIAL_TEXT_LIMIT

if TYPE_CHECKING:
    from proxy.core.relay import Relay
    from proxy.core.resend import Flight

PROXY_FAILURE_KEY = "io.mcp-recovery-proxy/upstreamFailure"
PROGRESS_NOTES = 20  # progress notes a call keeps as partial evidence, the latest


class Outbox(Protocol):
    """Where messages for one downstream request (or a listen stream) go. `send` never blocks.

    `hold(flight, owner)`: the request's answer must not be lost (proxy/core/resend.py): the
    outbox reports to `flight` what became of it, and a client's disconnect no longer cancels the
    request. `owner`: the request is the flight's own call (not a re-send attached to it). An
    outbox whose client cannot come back for an answer (the proxy's own requests, stdio) ignores it.
    """

    def send(self, message: Message) -> None: ...

    @property
    def closed(self) -> bool: ...

    def hold(self, flight: Flight, owner: bool) -> None: ...


# (relay, request, outbox, forwarded headers, principal or None) -> the response
ToolCallHandler = Callable[["Relay", Message, Outbox, Mapping[str, str] | None, Principal | None], Awaitable[Message]]


class NullOutbox:
    """An outbox for the proxy's own requests: whatever they stream is not for any client."""

    closed = False

    def send(self, message: Message) -> None:
        pass

    def hold(self, flight: Flight, owner: bool) -> None:
        pass


class ProgressRelay:
    """Maps one call's upstream progress back to the caller's token, keeping values increasing
    across attempts (a value that would go backwards, as a retried attempt starts over, is dropped)."""

    __slots__ = ("last", "token")

    def __init__(self, token: Any) -> None:
        self.token = token
        self.last: float | None = None

    def rewrite(self, message: Message) -> Message | None:
        params = message.get("params")
        if not isinstance(params, dict):
            return None
        value = params.get("progress")
        if isinstance(value, int | float):
            if self.last is not None and value <= self.last:
                return None
            self.last = value
        return {**message, "params": {**params, "progressToken": self.token}}


class CallProgress(ProgressRelay):
    """Progress relayed to the caller and remembered (bounded) as partial evidence."""

    __slots__ = ("attempt", "notes")

    def __init__(self, token: Any, now_s: float) -> None:
        super().__init__(token)
        self.attempt = 1
        # the latest notes (the furthest a failed call got), across its attempts
        self.notes: deque[PartialResult] = deque(maxlen=PROGRESS_NOTES)

    def rewrite(self, message: Message) -> Message | None:
        params = message.get("params")
        if isinstance(params, dict) and params.get("message"):
            # Bounded: a note is echoed back in the result; numbers and a cut message only.
            note: dict[str, Any] = {
                k: params[k]
                for k in ("progress", "total")
                if isinstance(params.get(k), (int, float)) and not isinstance(params[k], bool)
            }
            text = params["message"]
            note["message"] = bounded(text, PARTIAL_TEXT_LIMIT) if isinstance(text, str) else bounded(str(text), 80)
            self.notes.append(PartialResult("progress", self.attempt, note))
        if self.token is None:
            return None  # the caller asked for no progress: kept as evidence only
        return super().rewrite(message)


def progress_token_of(request: Message) -> Any:
    params = request.get("params")
    if isinstance(params, dict):
        meta = params.get("_meta")
        if isinstance(meta, dict):
            return meta.get("progressToken")
    return None


def failure_response(id_: RequestId, failure: UpstreamFailure) -> Message:
    """A JSON-RPC error for a relayed (non-tools/call) request that got no valid upstream answer."""
    if failure.body is not None and isinstance(failure.body.get("error"), dict):
        return {"jsonrpc": "2.0", "id": id_, "error": failure.body["error"]}
    data: dict[str, Any] = {
        PROXY_FAILURE_KEY: {
            "kind": failure.kind.value,
            "dispatched": failure.dispatched.value,
            "detail": bounded(failure.detail, 300),
        }
    }
    if failure.http_status is not None:
        data[PROXY_FAILURE_KEY]["httpStatus"] = failure.http_status
    if failure.retry_after_s is not None:
        data[PROXY_FAILURE_KEY]["retryAfterMs"] = int(failure.retry_after_s * 1000)
    return error(id_, INTERNAL_ERROR, bounded(f"upstream unavailable: {failure.detail}", 300), data)


def timeout_response(id_: RequestId, method: Any, timeout_s: float) -> Message:
    """The answer to a relayed request the upstream did not answer within the request timeout."""
    text = f"the upstream did not answer {bounded(str(method), 80)} within {timeout_s:g} s; the proxy cancelled it"
    data = {PROXY_FAILURE_KEY: {"kind": "timeout", "dispatched": "unknown", "timeoutMs": int(timeout_s * 1000)}}
    return error(id_, REQUEST_TIMEOUT, text, data)


class SilentProgress(ProgressRelay):
    """Progress for a caller that asked for none: the upstream gets a token (so a tool can report
    progress and keep an idle timer going), the caller gets nothing."""

    __slots__ = ()

    def rewrite(self, message: Message) -> Message | None:
        return None
