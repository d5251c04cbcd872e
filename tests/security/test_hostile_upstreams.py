"""Upstreams that misbehave on purpose, at the link level (docs/security.md, "Hostile upstreams"):
a real stdio child over real pipes under the proxy's guard (tests/fixtures/hostile_stdio.py) and a
raw-socket HTTP server on 127.0.0.1 (tests/fixtures/hostile_http.py).

Links have no timeout of their own (the engine times attempts): a wait bounded here by WAIT_S
that runs out means the link would have left its caller waiting until the attempt's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import Dispatch, FailureKind, UpstreamFailure
from proxy.jsonrpc import Message
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream
from proxy.upstream.stdio import upstream as stdio
from proxy.upstream.streamable.upstream import HttpUpstream
from tests.fixtures.hostile_http import BOMB_GATE, gzip_bomb, hostile_http

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTILE_STDIO = str(FIXTURES / "hostile_stdio.py")
PLAIN_GUARD = str(FIXTURES / "plain_guard.py")
WAIT_S = 30.0  # generous: a hang is what fails, not slowness


def _call(request_id: Any) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "poke", "arguments": {}}}


def _text(answer: Message) -> str:
    return str(answer["result"]["content"][0]["text"])


async def _answer(link: Any, message: Message) -> Message:
    ex = await link.send_request(message)
    return await asyncio.wait_for(ex.response, WAIT_S)


# -- ids of another JSON type -------------------------------------------------------------------


async def test_a_stdio_answer_whose_id_is_true_a_float_or_a_string_is_not_the_answer() -> None:
    """The child answers request 1 with `"id": true`, `1.0` and `"1"` first: each was (or could
    be) taken for 1. Only the answer with the integer id is the request's; the duplicate after it
    is dropped."""
    upstream = StdioUpstream([sys.executable, HOSTILE_STDIO, "--mode", "ids"])
    try:
        link = await upstream.open(Era.LEGACY)
        first = link.new_id()
        assert first == 1  # the id `true` equals in Python
        assert _text(await _answer(link, _call(first))) == "real"
        # the duplicate of the last answer and the next request's decoys do not answer it either
        assert _text(await _answer(link, _call(link.new_id()))) == "real"
    finally:
        await upstream.aclose()


@pytest.mark.parametrize("mode", ["id-true", "id-float"])
async def test_an_http_answer_whose_id_is_another_json_type_fails_the_request_at_once(mode: str) -> None:
    """A 2025 HTTP link numbers its requests from 1; an `application/json` answer to request 1
    with `"id": true` was delivered as its answer, one with `1.0` was taken for it but resolved
    nothing (the caller waited for its timeout). Either is no answer: the request fails now."""
    async with hostile_http() as base:
        upstream = HttpUpstream(f"{base}/{mode}/mcp")
        try:
            link = await upstream.open(Era.LEGACY)
            request_id = link.new_id()
            assert request_id == 1
            ex = await link.send_request(_call(request_id))
            with pytest.raises(UpstreamFailure) as info:
                await asyncio.wait_for(ex.response, WAIT_S)
            assert info.value.kind is FailureKind.CLOSED and info.value.dispatched is Dispatch.UNKNOWN
        finally:
            await upstream.aclose()


async def test_an_http_event_stream_of_lookalike_answers_delivers_only_the_real_one() -> None:
    async with hostile_http() as base:
        upstream = HttpUpstream(f"{base}/ids-sse/mcp")
        try:
            link = await upstream.open(Era.LEGACY)
            request_id = link.new_id()
            assert request_id == 1
            answer = await _answer(link, _call(request_id))
            assert answer["id"] == 1 and _text(answer) == "real"
        finally:
            await upstream.aclose()


# -- a process that leaves the group holding the pipes ---------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def _read_pid(path: Path) -> int | None:
    return int(path.read_text()) if path.exists() else None  # written whole (renamed into place)


async def _pid_from(path: Path) -> int:
    for _ in range(int(WAIT_S / 0.05)):  # the grandchild writes it right after its fork
        pid = _read_pid(path)
        if pid is not None:
            return pid
        await asyncio.sleep(0.05)
    raise AssertionError("the grandchild never wrote its pid")


async def _escape_and_recover(tmp_path: Path) -> int:
    """A call whose server forks a grandchild into a session of its own (holding stdin and stdout)
    and exits: the call fails as the child's end, and the link's next request gets a new child.
    Returns the grandchild's pid."""
    pid_file = tmp_path / "grandchild.pid"
    upstream = StdioUpstream([sys.executable, HOSTILE_STDIO, "--mode", "escape", "--pid-file", str(pid_file)])
    try:
        link = await upstream.open(Era.LEGACY)
        ex = await link.send_request(_call(link.new_id()))
        grandchild = await _pid_from(pid_file)
        with pytest.raises(UpstreamFailure) as info:
            await asyncio.wait_for(ex.response, WAIT_S)
        assert info.value.kind is FailureKind.CLOSED and info.value.dispatched is Dispatch.UNKNOWN
        pong = await _answer(link, {"jsonrpc": "2.0", "id": link.new_id(), "method": "ping"})
        assert pong["result"] == {}
        return grandchild
    finally:
        await upstream.aclose()


