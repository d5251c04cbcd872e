"""The warm pool sized to demand, over real children (a small Python server under the proxy's guard):
it grows to a burst of sessions so that the next burst takes only warm children, stays within its
ceiling and the sessions the upstream may still open, shrinks back once the burst has decayed, and
never starts children in a loop once the command stops working."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream
from proxy.upstream.stdio.link import StdioLink

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

CHILD = textwrap.dedent(
    """
    import json, os, sys
    if len(sys.argv) > 1 and os.path.exists(sys.argv[1]):
        sys.exit(3)  # the command stopped working
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" in msg:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": {"method": msg["method"]}}
            sys.stdout.write(json.dumps(reply) + "\\n")
            sys.stdout.flush()
    """
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _upstream(*command: str, **settings: int) -> StdioUpstream:
    upstream = StdioUpstream([sys.executable, "-c", CHILD, *command], **settings)  # type: ignore[arg-type]
    # Counted as if a start took a minute (as on a loaded host): every open of a test falls within one
    # start time, so the demand the pool sees is exactly what the test opened, however fast the machine.
    upstream.spare_pool.min_window_s = 60.0
    return upstream


async def _session(upstream: StdioUpstream) -> StdioLink:
    link = await upstream.open(Era.LEGACY)
    assert isinstance(link, StdioLink)
    ex = await link.send_request({"jsonrpc": "2.0", "id": link.new_id(), "method": "initialize"})
    assert (await asyncio.wait_for(ex.response, 30))["result"] == {"method": "initialize"}
    return link


async def _burst(upstream: StdioUpstream, n: int) -> list[StdioLink]:
    return list(await asyncio.gather(*(_session(upstream) for _ in range(n))))


async def _settled(upstream: StdioUpstream, bound_s: float = 60.0) -> int:
    """Until the pool starts nothing more (its starts and its memory reading are tasks: awaited,
    bounded); the spares it then holds."""
    pool = upstream.spare_pool
    async with asyncio.timeout(bound_s):
        while True:
            pending = list(pool.starting)
            if pool.memory.reading is not None:
                pending.append(pool.memory.reading)
            if not pending:
                return upstream.spares_ready
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)


async def test_the_pool_grows_to_a_burst_of_sessions_and_the_next_burst_takes_only_warm_children() -> None:
    upstream = _upstream(spares=1, spares_max=8, spare_starts=2)
    try:
        await _session(upstream)  # the command works: the base spare starts
        assert await _settled(upstream) == 1
        first = await _burst(upstream, 6)
        assert await _settled(upstream) == 7, "the pool learned the burst (and the session before it)"
        for link in first:
            await link.aclose()
        warm = list(upstream._pool)
        spawned = upstream.spawned
        second = await _burst(upstream, 6)
        assert {id(link.child) for link in second} <= {id(child) for child in warm}, (
            "every session of the second burst ran on a child started ahead"
        )
        assert upstream.spawned - spawned <= 6, "what started since is the pool's refill, no session's own"
    finally:
        await upstream.aclose()


async def test_the_pool_grows_no_further_than_its_ceiling() -> None:
    upstream = _upstream(spares=1, spares_max=3, spare_starts=2)
    try:
        await _session(upstream)
        await _burst(upstream, 6)
        assert await _settled(upstream) == 3
    finally:
        await upstream.aclose()


async def test_the_pool_grows_no_further_than_the_sessions_the_upstream_may_still_open() -> None:
    upstream = _upstream(spares=1, spares_max=8, spare_starts=2, max_children=6)
    try:
        await _session(upstream)
        await _burst(upstream, 3)  # four sessions open of six: room for two more
        assert await _settled(upstream) == 2
    finally:
        await upstream.aclose()


async def test_the_pool_grows_no_further_than_the_memory_it_may_take() -> None:
    upstream = _upstream(spares=1, spares_max=8, spare_starts=2)
    upstream.spare_pool.memory.share = 0.0  # no memory to spare beyond what runs now
    try:
        await _session(upstream)
        await _burst(upstream, 6)
        assert await _settled(upstream) == 1, "the base size only"
        per_child = upstream.spare_pool.memory.per_child
        assert per_child is not None and per_child > 5 << 20, "measured on a live child: a Python process and its guard"
    finally:
        await upstream.aclose()


async def test_a_pool_without_growth_keeps_its_size_whatever_the_burst() -> None:
    upstream = _upstream(spares=2, spares_max=0, spare_starts=2)
    try:
        await _session(upstream)
        await _burst(upstream, 5)
        assert await _settled(upstream) == 2
    finally:
        await upstream.aclose()


async def test_the_grown_pool_shrinks_back_once_the_burst_has_decayed() -> None:
    upstream = _upstream(spares=1, spares_max=8, spare_starts=2)
    try:
        await _session(upstream)
        await _burst(upstream, 5)
        assert await _settled(upstream) == 6
        assert upstream.reap_idle_spares() == 0, "within the decay the grown pool is kept"
        upstream.spare_pool.demand.decay_s = 0.0  # the burst is now past its decay
        reaped = list(upstream._pool)[:5]
        assert upstream.reap_idle_spares() == 5
        assert upstream.spares_ready == 1, "back to the base size"
        for child in reaped:
            await asyncio.wait_for(child.exited.wait(), 10)
        assert not upstream.spare_pool.starting, "and nothing starts to replace them"
    finally:
        await upstream.aclose()


async def test_spares_that_die_unused_stop_the_refill_until_a_child_answers_again(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    upstream = _upstream(str(broken), spares=1, spares_max=8, spare_starts=2)
    try:
        await _session(upstream)
        await _burst(upstream, 4)
        assert await _settled(upstream) == 5
        broken.touch()  # from now on every new child exits at once (a spare still booting too)
        # Four sessions take spares (one may die under them, if it was still booting); every take
        # starts a replacement, which dies unused.
        await asyncio.gather(*(_session(upstream) for _ in range(4)), return_exceptions=True)
        await _settled(upstream, bound_s=30)
        async with asyncio.timeout(30):
            while upstream.spares_ready:  # each death is awaited
                await upstream._pool[0].exited.wait()
        assert not upstream.spare_pool.starting, "a spare that died unused stops the refill: no loop of starts"
        broken.unlink()
        link = await _session(upstream)  # a fresh child answers: the command works again
        assert link.child is not None and link.child.answered
        assert await _settled(upstream) >= 1, "and the pool refills"
    finally:
        await upstream.aclose()
