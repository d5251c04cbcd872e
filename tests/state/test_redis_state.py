"""The shared state store (proxy/state/shared.py) against a real redis-server: two `RedisState`
instances in one process stand for two replicas (each with its own connections and its own
subscription), so the tests can look at both views; tests/state/test_two_proxies.py does the
same with two real proxy processes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from proxy.policy.compiled import AntiStorm as Limits
from proxy.policy.compiled import SideEffect, ToolPolicy
from proxy.recovery.antistorm import AntiStorm
from proxy.recovery.ledger import ExhaustedEntry, operation_digest
from proxy.recovery.reasons import StopReason
from proxy.state.connect import describe
from proxy.state.shared import RedisState
from tests.state.redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 10.0
TIMEOUT_S = 0.25


REPLICAS: list[RedisState] = []


async def until(condition: Callable[[], Any], timeout_s: float = 5.0) -> None:
    """Wait, bounded, for `condition` to hold: re-checked whenever a replica's state changes."""
    changed = asyncio.Event()
    for state in REPLICAS:
        state.on_change = changed.set
    with anyio.fail_after(timeout_s):
        while not condition():
            changed.clear()
            await changed.wait()


class Fleet:
    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"t{uuid.uuid4().hex[:8]}:"
        self.replicas: list[RedisState] = []

    async def replica(self) -> RedisState:
        state = RedisState(self.url, prefix=self.prefix, timeout_s=TIMEOUT_S, sync_interval_s=0.05, upstream_name="up")
        state.attach(AntiStorm())
        REPLICAS.append(state)
        state.on_change = lambda: None
        await state.start()
        self.replicas.append(state)
        await until(lambda: state.reconciles > 0)  # subscribed, and the store read in
        return state

    async def aclose(self) -> None:
        for state in self.replicas:
            await state.aclose()
            REPLICAS.remove(state)


@pytest.fixture
async def fleet(redis_server: RedisServer) -> AsyncIterator[Fleet]:
    f = Fleet(redis_server.url)
    yield f
    await f.aclose()


def op() -> str:
    return operation_digest("always_fail", {"n": uuid.uuid4().hex})


async def exhaust(state: RedisState, operation: str, window_s: float = 60.0) -> ExhaustedEntry:
    entry = state.ledger.record_exhausted(
        operation, "budget-" + uuid.uuid4().hex[:6], StopReason.ATTEMPTS_EXHAUSTED, window_s,
        state.clock(), {"attemptCount": 3},
    )  # fmt: skip
    await state.recorded(entry)
    return entry


