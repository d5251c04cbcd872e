"""The sans-I/O response reader, fed bytes the way h11 is tested: no socket, no loop, no process.

Every response read whole must read the same split at any byte boundary; the framings the
client meets (Content-Length, chunked, close-delimited, no body), interim 1xx answers, HEAD
answers, keep-alive, and each way the peer's bytes can be refused (malformed status line, header
or chunk size, a head past the bound, bytes nobody asked for)."""

from __future__ import annotations

from dataclasses import dataclass, field

import httptools
import pytest

from proxy.upstream.h1.errors import ProtocolError
from proxy.upstream.h1.headers import Headers
from proxy.upstream.h1.reader import MAX_HEAD_BYTES, Phase, ResponseReader, UnsolicitedResponse

Event = tuple[object, ...]


@dataclass
class Recorder:
    """The reader's events, in order; a head as (status, reason, header pairs)."""

    events: list[Event] = field(default_factory=list)
    headers: list[Headers] = field(default_factory=list)

    def on_head(self, status: int, reason: str, headers: Headers) -> None:
        self.headers.append(headers)
        self.events.append(("head", status, reason, list(headers)))

    def on_body(self, data: bytes) -> None:
        self.events.append(("body", data))

    def on_end(self, keep_alive: bool) -> None:
        self.events.append(("end", keep_alive))


def merged(events: list[Event]) -> list[Event]:
    """`events` with consecutive body pieces joined: how a body is cut depends on the reads."""
    out: list[Event] = []
    for event in events:
        if event[0] == "body" and out and out[-1][0] == "body":
            out[-1] = ("body", out[-1][1] + event[1])  # type: ignore[operator]
        else:
            out.append(event)
    return out


@dataclass
class Result:
    events: list[Event]
    error: ProtocolError | None
    eof_ended: bool | None  # what feed_eof said, if the peer was made to close


def read(pieces: list[bytes], *, head_only: bool = False, eof: bool = False) -> Result:
    """A fresh reader expecting one answer, fed `pieces` in order (stopping at the first error)."""
    recorder = Recorder()
    reader = ResponseReader(recorder)
    reader.expect(head_only)
    error = None
    for piece in pieces:
        error = reader.feed(piece)
        if error is not None:
            break
    eof_ended = reader.feed_eof() if eof and error is None else None
    return Result(merged(recorder.events), error, eof_ended)


def splits(raw: bytes) -> list[list[bytes]]:
    """`raw` whole, cut in two at every byte boundary, and byte by byte."""
    return (
        [[raw]] + [[raw[:cut], raw[cut:]] for cut in range(1, len(raw))] + [[raw[i : i + 1] for i in range(len(raw))]]
    )


RESPONSES = {
    "content-length": b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}',
    "chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\nworld12345\r\n0\r\nX-Trailer: t\r\n\r\n"
    ),
    "empty": b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",
    "no-content": b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n",
    "interim": b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "http/1.0": b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    "repeated headers": b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("name", list(RESPONSES))
def test_a_response_split_at_every_byte_boundary_reads_as_whole(name: str) -> None:
    raw = RESPONSES[name]
    whole = read([raw])
    assert whole.error is None and whole.events[-1][0] == "end", whole
    for pieces in splits(raw):
        assert read(pieces) == whole, [len(p) for p in pieces]


def test_a_close_delimited_response_split_anywhere_reads_as_whole() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
    whole = read([raw], eof=True)
    assert whole.events == [
        ("head", 200, "OK", [("Content-Type", "text/plain")]),
        ("body", b"until the end"),
        ("end", False),
    ]
    assert whole.eof_ended is True
    for pieces in splits(raw):
        assert read(pieces, eof=True) == whole, [len(p) for p in pieces]


