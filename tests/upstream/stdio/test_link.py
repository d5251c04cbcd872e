"""The stdio link's reading of a real child's pipes: lines split across writes, several messages in
one write, non-JSON noise, stderr, and a message over the size limit. The child is a small Python
script over real pipes (under the proxy's guard process)."""

from __future__ import annotations

import asyncio
import logging
import sys
import textwrap

import pytest

from proxy.errors import FailureKind, UpstreamFailure
from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

CHILD = textwrap.dedent(
    """
    import json, sys, time
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        reply = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"method": msg["method"]}})
        method = msg["method"]
        if method == "split":  # one message in two writes, 50 ms apart
            out.write(reply[:10]); out.flush(); time.sleep(0.05); out.write(reply[10:] + "\\n")
        elif method == "noisy":  # noise on stdout and stderr around the answer, all in one write
            sys.stderr.write("a line on stderr\\n"); sys.stderr.flush()
            out.write("not json at all\\n\\n" + reply + "\\n")
        elif method == "spew":  # 5000 stderr lines, one very long
            sys.stderr.write("".join(f"stderr line {i}\\n" for i in range(4999)) + "z" * 100000 + "\\n")
            sys.stderr.flush()
            out.write(reply + "\\n")
        elif method == "long":  # a 10,000-character line on stderr, and one of non-JSON on stdout
            sys.stderr.write("E" + "e" * 9998 + "$\\n"); sys.stderr.flush()
            out.write("O" + "o" * 9998 + "$\\n" + reply + "\\n")
        elif method == "huge":  # a line far over the proxy's limit, never ended
            out.write("x" * 5000)
        else:
            out.write(reply + "\\n")
        out.flush()
    """
)