async def test_an_exhaustion_recorded_on_one_replica_reaches_the_others_view(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    operation = op()
    entry = await exhaust(a, operation)
    await until(lambda: b.ledger.check(operation) is not None)
    seen = b.ledger.check(operation)
    assert seen is not None and seen.budget_id == entry.budget_id and seen.reason is StopReason.ATTEMPTS_EXHAUSTED
    assert dict(seen.summary) == {"attemptCount": 3}
    assert 59.0 < seen.retry_after_s(b.clock()) <= 60.0, "the window left travels with the entry"
    # a replica that starts later reads it from the store when it subscribes
    c = await fleet.replica()
    assert c.ledger.check(operation) is not None


async def test_the_entry_expires_with_its_window_in_the_store(fleet: Fleet, redis_server: RedisServer) -> None:
    a = await fleet.replica()
    operation = op()
    await exhaust(a, operation, window_s=30.0)
    key = f"{fleet.prefix}ledger:{{{operation}}}"
    ttl_ms = redis_server.client().pttl(key)
    assert 29_000 < ttl_ms <= 30_000


async def test_fifty_concurrent_approvals_of_one_budget_on_two_replicas_approve_exactly_one(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    operation = op()
    entry = await exhaust(a, operation)
    await until(lambda: b.ledger.check(operation) is not None)
    with anyio.fail_after(BOUND_S):
        verdicts = await asyncio.gather(
            *((a if i % 2 else b).approve(operation, entry.budget_id, a.clock()) for i in range(50))
        )
    assert sum(verdicts) == 1
    # the spent approval reaches both views; another budget id is never approved
    await until(lambda: all(s.ledger.check(operation).approved for s in (a, b)))  # type: ignore[union-attr]
    assert not await b.approve(operation, entry.budget_id, b.clock())
    other = op()
    await exhaust(b, other)
    assert not await a.approve(other, "not-the-budget", a.clock())


async def test_a_clear_on_one_replica_leaves_every_view(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    operation = op()
    await exhaust(a, operation)
    await until(lambda: b.ledger.check(operation) is not None)
    b.ledger.clear(operation)
    b.cleared(operation)
    await until(lambda: a.ledger.check(operation) is None)


def budget_policy() -> ToolPolicy:
    # 10% of the window's calls plus a floor of 2 retries per window: one floor for the fleet, so
    # a replica alone would allow more than the fleet does
    limits = Limits(retry_budget_ratio=0.1, retry_budget_min_per_s=0.2, breaker_failures=None)
    return ToolPolicy(tool="search", side_effect=SideEffect.READ_ONLY, anti_storm=limits)


async def test_the_retry_budget_counts_the_calls_and_retries_of_every_replica(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    assert a.budget.antistorm is not None and b.budget.antistorm is not None
    budget_a, budget_b, policy = a.budget.antistorm, b.budget.antistorm, budget_policy()
    now = time.monotonic()
    for _ in range(10):
        budget_a.count_call("search", now)
        budget_b.count_call("search", now)
    for _ in range(3):  # A spends its own budget: 10% of 10 calls + the floor of 2
        assert budget_a.admit_retry("search", policy, now) is None
    assert budget_a.admit_retry("search", policy, now) is not None
    await a.sync_budget()
    await b.sync_budget()
    # B alone would allow 3 retries; the fleet (20 calls: 2 + 2) has 1 left
    assert budget_b.admit_retry("search", policy, time.monotonic()) is None
    refused = budget_b.admit_retry("search", policy, time.monotonic())
    assert refused is not None and refused.reason is StopReason.RETRY_BUDGET
    # more traffic anywhere gives the fleet more room: 100 more calls on A allow 10 more retries
    for _ in range(100):
        budget_a.count_call("search", now)
    await a.sync_budget()
    await b.sync_budget()
    assert budget_b.admit_retry("search", policy, time.monotonic()) is None


async def test_a_replica_learns_the_fleets_count_of_a_tool_it_has_not_counted_yet(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    assert a.budget.antistorm is not None and b.budget.antistorm is not None
    policy = budget_policy()
    now = time.monotonic()
    for _ in range(2):  # the floor: 2 retries of the window, spent on A (which counted no call)
        assert a.budget.antistorm.admit_retry("search", policy, now) is None
    await a.sync_budget()  # A's counts, and the tool listed
    await b.sync_budget()  # B reads the listing
    await b.sync_budget()  # and the tool's totals
    b.budget.antistorm.count_call("search", time.monotonic())
    refused = b.budget.antistorm.admit_retry("search", policy, time.monotonic())
    assert refused is not None and refused.reason is StopReason.RETRY_BUDGET


async def test_a_store_that_is_gone_is_skipped_within_the_bound_and_reconciled_when_it_returns(
    own_redis: RedisServer,
) -> None:
    fleet = Fleet(own_redis.url)
    try:
        a = await fleet.replica()
        kept = op()
        before = await exhaust(a, kept)
        own_redis.kill()
        # bounded: the first operation finds the store gone within the timeout, then it is skipped
        with anyio.fail_after(TIMEOUT_S * 4 + 1):
            assert not await a.approve(kept, before.budget_id, a.clock()), "single use cannot be checked: refused"
        assert not a.up and a.errors["approve"] == 1 and a.fallbacks["approve"] == 1
        assert a.status()["up"] is False and "fallback" in a.status()
        local = op()
        with anyio.fail_after(0.5):  # known down: no wait on the store at all
            during = await exhaust(a, local)
        assert a.fallbacks["record"] == 1 and a.status()["pendingEntries"] == 1
        assert a.ledger.check(local) is not None, "the local ledger still refuses it"
        # restarted empty on the same port: the replica writes back every live entry it holds
        own_redis.start()
        await until(lambda: a.up and a.reconciles >= 2, timeout_s=10)
        store = own_redis.client()
        for operation, entry in ((kept, before), (local, during)):
            fields = store.hgetall(f"{fleet.prefix}ledger:{{{operation}}}")
            assert fields[b"b"].decode() == entry.budget_id
        assert a.status()["pendingEntries"] == 0
        # and an approval is decided by the store again
        assert await a.approve(local, during.budget_id, a.clock())
    finally:
        await fleet.aclose()


async def test_a_slow_store_costs_a_call_at_most_the_timeout(own_redis: RedisServer) -> None:
    fleet = Fleet(own_redis.url)
    try:
        a = await fleet.replica()
        operation = op()
        entry = await exhaust(a, operation)
        sleeper = own_redis.stall(2.0)
        with anyio.fail_after(TIMEOUT_S * 4):
            approved = await a.approve(operation, entry.budget_id, a.clock())
        assert not approved and a.errors["approve"] == 1 and a.fallbacks["approve"] == 1
        sleeper.settimeout(10)
        assert sleeper.recv(16).startswith(b"+OK")
        sleeper.close()
        await until(lambda: a.up, timeout_s=10)
    finally:
        await fleet.aclose()


async def test_an_approval_whose_answer_a_stalled_store_lost_is_honoured_once_when_it_answers(
    own_redis: RedisServer,
) -> None:
    # the approval's script was sent to a store that then slept: it runs when the store wakes up
    # (the approval is spent there) although the caller was refused when the bound ran out
    fleet = Fleet(own_redis.url)
    try:
        a, b = await fleet.replica(), await fleet.replica()
        operation = op()
        entry = await exhaust(a, operation)
        await a.sync_budget()  # a warm connection: the approval's script is written to the socket
        sleeper = own_redis.stall(2.0)
        assert not await a.approve(operation, entry.budget_id, a.clock())
        sleeper.settimeout(10)
        assert sleeper.recv(16).startswith(b"+OK")
        sleeper.close()
        await until(lambda: a.up, timeout_s=10)
        spent = own_redis.client().hget(f"{fleet.prefix}ledger:{{{operation}}}", "a")
        # the coordinator approves again through the same replica: honoured, once
        assert await a.approve(operation, entry.budget_id, a.clock()), f"spent in the store: {spent!r}"
        assert not await a.approve(operation, entry.budget_id, a.clock())
        assert not await b.approve(operation, entry.budget_id, b.clock())
    finally:
        await fleet.aclose()


def test_the_store_is_described_without_its_credentials() -> None:
    assert describe("redis://user:s3cret-pass@10.0.0.5:6380/2") == "redis://10.0.0.5:6380/2"
    assert describe("valkeys://:pw@[::1]:6379") == "valkeys://[::1]:6379"


def test_redis_is_imported_only_for_a_shared_store() -> None:
    import subprocess
    import sys

    code = "import proxy.server, sys; print('redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
