"""The stdio frontend's line handling under arbitrary lines (in-process `StdioFrontend.run`, in
front of the same real stdio upstream as the HTTP fuzz tests, its 2025 session already open).

Properties, for every batch of lines:
- every line the proxy writes is one JSON-RPC message;
- every valid request gets an answer with its id; a line that is not JSON gets a parse error;
- no error or traceback in the log, no hang (each batch is bounded).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonrpc
from proxy.frontend.stdio import StdioFrontend
from tests.fuzz.rig import Rig, modern_call, proxy_rig
from tests.fuzz.strategies import JSON, client_requests, jsonrpc_shaped, modern_request

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with proxy_rig(tmp_path_factory.mktemp("stdio-fuzz")) as rig:
        yield rig


class _Lines:
    """A reader that hands out the given lines, then reports end of input once every request
    the frontend started has finished (so the batch's answers are all written first)."""

    def __init__(self, lines: list[bytes], frontend: StdioFrontend) -> None:
        self._lines = list(lines)
        self._frontend = frontend

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        if self._lines:
            return self._lines.pop(0)
        while self._frontend._tasks:
            await asyncio.wait(set(self._frontend._tasks))
        raise asyncio.IncompleteReadError(b"", None)  # what a StreamReader raises at the end


class _Out:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data


async def _run_lines(rig: Rig, lines: list[bytes]) -> list[Any]:
    frontend = StdioFrontend(rig.service)
    # The 2025 session the rig opened serves these lines (no new child per batch); the frontend
    # does not own it, so it stays open after the batch.
    frontend._legacy = rig.service.sessions[rig.session_id]
    out = _Out()
    await frontend.run(_Lines(lines, frontend), out)  # type: ignore[arg-type]
    # The end of stdin is a graceful shutdown of the whole service (proxy/frontend/stdio.py), and
    # after it every request is answered "shutting down". This rig plays many stdin batches on one
    # service, so it takes the service out of its (finished, nothing-in-flight) drain again.
    assert rig.service.draining and not rig.service.requests.tasks
    rig.service.draining = False
    rig.service._drained = None
    assert out.data == b"" or out.data.endswith(b"\n"), bytes(out.data[-200:])
    return [jsonrpc.loads(line) for line in bytes(out.data).splitlines()]


def _line(value: bytes) -> bytes:
    return value.replace(b"\n", b" ") + b"\n"


_LINES = st.one_of(
    st.binary(max_size=120).map(_line),
    JSON.map(jsonrpc.dumps).map(_line),
    jsonrpc_shaped().map(jsonrpc.dumps).map(_line),
    client_requests().map(jsonrpc.dumps).map(_line),
    modern_request(names=st.sampled_from(["echo", "no_such_tool"])).map(lambda c: _line(jsonrpc.dumps(c[0]))),
)


@settings(deadline=None)  # each example is bounded by Rig.run: a wall-clock deadline would flake on a busy machine
@given(lines=st.lists(_LINES, min_size=1, max_size=6))
def test_any_lines_get_json_rpc_answers_and_every_request_its_own(rig: Rig, lines: list[bytes]) -> None:
    answers = rig.run(_run_lines(rig, lines))
    problems = rig.logs.take()
    assert not problems, problems
    for answer in answers:
        assert jsonrpc.validate(answer) is None and jsonrpc.is_response(answer), answer
    answered_ids = [a["id"] for a in answers]
    for line in lines:
        if not line.strip():
            continue
        try:
            message = jsonrpc.loads(line)
        except ValueError:
            assert any(a["id"] is None and a["error"]["code"] == jsonrpc.PARSE_ERROR for a in answers), answers
            continue
        if jsonrpc.validate(message) is None and jsonrpc.is_request(message):
            assert message["id"] in answered_ids, (message, answers)


@settings(deadline=None)  # each example is bounded by Rig.run: a wall-clock deadline would flake on a busy machine
@given(text=st.text(max_size=100), era=st.sampled_from(["legacy", "modern"]))
def test_valid_calls_over_stdio_are_still_answered(rig: Rig, text: str, era: str) -> None:
    if era == "legacy":
        message: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": text}},
        }
    else:
        message, _ = modern_call(9, "tools/call", {"name": "echo", "arguments": {"text": text}})
    (answer,) = rig.run(_run_lines(rig, [jsonrpc.dumps(message) + b"\n"]))
    assert not rig.logs.take()
    assert answer["id"] == 9 and answer["result"]["content"][0]["text"] == text, answer
