"""A call re-sent after its answer was lost never runs twice, when the re-send reaches another
replica (docs/recovery.md, "Re-sends"; proxy/state/resends.py).

Real processes: two proxies (HTTP in) sharing one real store (a redis-server, a Redis Cluster, a
valkey-server), in front of one scripted SDK
server over Streamable HTTP whose `charge` tool (state-changing, no annotations) journals its
effect first, then waits; raw HTTP clients whose connection to replica A is closed mid-call the way
a client's read timeout or a network drop closes it, and that re-send through replica B. The
journal shows every execution; each proxy's admin port what it holds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.test_resend import KEY, RESEND, answer_of, drop_mid_call, modern, status, until_listed
from tests.fixtures.helpers import ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess
from tests.state.redis_server import RedisCluster, RedisServer
from tests.state.test_two_proxies import metric, wait_gauge

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]
BOUND_S = 60.0
POLICIES = {
    "charge.yaml": "tools: [charge]\nside_effect: state_changing\nattempts: 2\ndeadline: 40s\nattempt_timeout: 30s\n",
}


class Replicas:
    """Two proxies on one store and one upstream (the replicas of one service behind one address)."""

    def __init__(self, tmp: Path, store: RedisServer | RedisCluster) -> None:
        self.tmp = tmp
        self.store = store
        self.journal = Journal(tmp / "journal.jsonl")
        self.policies = tmp / "policies"
        self.policies.mkdir(exist_ok=True)
        for name, text in POLICIES.items():
            (self.policies / name).write_text(text)
        self.prefix = f"rs{uuid.uuid4().hex[:6]}:"
        self.stack = ExitStack()
        self.proxies: list[ProxyProcess] = []
        self.upstream = ScriptedHTTP(self.journal.path, tmp / "state.json")

    def __enter__(self) -> Replicas:
        self.stack.callback(self.upstream.stop)
        self.upstream.start(timeout_s=90)
        for n in range(2):
            args = ["--policies", str(self.policies), "--state", self.store.url, "--state-prefix", self.prefix]
            args += ["--state-sync-interval-s", "0.05"]
            proxy = ProxyProcess(upstream_url=self.upstream.url, extra=args, log_path=self.tmp / f"proxy{n}.log")
            self.stack.callback(proxy.stop)
            proxy.start(timeout_s=90)  # bounded, and generous: a loaded machine
            self.proxies.append(proxy)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    @property
    def a(self) -> ProxyProcess:
        return self.proxies[0]

    @property
    def b(self) -> ProxyProcess:
        return self.proxies[1]


@pytest.fixture(scope="module", params=["redis", "cluster", "valkey"])
def replicas(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """For the tests that leave the store alone (each charges accounts of its own): on a
    redis-server, a three-master Redis Cluster (every record's script on its own slot's primary,
    the channel reaching every node) and a valkey-server."""
    fixture = {"redis": "redis_server", "cluster": "redis_cluster", "valkey": "valkey_server"}[request.param]
    store = request.getfixturevalue(fixture)
    with Replicas(tmp_path_factory.mktemp(f"resend-{request.param}"), store) as r:
        yield r


async def records(proxy: ProxyProcess) -> int:
    """The re-send records of the fleet this replica's view holds (/readyz, the state detail)."""
    async with httpx.AsyncClient(timeout=5.0) as admin:
        return int((await admin.get(proxy.admin + "/readyz")).json()["state"]["resendRecords"])


async def until_records(proxy: ProxyProcess, n: int) -> None:
    """Until this replica's view holds `n` records (another replica listed, or delivered, them)."""
    with anyio.fail_after(10):
        # another process's state: nothing to wait on but polling its admin port
        while await records(proxy) != n:  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def until_kept(proxy: ProxyProcess, n: int) -> None:
    with anyio.fail_after(10):
        while (await status(proxy))["kept"] != n:  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def post(proxy: ProxyProcess, body: dict[str, Any], headers: dict[str, str], code: int = 200) -> Any:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        return answer_of(await http.post(proxy.url, headers=headers, json=body), code)


