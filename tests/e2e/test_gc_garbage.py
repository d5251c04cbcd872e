"""The real proxy leaves (almost) no cyclic garbage per call, failed calls included:
full collections stop every call in flight, so they must stay rare.

The proxy (`python -m proxy serve`) runs in front of the scripted HTTP upstream (every 3rd
tools/call answered 503) with a `sitecustomize` on PYTHONPATH that, in the proxy process only,
adds up what each collection freed (`gc.callbacks`: the `collected` of every collection is
exactly the cyclic garbage, reference counting frees the rest) and, on SIGUSR1, runs
`gc.collect()` and appends that running total to a file. Between two such marks, 2026 SDK clients
make calls that succeed, recover from tool errors, from answers cut mid-way (`reset_read`) and from
503s, and time out (`hang`: attempts cancelled by the attempt timer). The garbage freed between
the marks, per call, must stay under a small bound (reference cycles on the call paths left about
135 objects per call of such a mix). Counts only; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
import uuid
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.fixtures.helpers import ScriptedHTTP
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.anyio, pytest.mark.timeout(180)]
BOUND_S = 30.0
ROUNDS = 4
PER_CALL_BOUND = 5.0

POLICIES = {
    "defaults.yaml": """
retry_on: [transient]
attempts: 3
deadline: 4s
attempt_timeout: 1s
min_attempt_time: 100ms
backoff: {initial: 10ms, max: 50ms, multiplier: 2, jitter: full}
retry_after_cap: 1s
unclassified: transient
ledger_window: 60s
""",
    "hang.yaml": """
