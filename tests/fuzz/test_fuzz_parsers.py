"""Property tests of the pure parsers a peer's bytes reach first.

- The SSE parser (`proxy/upstream/sse/parse.py`) against a reference reading of the WHATWG event
  stream rules written here from the specification, whatever the chunk boundaries: same events,
  same last event id, same reconnection time; the only exception it may raise is `SseError`, and
  only when a line or an event is larger than its bound.
- `jsonrpc.validate` over arbitrary JSON values: never raises, and what it accepts is exactly one
  of request, notification or response.
- The Host and Origin allow-lists (`proxy.frontend.hostcheck`): never raise on any header value, and the
  verdict does not depend on the cache.
- The 2026 header shortcut (`plainly_routable`) against the SDK's own ladder
  (`classify_inbound_request`) on generated messages and headers: the shortcut never routes what
  the ladder rejects (extends the table test in tests/frontend/http/test_checks.py).
- An upstream's error answer (`status_failure_of`): whatever its status, reason, `Location`,
  `Retry-After`, `WWW-Authenticate` and body, it is described as the status failure it is, never
  an exception, its detail bounded, its wait a finite number of seconds or none.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from mcp.shared.inbound import InboundLadderRejection, InboundModernRoute, classify_inbound_request

from proxy import jsonrpc
from proxy.errors import FailureKind
from proxy.frontend.hostcheck import HostAllowList, OriginAllowList
from proxy.frontend.http.checks import plainly_routable
from proxy.upstream.h1.headers import Headers
from proxy.upstream.h1.response import Response
from proxy.upstream.sse.parse import SseError, SseEvent, SseParser
from proxy.upstream.streamable.failures import MAX_DETAIL, status_failure_of
from tests.fuzz.strategies import JSON, jsonrpc_shaped, modern_request

# ---------------------------------------------------------------------------------------------- SSE

_TERMINATORS = st.sampled_from([b"\n", b"\r", b"\r\n"])
_FIELD = st.sampled_from([b"data", b"event", b"id", b"retry", b"", b":", b"dat", b"DATA", b"data "])
_VALUE = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b" ", b"  x", b"12", b"007", b"1a", b"\x00", b"a\x00b", b"\xef\xbb\xbf", b"\xff\xfe"]),
    # A run of digits longer than Python's int-from-string limit (4300) is a legal `retry` value.
    st.integers(min_value=1, max_value=6000).map(lambda n: b"9" * n),
)


@st.composite
def sse_lines(draw: st.DrawFn) -> bytes:
    """A stream made of SSE-shaped lines (fields, comments, blank lines) with mixed terminators."""
    out = bytearray(draw(st.sampled_from([b"", b"\xef\xbb\xbf", b"\xef\xbb"])))
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        kind = draw(st.integers(min_value=0, max_value=4))
        if kind == 0:
            line = b""
        elif kind == 1:
            line = b":" + draw(st.binary(max_size=10))
        else:
            name = draw(_FIELD)
            colon = draw(st.sampled_from([b":", b": ", b""]))
            line = name + colon + draw(_VALUE)
        out += line.replace(b"\r", b"").replace(b"\n", b"") + draw(_TERMINATORS)
    if draw(st.booleans()):
        out += draw(st.binary(max_size=8))  # an unterminated tail
    return bytes(out)


_STREAMS = st.one_of(sse_lines(), st.binary(max_size=300))


def reference_events(stream: bytes) -> tuple[list[tuple[str, bytes, str | None, int | None]], str | None, int | None]:
    """The WHATWG "interpreting an event stream" steps, over the whole stream at once.

    Returns the dispatched events as (type, data, last event id, retry since the last dispatch),
    the stream's last event id and its reconnection time. An unterminated last line is not
    processed (the stream has not ended). A `retry` value too long to be a delay is clamped, as
    only its size matters to a reconnection timer (every consumer caps it).
    """
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    lines = re.split(rb"\r\n|\r|\n", stream)[:-1]  # the last piece has no terminator yet
    events: list[tuple[str, bytes, str | None, int | None]] = []
    data: list[bytes] = []
    event_type = b""
    last_id: str | None = None
    retry: int | None = None
    pending_retry: int | None = None
    for line in lines:
        if not line:
            if data:
                type_ = event_type.decode("utf-8", "replace") or "message"
                events.append((type_, b"\n".join(data), last_id, pending_retry))
            data, event_type, pending_retry = [], b"", None
            continue
        if line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event_type = value
        elif name == b"id" and b"\x00" not in value:
            last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value and all(0x30 <= c <= 0x39 for c in value):
            retry = pending_retry = int(value) if len(value) <= 18 else 10**18
    return events, last_id, retry


def _feed_all(parser: SseParser, chunks: list[bytes]) -> list[SseEvent]:
    out: list[SseEvent] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return out


def _split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces, start = [], 0
    for p in points:
        pieces.append(stream[start:p])
        start = p
    pieces.append(stream[start:])
    return pieces


def _as_tuples(events: list[SseEvent]) -> list[tuple[str, bytes, str | None, int | None]]:
    return [(e.event, e.data, e.id, None if e.retry is None else min(e.retry, 10**18)) for e in events]


@given(stream=_STREAMS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
@example(stream=b"retry: " + b"1" * 5000 + b"\ndata: x\n\n", cuts=[])
@example(stream=b"data: a\r", cuts=[8])
@example(stream=b"data: a\r\n\r\n", cuts=[8, 9])
def test_sse_parser_matches_the_reference_whatever_the_chunking(stream: bytes, cuts: list[int]) -> None:
    parser = SseParser()
    events = _feed_all(parser, _split(stream, cuts))
    expected, last_id, retry = reference_events(stream)
    assert _as_tuples(events) == expected
    assert parser.last_event_id == last_id
    assert (None if parser.retry is None else min(parser.retry, 10**18)) == retry


@given(stream=_STREAMS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_sse_parser_only_raises_sse_error_and_only_past_its_bound(stream: bytes, cuts: list[int]) -> None:
    bound = 24
    parser = SseParser(max_event_bytes=bound)
    try:
        _feed_all(parser, _split(stream, cuts))
    except SseError:
        # Only a line or an event's data larger than the bound may raise.
        lines = re.split(rb"\r\n|\r|\n", stream.removeprefix(b"\xef\xbb\xbf"))
        assert any(len(line) > bound for line in lines), stream
        return


# ------------------------------------------------------------------------------------------ JSON-RPC


@given(message=st.one_of(JSON, jsonrpc_shaped(st.sampled_from(["tools/call", "initialize", "ping"]))))
def test_validate_never_raises_and_accepts_exactly_one_kind(message: Any) -> None:
    problem = jsonrpc.validate(message)
    if problem is None:
        kinds = [jsonrpc.is_request(message), jsonrpc.is_notification(message), jsonrpc.is_response(message)]
        assert kinds.count(True) == 1, message
        if "id" in message and "method" in message:
            assert jsonrpc.valid_id(message["id"])
    else:
        assert isinstance(problem, str) and problem


# ------------------------------------------------------------------------------------ Host / Origin

_HEADER_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=60)


@given(value=st.one_of(_HEADER_TEXT, st.sampled_from(["[::1]", "[::1]:8080", "127.0.0.1:1", "localhost:*", "*"])))
def test_host_allow_list_never_raises_and_its_cache_does_not_change_verdicts(value: str) -> None:
    patterns = ["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*", "mcp.internal:*"]
    cached = HostAllowList(patterns)
    first = cached(value)
    assert isinstance(first, bool)
    assert cached(value) is first
    assert HostAllowList(patterns)(value) is first


@given(
    value=st.one_of(
        _HEADER_TEXT,
        st.sampled_from(["http://[::1]:8080", "http://127.0.0.1:1@evil.com", "null", "http://localhost"]),
    )
)
def test_origin_allow_list_never_raises_and_its_cache_does_not_change_verdicts(value: str) -> None:
    patterns = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*", "https://app.example:443"]
    cached = OriginAllowList(patterns)
    first = cached(value)
    assert isinstance(first, bool)
    assert cached(value) is first
    assert OriginAllowList(patterns)(value) is first


# --------------------------------------------------------------------------------- 2026 header rules

Case = tuple[dict[str, Any], dict[str, str]]


@given(case=modern_request())
def test_the_header_shortcut_never_routes_what_the_sdk_ladder_rejects(case: Case) -> None:
    message, headers = case
    verdict = classify_inbound_request(message, headers=headers)
    assert isinstance(verdict, InboundLadderRejection | InboundModernRoute)
    if plainly_routable(message, headers):
        assert isinstance(verdict, InboundModernRoute), (message, headers, verdict)


@given(name=st.text(max_size=20), method=st.sampled_from(["tools/call", "prompts/get"]))
def test_the_shortcut_takes_the_plain_case(name: str, method: str) -> None:
    """Valid input still takes the fast path: a mirrored, plain name is routed by both."""
    assume(not name.startswith("=?"))
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": method,
        "params": {
            "name": name,
            "_meta": {jsonrpc.META_PROTOCOL_VERSION: "2026-07-28", jsonrpc.META_CLIENT_CAPABILITIES: {}},
        },
    }
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method, "mcp-name": name}
    assert plainly_routable(message, headers)
    verdict = classify_inbound_request(message, headers=headers)
    if isinstance(verdict, InboundLadderRejection):
        # The ladder refuses some names as header values (e.g. control characters); the shortcut
        # must not have accepted those.
        pytest.fail(f"shortcut routed what the ladder rejects: {name!r}: {verdict}")


def test_regression_a_retry_field_longer_than_int_parsing_allows_is_not_a_crash() -> None:
    """Found by the SSE property above: `retry:` with more than 4300 digits raised a bare
    ValueError (Python's int-from-text limit) out of `feed`, which the upstream adapters, catching
    `SseError` only, did not expect."""
    parser = SseParser()
    events = parser.feed(b"retry: " + b"7" * 5000 + b"\ndata: x\n\n")
    assert [e.data for e in events] == [b"x"]
    assert parser.retry is not None and parser.retry >= 10**18


# ----------------------------------------------------------------------- an upstream's error answer


class _NoConnection:
    """The connection a `Response` is built on; these tests read only its head."""

    loop = None
    paused = False

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...

    def response_done(self, reusable: bool) -> None: ...


_URLISH = st.one_of(
    _HEADER_TEXT,
    st.from_regex(r"\A[a-z]{0,6}://(\[[0-9a-f:]{0,8}\]?|[a-z.]{0,12})(:[0-9a-z]{0,7})?(/[^\s]{0,12})?\Z"),
)
_RETRY_AFTER = st.one_of(
    _HEADER_TEXT,
    st.from_regex(r"\A[+-]?[0-9]{0,30}(\.[0-9]{0,5})?\Z"),
    st.from_regex(
        r"\A[A-Z][a-z]{2}, [0-9]{1,3} [A-Z][a-z]{2} [0-9]{1,6} [0-9]{1,2}:[0-9]{2}:[0-9]{2} [A-Z+0-9-]{0,5}\Z"
    ),
)


@given(
    status=st.integers(min_value=100, max_value=999),
    reason=_HEADER_TEXT,
    location=st.one_of(st.none(), _URLISH),
    retry_after=st.one_of(st.none(), _RETRY_AFTER),
    challenge=st.one_of(st.none(), _HEADER_TEXT),
    body=st.one_of(
        st.binary(max_size=200),
        JSON.map(jsonrpc.dumps),
        st.fixed_dictionaries(
            {"jsonrpc": st.just("2.0"), "id": JSON, "error": st.fixed_dictionaries({"code": JSON, "message": JSON})}
        ).map(jsonrpc.dumps),
    ),
    request_id=st.one_of(st.none(), st.integers(), st.text(max_size=5)),
)
@example(status=307, reason="", location="http://[", retry_after=None, challenge=None, body=b"", request_id=1)
@example(status=302, reason="", location="http://h:port/x", retry_after="-1", challenge=None, body=b"", request_id=1)
def test_an_upstream_error_answer_is_described_never_raised(
    status: int,
    reason: str,
    location: str | None,
    retry_after: str | None,
    challenge: str | None,
    body: bytes,
    request_id: int | str | None,
) -> None:
    items = [("location", location), ("retry-after", retry_after), ("www-authenticate", challenge)]
    headers = Headers([(name, value) for name, value in items if value is not None])
    response = Response(_NoConnection(), status, reason, headers)  # type: ignore[arg-type]
    failure = status_failure_of(response, body, request_id)
    assert failure.kind is FailureKind.HTTP_STATUS and failure.http_status == status
    assert len(failure.detail) <= MAX_DETAIL + 1
    wait = failure.retry_after_s
    assert wait is None or 0.0 <= wait < float("inf")
