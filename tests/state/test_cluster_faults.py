"""Faults on a Redis Cluster of real redis-server nodes (`redis+cluster://`): a primary SIGKILLed
under load and its replica promoted, a spend the promoted replica never received, and the whole
cluster restarted empty. Nodes are started and stopped by their pids (tests/state/redis_server.py);
every wait is bounded; what ran upstream is read from the upstream's journal.

The window in which a slot has no primary is held open by the test, not guessed: the replica is
told not to take over (`cluster-replica-no-failover yes`) until the checks of the outage are done,
then allowed to. So nothing here depends on how fast a failover happens on a loaded machine.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from proxy.state.shared import RedisState
from tests.state.redis_server import RedisCluster, RedisServer
from tests.state.test_tls_cluster_valkey import exhaust_locally, started, until
from tests.state.test_two_proxies import (
    DEADLINE_S,
    Pair,
    call,
    exhausting,
    metric,
    readyz,
    report,
    wait_gauge,
    wait_metric,
)

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]
BOUND_S = 60.0


def eventually(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    """Wait (bounded) for a condition read from a real process (a store node, a proxy's /readyz)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def ledger_keys(cluster: RedisCluster, prefix: str) -> list[str]:
    """Every ledger key under `prefix`, read from each live primary (each holds its own slots)."""
    keys: list[str] = []
    for info in cluster.topology():
        if info.primary and not info.failed and info.slots:
            keys += [k.decode() for k in cluster.node(info.port).client().keys(f"{prefix}ledger:*")]
    return keys


def replica_has(replica: RedisServer, key: str, field: str | None = None) -> Any:
    """What a replica holds of a key (READONLY: a replica serves its own copy instead of MOVED)."""
    client = replica.client()
    with client.pipeline(transaction=False) as pipe:  # one connection: READONLY applies to it
        pipe.execute_command("READONLY")
        if field is None:
            pipe.exists(key)
        else:
            pipe.hget(key, field)
        return pipe.execute()[1]


def hold_failover(replica: RedisServer, held: bool) -> None:
    replica.client().config_set("cluster-replica-no-failover", "yes" if held else "no")


async def test_a_primary_killed_under_load_fails_over_and_two_proxies_keep_one_budget(
    tmp_path: Path, replicated_cluster: RedisCluster
) -> None:
    cluster = replicated_cluster
    with Pair(tmp_path, cluster) as pair:
        # X: exhausted through A before the kill, and replicated (the replica holds it)
        x = uuid.uuid4().hex[:10]
        first = report(await call(pair.a, "always_fail", exhausting(x)))
        (key,) = ledger_keys(cluster, pair.prefix)
        primary = cluster.primary_holding(key)
        replica = cluster.replica_of(primary)
        await anyio.to_thread.run_sync(lambda: eventually(lambda: replica_has(replica, key) == 1, "X on the replica"))
        hold_failover(replica, True)
        reconciled = {p.admin: metric(p, "mcp_recovery_state_reconciles_total") for p in (pair.a, pair.b)}

        durations: list[float] = []
        answered = 0
        killed, recovered = anyio.Event(), anyio.Event()
        y = uuid.uuid4().hex[:10]
        outage: dict[str, Any] = {}

        async def load(proxy: Any) -> None:
            nonlocal answered
            async with Client(proxy.url, mode="2026-07-28") as client:
                await client.list_tools()
                for i in range(1500):  # bounded; ends once the cluster has recovered
                    started_at = time.monotonic()
                    with anyio.fail_after(DEADLINE_S + 2):
                        result = await client.call_tool("echo", {"text": f"m{i}"})
                    durations.append(time.monotonic() - started_at)
                    assert not result.is_error
                    answered += 1
                    if answered == 20:
                        primary.kill()
                        killed.set()
                    if recovered.is_set() and i >= 10:
                        return

        async def during_the_outage() -> None:
            await killed.wait()
            # every PING of the primaries now fails: both proxies are on local state, and say so
            for proxy in (pair.a, pair.b):
                await anyio.to_thread.run_sync(lambda p=proxy: wait_gauge(p, "mcp_recovery_state_store_up", 0, 30))
                ready = readyz(proxy)
                assert ready.status_code == 200, "an unreachable store does not fail /readyz by default"
                state = ready.json()["state"]
                assert state["up"] is False and "fallback" in state and state["error"], state
            # an approval cannot be checked: refused at once, nothing runs
            approval = {"io.mcp-recovery-proxy/approveBudget": first["operation"]["budgetId"]}
            begun = time.monotonic()
            refused = report(await call(pair.b, "always_fail", exhausting(x), meta=approval))
            outage["approval_s"] = time.monotonic() - begun
            assert refused["stopReason"] == "ledger_exhausted", refused
            # a new exhaustion through A is kept locally, for the store
            outage["y"] = report(await call(pair.a, "always_fail", exhausting(y)))
            assert outage["y"]["stopReason"] == "attempts_exhausted"
            assert readyz(pair.a).json()["state"]["pendingEntries"] >= 1
            hold_failover(replica, False)  # now let the replica take over
            await anyio.to_thread.run_sync(lambda: cluster.wait_promoted(replica, 60))
            for proxy in (pair.a, pair.b):
                await anyio.to_thread.run_sync(lambda p=proxy: wait_gauge(p, "mcp_recovery_state_store_up", 1, 30))
            recovered.set()

        with anyio.fail_after(4 * BOUND_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(load, pair.a)
                tg.start_soon(load, pair.b)
                tg.start_soon(during_the_outage)
        assert answered >= 60 and max(durations) < DEADLINE_S, (answered, max(durations))
        assert outage["approval_s"] < DEADLINE_S

        # after the failover: both reconcile (the listener resubscribes once it sees the store
        # back), and /readyz says the store answers
        name = "mcp_recovery_state_reconciles_total"
        for proxy in (pair.a, pair.b):
            await anyio.to_thread.run_sync(lambda p=proxy: wait_metric(p, name, reconciled[p.admin] + 1, 30))
            assert metric(proxy, "mcp_recovery_state_store_errors_total", 'operation="ping"') >= 1
            assert readyz(proxy).json()["state"]["up"] is True
        # Y, kept by A while the slot was down, was written to the cluster by A's reconcile and
        # reached B's view
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: readyz(pair.b).json()["state"]["entries"] >= 2, "Y in B's view")
        )
        again = report(await call(pair.b, "always_fail", exhausting(y)))
        assert again["stopReason"] == "ledger_exhausted"
        assert again["operation"]["budgetId"] == outage["y"]["operation"]["budgetId"]
        assert pair.journal.executions("always_fail", y) == 3
        # X, exhausted through A before the kill, is refused by B after it (the promoted replica
        # had it), and the approval properties still hold on the new primary
        assert key in ledger_keys(cluster, pair.prefix)
        again = report(await call(pair.b, "always_fail", exhausting(x)))
        assert again["stopReason"] == "ledger_exhausted"
        assert again["operation"]["budgetId"] == first["operation"]["budgetId"]
        approval = {"io.mcp-recovery-proxy/approveBudget": first["operation"]["budgetId"]}
        fresh = report(await call(pair.a, "always_fail", exhausting(x), meta=approval))
        assert fresh["operation"]["approvedBudgetId"] == first["operation"]["budgetId"]
        reused = report(await call(pair.b, "always_fail", exhausting(x), meta=approval))
        assert reused["stopReason"] == "ledger_exhausted", "the approval was spent on A"
        assert pair.journal.executions("always_fail", x) == 6


