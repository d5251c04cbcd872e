"""The POSTs that are not a link's exchanges: one request read to its answer (`rpc_once`, for the
probe and for replaying a session's `initialize`), and a notification or response whose answer
should be empty (`post_small`).

Both translate the client's exceptions through the upstream (`HttpClientOwner.translate`, which
also marks it down when it cannot be reached); neither retries. `rpc_once` raises
`UpstreamFailure` for a non-2xx answer, an answer of another content type, or a stream that ends
without the response; `post_small` returns whatever status came (`SmallAnswer`), its body read
(bounded), for the caller to judge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message, dumps
from proxy.upstream.base import Health
from proxy.upstream.h1 import Headers, HttpClient, Response
from proxy.upstream.sse.parse import SseError
from proxy.upstream.streamable.failures import (
    CLIENT_ERRORS,
    MAX_ERROR_BODY,
    WriteFlag,
    read_bounded,
    status_failure,
    status_failure_of,
)
from proxy.upstream.streamable.headers import post_headers
from proxy.upstream.streamable.messages import StreamState, answer_messages
from proxy.upstream.streamable.owner import HttpClientOwner


@dataclass(slots=True)
class SmallAnswer:
    """The answer to a notification POST, body already read (`status_failure` can use it later)."""

    response: Response
    body: bytes

    @property
    def status_code(self) -> int:
        return self.response.status

    def failure(self) -> UpstreamFailure:
        return status_failure_of(self.response, self.body, None)


async def post_small(
    upstream: HttpClientOwner, client: HttpClient, message: Message, headers: Mapping[str, str], what: str
) -> SmallAnswer:
    """POST a notification or response on `client`; the answer's body is read (it should be empty).
    Nothing times a notification but this: it waits for a pooled connection at most the upstream's
    `wait_s`."""
    h = post_headers(headers)
    flag = WriteFlag()
    try:
        async with await client.request(
            "POST", headers=h, body=dumps(message), on_write=flag.mark, max_body=MAX_ERROR_BODY, wait_s=upstream.wait_s
        ) as response:
            return SmallAnswer(response, await read_bounded(response))
    except CLIENT_ERRORS as exc:
        raise upstream.translate(exc, flag.written, what) from None


async def rpc_once(
    upstream: HttpClientOwner,
    message: Message,
    headers: Mapping[str, str],
    *,
    on_other: Callable[[Message], None] | None = None,
    dedicated: bool = False,
) -> tuple[Headers, Message]:
    """POST one request and read its response (JSON or SSE); other messages go to `on_other`.
    `dedicated`: on a connection outside the pool (`h1.HttpClient.request`)."""
    h = post_headers(headers)
    flag = WriteFlag()
    try:
        async with await upstream.client.request(
            "POST",
            headers=h,
            body=dumps(message),
            on_write=flag.mark,
            max_body=upstream.max_event_bytes,
            dedicated=dedicated,
        ) as response:
            if not 200 <= response.status < 300:
                raise await status_failure(response, message.get("id"))
            async for msg in answer_messages(response, StreamState(), upstream.max_event_bytes):
                if "method" not in msg and msg.get("id") in (message.get("id"), None):
                    if upstream.health.state is not Health.UP:
                        upstream.health.answered()
                    return response.headers, msg
                if on_other is not None:
                    on_other(msg)
    except (*CLIENT_ERRORS, SseError) as exc:
        raise upstream.translate(exc, flag.written) from None
    raise UpstreamFailure(
        FailureKind.CLOSED, Dispatch.UNKNOWN, "the upstream closed the stream before the response arrived"
    )
