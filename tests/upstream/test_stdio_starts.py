"""Children of a stdio upstream start a bounded few at a time (`--stdio-max-starting`).

Fifty 2025 sessions opened together started fifty Python interpreters at once on two cores: each
took 45 s to start instead of one, and the proxy's event loop, one process among fifty, stalled for
seconds (bench/load_faults.py's deadline probe saw calls answered 6 s after their deadline). Real
child processes over real pipes; each child writes down when it began and when it was ready (after
a pause standing for an interpreter's imports), before it answers anything, so the overlap of
those intervals is what the proxy allowed, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import UpstreamFailure
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

BOOTING_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    began = time.time()
    time.sleep(0.3)  # a real server's imports
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "began": began, "ready": time.time()}) + "\\n")
    for line in sys.stdin:
        message = json.loads(line)
        if "id" in message:
            print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {}}), flush=True)
    """
)


async def _initialize(upstream: StdioUpstream) -> dict[str, Any]:
    link = await upstream.open(Era.LEGACY)
    request = {"jsonrpc": "2.0", "id": link.new_id(), "method": "initialize", "params": {}}
    exchange = await link.send_request(request)
    async with asyncio.timeout(30):
        return await exchange.response


def _most_at_once(starts: list[dict[str, float]]) -> int:
    edges = sorted([(s["began"], 1) for s in starts] + [(s["ready"], -1) for s in starts])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("limit", [1, 2])
async def test_sessions_opened_together_start_their_children_a_bounded_few_at_a_time(
    tmp_path: Path, limit: int
) -> None:
    journal = tmp_path / "starts.jsonl"
    upstream = StdioUpstream(
        [sys.executable, "-c", BOOTING_CHILD, str(journal)], spares=0, max_starting=limit, max_children=16
    )
    try:
        answers = await asyncio.gather(*(_initialize(upstream) for _ in range(6)))
        assert all(a.get("result") == {} for a in answers)
    finally:
        await upstream.aclose()
    starts = [json.loads(line) for line in journal.read_text().splitlines()]
    assert len(starts) == 6, "every session got its own child"
    assert _most_at_once(starts) == limit, "never more than the limit starting at once, and the limit is used"


async def test_a_child_that_exits_without_a_word_gives_its_start_slot_back(tmp_path: Path) -> None:
    # (a handshake timeout beyond the test's bound: the slot's own fallback, that long, cannot
    # hide a slot kept after the exit)
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    upstream = StdioUpstream(command, spares=0, max_starting=1, handshake_timeout_s=120)
    try:
        for _ in range(3):  # with the slot kept, the second start would wait for good
            with pytest.raises(UpstreamFailure):
                await _initialize(upstream)
    finally:
        await upstream.aclose()
