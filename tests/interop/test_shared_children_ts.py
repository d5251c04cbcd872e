"""`--stdio-sessions shared` with TypeScript SDK clients (tests/interop/ts_client.mjs over Streamable
HTTP) in front of real SDK stdio servers (tests/e2e/shared_server.py): the other SDK's sessions
are kept apart on shared children too.

- Two TS sessions on one shared child (`--stdio-shared-children 1`), calling at once: each gets its
  own answer and only its own progress.
- Two TS sessions asking for sampling at once on two children: each answers only its own request.
- Five TS sessions on two children (more sessions than children): every call answered.
Each client runs in a thread of its own (its replies are read with a bound); the proxy is started
and stopped by its pid.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.forkserver import python_argv
from tests.interop.harness import Call, Prerequisites, Reply, Target, TsClient, started
from tests.proxy_process import ProxyProcess

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "e2e" / "shared_server.py"


def shared_proxy(tmp_path: Path, children: int) -> ProxyProcess:
    return ProxyProcess(
        upstream=python_argv(SERVER),
        extra=["--stdio-sessions", "shared", "--stdio-shared-children", str(children)],
        log_path=tmp_path / "proxy.log",
    )


def in_threads(n: int, work: Callable[[int], Any]) -> list[Any]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(work, range(n)))


def test_two_ts_sessions_on_one_child_get_only_their_own_progress(prereq: Prerequisites, tmp_path: Path) -> None:
    with started(shared_proxy(tmp_path, 1)) as proxy:
        target = Target(url=proxy.url)

        def session(n: int) -> list[Reply]:
            who = ["alice", "bob"][n]
            with TsClient(prereq, target) as client:
                calls = [Call("progress", {"who": f"{who}{i}", "steps": 3}) for i in range(3)]
                return [client.call(call, progress=True) for call in calls]

        alice, bob = in_threads(2, session)
    for who, replies in (("alice", alice), ("bob", bob)):
        for i, reply in enumerate(replies):
            assert reply.ok, reply.error
            assert reply.texts == f"done for {who}{i}"
            assert [p.get("message") for p in reply.progress] == [f"progress of {who}{i}"] * 3, reply.progress


def test_ts_sampling_requests_reach_the_session_whose_call_caused_them(prereq: Prerequisites, tmp_path: Path) -> None:
    with started(shared_proxy(tmp_path, 2)) as proxy:
        target = Target(url=proxy.url)

        def session(n: int) -> list[Reply]:
            who = ["alice", "bob"][n]
            with TsClient(prereq, target, env={"MCP_INTEROP_SAMPLING_REPLY": who}) as client:
                return [client.call(Call("ask", {"prompt": f"question {i} of {who}"})) for i in range(3)]

        alice, bob = in_threads(2, session)
    for who, replies in (("alice", alice), ("bob", bob)):
        assert [r.texts for r in replies] == [f"llm said: {who} answers question {i} of {who}" for i in range(3)]


def test_more_ts_sessions_than_children_are_all_answered(prereq: Prerequisites, tmp_path: Path) -> None:
    with started(shared_proxy(tmp_path, 2)) as proxy:
        target = Target(url=proxy.url)

        def session(n: int) -> list[str]:
            with TsClient(prereq, target) as client:
                return [client.call(Call("progress", {"who": f"s{n}-{i}", "steps": 2})).texts for i in range(2)]

        answers = in_threads(5, session)
    assert answers == [[f"done for s{n}-{i}" for i in range(2)] for n in range(5)]