async def test_a_dead_primary_keeps_the_store_down_though_the_other_slots_answer(partial_cluster: RedisCluster) -> None:
    # With `cluster-require-full-coverage no` the live primaries keep serving their slots: an
    # operation there succeeds, and must not mark the store up while the dead primary's slots have
    # no owner (the proxy would leave local state, then fail again: up and down at every sync)
    cluster = partial_cluster
    state = await started(cluster.url, f"p{uuid.uuid4().hex[:6]}:")
    try:
        served = cluster.primary_holding(state.budget.tools_key())  # what a budget sync reads
        victim = next(n for n in cluster.nodes if n is not served)
        victim.kill()
        await until(state, lambda: not state.up)
        syncs = state.budget_syncs
        await state.sync_budget()  # answered by a live primary
        # (the state's own syncs, every 50 ms here, may complete beside this one on a busy machine)
        assert state.budget_syncs > syncs
        assert not state.up, "a slot still has no primary: the store is not back"
        reconciles = state.reconciles
        await anyio.to_thread.run_sync(victim.start)  # back on its port, with its nodes.conf
        await anyio.to_thread.run_sync(cluster.wait_ok)
        await until(state, lambda: state.up and state.reconciles > reconciles)
    finally:
        await state.aclose()


async def test_a_spend_the_promoted_replica_never_received_is_not_approved_twice(
    replicated_cluster: RedisCluster,
) -> None:
    # Replication is asynchronous: a spend acknowledged by a primary that dies before its replica
    # got it is not in the promoted replica. The replicas that learnt the spend keep it.
    cluster = replicated_cluster
    prefix = f"f{uuid.uuid4().hex[:6]}:"
    a = await started(cluster.url, prefix)
    b = await started(cluster.url, prefix)
    late: RedisState | None = None
    try:
        (op,) = exhaust_locally(a, 1)
        entry = a.ledger.check(op)
        assert entry is not None
        await a.recorded(entry)
        key = f"{prefix}ledger:{{{op}}}"
        primary = cluster.primary_holding(key)
        replica = cluster.replica_of(primary)
        await until(b, lambda: b.ledger.check(op) is not None)
        await anyio.to_thread.run_sync(lambda: eventually(lambda: replica_has(replica, key) == 1, "on the replica"))
        # cut the replica off: a wrong masterauth keeps it from reconnecting (its primary has no
        # password, so the AUTH it now sends is refused), and its link is closed
        replica.client().config_set("masterauth", "not-the-password")
        primary.client().execute_command("CLIENT", "KILL", "TYPE", "replica")
        await anyio.to_thread.run_sync(
            lambda: eventually(
                lambda: replica.client().info("replication")["master_link_status"] == "down", "replica cut off"
            )
        )
        assert await a.approve(op, entry.budget_id, a.clock())  # spent on the primary only
        await until(b, lambda: (e := b.ledger.check(op)) is not None and e.approved)
        assert replica_has(replica, key, "a") == b"0", "the replica never got the spend"
        before = (a.reconciles, b.reconciles)
        primary.kill()
        await anyio.to_thread.run_sync(lambda: cluster.wait_promoted(replica, 60))
        await until(a, lambda: a.up and a.reconciles > before[0])
        await until(b, lambda: b.up and b.reconciles > before[1])
        # neither replica approves the budget a second time, and the spend is back in the store
        assert not await b.approve(op, entry.budget_id, b.clock())
        assert not await a.approve(op, entry.budget_id, a.clock())
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: replica.client().hget(key, "a") == b"1", "the spend written back")
        )
        # a replica that starts now reads it from the store (through a live node: a client that
        # knows only a dead one cannot learn the cluster; docs/state.md)
        late = await started(cluster.url_via(replica), prefix)
        assert not await late.approve(op, entry.budget_id, late.clock())
    finally:
        for state in (a, b, late):
            if state is not None:
                await state.aclose()