tools: [hang]
attempts: 2
deadline: 2s
attempt_timeout: 300ms
min_attempt_time: 100ms
""",
}

SITECUSTOMIZE = textwrap.dedent(
    """
    import os, sys
    if "serve" in sys.argv:
        import gc, signal
        _freed = [0]

        def _count(phase, info):
            if phase == "stop":
                _freed[0] += info["collected"]

        def _mark(*_):
            gc.collect()
            with open(os.environ["GC_MARKS"], "a") as f:
                f.write(f"{_freed[0]}\\n")

        gc.callbacks.append(_count)
        signal.signal(signal.SIGUSR1, _mark)
    """
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def mark(proxy: ProxyProcess, marks: Path) -> int:
    """Have the proxy collect and write its running total of freed objects; return it."""
    before = len(marks.read_text().splitlines()) if marks.exists() else 0
    assert proxy.proc is not None
    os.kill(proxy.proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + BOUND_S
    while True:
        lines = marks.read_text().splitlines() if marks.exists() else []
        if len(lines) > before:
            return int(lines[-1])
        assert time.monotonic() < deadline, f"the proxy wrote no mark; log: {proxy.log_tail()}"
        time.sleep(0.05)  # polling another process's file (bounded above)


async def one_round(url: str) -> int:
    """One call of each kind, concurrently; the number of calls made."""
    calls = [
        ("echo", {"text": "hi"}),
        ("flaky_read", {"key": uuid.uuid4().hex, "fail_times": 2}),
        ("reset_read", {"key": uuid.uuid4().hex, "fail_times": 1}),
        ("hang", {"seconds": 5}),
        ("echo", {"text": "again"}),  # with the 503s, every 3rd call fails at least once
        ("echo", {"text": "more"}),
    ]
    with anyio.fail_after(BOUND_S):
        async with Client(url, mode="2026-07-28") as client:
            await client.list_tools()
            async with anyio.create_task_group() as tg:
                for name, args in calls:
                    tg.start_soon(client.call_tool, name, {**args, "call_id": uuid.uuid4().hex[:12]})
    return len(calls)


async def test_calls_that_fail_recover_and_time_out_leave_almost_no_cyclic_garbage(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    policies = tmp_path / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / name).write_text(text)
    marks = tmp_path / "marks.txt"
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "GC_MARKS": str(marks),
    }
    journal = Journal(tmp_path / "journal.jsonl")
    with ScriptedHTTP(journal.path, tmp_path / "state.json", extra=("--http-fail-every", "3")) as server:
        extra = ["--policies", str(policies)]
        with ProxyProcess(upstream_url=server.url, extra=extra, env=env, log_path=tmp_path / "proxy.log") as proxy:
            await one_round(proxy.url)  # warm-up: lazy imports, pools, the first session's objects
            start = mark(proxy, marks)
            calls = 0
            for _ in range(ROUNDS):
                calls += await one_round(proxy.url)
            freed = mark(proxy, marks) - start
    # the mix did fail: cut answers, 503s and hangs reached the upstream
    assert journal.executions("reset_read") >= ROUNDS + 1
    # The server refuses every 3rd tools/call with a 503; a round's hang has two attempts, and both
    # can be among the refused (which calls are depends on how the round's concurrent calls and
    # retries are scheduled), so it may not run in every round. It must in most of them.
    assert journal.executions("hang") >= (ROUNDS + 1) // 2 + 1
    print(f"cyclic garbage: {freed} objects for {calls} calls")
    assert freed / calls < PER_CALL_BOUND, f"{freed} objects of cyclic garbage for {calls} calls"


STARTUP_CENSUS = textwrap.dedent(
    """
    import os, sys
    if "serve" in sys.argv:
        import collections, gc, json, signal

        def _census(*_):
            # Nothing saved before this: DEBUG_SAVEALL before the freeze would keep start-up garbage
            # alive, and the freeze would then hold it.
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            after = len(gc.garbage)
            gc.unfreeze()
            gc.collect()  # what the freeze holds that nothing references
            kinds = collections.Counter(type(o).__module__ for o in gc.garbage)
            census = {"after_freeze": after, "frozen": len(gc.garbage) - after, "kinds": dict(kinds)}
            with open(os.environ["GC_CENSUS"] + ".tmp", "w") as f:
                json.dump(census, f)
            os.replace(os.environ["GC_CENSUS"] + ".tmp", os.environ["GC_CENSUS"])

        signal.signal(signal.SIGUSR1, _census)
        _freeze = gc.freeze

        def _frozen():  # start-up is over: say so (the probe may make readiness wait long)
            _freeze()
            open(os.environ["GC_CENSUS"] + ".frozen", "w").close()

        gc.freeze = _frozen
    """
)


def test_the_command_lines_parser_is_neither_collected_after_start_up_nor_frozen(tmp_path: Path) -> None:
    """argparse makes a formatter, a reference cycle, per flag it adds, and the parser itself is
    one: ~1,570 objects of cyclic garbage at each start, ~385 of them argparse's (bench/gc_garbage.py
    --census counted them, from the interpreter's start, as if traffic had made them). They are all
    collected before `gc.freeze()` (proxy/frontend/http/app.py): none is left for a collection after
    start-up, and none is frozen for good. (A guard: the code before it passed too; measured so.)"""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STARTUP_CENSUS)
    out = tmp_path / "census.json"
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "GC_CENSUS": str(out),
    }
    command = scripted_stdio_command(tmp_path / "journal.jsonl")
    proxy = ProxyProcess(upstream=command, env=env, log_path=tmp_path / "proxy.log")
    process = proxy.spawn()  # not awaiting readiness: a probe under load can hold it, not the freeze
    try:
        for done in (Path(f"{out}.frozen"), out):
            deadline = time.monotonic() + BOUND_S * 4
            while not done.exists():
                assert process.poll() is None, f"the proxy exited; log: {proxy.log_tail()}"
                assert time.monotonic() < deadline, f"no {done.name}; log: {proxy.log_tail()}"
                time.sleep(0.05)  # polling another process's file (bounded above)
            if done != out:
                os.kill(process.pid, signal.SIGUSR1)
        census = json.loads(out.read_text())
    finally:
        proxy.stop()
    print(f"start-up garbage census: {census}")
    assert census["kinds"].get("argparse", 0) == 0, census
