"""The store kinds beyond a plain redis-server, on real servers: TLS (`rediss://`, a throwaway CA
made by openssl), a three-master Redis Cluster (`redis+cluster://`) and Valkey (`valkey://`).
tests/state/test_two_proxies.py runs the cross-replica properties through two proxy processes on
each kind; this file covers what is particular to each: a wrong CA stops the start (named, exit
2) instead of failing every call; mutual TLS; the cluster's keys spread over every primary and
read back by SCAN on each; Lua scripts and the budget sync on one slot per operation or tool.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import redis
from redis.cluster import RedisCluster as SyncCluster

from proxy.recovery.antistorm import AntiStorm
from proxy.recovery.ledger import operation_digest
from proxy.recovery.reasons import StopReason
from proxy.settings import Settings
from proxy.state import StateConfigError, build_state, check_url
from proxy.state.connect import client_url, describe
from proxy.state.shared import RedisState
from tests.fixtures.helpers import free_port
from tests.state.redis_server import RedisCluster, RedisServer, TlsFiles

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0


async def started(url: str, prefix: str, **tls: Path) -> RedisState:
    state = RedisState(url, prefix=prefix, timeout_s=1.0, sync_interval_s=0.05, upstream_name="up", **tls)
    state.attach(AntiStorm())
    changed = asyncio.Event()
    state.on_change = changed.set
    await state.check()
    await state.start()
    with anyio.fail_after(BOUND_S):
        while state.reconciles == 0:  # subscribed, and the store read in
            changed.clear()
            await changed.wait()
    return state


async def two_replicas_share_one_approval(url: str, **tls: Path) -> None:
    """Two stores on `url`: an operation exhausted through one is seen by the other, and its
    approval is spent exactly once between them."""
    prefix = f"v{uuid.uuid4().hex[:6]}:"
    a = await started(url, prefix, **tls)
    b = await started(url, prefix, **tls)
    try:
        (op,) = exhaust_locally(a, 1)
        entry = a.ledger.check(op)
        assert entry is not None
        await a.recorded(entry)
        await until(b, lambda: b.ledger.check(op) is not None)
        assert await b.approve(op, entry.budget_id, b.clock())
        assert not await a.approve(op, entry.budget_id, a.clock())
    finally:
        await a.aclose()
        await b.aclose()


async def until(state: RedisState, condition: object) -> None:
    changed = asyncio.Event()
    state.on_change = changed.set
    with anyio.fail_after(BOUND_S):
        while not condition():  # type: ignore[operator]
            changed.clear()
            await changed.wait()


def exhaust_locally(state: RedisState, n: int) -> list[str]:
    ops = []
    for _ in range(n):
        op = operation_digest("always_fail", {"n": uuid.uuid4().hex})
        state.ledger.record_exhausted(op, "b-" + op[:6], StopReason.ATTEMPTS_EXHAUSTED, 60.0, state.clock(), {})
        ops.append(op)
    return ops


# -- TLS ---------------------------------------------------------------------------------------


def serve(*args: str) -> tuple[int, str]:
    """`mcp-recovery-proxy serve` until it exits (bounded): its exit code and stderr."""
    import subprocess

    argv = [sys.executable, "-m", "proxy", "serve", "--listen", f"http://127.0.0.1:{free_port()}/mcp", *args]
    done = subprocess.run([*argv, "--", sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def test_a_proxy_whose_state_ca_did_not_sign_the_stores_certificate_refuses_to_start(
    tls_redis: RedisServer, tls_files: TlsFiles
) -> None:
    code, err = serve("--state", tls_redis.url, "--state-ca", str(tls_files.other_ca))
    assert code == 2, err
    assert "--state rediss://127.0.0.1" in err and "certificate does not verify" in err and "--state-ca" in err
    # without --state-ca the system roots do not know the private CA either
    code, err = serve("--state", tls_redis.url)
    assert code == 2 and "certificate does not verify" in err, err


def test_a_state_ca_that_is_missing_or_not_pem_is_named_at_start(tmp_path: Path, tls_redis: RedisServer) -> None:
    code, err = serve("--state", tls_redis.url, "--state-ca", str(tmp_path / "absent.pem"))
    assert code == 2 and "--state-ca" in err and "cannot be read" in err, err
    (tmp_path / "junk.pem").write_text("not a certificate")
    code, err = serve("--state", tls_redis.url, "--state-ca", str(tmp_path / "junk.pem"))
    assert code == 2 and "--state-ca" in err and "no PEM certificate" in err, err


def test_tls_settings_are_refused_where_they_cannot_apply_and_the_url_cannot_turn_verification_off() -> None:
    with pytest.raises(ValueError, match="--state-ca: only for a TLS store"):
        build_state(Settings(state="redis://127.0.0.1:1/0", state_ca=Path("ca.pem")), upstream_name="u")
    with pytest.raises(ValueError, match="--state-ca: only for a TLS store"):
        build_state(Settings(state_ca=Path("ca.pem")), upstream_name="u")
    for url in ("rediss://h:1/0?ssl_cert_reqs=none", "rediss://h:1/0?ssl_check_hostname=false"):
        with pytest.raises(ValueError, match="not accepted; TLS is verified always"):
            Settings(state=url)
    with pytest.raises(ValueError, match="database 0 only"):
        check_url("redis+cluster://h:1/3")
    assert check_url("valkeys+cluster://h:1") == (True, True)
    assert check_url("valkey://h:1/2") == (False, False)
    assert client_url("valkeys+cluster://:pw@h:1") == "rediss://:pw@h:1"
    assert client_url("redis+cluster://h:1") == "redis://h:1"
    assert describe("rediss+cluster://:pw@h:1") == "rediss+cluster://h:1"


async def test_the_right_ca_connects_and_a_wrong_one_raises_before_serving(
    tls_redis: RedisServer, tls_files: TlsFiles
) -> None:
    state = await started(tls_redis.url, f"t{uuid.uuid4().hex[:6]}:", ca=tls_files.ca)
    try:
        assert state.up
    finally:
        await state.aclose()
    wrong = RedisState(tls_redis.url, ca=tls_files.other_ca, timeout_s=1.0)
    try:
        with pytest.raises(StateConfigError, match="certificate does not verify"):
            await wrong.check()
    finally:
        await wrong.aclose()


async def test_a_store_that_requires_client_certificates_takes_the_proxys(tmp_path: Path, tls_files: TlsFiles) -> None:
    # TLS 1.2: the server refuses a missing client certificate inside the handshake, so the refusal
    # is seen every time. Under TLS 1.3 it comes as an alert after the handshake, which a reset of
    # the connection can overtake: the proxy may then see a store that does not answer (serving on
    # local state, as docs/state.md says), and the assertion below would be a race (CI, 2026-12-02).
    with RedisServer(tmp_path / "mtls.log", tls=tls_files, tls_auth_clients="yes", tls_protocols="TLSv1.2") as store:
        anonymous = RedisState(store.url, ca=tls_files.ca, timeout_s=1.0)
        try:
            with pytest.raises(StateConfigError):  # the server ends the handshake: refused, named
                await anonymous.check()
        finally:
            await anonymous.aclose()
        state = await started(
            store.url, "m:", ca=tls_files.ca, client_cert=tls_files.client_cert, client_key=tls_files.client_key
        )
        try:
            ops = exhaust_locally(state, 1)
            entry = state.ledger.check(ops[0])
            assert entry is not None
            await state.recorded(entry)
            assert state.up and store.client().exists(f"m:ledger:{{{ops[0]}}}") == 1
        finally:
            await state.aclose()


# -- Redis Cluster ----------------------------------------------------------------------------


@pytest.fixture
async def cluster_prefix(redis_cluster: RedisCluster) -> AsyncIterator[str]:
    yield f"c{uuid.uuid4().hex[:6]}:"


async def test_a_cluster_replica_reads_back_entries_from_every_primary(
    redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    a = await started(redis_cluster.url, cluster_prefix)
    try:
        ops = exhaust_locally(a, 40)
        for op in ops:
            entry = a.ledger.check(op)
            assert entry is not None
            await a.recorded(entry)
        assert a.up
        # the hash tags spread the operations over the three primaries' slots
        holding = [
            n.client().eval("return #redis.call('KEYS', ARGV[1])", 0, f"{cluster_prefix}ledger:*")
            for n in redis_cluster.nodes
        ]
        assert sum(holding) == 40 and all(h > 0 for h in holding), holding
        late = await started(redis_cluster.url, cluster_prefix)  # its reconcile SCANs each primary
        try:
            assert all(late.ledger.check(op) is not None for op in ops)
        finally:
            await late.aclose()
    finally:
        await a.aclose()


async def test_cluster_replicas_see_each_others_records_and_approve_one_budget_once(
    redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    a = await started(redis_cluster.url, cluster_prefix)
    b = await started(redis_cluster.url, cluster_prefix)
    try:
        (op,) = exhaust_locally(a, 1)
        entry = a.ledger.check(op)
        assert entry is not None
        await a.recorded(entry)
        await until(b, lambda: b.ledger.check(op) is not None)  # pub/sub across the cluster's nodes
        with anyio.fail_after(BOUND_S):
            verdicts = await asyncio.gather(
                *((a if i % 2 else b).approve(op, entry.budget_id, a.clock()) for i in range(50))
            )
        assert sum(verdicts) == 1
        b.ledger.clear(op)
        b.cleared(op)
        await until(a, lambda: a.ledger.check(op) is None)
        cluster = SyncCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
        try:
            assert cluster.exists(f"{cluster_prefix}ledger:{{{op}}}") == 0
        finally:
            cluster.close()
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_fleet_budget_is_counted_on_a_cluster(redis_cluster: RedisCluster, cluster_prefix: str) -> None:
    from proxy.policy.compiled import AntiStorm as Limits
    from proxy.policy.compiled import SideEffect, ToolPolicy

    a = await started(redis_cluster.url, cluster_prefix)
    b = await started(redis_cluster.url, cluster_prefix)
    try:
        assert a.budget.antistorm is not None and b.budget.antistorm is not None
        policy = ToolPolicy(
            tool="search",
            side_effect=SideEffect.READ_ONLY,
            anti_storm=Limits(retry_budget_ratio=0.0, retry_budget_min_per_s=0.2, breaker_failures=None),
        )
        now = a.clock()
        for _ in range(2):  # the fleet's floor of the window, spent on A
            assert a.budget.antistorm.admit_retry("search", policy, now) is None
        await a.sync_budget()
        await b.sync_budget()
        await b.sync_budget()
        refused = b.budget.antistorm.admit_retry("search", policy, b.clock())
        assert refused is not None and refused.reason is StopReason.RETRY_BUDGET
        assert a.up and b.up and not any(a.errors.values()) and not any(b.errors.values())
    finally:
        await a.aclose()
        await b.aclose()


# -- Valkey -----------------------------------------------------------------------------------


async def test_valkey_shares_the_ledger_like_redis(valkey_server: RedisServer) -> None:
    assert valkey_server.url.startswith("valkey://")
    info = valkey_server.client().info("server")
    assert "valkey_version" in info or "server_name" in info, "a real Valkey, not redis-server"
    await two_replicas_share_one_approval(valkey_server.url)


def test_the_tls_fixture_really_refuses_a_plain_connection(tls_redis: RedisServer) -> None:
    # the TLS store has no plain port: a plain client cannot talk to it (the tests above use TLS)
    plain = redis.Redis(host="127.0.0.1", port=tls_redis.port, socket_timeout=2, socket_connect_timeout=2)
    with pytest.raises(redis.RedisError):
        plain.ping()


async def test_entries_held_before_the_cluster_answered_are_written_to_it_on_reconcile(
    redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    # what a replica holds when the store comes back (or when it starts with entries, as here) is
    # written in one pipeline spanning the primaries; then another replica reads it
    state = RedisState(redis_cluster.url, prefix=cluster_prefix, timeout_s=1.0, sync_interval_s=0.05)
    held = exhaust_locally(state, 12)
    changed = asyncio.Event()
    state.on_change = changed.set
    await state.start()
    try:
        with anyio.fail_after(BOUND_S):
            while state.reconciles == 0:
                changed.clear()
                await changed.wait()
        assert state.up and state.errors["reconcile"] == 0, state.last_error
        other = await started(redis_cluster.url, cluster_prefix)
        try:
            assert all(other.ledger.check(op) is not None for op in held)
        finally:
            await other.aclose()
    finally:
        await state.aclose()


async def test_a_cluster_that_does_not_answer_at_start_leaves_the_proxy_on_local_state_retrying() -> None:
    # redis-py's cluster client raises errors of its own (not RedisError; their class names change
    # between releases) and its pub/sub a KeyError while it knows no node: none may stop the check,
    # the start or the listener, and the failed ping is what the status shows
    state = RedisState(f"redis+cluster://127.0.0.1:{free_port()}", timeout_s=0.5, sync_interval_s=0.05)
    try:
        await state.check()
        assert not state.up and state.errors["ping"] == 1
        assert (state.last_error or "").startswith("ping: "), state.last_error
        await state.start()
        await until(state, lambda: state.errors["subscribe"] + state.errors["reconcile"] >= 2)
        assert all(not task.done() for task in state._tasks), "the listener and the sync task live on"
    finally:
        await state.aclose()