async def test_a_2026_reissue_on_the_other_replica_while_the_call_runs_is_answered_by_that_one_execution(
    replicas: Replicas,
) -> None:
    journal, call = replicas.journal, uuid.uuid4().hex[:8]
    arguments = {"account": f"a-{call}", "amount": 5, "then": "hang", "hang_s": 3.0, "call_id": call}
    headers, body = modern(1, "charge", arguments)
    with anyio.fail_after(BOUND_S):
        before = await records(replicas.b)
        await drop_mid_call(replicas.a.url, headers, body, journal, "charge", call)
        await until_listed(replicas.a, "running")
        await until_records(replicas.b, before + 1)  # B has heard of A's running call
        assert not journal.events(tool="charge", event="completed", call=call), "re-sent while it runs"
        _, again = modern(2, "charge", arguments)
        answer = await post(replicas.b, again, headers)
    assert answer["id"] == 2
    result = answer["result"]
    assert result.get("isError") is not True, result
    assert result["structuredContent"]["account"] == f"a-{call}" and result["structuredContent"]["charged"]
    assert result["_meta"][RESEND] == {"attached": True}
    assert journal.executions("charge", call) == 1
    assert not journal.events(tool="charge", event="cancelled", call=call)
    assert (await status(replicas.b))["attached"] >= 1
    # delivered through B: A keeps nothing of it, and B's view forgets it
    await until_kept(replicas.a, 0)
    await until_records(replicas.b, before)


async def test_an_answer_kept_on_one_replica_goes_to_the_reissue_on_the_other_and_only_once(
    replicas: Replicas,
) -> None:
    journal, call = replicas.journal, uuid.uuid4().hex[:8]
    arguments = {"account": f"k-{call}", "amount": 7, "then": "hang", "hang_s": 0.3, "call_id": call}
    headers, body = modern(1, "charge", arguments)
    with anyio.fail_after(BOUND_S):
        before = await records(replicas.b)
        await drop_mid_call(replicas.a.url, headers, body, journal, "charge", call)
        await journal.await_for(lambda j: j.events(tool="charge", event="completed", call=call), timeout_s=20)
        await until_kept(replicas.a, 1)
        await until_records(replicas.b, before + 1)
        _, again = modern(9, "charge", arguments)
        first = await post(replicas.b, again, headers)
        # delivered now, through B: a deliberate repeat is a new call on either replica
        await until_kept(replicas.a, 0)
        _, repeat = modern(10, "charge", arguments)
        second = await post(replicas.a, repeat, headers)
    assert first["id"] == 9 and first["result"]["_meta"][RESEND] == {"attached": True}
    assert first["result"]["structuredContent"]["account"] == f"k-{call}"
    assert RESEND not in (second["result"].get("_meta") or {})
    assert journal.executions("charge", call) == 2


async def test_a_keyed_repeat_after_delivery_on_the_other_replica_gets_the_kept_answer(replicas: Replicas) -> None:
    journal, call = replicas.journal, uuid.uuid4().hex[:8]
    arguments = {"account": f"o-{call}", "amount": 4, "call_id": call}
    headers, body = modern(1, "charge", arguments)
    body["params"]["_meta"][KEY] = f"order-{call}"
    with anyio.fail_after(BOUND_S):
        before = await records(replicas.b)
        first = await post(replicas.a, body, headers)
        await until_records(replicas.b, before + 1)
        repeat = await post(replicas.b, {**body, "id": 2}, headers)
        other = {**body, "id": 3, "params": {**body["params"], "arguments": {**arguments, "amount": 5}}}
        refused = await post(replicas.b, other, headers, 400)  # invalid params: HTTP 400 in 2026
    assert RESEND not in (first["result"].get("_meta") or {})
    assert repeat["id"] == 2 and repeat["result"]["_meta"][RESEND] == {"attached": True}
    assert repeat["result"]["structuredContent"] == first["result"]["structuredContent"]
    assert refused["error"]["code"] == -32602 and "other arguments" in refused["error"]["message"]
    assert journal.executions("charge", call) == 1