async def test_a_cluster_restarted_empty_gets_back_the_entries_the_replicas_hold(own_cluster: RedisCluster) -> None:
    # every node SIGKILLed and started again on its port with its nodes.conf but no data (no
    # persistence): the proxies' reconcile writes back what they hold, spends included
    cluster = own_cluster
    prefix = f"r{uuid.uuid4().hex[:6]}:"
    a = await started(cluster.url, prefix)
    b = await started(cluster.url, prefix)
    late: RedisState | None = None
    try:
        ops = exhaust_locally(a, 9)
        for op in ops:
            entry = a.ledger.check(op)
            assert entry is not None
            await a.recorded(entry)
        spent = a.ledger.check(ops[0])
        assert spent is not None and await a.approve(ops[0], spent.budget_id, a.clock())
        await until(b, lambda: all(b.ledger.check(op) is not None for op in ops))
        await until(b, lambda: (e := b.ledger.check(ops[0])) is not None and e.approved)
        before = (a.reconciles, b.reconciles)
        cluster.kill_all()
        await until(a, lambda: not a.up)
        await until(b, lambda: not b.up)
        await anyio.to_thread.run_sync(cluster.restart_all)
        await until(a, lambda: a.up and a.reconciles > before[0])
        await until(b, lambda: b.up and b.reconciles > before[1])
        assert sorted(ledger_keys(cluster, prefix)) == sorted(f"{prefix}ledger:{{{op}}}" for op in ops)
        late = await started(cluster.url, prefix)
        assert all(late.ledger.check(op) is not None for op in ops)
        assert not await late.approve(ops[0], spent.budget_id, late.clock()), "the spend survived the restart"
        other = late.ledger.check(ops[1])
        assert other is not None and await late.approve(ops[1], other.budget_id, late.clock())
    finally:
        for state in (a, b, late):
            if state is not None:
                await state.aclose()
