"""Unit tests of the incremental SSE parser."""

from __future__ import annotations

import pytest

from proxy.upstream.sse.parse import SseError, SseEvent, SseParser


def feed_all(chunks: list[bytes], parser: SseParser | None = None) -> list[SseEvent]:
    p = parser or SseParser()
    out: list[SseEvent] = []
    for c in chunks:
        out.extend(p.feed(c))
    return out


def test_basic_event_and_fields() -> None:
    evs = feed_all([b'event: message\nid: 7\nretry: 1500\ndata: {"a":1}\n\n'])
    assert evs == [SseEvent("message", b'{"a":1}', "7", 1500)]


def test_multiline_data_and_default_event() -> None:
    evs = feed_all([b"data: one\ndata:two\ndata:  three\n\n"])
    assert evs[0].event == "message"
    assert evs[0].data == b"one\ntwo\n three"


def test_comments_and_empty_blocks_are_ignored() -> None:
    evs = feed_all([b": ping\n\n:keepalive\n\ndata: x\n\n"])
    assert [e.data for e in evs] == [b"x"]


@pytest.mark.parametrize("sep", [b"\n", b"\r\n", b"\r"])
def test_line_terminators(sep: bytes) -> None:
    raw = b"event: endpoint" + sep + b"data: /messages/?s=1" + sep + sep + b"data: y" + sep + sep
    # every possible split point, byte by byte included
    for cut in range(len(raw) + 1):
        evs = feed_all([raw[:cut], raw[cut:]])
        assert [(e.event, e.data) for e in evs] == [("endpoint", b"/messages/?s=1"), ("message", b"y")], cut
    evs = feed_all([bytes([b]) for b in raw])
    assert len(evs) == 2


def test_crlf_split_across_chunks_is_one_terminator() -> None:
    evs = feed_all([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])
    assert [e.data for e in evs] == [b"a\nb"]


def test_id_persists_and_nul_id_ignored() -> None:
    p = SseParser()
    evs = feed_all([b"id: 1\ndata: a\n\ndata: b\n\nid: x\x00y\ndata: c\n\n"], p)
    assert [e.id for e in evs] == ["1", "1", "1"]
    assert p.last_event_id == "1"


def test_id_without_data_updates_last_event_id_only() -> None:
    p = SseParser()
    assert p.feed(b"id: prime-9\nretry: 250\n\n") == []
    assert p.last_event_id == "prime-9"
    assert p.retry == 250


def test_empty_data_is_dispatched() -> None:
    evs = feed_all([b"id: 3\ndata:\n\n"])
    assert evs == [SseEvent("message", b"", "3", None)]


def test_invalid_retry_ignored_and_field_without_colon() -> None:
    p = SseParser()
    evs = feed_all([b"retry: 12a\ndata\n\n"], p)
    assert p.retry is None
    assert evs[0].data == b""


def test_bom_is_stripped_even_when_split() -> None:
    evs = feed_all([b"\xef", b"\xbb", b"\xbfdata: z\n\n"])
    assert [e.data for e in evs] == [b"z"]


def test_incomplete_event_waits_for_blank_line() -> None:
    p = SseParser()
    assert p.feed(b"data: par") == []
    assert p.feed(b"tial\n") == []
    assert [e.data for e in p.feed(b"\n")] == [b"partial"]


def test_event_size_bound() -> None:
    p = SseParser(max_event_bytes=10)
    with pytest.raises(SseError):
        p.feed(b"data: 0123456789abc\n")
    p = SseParser(max_event_bytes=10)
    with pytest.raises(SseError):
        p.feed(b"data: 0123456789abcdef")  # an unterminated line is bounded too


class _CountingPattern:
    """Stands in for the parser's line-end pattern and adds up how many bytes it was asked to scan."""

    def __init__(self, pattern) -> None:  # type: ignore[no-untyped-def]
        self.pattern = pattern
        self.scanned = 0

    def finditer(self, data):  # type: ignore[no-untyped-def]
        self.scanned += len(data)
        return self.pattern.finditer(data)


def test_a_long_unterminated_line_is_scanned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream dribbling one long line must not make the parser rescan everything it has kept on
    every chunk (quadratic: 41 s of CPU for 15 MiB). The work is counted in bytes
    scanned, not timed: it must stay linear in what was fed."""
    import proxy.upstream.sse.parse as sse_parse

    counting = _CountingPattern(sse_parse._LINE_END)
    monkeypatch.setattr(sse_parse, "_LINE_END", counting)
    parser = SseParser(max_event_bytes=4 * 1024 * 1024)
    chunk = b"x" * 1024
    fed = 0
    parser.feed(b"data: ")
    for _ in range(2048):  # 2 MiB in 1 KiB chunks, no line end
        parser.feed(chunk)
        fed += len(chunk)
    events = parser.feed(b"\n\n")
    assert len(events) == 1 and len(events[0].data) == fed
    assert counting.scanned <= 2 * (fed + 16)


def test_an_unterminated_line_over_the_bound_is_refused_and_not_kept() -> None:
    parser = SseParser(max_event_bytes=10_000)
    with pytest.raises(SseError):
        for _ in range(100):
            parser.feed(b"y" * 1000)
    assert parser._pending_len == 0 and not parser._pending


def test_crlf_at_the_end_of_a_chunk_is_one_terminator() -> None:
    parser = SseParser()
    assert parser.feed(b"data: a\r\n") == []
    assert [e.data for e in parser.feed(b"\r\n")] == [b"a"]
    assert [e.data for e in feed_all([b"data: b\r", b"\n\r", b"\n"])] == [b"b"]