@pytest.mark.parametrize(
    "raw",
    [
        b"HTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nNo colon here\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    ],
    ids=["protocol", "status", "header", "chunk-size"],
)
def test_a_malformed_response_fails_the_same_split_anywhere(raw: bytes) -> None:
    whole = read([raw])
    assert whole.error is not None
    for pieces in splits(raw):
        split = read(pieces)
        assert split.events == whole.events and type(split.error) is type(whole.error), [len(p) for p in pieces]


def test_content_length_bounds_the_body_and_keeps_the_connection() -> None:
    result = read([RESPONSES["content-length"]])
    assert result.events == [
        ("head", 200, "OK", [("Content-Type", "application/json"), ("Content-Length", "11")]),
        ("body", b'{"ok":true}'),
        ("end", True),
    ]


def test_a_chunked_body_arrives_without_its_framing_and_trailers() -> None:
    result = read([RESPONSES["chunked"]])
    assert result.events == [
        ("head", 200, "OK", [("Transfer-Encoding", "chunked")]),
        ("body", b"hello world12345"),
        ("end", True),
    ]


def test_a_body_without_length_or_chunks_ends_only_when_the_peer_closes() -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    reader.expect()
    assert reader.feed(b"HTTP/1.1 200 OK\r\n\r\npart one, ") is None
    assert reader.until_eof
    assert reader.feed(b"part two") is None
    assert recorder.events[-1] == ("body", b"part two"), "no end before the close"
    assert reader.feed_eof() is True
    assert recorder.events[-1] == ("end", False)
    assert reader.feed_eof() is False, "the body ended once"


def test_a_body_cut_short_by_the_close_does_not_end() -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    reader.expect()
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf") is None
    assert not reader.until_eof
    assert reader.feed_eof() is False
    assert [e[0] for e in recorder.events] == ["head", "body"]


def test_a_close_before_any_answer_ends_nothing() -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    reader.expect()
    assert reader.feed_eof() is False
    assert recorder.events == []


@pytest.mark.parametrize(
    ("raw", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
    ],
    ids=["1.1", "1.1-close", "1.0", "1.0-keep-alive"],
)
def test_the_end_says_whether_the_connection_may_carry_another_request(raw: bytes, keep_alive: bool) -> None:
    assert read([raw]).events[-1] == ("end", keep_alive)


@pytest.mark.parametrize("status", [204, 304])
def test_a_no_body_status_ends_with_its_head(status: int) -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    reader.expect()
    assert reader.feed(b"HTTP/1.1 %d X\r\n\r\n" % status) is None
    assert recorder.events == [("head", status, "X", []), ("end", True)]
    assert not reader.until_eof


def test_interim_answers_are_skipped_and_the_final_one_is_read() -> None:
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    )
    result = read([raw])
    assert result.events == [("head", 201, "Created", [("Content-Length", "2")]), ("body", b"ok"), ("end", True)]


def test_an_interim_answer_leaves_the_request_awaiting_its_head() -> None:
    reader = ResponseReader(Recorder())
    reader.expect()
    assert reader.feed(b"HTTP/1.1 103 Early Hints\r\n\r\n") is None
    assert reader.awaiting and reader.started


def test_a_head_answer_ends_with_its_head_and_its_body_is_ignored() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    whole = read([raw, b"hello"], head_only=True)
    assert whole.error is None
    assert whole.events == [("head", 200, "OK", [("Content-Length", "5")]), ("end", False)]
    for pieces in splits(raw):
        assert read(pieces, head_only=True) == whole


def test_started_tells_whether_any_of_the_answer_came() -> None:
    reader = ResponseReader(Recorder())
    reader.expect()
    assert not reader.started and reader.awaiting
    assert reader.feed(b"HTTP/1.1 20") is None
    assert not reader.started, "a status code alone is not yet the status line"
    assert reader.feed(b"0 OK\r\n") is None
    assert reader.started and reader.awaiting
    assert reader.feed(b"Content-Length: 0\r\n\r\n") is None
    assert not reader.awaiting
    reader.expect()
    assert not reader.started, "a new request starts over"


def test_a_keep_alive_connection_reads_one_answer_per_request() -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    for body in (b"one", b"two"):
        reader.expect()
        assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n" + body) is None
    assert [e for e in recorder.events if e[0] != "head"] == [
        ("body", b"one"),
        ("end", True),
        ("body", b"two"),
        ("end", True),
    ]


def test_headers_keep_order_and_repeats_and_are_found_by_any_case() -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    reader.expect()
    assert reader.feed(RESPONSES["repeated headers"]) is None
    (headers,) = recorder.headers
    assert list(headers) == [("Set-Cookie", "a=1"), ("set-cookie", "b=2"), ("Content-Length", "0")]
    assert headers.getall("SET-COOKIE") == ["a=1", "b=2"]
    assert headers["set-cookie"] == "a=1" and headers.get("content-length") == "0"
    assert "Headers(['Set-Cookie', 'set-cookie', 'Content-Length'])" == repr(headers), "names only"


def test_a_reason_phrase_split_across_reads_is_read_whole() -> None:
    result = read([b"HTTP/1.1 503 Service Unav", b"ailable\r\nContent-Length: 0\r\n\r\n"])
    assert result.events[0] == ("head", 503, "Service Unavailable", [("Content-Length", "0")])


def test_header_bytes_are_read_as_latin_1() -> None:
    result = read([b"HTTP/1.1 200 \xc9t\xe9\r\nX-Name: caf\xe9\r\nContent-Length: 0\r\n\r\n"])
    assert result.events[0] == ("head", 200, "\xc9t\xe9", [("X-Name", "caf\xe9"), ("Content-Length", "0")])


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"HTP/1.1 200 OK\r\n\r\n", "HttpParserError"),
        (b"HTTP/1.1 2x0 OK\r\n\r\n", "HttpParserInvalidStatusError"),
        (b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", "HttpParserError"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nhi", "HttpParserError"),
    ],
    ids=["protocol", "status", "header", "two-lengths"],
)
def test_a_malformed_head_is_a_protocol_error_naming_the_parser_error(raw: bytes, what: str) -> None:
    result = read([raw])
    assert result.events == []
    error = result.error
    assert type(error) is ProtocolError
    assert str(error).startswith(f"the upstream sent an invalid HTTP response ({what}: ")
    assert isinstance(error.__cause__, httptools.HttpParserError)
    assert error.__traceback__ is None, "returned, never raised"