async def test_a_grandchild_that_leaves_the_group_with_the_pipes_is_ended_by_the_guard(tmp_path: Path) -> None:
    """The guard is its subreaper: once the server exits, what left the group is ended too (before,
    it lived on with the pipes, and the link waited on a dead child for ever)."""
    grandchild = await _escape_and_recover(tmp_path)
    try:
        for _ in range(int(WAIT_S / 0.05)):
            if not _alive(grandchild):
                break
            await asyncio.sleep(0.05)
        assert not _alive(grandchild), "the process that left the group outlived the guard"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


async def test_a_child_whose_stdout_outlives_its_process_is_ended_by_the_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a guard able to act (here a stand-in that only execs the command), the proxy itself
    ends the link once the process exited and its stdout stayed open a moment longer."""
    monkeypatch.setattr(stdio, "_GUARD", PLAIN_GUARD)
    grandchild = 0
    try:
        with caplog.at_level(logging.WARNING, logger="proxy.upstream.stdio"):
            grandchild = await _escape_and_recover(tmp_path)
        assert any("still holds its stdout" in r.getMessage() for r in caplog.records)
    finally:
        grandchild = grandchild or _read_pid(tmp_path / "grandchild.pid") or 0
        if grandchild:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)


# -- a byte order mark before the first line ------------------------------------------------


@pytest.mark.parametrize("mode", ["bom", "crlf"])
async def test_a_stdio_server_with_a_bom_or_crlf_line_ends_is_probed_and_answers(mode: str) -> None:
    """`bom`: the answer to the probe was that first line, dropped as not JSON, and the server read
    as one that never answers `server/discover` (and then `initialize`). `crlf` held already."""
    upstream = StdioUpstream([sys.executable, HOSTILE_STDIO, "--mode", mode], handshake_timeout_s=WAIT_S)
    try:
        capabilities = await upstream.probe()
        assert capabilities.modern and capabilities.legacy, capabilities
        link = await upstream.open(Era.LEGACY)
        assert _text(await _answer(link, _call(link.new_id()))) == "real"
    finally:
        await upstream.aclose()


# -- what an upstream can make the proxy log --------------------------------------------------


async def test_an_event_stream_of_junk_logs_a_bounded_number_of_lines(caplog: pytest.LogCaptureFixture) -> None:
    """20,000 events that are not JSON in one response, then the answer: the answer arrives, and
    the warnings are the bucket's (100 at once, 20 a second), not one per event."""
    n = 20_000
    async with hostile_http() as base:
        upstream = HttpUpstream(f"{base}/junk-sse/mcp?n={n}")
        try:
            link = await upstream.open(Era.LEGACY)
            started = time.monotonic()
            with caplog.at_level(logging.INFO, logger="proxy.upstream"):
                answer = await _answer(link, _call(link.new_id()))
            took_s = time.monotonic() - started
        finally:
            await upstream.aclose()
    assert _text(answer) == "real"
    lines = [r for r in caplog.records if "not JSON" in r.getMessage()]
    # A bound computed from the run's own length (the bucket refills as time passes), not a timing
    # assertion: before, every event was a line.
    assert len(lines) <= 100 + 20 * took_s + 1, len(lines)