@pytest.fixture(params=[pytest.param(False, id="asyncio"), pytest.param(True, id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return "asyncio", {"use_uvloop": request.param}  # the proxy itself runs on uvloop


async def _link(max_message_bytes: int = 1_000_000):  # type: ignore[no-untyped-def]
    upstream = StdioUpstream([sys.executable, "-c", CHILD], max_message_bytes=max_message_bytes)
    return upstream, await upstream.open(Era.LEGACY)


async def _call(link, method: str) -> dict:  # type: ignore[no-untyped-def]
    uid = link.new_id()
    ex = await link.send_request({"jsonrpc": "2.0", "id": uid, "method": method})
    return await asyncio.wait_for(ex.response, 10)


async def test_a_message_split_across_writes_and_noise_around_one_are_read_correctly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream, link = await _link()
    try:
        with caplog.at_level(logging.INFO, logger="proxy.upstream"):
            assert (await _call(link, "split"))["result"] == {"method": "split"}
            assert (await _call(link, "noisy"))["result"] == {"method": "noisy"}
            for _ in range(50):  # stderr arrives on its own pipe, maybe a moment later
                if any("a line on stderr" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.02)
        messages = [r.getMessage() for r in caplog.records]
        assert any("not json at all" in m for m in messages), "non-JSON stdout is logged and skipped"
        assert any("a line on stderr" in m for m in messages), "stderr is logged line by line"
    finally:
        await upstream.aclose()


async def test_a_long_stderr_or_non_json_stdout_line_is_logged_cut_at_the_line_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a child writes reaches the proxy's log bounded: a 10,000-character line is logged as
    its first `STDERR_LINE_LIMIT` (2000) characters, on stderr and as non-JSON stdout alike."""
    from proxy.upstream.stdio.process import STDERR_LINE_LIMIT

    assert STDERR_LINE_LIMIT == 2000
    upstream, link = await _link()
    try:
        with caplog.at_level(logging.INFO, logger="proxy.upstream"):
            assert (await _call(link, "long"))["result"] == {"method": "long"}
            for _ in range(50):  # stderr arrives on its own pipe, maybe a moment later
                if any("Eeee" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.02)
        messages = [r.getMessage() for r in caplog.records]
        for head, body in (("E", "e"), ("O", "o")):  # stderr, then stdout
            (logged,) = [m for m in messages if head + body * 4 in m]
            line = logged[logged.index(head + body) :]
            assert line == head + body * (STDERR_LINE_LIMIT - 1), (head, len(line))
    finally:
        await upstream.aclose()


async def test_many_answers_in_flight_each_reach_their_request() -> None:
    upstream, link = await _link()
    try:
        results = await asyncio.gather(*(_call(link, f"m{i}") for i in range(200)))
        assert [r["result"]["method"] for r in results] == [f"m{i}" for i in range(200)]
    finally:
        await upstream.aclose()


async def test_a_message_over_the_size_limit_stops_the_child_and_fails_its_call_promptly() -> None:
    upstream, link = await _link(max_message_bytes=1024)
    try:
        with pytest.raises(UpstreamFailure) as failure:
            await _call(link, "huge")
        assert failure.value.kind is FailureKind.CLOSED
        # the next call gets a fresh child
        assert (await _call(link, "after"))["result"] == {"method": "after"}
    finally:
        await upstream.aclose()


async def _pool_holds(upstream: StdioUpstream, n: int, bound_s: float = 20.0) -> None:
    """Until `n` spares are ready (their starts are tasks of the pool: awaited, bounded)."""
    async with asyncio.timeout(bound_s):
        while upstream.spares_ready < n:
            if upstream._starting:
                await asyncio.wait(list(upstream._starting), return_when=asyncio.FIRST_COMPLETED)
            else:
                assert upstream.spares_ready >= n, f"pool stuck at {upstream.spares_ready} of {n}, nothing starting"


async def test_a_new_session_gets_the_warm_spare_and_a_new_spare_is_started() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=1)
    try:
        first = await upstream.open(Era.LEGACY)
        await _call(first, "initialize")  # the command works: a spare is started for the next session
        await _pool_holds(upstream, 1)
        spare = upstream._pool[0]
        assert spare.alive
        second = await upstream.open(Era.LEGACY)
        assert (await _call(second, "initialize"))["result"] == {"method": "initialize"}
        assert second._child is spare, "the second session runs on the spare, already started"
        assert first._child is not spare
        await _pool_holds(upstream, 1)
        assert upstream._pool[0] is not spare, "and the next spare is warming"
        last = upstream._pool[0]
    finally:
        await upstream.aclose()
    assert not last.alive and last.returncode is not None, "closing the upstream stops the spare too"


async def test_the_pool_fills_to_its_size_a_bounded_few_at_a_time_and_serves_sessions_oldest_first() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=4, spare_starts=2)
    links = []
    try:
        first = await upstream.open(Era.LEGACY)
        await _call(first, "initialize")
        assert len(upstream._starting) == 2, "two start at once, not four"
        await _pool_holds(upstream, 4)
        assert upstream.spares_ready == 4 and not upstream._starting, "bounded: no fifth"
        ready = list(upstream._pool)
        for _ in range(4):
            link = await upstream.open(Era.LEGACY)
            assert (await _call(link, "initialize"))["result"] == {"method": "initialize"}
            links.append(link)
        assert [link._child for link in links] == ready, "every session got a warm child, oldest first"
        assert upstream.children == 5, "spares are counted as children only once a session has them"
        await _pool_holds(upstream, 4)
    finally:
        await upstream.aclose()
    assert not any(child.alive for child in ready)


async def test_a_session_waits_for_a_starting_spare_instead_of_starting_its_own() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=2, spare_starts=2)
    try:
        first = await upstream.open(Era.LEGACY)
        await _call(first, "initialize")
        assert upstream.spares_ready == 0 and len(upstream._starting) == 2
        starting = list(upstream._starting)
        second = await upstream.open(Era.LEGACY)
        await _call(second, "initialize")
        assert second._child in [task.result() for task in starting if task.done()], (
            "no process of its own: it took one of the two starting"
        )
    finally:
        await upstream.aclose()


async def test_the_pool_warms_once_the_probe_answered_so_the_first_session_gets_a_spare() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=1)
    try:
        caps = await upstream.probe()  # (the child answers discover without versions: legacy only)
        assert caps.legacy and not caps.modern
        await _pool_holds(upstream, 1)
        spare = upstream._pool[0]
        first = await upstream.open(Era.LEGACY)
        assert (await _call(first, "initialize"))["result"] == {"method": "initialize"}
        assert first._child is spare, "the first session did not wait for a process start of its own"
    finally:
        await upstream.aclose()
    broken = StdioUpstream([sys.executable, "-c", "import sys; sys.exit(3)"], spares=1)
    try:
        with pytest.raises(UpstreamFailure):
            await broken.probe()
        assert broken.spares_ready == 0 and not broken._starting, "a command that never answered gets no spare"
    finally:
        await broken.aclose()


async def test_idle_spares_are_reaped_down_to_one() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=3, spare_idle_s=0.0)
    try:
        first = await upstream.open(Era.LEGACY)
        await _call(first, "initialize")
        await _pool_holds(upstream, 3)
        reaped = list(upstream._pool)[:2]
        assert upstream.reap_idle_spares() == 2
        assert upstream.spares_ready == 1
        for child in reaped:
            await asyncio.wait_for(child.exited.wait(), 10)
        assert not upstream._starting, "a reaped spare is not replaced until a session takes one"
    finally:
        await upstream.aclose()


async def test_no_spare_without_a_session_that_answered_and_none_when_off() -> None:
    upstream = StdioUpstream([sys.executable, "-c", CHILD], spares=0)
    try:
        link = await upstream.open(Era.LEGACY)
        await _call(link, "initialize")
        assert upstream.spares_ready == 0 and not upstream._starting
    finally:
        await upstream.aclose()
    broken = StdioUpstream([sys.executable, "-c", "import sys; sys.exit(3)"], spares=1)
    try:
        link = await broken.open(Era.LEGACY)
        with pytest.raises(UpstreamFailure):
            await _call(link, "initialize")
        assert broken.spares_ready == 0 and not broken._starting, "a command that never answered gets no spare"
    finally:
        await broken.aclose()


async def test_ending_a_session_does_not_wait_for_its_child_to_exit() -> None:
    """A DELETE ends the session at once; the child's graceful exit (here: one that lingers after
    its stdin closes) runs in the background and is awaited when the service shuts down."""
    from proxy.core.service import Service
    from proxy.settings import Settings

    lingering = CHILD + "\ntime.sleep(30)\n"  # answers until stdin closes, then lingers
    upstream = StdioUpstream([sys.executable, "-c", lingering], spares=0)
    service = Service(Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x"), upstream)
    session_id, relay = await service.new_session()
    await _call(relay.link, "initialize")
    child = relay.link._child  # type: ignore[attr-defined]
    assert child is not None and child.alive
    assert await service.close_session(session_id)
    assert session_id not in service.sessions
    assert child.alive, "close_session returned without waiting for the child's exit"
    await service.aclose()
    assert not child.alive and child.returncode is not None, "shutdown waited for it"


async def test_the_stderr_budget_comes_from_the_settings(caplog: pytest.LogCaptureFixture) -> None:
    """`--stderr-burst-lines` and `--stderr-lines-per-s` reach every child's log budget (they were
    constants): with a burst of 5 and no refill, 5 of the 5000 lines are logged, the rest counted."""
    from proxy.core.upstreams import build_upstream
    from proxy.settings import Settings
    from proxy.telemetry.shed import SHED

    settings = Settings(upstream_command=f"{sys.executable} -c 'pass'", stderr_burst_lines=5, stderr_lines_per_s=0)
    upstream = build_upstream(settings)
    assert isinstance(upstream, StdioUpstream)
    upstream.command = [sys.executable, "-c", CHILD]
    before = SHED.get("stderr_lines_dropped")
    link = await upstream.open(Era.LEGACY)
    try:
        with caplog.at_level(logging.INFO, logger="proxy.upstream"):
            assert (await _call(link, "spew"))["result"] == {"method": "spew"}
            protocol = link._child.protocol
            await link.aclose()
            await asyncio.wait_for(protocol.stderr_closed.wait(), 10)
        logged = [r.getMessage() for r in caplog.records if "stderr line " in r.getMessage()]
        assert len(logged) == 5
        assert SHED.get("stderr_lines_dropped") - before == 4995
    finally:
        await upstream.aclose()


async def test_readiness_and_admission_agree_while_a_closed_sessions_child_is_still_stopping() -> None:
    """At the session cap, a closed session's child that lingers after its stdin closes still
    counts against the upstream's cap of children: an `initialize` then got 503 while `/readyz`
    said ready. Now `/readyz` says the slot is closing, and an `initialize` in that window waits
    for the child to be gone and is then admitted (not refused, and no other session closed)."""
    from proxy.core.service import Service
    from proxy.settings import Settings
    from proxy.upstream.base import Capabilities

    lingering = CHILD + "\ntime.sleep(30)\n"  # answers until stdin closes, then lingers
    upstream = StdioUpstream([sys.executable, "-c", lingering], spares=0, max_children=1)
    settings = Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x", max_sessions=1)
    service = Service(settings, upstream)
    service.capabilities = Capabilities(legacy=True, modern=False)  # as a start-up probe leaves it

    async def admitted() -> bool:
        try:
            session_id, _ = await service.new_session()
        except UpstreamFailure:
            return False
        await service.close_session(session_id)
        return True

    try:
        session_id, relay = await service.new_session()
        await _call(relay.link, "initialize")
        child = relay.link._child  # type: ignore[attr-defined]
        assert await service.close_session(session_id)
        assert child.alive, "the child is still stopping (it lingers after its stdin closed)"
        ready, why = await service.readiness()
        assert not ready and why is not None and "closing" in why, why
        assert await asyncio.wait_for(admitted(), 30), "admission waits for the closing child"
        assert not child.alive, "admitted only once the child was gone"
        await asyncio.wait_for(asyncio.gather(*service._closing), 20)
        assert await service.readiness() == (True, None)
    finally:
        await service.aclose()


async def test_a_child_flooding_stderr_is_logged_within_its_budget(caplog: pytest.LogCaptureFixture) -> None:
    """A child cannot turn every stderr line into a log line (200k lines in 2.5 s): a burst of
    100 lines, then 20 a second, per child; the rest is counted and summed up in one line."""
    from proxy.telemetry.shed import SHED

    before = SHED.get("stderr_lines_dropped")
    upstream, link = await _link()
    try:
        with caplog.at_level(logging.INFO, logger="proxy.upstream"):
            assert (await _call(link, "spew"))["result"] == {"method": "spew"}
            protocol = link._child.protocol
            await link.aclose()  # the child's stderr ends: what it dropped is summed up
            await asyncio.wait_for(protocol.stderr_closed.wait(), 10)
        messages = [r.getMessage() for r in caplog.records]
        logged = [m for m in messages if "stderr line " in m or "zzzz" in m]
        dropped = SHED.get("stderr_lines_dropped") - before
        assert len(logged) < 1000, "logging is rate-limited"
        assert len(logged) + dropped == 5000, "every line is either logged or counted"
        assert all(len(m) < 2100 for m in logged), "each logged line is bounded"
        summaries = [r.getMessage() for r in caplog.records if "output lines not logged" in r.getMessage()]
        assert summaries and sum(int(m.split(": ")[1].split()[0]) for m in summaries) == dropped
    finally:
        await upstream.aclose()