async def test_one_key_sent_to_both_replicas_at_once_runs_once(replicas: Replicas) -> None:
    journal, call = replicas.journal, uuid.uuid4().hex[:8]
    arguments = {"account": f"t-{call}", "amount": 2, "then": "hang", "hang_s": 1.0, "call_id": call}
    headers, body = modern(1, "charge", arguments)
    body["params"]["_meta"][KEY] = f"twice-{call}"
    answers: list[Any] = []

    async def send(proxy: ProxyProcess, id_: int) -> None:
        answers.append(await post(proxy, {**body, "id": id_}, headers))

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send, replicas.a, 1)
            tg.start_soon(send, replicas.b, 2)
    assert journal.executions("charge", call) == 1
    assert sorted(RESEND in (a["result"].get("_meta") or {}) for a in answers) == [False, True]
    assert answers[0]["result"]["structuredContent"] == answers[1]["result"]["structuredContent"]


async def test_with_the_store_killed_every_call_is_answered_in_time_and_re_sends_match_per_replica(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with Replicas(tmp_path, own_redis) as r:
        own_redis.kill()
        for proxy in (r.a, r.b):
            wait_gauge(proxy, "mcp_recovery_state_store_up", 0)
        call = uuid.uuid4().hex[:8]
        arguments = {"account": f"d-{call}", "amount": 1, "then": "hang", "hang_s": 1.0, "call_id": call}
        headers, body = modern(1, "charge", arguments)
        with anyio.fail_after(BOUND_S):
            await drop_mid_call(r.a.url, headers, body, r.journal, "charge", call)
            await until_listed(r.a, "running")
            started = time.monotonic()
            _, on_b = modern(2, "charge", arguments)
            elsewhere = await post(r.b, on_b, headers)  # B cannot know of it: a call of its own
            _, on_a = modern(3, "charge", arguments)
            same = await post(r.a, on_a, headers)  # A matches it in its own table
            took = time.monotonic() - started
        assert RESEND not in (elsewhere["result"].get("_meta") or {}) and elsewhere["result"]["structuredContent"]
        assert same["result"]["_meta"][RESEND] == {"attached": True}
        assert r.journal.executions("charge", call) == 2
        assert took < 10.0, "no call waited on the store that is away"
        # A's listing could not be written: counted, and the call matched on A alone
        assert metric(r.a, "mcp_recovery_state_fallbacks_total", 'operation="resend"') >= 1


async def test_a_stalled_store_holds_no_re_send_or_keyed_call_past_its_bound(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with Replicas(tmp_path, own_redis) as r:
        call = uuid.uuid4().hex[:8]
        arguments = {"account": f"s-{call}", "amount": 1, "then": "hang", "hang_s": 2.0, "call_id": call}
        headers, body = modern(1, "charge", arguments)
        with anyio.fail_after(BOUND_S):
            before = await records(r.b)
            await drop_mid_call(r.a.url, headers, body, r.journal, "charge", call)
            await until_records(r.b, before + 1)  # B would wait for A's call
        sleeper = own_redis.stall(12.0)
        try:
            started = time.monotonic()
            with anyio.fail_after(11.0):  # before the store wakes up
                _, again = modern(2, "charge", arguments)
                resent = await post(r.b, again, headers)
                keyed_headers, keyed = modern(3, "charge", {"account": f"s-{call}", "amount": 2, "call_id": call})
                keyed["params"]["_meta"][KEY] = f"stalled-{call}"
                claimed = await post(r.a, keyed, keyed_headers)
            took = time.monotonic() - started
        finally:
            sleeper.settimeout(30)
            assert sleeper.recv(16).startswith(b"+OK"), "the store woke up"
            sleeper.close()
        # B stopped waiting on the store it could not reach: the re-send ran as a call of its own;
        # the keyed call ran without its claim
        assert resent["result"]["structuredContent"]["charged"] and not claimed["result"].get("isError")
        assert took < 11.0
        assert r.journal.executions("charge", call) == 3