# -- a compressed event stream that inflates without bound ------------------------------------


async def test_a_gzip_bomb_on_an_event_stream_fails_the_request_without_being_inflated() -> None:
    """64 KiB of gzip that inflate to 64 MiB, in an event stream already being read (whose body has
    no bound of its own, only each event): one read was inflated whole, 64 MiB at once (hundreds
    from a larger bomb). Measured by tracemalloc's peak over the request, the bomb built before."""
    gzip_bomb()
    gate = BOMB_GATE["gzip-sse"] = asyncio.Event()  # set once the stream's first event is read
    async with hostile_http() as base:
        upstream = HttpUpstream(f"{base}/gzip-sse/mcp")
        tracemalloc.start()
        try:
            link = await upstream.open(Era.LEGACY)
            ex = await link.send_request(_call(link.new_id()), on_message=lambda _: gate.set())
            with pytest.raises(UpstreamFailure) as info:
                await asyncio.wait_for(ex.response, WAIT_S)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await upstream.aclose()
    assert info.value.kind is FailureKind.PROTOCOL and info.value.dispatched is Dispatch.UNKNOWN
    assert peak < 40 * 1024 * 1024, f"{peak / 2**20:.1f} MiB held at once"


async def test_a_child_that_closes_its_stdout_and_ignores_sigterm_fails_the_call_and_is_replaced() -> None:
    """Held already: its stdout's end stops its group (SIGTERM, then SIGKILL), the call fails as
    the child's end (dispatch unknown), and the next request gets a new child."""
    upstream = StdioUpstream([sys.executable, HOSTILE_STDIO, "--mode", "close-stdout"])
    try:
        link = await upstream.open(Era.LEGACY)
        ex = await link.send_request(_call(link.new_id()))
        with pytest.raises(UpstreamFailure) as info:
            await asyncio.wait_for(ex.response, WAIT_S)
        assert info.value.kind is FailureKind.CLOSED and info.value.dispatched is Dispatch.UNKNOWN
        pong = await _answer(link, {"jsonrpc": "2.0", "id": link.new_id(), "method": "ping"})
        assert pong["result"] == {}
    finally:
        await upstream.aclose()


async def test_a_redirect_to_an_address_that_is_not_a_url_is_a_redirect_not_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A `Location: http://[` made the failure's own description raise (urlsplit's ValueError):
    the call failed as "internal error while relaying" with a traceback in the log. It is the
    redirect it is: not run there, nothing logged as a failure of the proxy's."""
    async with hostile_http() as base:
        upstream = HttpUpstream(f"{base}/bad-redirect/mcp")
        try:
            link = await upstream.open(Era.LEGACY)
            with caplog.at_level(logging.ERROR, logger="proxy"):
                ex = await link.send_request(_call(link.new_id()))
                with pytest.raises(UpstreamFailure) as info:
                    await asyncio.wait_for(ex.response, WAIT_S)
        finally:
            await upstream.aclose()
    assert info.value.kind is FailureKind.HTTP_STATUS and info.value.http_status == 307
    assert info.value.dispatched is Dispatch.NO
    assert "redirected the request to an address that is not a URL" in info.value.detail
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_200_with_an_html_page_is_a_protocol_failure_not_an_answer() -> None:
    """Held already (no test said so): the request fails, its effect unknown, the page not echoed."""
    async with hostile_http() as base:
        upstream = HttpUpstream(f"{base}/html/mcp")
        try:
            link = await upstream.open(Era.LEGACY)
            ex = await link.send_request(_call(link.new_id()))
            with pytest.raises(UpstreamFailure) as info:
                await asyncio.wait_for(ex.response, WAIT_S)
        finally:
            await upstream.aclose()
    assert info.value.kind is FailureKind.PROTOCOL and info.value.dispatched is Dispatch.UNKNOWN
    assert "text/html" in info.value.detail and "Welcome" not in info.value.detail
