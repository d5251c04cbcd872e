"""What one attempt produced, and what classification made of it: closed value types, no behaviour.

Contract:
- An attempt produces exactly one `Outcome`: `Success`, `ToolError`, `RpcError` or `TransportError`.
  The engine builds it with `outcome_from_response` (a JSON-RPC response from the upstream) or
  `TransportError.from_failure` (an `UpstreamFailure` raised by an adapter); nothing else.
- `Success` covers every non-error result, including empty lists, zero matches, a 2026
  `InputRequiredResult` (`resultType: "input_required"`) and task results: they pass through.
- `Classified` is what `classify()` concluded: the category (None for success), whether the attempt
  may have executed upstream, the evidence that decided it, and the upstream's own retry hints.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.policy.compiled import Category


@dataclass(frozen=True, slots=True)
class Success:
    """A result that is not an error. Passed through, never retried."""

    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolError:
    """A CallToolResult with `isError: true`: the tool executed and reported a failure."""

    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RpcError:
    """A JSON-RPC error response from the upstream (`error` is the response's `error` member)."""

    error: dict[str, Any]
    http_status: int | None = None

    @property
    def code(self) -> int | None:
        code = self.error.get("code")
        return code if isinstance(code, int) and not isinstance(code, bool) else None


@dataclass(frozen=True, slots=True)
class TransportError:
    """No valid response: the adapter raised an `UpstreamFailure`.

    `body` is a JSON-RPC error message that came with an HTTP error status, if any; it is consulted
    only when the HTTP status itself does not classify the failure.
    """

    kind: FailureKind
    dispatched: Dispatch
    detail: str
    http_status: int | None = None
    retry_after_s: float | None = None
    body: dict[str, Any] | None = None
    challenge: str | None = None  # an HTTP 401/403's WWW-Authenticate

    @classmethod
    def from_failure(cls, failure: UpstreamFailure) -> TransportError:
        return cls(
            kind=failure.kind,
            dispatched=failure.dispatched,
            detail=failure.detail,
            http_status=failure.http_status,
            retry_after_s=failure.retry_after_s,
            body=failure.body,
            challenge=failure.challenge,
        )

    def as_failure(self) -> UpstreamFailure:
        return UpstreamFailure(
            self.kind,
            self.dispatched,
            self.detail,
            http_status=self.http_status,
            retry_after_s=self.retry_after_s,
            body=self.body,
            challenge=self.challenge,
        )


Outcome = Success | ToolError | RpcError | TransportError


def outcome_from_response(response: dict[str, Any], *, http_status: int | None = None) -> Outcome:
    """Turn one upstream JSON-RPC response to `tools/call` into an outcome.

    A response with `error` is an `RpcError`; a result with `isError: true` is a `ToolError`;
    anything else is a `Success`. A response without an object `result` is not MCP: a
    `TransportError` of kind `protocol` with dispatch unknown.
    """
    error = response.get("error")
    if isinstance(error, dict):
        return RpcError(error, http_status)
    result = response.get("result")
    if isinstance(result, dict):
        if result.get("isError") is True:
            return ToolError(result)
        return Success(result)
    return TransportError(
        kind=FailureKind.PROTOCOL,
        dispatched=Dispatch.UNKNOWN,
        detail="the upstream's response to tools/call carries neither an object result nor an error",
        http_status=http_status,
    )


def outcome_name(outcome: Outcome) -> str:
    """A bounded label of the outcome's shape: success, tool_error, jsonrpc_error, transport_error."""
    match outcome:
        case Success():
            return "success"
        case ToolError():
            return "tool_error"
        case RpcError():
            return "jsonrpc_error"
        case TransportError():
            return "transport_error"


class EvidenceSource(StrEnum):
    """Which source of evidence decided the category (docs/recovery.md, "Classification")."""

    TRANSPORT = "transport"
    HTTP = "http"
    JSONRPC = "jsonrpc"
    UPSTREAM = "upstream"  # the upstream's own structuredContent.errorCategory (or a success)
    RULE = "rule"  # a policy rule
    SHIPPED = "shipped"  # a shipped rule for what real servers say (proxy/recovery/shipped.py)
    DEFAULT = "default"  # nothing matched: the policy's `unclassified` category


@dataclass(frozen=True, slots=True)
class Evidence:
    source: EvidenceSource
    code: str | int | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class Classified:
    """The classification of one outcome.

    - `category`: None for a success.
    - `dispatched`: whether the upstream may have executed the attempt.
    - `retryable_hint`: the upstream's `isRetryable` (False also for a negative `retryAfterMs`
      pushback); None when it said nothing or is not trusted.
    - `retry_after_s`: how long the upstream asked us to wait (Retry-After or `retryAfterMs`).
    - `defaulted`: nothing classified the failure; `category` is the policy's `unclassified` and the
      failure is never retried.
    - `rule_retryable`: the `retryable` setting of the policy rule that matched, if any.
    """

    category: Category | None
    dispatched: Dispatch
    evidence: Evidence
    retryable_hint: bool | None = None
    retry_after_s: float | None = None
    defaulted: bool = False
    rule_retryable: bool | None = None

    @property
    def is_success(self) -> bool:
        return self.category is None