def test_a_malformed_chunk_size_fails_after_the_head_was_delivered() -> None:
    result = read([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"])
    assert result.events == [("head", 200, "OK", [("Transfer-Encoding", "chunked")]), ("body", b"hello")]
    assert type(result.error) is ProtocolError
    assert "Invalid character in chunk size" in str(result.error)


def test_a_head_past_the_bound_fails_once_the_bytes_read_exceed_it() -> None:
    reader = ResponseReader(Recorder())
    reader.expect()
    start = b"HTTP/1.1 200 OK\r\nX-Long: "
    assert reader.feed(start) is None
    assert reader.feed(b"a" * (MAX_HEAD_BYTES - len(start))) is None, "exactly the bound is fine"
    error = reader.feed(b"a")
    assert type(error) is ProtocolError
    assert str(error) == (
        f"the upstream sent an invalid HTTP response (_HeadTooLarge: the response head exceeds {MAX_HEAD_BYTES} bytes)"
    )


def test_the_head_bound_counts_only_bytes_read_while_the_head_is_incomplete() -> None:
    body = b"b" * (2 * MAX_HEAD_BYTES)
    result = read([b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10], body[10:]])
    assert result.error is None and result.events[-1] == ("end", True)


def test_an_interim_answer_restarts_the_head_bound() -> None:
    reader = ResponseReader(Recorder())
    reader.expect()
    interim = b"HTTP/1.1 103 Early Hints\r\nX: " + b"a" * (MAX_HEAD_BYTES - 100) + b"\r\n\r\n"
    assert reader.feed(interim[:1000]) is None
    assert reader.feed(interim[1000:]) is None
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") is None


def test_bytes_nobody_asked_for_are_an_unsolicited_response() -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    error = reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert isinstance(error, UnsolicitedResponse) and isinstance(error, ProtocolError)
    assert recorder.events == []


def test_a_second_answer_to_one_request_is_unsolicited() -> None:
    result = read([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"])
    assert result.events == [("head", 200, "OK", [("Content-Length", "2")]), ("body", b"hi"), ("end", True)]
    assert isinstance(result.error, UnsolicitedResponse)


def test_an_event_callback_that_raises_is_returned_as_a_protocol_error() -> None:
    class Broken(Recorder):
        def on_head(self, status: int, reason: str, headers: Headers) -> None:
            raise RuntimeError("a bug in the listener")

    reader = ResponseReader(Broken())
    reader.expect()
    error = reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert type(error) is ProtocolError
    assert isinstance(error.__cause__, httptools.HttpParserCallbackError)
    assert isinstance(error.__cause__.__context__, RuntimeError)


def test_a_closed_reader_ignores_what_it_is_fed() -> None:
    recorder = Recorder()
    reader = ResponseReader(recorder)
    reader.expect()
    reader.close()
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") is None
    assert recorder.events == []


def test_the_phase_walks_idle_awaiting_head_body_done_for_each_request() -> None:
    reader = ResponseReader(Recorder())
    seen = [reader.phase]
    reader.expect()
    seen.append(reader.phase)
    for piece in (b"HTTP/1.1 103 Early Hints\r\n\r\n", b"HTTP/1.1 200 OK\r\n", b"Transfer-Encoding: chunked\r\n\r\n"):
        assert reader.feed(piece) is None
        seen.append(reader.phase)
    assert reader.feed(b"2\r\nok\r\n0\r\nX-Trailer: t\r\n") is None
    seen.append(reader.phase)
    assert reader.feed(b"\r\n") is None
    seen.append(reader.phase)
    reader.expect(head_only=True)
    seen.append(reader.phase)
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n") is None
    seen.append(reader.phase)
    assert seen == [
        Phase.IDLE,
        Phase.AWAITING,
        Phase.HEAD,  # the interim answer's end: still waiting for the real head
        Phase.HEAD,
        Phase.BODY,
        Phase.BODY,  # a trailer is not a head
        Phase.DONE,
        Phase.AWAITING,
        Phase.DONE,  # a HEAD request's answer ends with its head
    ]


def test_a_close_delimited_body_ends_in_done_at_eof() -> None:
    reader = ResponseReader(Recorder())
    reader.expect()
    assert reader.feed(b"HTTP/1.0 200 OK\r\n\r\nabc") is None
    assert reader.phase is Phase.BODY and reader.until_eof
    assert reader.feed_eof()
    assert reader.phase is Phase.DONE
