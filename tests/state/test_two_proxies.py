"""Two real proxy processes sharing one real store, in front of one scripted upstream over
Streamable HTTP (the replicas of one service in front of its backend; one upstream process also
keeps the set-up light on a loaded machine). What happened upstream is read from its journal,
never from the proxies' bookkeeping.

The cross-replica properties run on every kind of store (`STORES`): a redis-server over
`redis://`, the same over TLS (`rediss://` with `--state-ca`), a three-master Redis Cluster
(`redis+cluster://`) and a real valkey-server (`valkey://`). The fault tests (kill, restart
empty, stall) run on a plain redis-server of their own.

The promise under test (docs/recovery.md, "Ledger"): one budget per operation across replicas, whichever
replica and session the caller comes back through.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from mcp import Client

from tests.fixtures.helpers import ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess
from tests.state.redis_server import RedisCluster, RedisServer

# Bounded, and generous: each proxy starts a Python upstream, which takes seconds on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]
BOUND_S = 60.0
DEADLINE_S = 4.0

POLICIES = {
    "defaults.yaml": """
retry_on: [transient]
attempts: 3
deadline: 4s
attempt_timeout: 1s
min_attempt_time: 200ms
backoff: {initial: 20ms, max: 50ms, multiplier: 2, jitter: full}
unclassified: transient
ledger_window: 60s
""",
    # two retries per 10 s window for the whole fleet, however many calls
    "flaky.yaml": """
tools: [flaky_read]
anti_storm: {retry_budget_ratio: 0.0, retry_budget_min_per_s: 0.2}
""",
}


class Pair:
    def __init__(self, tmp: Path, store: RedisServer | RedisCluster, extra: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.store = store
        self.journal = Journal(tmp / "journal.jsonl")
        self.policies = tmp / "policies"
        self.policies.mkdir(exist_ok=True)
        for name, text in POLICIES.items():
            (self.policies / name).write_text(text)
        self.prefix = f"e2e{uuid.uuid4().hex[:6]}:"
        self.extra = extra
        self.stack = ExitStack()
        self.proxies: list[ProxyProcess] = []
        self.upstream = ScriptedHTTP(self.journal.path, tmp / "state.json")

    def start_proxy(self, *more: str) -> ProxyProcess:
        n = len(self.proxies)
        args = ["--policies", str(self.policies), "--state", self.store.url, "--state-prefix", self.prefix]
        args += ["--state-sync-interval-s", "0.05", *self.extra, *more]
        proxy = ProxyProcess(upstream_url=self.upstream.url, extra=args, log_path=self.tmp / f"proxy{n}.log")
        self.stack.callback(proxy.stop)
        proxy.start(timeout_s=90)  # bounded, and generous: CI and this machine run loaded
        self.proxies.append(proxy)
        return proxy

    def __enter__(self) -> Pair:
        self.stack.callback(self.upstream.stop)
        self.upstream.start(timeout_s=90)
        self.start_proxy()
        self.start_proxy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    @property
    def a(self) -> ProxyProcess:
        return self.proxies[0]

    @property
    def b(self) -> ProxyProcess:
        return self.proxies[1]


STORES = ["redis", "rediss", "cluster", "valkey"]


@pytest.fixture(scope="module", params=STORES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two proxies for the tests that leave the store alone (each uses operations of its own)."""
    extra: tuple[str, ...] = ()
    if request.param == "redis":
        store = request.getfixturevalue("redis_server")
    elif request.param == "rediss":
        store = request.getfixturevalue("tls_redis")
        extra = ("--state-ca", str(request.getfixturevalue("tls_files").ca))
    elif request.param == "cluster":
        store = request.getfixturevalue("redis_cluster")
    else:
        store = request.getfixturevalue("valkey_server")
    assert store.url.startswith({"rediss": "rediss://", "cluster": "redis+cluster://"}.get(request.param, "x")) or (
        request.param in ("redis", "valkey") and store.url.startswith(request.param + "://")
    )
    with Pair(tmp_path_factory.mktemp(f"pair-{request.param}"), store, extra) as p:
        yield p


async def call(
    proxy: ProxyProcess, tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None, mode: str = "legacy"
) -> Any:
    with anyio.fail_after(BOUND_S):
        async with Client(proxy.url, mode=mode) as client:
            await client.list_tools()
            return await client.call_tool(tool, args, meta=meta)


