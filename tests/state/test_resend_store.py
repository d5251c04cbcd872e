"""The re-send records shared by the replicas (proxy/state/resends.py) against a real redis-server:
two `RedisState` instances in one process stand for two replicas, as in test_redis_state.py, and
each one's `resends` is what its engine's re-send table talks to."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import orjson
import pytest

from proxy.core.resend import Resends
from proxy.state.shared import RedisState
from tests.state.redis_server import RedisServer
from tests.state.test_redis_state import Fleet, until

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 10.0


@pytest.fixture
async def fleet(redis_server: RedisServer) -> AsyncIterator[Fleet]:
    f = Fleet(redis_server.url)
    yield f
    await f.aclose()


def op() -> str:
    return uuid.uuid4().hex


def answer(text: str) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}}


async def written(state: RedisState) -> None:
    """Until the replica's background writes reached the store (bounded)."""
    with anyio.fail_after(BOUND_S):
        await state.resends.flushed()


async def test_a_re_send_on_another_replica_waits_for_the_running_call_and_gets_its_answer(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    operation = op()
    a.resends.listed(operation, False, None, 30.0)
    await until(lambda: b.resends.find(operation) is not None)
    waiting = asyncio.ensure_future(b.resends.answer(operation, BOUND_S))
    await asyncio.sleep(0)
    assert not waiting.done(), "running: the re-send waits"
    a.resends.answered(operation, orjson.dumps(answer("charged")), 60.0, False, None)
    with anyio.fail_after(BOUND_S):
        got = await waiting
    assert got == answer("charged")


async def test_one_record_per_operation_the_first_replica_keeps_it(fleet: Fleet, redis_server: RedisServer) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    operation = op()
    a.resends.listed(operation, False, None, 30.0)
    await written(a)
    b.resends.listed(operation, False, None, 30.0)  # B ran the same call too: it cannot take the record
    b.resends.answered(operation, orjson.dumps(answer("B's")), 60.0, False, None)
    b.resends.gone(operation, True)  # and its own delivery does not end A's record
    await written(b)
    key = a.resends.key(operation)
    assert redis_server.client().hget(key, "o") == a.resends.replica.encode()
    assert redis_server.client().hget(key, "s") == b"r", "B's answer was not written over A's record"
    a.resends.answered(operation, orjson.dumps(answer("A's")), 60.0, False, None)
    await until(lambda: (r := b.resends.find(operation)) is not None and r.answered)
    assert await b.resends.answer(operation, 1.0) == answer("A's")
    b.resends.gone(operation, False)  # delivered through B, a re-send: the record ends
    await until(lambda: a.resends.find(operation) is None)
    assert redis_server.client().exists(key) == 0


async def test_a_running_record_lives_for_the_calls_deadline_and_an_answer_for_the_window(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    a = await fleet.replica()
    operation = op()
    a.resends.listed(operation, True, "args-digest", 20.0)
    await written(a)
    key = a.resends.key(operation)
    assert 20_000 < redis_server.client().pttl(key) <= 25_000  # the deadline and a grace
    assert redis_server.client().hmget(key, ["k", "g"]) == [b"1", b"args-digest"]
    a.resends.answered(operation, orjson.dumps(answer("x")), 300.0, True, "args-digest")
    await written(a)
    assert 299_000 < redis_server.client().pttl(key) <= 300_000


async def test_a_record_gone_ends_the_wait_at_once_and_the_re_send_runs_anew(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    operation = op()
    a.resends.listed(operation, False, None, 30.0)
    await until(lambda: b.resends.find(operation) is not None)
    waiting = asyncio.ensure_future(b.resends.answer(operation, BOUND_S))
    await asyncio.sleep(0)
    a.resends.gone(operation, True)  # A's caller cancelled its call
    with anyio.fail_after(BOUND_S / 2):
        assert await waiting is None
    assert b.resends.find(operation) is None


async def test_a_wait_ends_when_the_store_goes_away(own_redis: RedisServer) -> None:
    fleet = Fleet(own_redis.url)
    try:
        a, b = await fleet.replica(), await fleet.replica()
        operation = op()
        a.resends.listed(operation, False, None, 30.0)
        await until(lambda: b.resends.find(operation) is not None)
        waiting = asyncio.ensure_future(b.resends.answer(operation, 30.0))
        await asyncio.sleep(0)
        started = time.monotonic()
        own_redis.kill()
        with anyio.fail_after(BOUND_S):
            assert await waiting is None
        assert time.monotonic() - started < BOUND_S
        # writes while it is away are dropped at once, and counted
        before = a.fallbacks["resend"]
        a.resends.listed(op(), False, None, 30.0)
        await until(lambda: not a.up)
        a.resends.listed(op(), False, None, 30.0)
        assert a.fallbacks["resend"] > before
        assert await a.resends.claim(op(), "args", 30.0) is None, "the call runs, matched here only"
    finally:
        await fleet.aclose()


async def test_a_replica_that_starts_later_reads_the_records_and_a_table_shares_its_listing(fleet: Fleet) -> None:
    a = await fleet.replica()
    table = Resends(keep_s=60.0)
    table.share(a.resends)
    operation = op()
    flight = table.flight(lambda: operation, 30.0)
    flight.stranded()  # the table lists it: the store gets it
    await written(a)
    late = await fleet.replica()
    record = late.resends.find(operation)
    assert record is not None and not record.answered
    flight.answered(answer("kept"))
    await until(lambda: (r := late.resends.find(operation)) is not None and r.answered)
    assert await late.resends.answer(operation, 1.0) == answer("kept")
    table.close()


async def test_a_keyed_claim_is_won_by_one_replica_and_the_other_learns_the_record(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    operation = op()
    assert await a.resends.claim(operation, "args", 30.0) is True
    assert await b.resends.claim(operation, "args", 30.0) is False
    record = b.resends.find(operation)
    assert record is not None and record.keyed and record.arguments_op == "args" and not record.answered