def report(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    return dict(result.meta["io.mcp-recovery-proxy/unresolved"])


def metric(proxy: ProxyProcess, name: str, labels: str = "") -> float:
    text = httpx.get(proxy.admin + "/metrics", timeout=5).text
    pattern = re.escape(name + (f"{{{labels}}}" if labels else "")) + r" ([0-9.e+-]+)"
    found = re.search(pattern, text)
    assert found is not None, f"{name} not on /metrics"
    return float(found.group(1))


def wait_metric(proxy: ProxyProcess, name: str, at_least: float, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until a counter of the proxy's reaches a value: read from its /metrics."""
    deadline = time.monotonic() + timeout_s
    while metric(proxy, name) < at_least:
        assert time.monotonic() < deadline, f"{name} stayed below {at_least}"
        time.sleep(0.02)


def wait_gauge(proxy: ProxyProcess, name: str, value: float, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while metric(proxy, name) != value:
        assert time.monotonic() < deadline, f"{name} never became {value}"
        time.sleep(0.02)


def more_syncs(proxy: ProxyProcess, n: int) -> None:
    """Wait until the proxy has exchanged its retry budget's counts with the store `n` more times."""
    name = "mcp_recovery_state_budget_syncs_total"
    wait_metric(proxy, name, metric(proxy, name) + n)


def readyz(proxy: ProxyProcess) -> httpx.Response:
    return httpx.get(proxy.admin + "/readyz", timeout=5)


def exhausting(cid: str) -> dict[str, Any]:
    return {"category": "transient", "retryable": True, "call_id": cid}


async def test_an_operation_exhausted_through_one_proxy_is_refused_by_the_other_whichever_session_asks(
    pair: Pair,
) -> None:
    cid = uuid.uuid4().hex[:10]
    first = report(await call(pair.a, "always_fail", exhausting(cid)))
    assert first["stopReason"] == "attempts_exhausted"
    assert pair.journal.executions("always_fail", cid) == 3
    # at once, through the other replica, in a new 2025 session and as a 2026 request
    for mode in ("legacy", "2026-07-28"):
        again = report(await call(pair.b, "always_fail", exhausting(cid), mode=mode))
        assert again["stopReason"] == "ledger_exhausted", again
        assert again["operation"]["budgetId"] == first["operation"]["budgetId"]
    assert pair.journal.executions("always_fail", cid) == 3, "B refused without touching its upstream"


async def test_an_approval_used_through_one_proxy_is_refused_by_the_other(pair: Pair) -> None:
    cid = uuid.uuid4().hex[:10]
    first = report(await call(pair.a, "always_fail", exhausting(cid)))
    approval = {"io.mcp-recovery-proxy/approveBudget": first["operation"]["budgetId"]}
    fresh = report(await call(pair.a, "always_fail", exhausting(cid), meta=approval))
    assert fresh["stopReason"] == "attempts_exhausted"
    assert fresh["operation"]["approvedBudgetId"] == first["operation"]["budgetId"]
    assert pair.journal.executions("always_fail", cid) == 6
    reused = report(await call(pair.b, "always_fail", exhausting(cid), meta=approval))
    assert reused["stopReason"] == "ledger_exhausted", "the approval was spent on A"
    assert pair.journal.executions("always_fail", cid) == 6


async def test_fifty_concurrent_approvals_through_both_proxies_let_exactly_one_call_through(pair: Pair) -> None:
    cid = uuid.uuid4().hex[:10]
    first = report(await call(pair.a, "always_fail", exhausting(cid)))
    approval = {"io.mcp-recovery-proxy/approveBudget": first["operation"]["budgetId"]}
    results: list[dict[str, Any]] = []

    async def one(i: int) -> None:
        proxy = pair.a if i % 2 else pair.b
        results.append(report(await call(proxy, "always_fail", exhausting(cid), meta=approval, mode="2026-07-28")))

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
    approved = [r for r in results if r["operation"].get("approvedBudgetId") == first["operation"]["budgetId"]]
    assert len(approved) == 1, [r["stopReason"] for r in results]
    assert pair.journal.executions("always_fail", cid) == 3 + 3, "one approved call's three attempts, no more"


async def test_the_retry_budget_spent_through_one_proxy_limits_retries_through_the_other(pair: Pair) -> None:
    # 2026 requests: no stdio child to start per session, so the test stays well inside the
    # budget's 10 s window on a loaded machine
    with anyio.fail_after(BOUND_S):
        async with Client(pair.a.url, mode="2026-07-28") as client:
            await client.list_tools()
            for _ in range(2):  # A spends the fleet's two retries of the window
                key = uuid.uuid4().hex[:10]
                done = await client.call_tool("flaky_read", {"key": key, "fail_times": 1, "call_id": key})
                assert not done.is_error and done.meta["io.mcp-recovery-proxy/attempts"] == 2
    # A has written its counts (and listed the tool) since; B has then read the tool's listing and
    # the fleet's totals (each syncs every 50 ms)
    more_syncs(pair.a, 2)
    more_syncs(pair.b, 3)
    key = uuid.uuid4().hex[:10]
    args = {"key": key, "fail_times": 1, "call_id": key}
    refused = report(await call(pair.b, "flaky_read", args, mode="2026-07-28"))
    assert refused["stopReason"] == "retry_budget", refused
    assert pair.journal.executions("flaky_read", key) == 1


async def test_a_store_killed_mid_run_leaves_every_call_answered_in_time_on_local_state(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with Pair(tmp_path, own_redis) as pair:
        strict = pair.start_proxy("--state-required-for-ready")
        assert readyz(pair.a).json()["state"]["up"] is True
        before = report(await call(pair.a, "always_fail", exhausting(cid := uuid.uuid4().hex[:10])))
        durations: list[float] = []
        answered = 0
        midway = anyio.Event()

        async def load(proxy: ProxyProcess, n: int) -> None:
            nonlocal answered
            async with Client(proxy.url, mode="2026-07-28") as client:
                await client.list_tools()
                for i in range(n):
                    started = time.monotonic()
                    with anyio.fail_after(DEADLINE_S + 2):
                        result = await client.call_tool("echo", {"text": f"m{i}"})
                    durations.append(time.monotonic() - started)
                    assert not result.is_error
                    answered += 1
                    if answered == 20:
                        midway.set()

        async def kill_midway() -> None:
            await midway.wait()
            own_redis.kill()

        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                for proxy in (pair.a, pair.b):
                    tg.start_soon(load, proxy, 30)
                tg.start_soon(kill_midway)
        assert answered == 60 and max(durations) < DEADLINE_S
        # the ledger still refuses on local state; a new exhaustion is kept locally
        with anyio.fail_after(DEADLINE_S + 2):
            again = report(await call(pair.b, "always_fail", exhausting(cid)))
        assert again["stopReason"] == "ledger_exhausted"
        assert again["operation"]["budgetId"] == before["operation"]["budgetId"]
        for proxy in (pair.a, pair.b):
            wait_gauge(proxy, "mcp_recovery_state_store_up", 0)
            ready = readyz(proxy)
            assert ready.status_code == 200, "an unreachable store does not fail /readyz by default"
            assert ready.json()["state"]["up"] is False and "fallback" in ready.json()["state"]
        assert readyz(strict).status_code == 503
        assert "shared state store unreachable" in readyz(strict).json()["reasons"][0]
        errors = sum(
            metric(pair.a, "mcp_recovery_state_store_errors_total", f'operation="{op}"')
            for op in ("ping", "budget", "subscribe", "record", "approve")
        )
        assert errors >= 1


async def test_a_store_restarted_empty_gets_back_the_entries_the_proxies_hold(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with Pair(tmp_path, own_redis) as pair:
        cid = uuid.uuid4().hex[:10]
        first = report(await call(pair.a, "always_fail", exhausting(cid)))
        own_redis.kill()
        own_redis.start()  # empty: no persistence
        for proxy in (pair.a, pair.b):
            wait_metric(proxy, "mcp_recovery_state_reconciles_total", 2, timeout_s=15)
        late = pair.start_proxy()  # a replica that never saw the entry reads it from the store
        again = report(await call(late, "always_fail", exhausting(cid)))
        assert again["stopReason"] == "ledger_exhausted"
        assert again["operation"]["budgetId"] == first["operation"]["budgetId"]
        assert pair.journal.executions("always_fail", cid) == 3


async def test_a_slow_store_delays_no_call_past_its_bound(tmp_path: Path, own_redis: RedisServer) -> None:
    with Pair(tmp_path, own_redis) as pair:
        cid = uuid.uuid4().hex[:10]
        first = report(await call(pair.a, "always_fail", exhausting(cid)))
        approval = {"io.mcp-recovery-proxy/approveBudget": first["operation"]["budgetId"]}
        sleeper = own_redis.stall(12.0)
        try:
            started = time.monotonic()
            with anyio.fail_after(11.0):  # before the store wakes up (generous: a loaded machine)
                refused = report(await call(pair.b, "always_fail", exhausting(cid), meta=approval))
                echoed = await call(pair.a, "echo", {"text": "still here"})
            # approvals cannot be checked against a store that does not answer: refused, at once
            assert refused["stopReason"] == "ledger_exhausted" and not echoed.is_error
            assert time.monotonic() - started < 11.0, "answered before the store woke up"
        finally:
            sleeper.settimeout(30)
            assert sleeper.recv(16).startswith(b"+OK"), "the store woke up"
            sleeper.close()
        assert pair.journal.executions("always_fail", cid) == 3
        # the approval was not spent: once the store answers again, it is honoured
        wait_gauge(pair.b, "mcp_recovery_state_store_up", 1)
        fresh = report(await call(pair.b, "always_fail", exhausting(cid), meta=approval))
        assert fresh["operation"]["approvedBudgetId"] == first["operation"]["budgetId"]
