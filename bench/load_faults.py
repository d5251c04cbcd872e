"""The fault and load run: many concurrent SDK clients of both eras through the real
proxy, in front of a stdio upstream and an HTTP upstream, while faults are injected; judged from
the upstream's own journal and the callers' results, never from the proxy's metrics.

    .venv/bin/python bench/load_faults.py --quick                 # 10 clients, 400 calls, a SIGTERM leg
    .venv/bin/python bench/load_faults.py --sigterm-at 10         # 100 clients, 20,000 calls (the full run)
    .venv/bin/python bench/load_faults.py --quick --json out.json # what tests/e2e/test_load_faults.py reads

Legs, each with its own proxy (`python -m proxy serve`, stopped by SIGTERM to its pid, then SIGKILL):

1. **Load** (once per upstream, `--upstreams stdio,http`): `--clients` SDK `Client`s (alternating
   `mode="legacy"` and `mode="2026-07-28"`), one call in flight each, share `--calls` calls of a
   mix of idempotent reads and state-changing `charge` calls (the journal records each charge's
   effect before anything can fail). Faults: scripted transient errors (isError and JSON-RPC),
   non-transient refusals, hangs (cancelled at the attempt timeout), slow answers, `charge` that fails
   after its effect or hangs, scripted process crashes mid-call, external SIGKILLs of the upstream
   (a stdio child of the proxy; the HTTP server, which the bench restarts on its port), HTTP only:
   answers cut mid-way (`reset_read`: the connection is dropped after half an answer) and a 503 for
   every 40th tools/call, and one policy file rewritten mid-run (hot reload: `always_fail` from 3
   attempts to 2). Printed: calls answered (exactly one answer, and the right one), duplicate
   executions of `charge`, attempts beyond the policy's budget and repeats of ineligible failures,
   per era the tool calls answered outside the engine (a JSON-RPC error or an isError result without
   the report) and the hanging attempts that ran to their end instead of being cancelled (both must
   be 0, restarts included), deadline overshoot (caller-observed time minus the policy deadline, for
   calls stopped by their deadline), peak and final proxy RSS, processes and file descriptors left
   after the proxy's shutdown.
2. **Outage** (HTTP upstream): every tools/call answered 503 for `--outage-s` seconds while
   callers send an open-loop `--outage-rate` calls/s; upstream attempts per second (counted from
   the upstream's journal) with the retry budget and breaker off, the budget on, budget and breaker
   on (three proxies, three policy folders).
3. **SIGTERM** (`--sigterm-at S`): the load mix plus hangs longer than the grace; S seconds in,
   the callers stop sending and the proxy gets SIGTERM. Every call in flight must be answered (a
   success, or an unresolved result; those outliving the grace with stop reason `shutdown`), every
   attempt the journal shows started must end (completed, failed or cancelled: no attempt is left
   running), no child is left, and the proxy exits 0 within its grace (+ its documented bound).

Every wait is bounded; the whole run is bounded by `--max-seconds`; loopback only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
import httpx  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from bench.faults import (  # noqa: E402
    NON_TRANSIENT,
    BenchProxy,
    Report,
    alive,
    cmdline_has,
    descendants,
    fmt,
    is_ours,
    pct,
)
from tests.fixtures.helpers import PYTHON, free_port, scripted_args, terminate  # noqa: E402
from tests.fixtures.journal import Journal  # noqa: E402
from tests.proxy_process import scripted_stdio_command  # noqa: E402

T = TypeVar("T")
MODES = ("legacy", "2026-07-28")
UNRESOLVED = "io.mcp-recovery-proxy/unresolved"
# errors the SDK client synthesizes (-32000, CONNECTION_CLOSED) when a response stream ends or
# breaks without the answer: nobody answered the call
SDK_MADE_UP = ("SSE stream ended without a response", "SSE stream failed")
# JSON-RPC errors of a tools/call the engine answers as they came (the 2026 header and version
# errors, for the client's protocol machinery): anything else as a JSON-RPC error bypassed it
KEPT_PROTOCOL_ERRORS = ("-32020", "-32021", "-32022")
OVERSHOOT_TARGET_MS = 50.0
HANG_S = 8.0
EXIT_BOUND_S = 14.0  # docs/reliability.md: the proxy never outlives grace + about 14 s
# how long a state-changing `charge` or a long hang sleeps in the SIGTERM leg: beyond any grace
SIGTERM_HANG_S = 25.0

LIFTED = "anti_storm: {retry_budget_ratio: 1, retry_budget_min_per_s: 100000}"
LOAD_POLICIES = {
    "defaults.yaml": f"""\
# bench/load_faults.py: short timeouts; the mix is a deliberate storm (a third of the calls fail),
# so the retry budget is lifted here to exercise every per-call rule (the outage leg measures it)
retry_on: [transient]
attempts: 3
deadline: 3s
attempt_timeout: 1s
min_attempt_time: 50ms
backoff: {{initial: 10ms, max: 50ms, multiplier: 2, jitter: full}}
unclassified: transient
ledger_window: 60s
{LIFTED}
""",
    "reads.yaml": "tools: [echo, reset_read, slow_progress]\nside_effect: read_only\n",
    "always_fail.yaml": "tools: [always_fail]\nside_effect: read_only\nattempts: 3\n",
    "flaky_read.yaml": "tools: [flaky_read]\nside_effect: read_only\ndeadline: 5s\nattempt_timeout: 1500ms\n",
    "hang.yaml": "tools: [hang]\nside_effect: read_only\nattempts: 10\nattempt_timeout: 300ms\ndeadline: 1500ms\n",
    "charge.yaml": "tools: [charge]\nside_effect: state_changing\nreport:\n  status_check_tool: echo\n",
}
RELOADED = ("always_fail.yaml", "tools: [always_fail]\nside_effect: read_only\nattempts: 2\n")
# the SIGTERM leg: hangs and charges that outlive any grace (their deadline is far beyond it)
SIGTERM_POLICIES = {
    **LOAD_POLICIES,
    "hang.yaml": "tools: [hang]\nside_effect: read_only\nattempts: 2\nattempt_timeout: 60s\ndeadline: 60s\n",
    "charge.yaml": "tools: [charge]\nside_effect: state_changing\nattempt_timeout: 60s\ndeadline: 60s\n",
}
OUTAGE_BASE = """\
retry_on: [transient]
attempts: 3
deadline: 2s
attempt_timeout: 500ms
backoff: {initial: 20ms, max: 100ms, multiplier: 2, jitter: full}
"""
OUTAGE_VARIANTS = {
    "budget and breaker off": OUTAGE_BASE + LIFTED + "\n",
    "retry budget on (20% + 10/s)": OUTAGE_BASE + "anti_storm: {retry_budget_ratio: 0.2, retry_budget_min_per_s: 10}\n",
    "retry budget and breaker on": OUTAGE_BASE
    + "anti_storm: {retry_budget_ratio: 0.2, retry_budget_min_per_s: 10, breaker_failures: 5, breaker_cooldown: 2s}\n",
}

LOAD_WEIGHTS = {
    "echo": 26,
    "slow": 10,
    "flaky_recovered": 12,
    "flaky_jsonrpc": 4,
    "exhausted": 5,
    "validation": 2,
    "business": 2,
    "permission": 2,
    "declined": 2,
    "charge_ok": 14,
    "charge_fail": 4,
    "charge_hang": 2,
    "hang": 3,
    "reset": 6,
}
SIGTERM_WEIGHTS = {"echo": 30, "slow": 10, "flaky_recovered": 10, "charge_ok": 20, "hang": 5, "charge_hang": 3}
CRASH_KINDS = ("flaky_crash", "charge_crash")
STATE_CHANGING = ("charge",)


# --------------------------------------------------------------------------- the plan


@dataclass
class Spec:
    index: int
    kind: str
    tool: str
    args: dict[str, Any]
    client: int
    max_attempts: int  # the policy's total attempts (at the start of the run)
    after_reload: bool = False  # sent only once the policy reload is seen applied (or RELOAD_WAIT_S)

    @property
    def call_id(self) -> str:
        return str(self.args["call_id"])


def make_spec(index: int, kind: str, cid: str, rng: random.Random, client: int, *, sigterm: bool = False) -> Spec:
    attempts = 3
    if kind == "echo":
        tool, args = "echo", {"text": f"hello {cid}"}
    elif kind == "slow":  # a slow answer: 2 steps of 25-125 ms, well inside the attempt timeout
        tool, args = "slow_progress", {"steps": 2, "delay_s": round(rng.uniform(0.025, 0.125), 3)}
    elif kind in ("flaky_recovered", "flaky_jsonrpc", "flaky_crash"):
        mode = {"flaky_recovered": "tool_error", "flaky_jsonrpc": "jsonrpc", "flaky_crash": "crash"}[kind]
        fails = rng.choice((1, 2)) if kind == "flaky_recovered" else 1
        tool, args = "flaky_read", {"key": cid, "fail_times": fails, "mode": mode}
    elif kind == "exhausted":
        tool, args = "always_fail", {"category": "transient", "retryable": True}
    elif kind in NON_TRANSIENT:
        tool, args = "always_fail", {"category": kind, "retryable": False}
    elif kind == "declined":
        tool, args = "always_fail", {"category": "transient", "retryable": False}
    elif kind.startswith("charge_"):
        then = kind.removeprefix("charge_")
        tool, args = "charge", {"account": f"acct-{cid}", "amount": round(rng.uniform(1, 500), 2), "then": then}
        if then == "hang":
            args["hang_s"] = SIGTERM_HANG_S if sigterm else HANG_S
        attempts = 3
    elif kind == "hang":
        tool, args = "hang", {"seconds": SIGTERM_HANG_S if sigterm else HANG_S}
        attempts = 2 if sigterm else 10
    elif kind == "reset":
        tool, args = "reset_read", {"key": cid, "fail_times": 1}
    else:
        raise ValueError(kind)
    args["call_id"] = cid
    return Spec(index, kind, tool, args, client, attempts)


def make_plan(
    calls: int,
    clients: int,
    crashes: int,
    seed: int,
    tag: str,
    weights: dict[str, int],
    *,
    sigterm: bool = False,
    after_reload: int = 0,
) -> list[Spec]:
    """`calls` specs drawn with `weights`, client i % clients. The last `after_reload` calls (each
    the last of its client's queue) are exhausted calls held until the policy reload is applied:
    however fast a short run goes, some calls run under the reloaded policy."""
    rng = random.Random(f"{seed}-{tag}")
    kinds = rng.choices(list(weights), weights=list(weights.values()), k=calls)
    for i in range(crashes):  # spaced through the run, alternating the two kinds
        kinds[int((i + 0.5) * calls / crashes)] = CRASH_KINDS[i % 2]
    held = min(after_reload, clients, calls)
    for i in range(calls - held, calls):
        kinds[i] = "exhausted"
    plan = [
        make_spec(i, kind, f"{tag}-{seed}-{i:05d}-{kind}", rng, i % clients, sigterm=sigterm)
        for i, kind in enumerate(kinds)
    ]
    for spec in plan[calls - held :]:
        spec.after_reload = True
    return plan


# --------------------------------------------------------------------------- processes


class LoadProxy(BenchProxy):
    """The real proxy (`-m proxy` from `repo`), in a session of its own, stopped by its pid."""

    def start(self, timeout_s: float = 120.0) -> LoadProxy:
        super().start(timeout_s)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class JournalTail:
    """Reads a journal incrementally: `new()` returns the events appended since its last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                raw = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(raw)
        lines = (self.partial + raw).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    out.append(record)
        return out


class HttpUpstream:
    """The scripted server over Streamable HTTP on a fixed loopback port, with a warm standby
    (`--bind-retry-s`) that takes the port over when the server dies (our SIGKILL or its scripted
    crash): `ensure()` promotes it and starts the next standby, as a supervisor with a warm spare
    would. Without it a Python start (3-5 s here) would turn every kill into a long outage."""

    def __init__(
        self, journal: Path, state: Path, log: Path, extra: Sequence[str] = (), *, standby: bool = True
    ) -> None:
        self.with_standby = standby
        self.journal = Journal(journal)
        self.tail = JournalTail(journal)
        self.state = state
        self.log = log
        self.extra = list(extra)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None  # the one serving (or about to)
        self.standby: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []
        self.listening_pids: set[int] = set()
        self.standby_pids: set[int] = set()
        self.start_fds: dict[int, int] = {}  # pid -> open fds once it listened
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(
                [
                    PYTHON,
                    *scripted_args("http", self.journal.path, self.state, self.port, self.extra),
                    "--bind-retry-s",
                    "3600",
                ],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.pids.append(proc.pid)
        return proc

    def poll(self) -> None:
        for e in self.tail.new():
            if e.get("event") == "listening" and isinstance(e.get("pid"), int):
                self.listening_pids.add(e["pid"])
                self.start_fds.setdefault(e["pid"], fd_count(e["pid"]))
            elif e.get("event") == "standby" and isinstance(e.get("pid"), int):
                self.standby_pids.add(e["pid"])

    def start(self, timeout_s: float = 60.0) -> HttpUpstream:
        self.proc = self.spawn()
        deadline = time.monotonic() + timeout_s
        while self.proc.pid not in self.listening_pids:
            self.poll()
            if self.proc.poll() is not None:
                raise RuntimeError(f"HTTP upstream exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"HTTP upstream not listening after {timeout_s}s")
            time.sleep(0.05)
        if self.with_standby:
            self.standby = self.spawn()
        return self

    def ensure(self) -> bool:
        """Promote the standby when the server has died (and start the next); True if it did."""
        self.poll()
        if self.proc is None or self.proc.poll() is None:
            return False
        self.restarts += 1
        self.proc, self.standby = (self.standby or self.spawn()), (self.spawn() if self.with_standby else None)
        return True

    def killable(self) -> bool:
        """Serving, with a warm standby waiting for the port."""
        self.poll()
        return (
            self.proc is not None
            and self.proc.poll() is None
            and self.proc.pid in self.listening_pids
            and self.standby is not None
            and self.standby.pid in self.standby_pids
        )

    def stop(self) -> None:
        for proc in (self.standby, self.proc):
            if proc is not None:
                terminate(proc)


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB, 0 when gone."""
    rss = hwm = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def upstream_connections(port: int) -> int:
    """TCP connections whose local end is the upstream's port and still open on its side
    (ESTABLISHED, or CLOSE_WAIT: the peer closed, the upstream still holds the fd)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] in ("01", "08"):
                    n += 1
    return n


def stop_proxy(proxy: LoadProxy, bound_s: float) -> tuple[int | None, float]:
    """SIGTERM by pid; the exit code and seconds until it exited (SIGKILL after `bound_s`)."""
    assert proxy.proc is not None
    t0 = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(proxy.pid, signal.SIGTERM)
    try:
        code = proxy.proc.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        proxy.proc.kill()
        proxy.proc.wait(timeout=10)
        code = None
    return code, time.monotonic() - t0


# --------------------------------------------------------------------------- calling


@dataclass
class Outcome:
    index: int
    kind: str
    call_id: str
    mode: str
    answer: str = "none"  # result | jsonrpc_error | no_answer | exception | not_sent
    right_answer: bool | None = None  # a success carried this call's own payload
    t_start: float = 0.0  # time.time()
    elapsed_s: float = 0.0
    is_error: bool | None = None
    stop_reason: str | None = None
    elapsed_ms: float | None = None
    deadline_ms: float | None = None
    attempt_count: int | None = None
    max_attempts: int | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""


def _right_answer(spec: Spec, structured: Any, text: str) -> bool | None:
    """Whether a success is this call's own answer (an answer routed to the wrong caller is not)."""
    sc = structured if isinstance(structured, dict) else {}
    if spec.tool == "echo":
        return sc.get("text") == spec.args["text"]
    if spec.tool in ("flaky_read", "reset_read"):
        return sc.get("key") == spec.args["key"]
    if spec.tool == "charge":
        return sc.get("account") == spec.args["account"]
    if spec.tool == "slow_progress":
        return text == f"done after {spec.args['steps']} steps"
    return None


async def call_once(client: Client, spec: Spec, mode: str, bound_s: float) -> Outcome:
    out = Outcome(spec.index, spec.kind, spec.call_id, mode)
    started = time.monotonic()
    out.t_start = time.time()
    try:
        with anyio.fail_after(bound_s):
            result = await client.call_tool(spec.tool, spec.args)
        out.answer = "result"
        out.is_error = bool(result.is_error)
        text = result.content[0].text if result.content and hasattr(result.content[0], "text") else ""
        report = (result.meta or {}).get(UNRESOLVED)
        if result.is_error and isinstance(report, dict):
            out.stop_reason = report.get("stopReason")
            out.elapsed_ms = report.get("elapsedMs")
            out.deadline_ms = report.get("deadlineMs")
            out.attempt_count = report.get("attemptCount")
            out.max_attempts = report.get("maxAttempts")
            for step in report.get("attemptedSteps") or []:
                if isinstance(step, dict):
                    kept = ("number", "outcome", "category", "dispatched", "startedAt", "durationMs", "backoffMs")
                    out.steps.append({k: step.get(k) for k in kept} | {"detail": str(step.get("detail"))[:120]})
            out.detail = text[:200]
        elif result.is_error:
            out.detail = f"isError without a report: {text[:200]}"
        else:
            out.right_answer = _right_answer(spec, result.structured_content, text)
    except TimeoutError:
        out.answer = "no_answer"
    except MCPError as exc:  # a JSON-RPC error answer is still an answer, unless the SDK made it up
        out.answer = "stream_ended" if exc.message.startswith(SDK_MADE_UP) else "jsonrpc_error"
        out.detail = f"{exc.code}: {exc.message}"[:200]
    except Exception as exc:
        out.answer = "exception"
        out.detail = repr(exc)[:300]
    out.elapsed_s = time.monotonic() - started
    return out


@dataclass
class Progress:
    done: int = 0
    stop: anyio.Event = field(default_factory=anyio.Event)
    go_at: float = 0.0
    broken: list[str] = field(default_factory=list)  # client sessions that broke under their client
    open_failures: list[str] = field(default_factory=list)  # clients that failed to open (then retried)
    reloaded: anyio.Event = field(default_factory=anyio.Event)  # the policy reload is seen applied


MAX_REOPENS = 20  # per client: a session that breaks is replaced, at most this often
RELOAD_WAIT_S = 30.0  # a call held for the policy reload waits at most this long
AFTER_RELOAD_CALLS = 3  # calls of a load leg held until the reload is applied (its last ones)


def refused_at_connect(exc: BaseException) -> bool:
    """Whether `exc` (an SDK client's failure, often an exception group) comes from a TCP connection
    the peer refused: the request never reached it."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError) or type(e).__name__ == "ConnectError":
            return True
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return False


async def run_clients(
    url: str,
    plan: Sequence[Spec],
    clients: int,
    bound_s: float,
    side: Callable[[Progress], Any] | None = None,
    *,
    open_bound_s: float = 180.0,
) -> tuple[list[Outcome], float, Progress]:
    """`clients` SDK clients (alternating eras), one call in flight each, through `plan`. `side`
    (an async function of the shared Progress) runs beside them from the start signal until every
    client is done; setting `progress.stop` makes the clients send no further call."""
    outcomes: list[Outcome] = []
    queues: dict[int, list[Spec]] = collections.defaultdict(list)
    for spec in plan:
        queues[spec.client].append(spec)
    progress = Progress()
    ready, go, all_done = anyio.Event(), anyio.Event(), anyio.Event()
    counts = {"ready": 0, "done": 0}

    async def client_task(c: int) -> None:
        mode = MODES[c % len(MODES)]
        queue = collections.deque(queues[c])
        opened = False
        try:
            for _ in range(MAX_REOPENS + 1):
                try:
                    async with Client(url, mode=mode) as client:
                        if not opened:
                            with anyio.fail_after(open_bound_s):
                                await client.list_tools()
                            opened = True
                            counts["ready"] += 1
                            if counts["ready"] == clients:
                                ready.set()
                            await go.wait()
                        while queue and not progress.stop.is_set():
                            if queue[0].after_reload:
                                with anyio.move_on_after(RELOAD_WAIT_S):
                                    await progress.reloaded.wait()
                            outcomes.append(await call_once(client, queue[0], mode, bound_s))
                            queue.popleft()
                            progress.done += 1
                except Exception as exc:
                    # The client's session broke under it (its SDK task group failed, e.g. a read
                    # error on a stream): the call in flight got no answer; a new client goes on.
                    if not opened:
                        progress.open_failures.append(f"{mode}: {exc!r}"[:300])
                        if len(progress.open_failures) > clients:
                            raise
                        continue
                    progress.broken.append(f"{mode}: {exc!r}"[:300])
                    if queue:
                        spec = queue.popleft()
                        # After the callers were stopped (the SIGTERM leg), a call whose connection
                        # the proxy's closed listener refused never reached it: not sent, rather
                        # than a call in flight left unanswered.
                        refused = progress.stop.is_set() and refused_at_connect(exc)
                        o = Outcome(
                            spec.index, spec.kind, spec.call_id, mode, answer="not_sent" if refused else "session_broke"
                        )
                        o.detail = repr(exc)[:300]
                        outcomes.append(o)
                        progress.done += 1
                if not queue or progress.stop.is_set():
                    break
        finally:
            outcomes.extend(Outcome(sp.index, sp.kind, sp.call_id, mode, answer="not_sent") for sp in queue)
            counts["done"] += 1
            if counts["done"] == clients:
                all_done.set()

    async with anyio.create_task_group() as tg:
        for c in range(clients):
            tg.start_soon(client_task, c)
        with anyio.fail_after(open_bound_s + 30):
            await ready.wait()
        t0 = time.monotonic()
        progress.go_at = time.time()
        go.set()
        if side is not None:
            async with anyio.create_task_group() as side_tg:
                side_tg.start_soon(side, progress)
                await all_done.wait()
                side_tg.cancel_scope.cancel()
        else:
            await all_done.wait()
        wall = time.monotonic() - t0
    outcomes.sort(key=lambda o: o.index)
    return outcomes, wall, progress


# --------------------------------------------------------------------------- a leg's side activity


@dataclass
class Faults:
    """What the fault injector did, with timestamps (time.time())."""

    kills: list[tuple[float, int]] = field(default_factory=list)  # (t, pid) SIGKILLed by us
    reload_written_at: float | None = None
    reload_seen_at: float | None = None
    rss_samples: list[int] = field(default_factory=list)  # KiB
    fd_samples: list[int] = field(default_factory=list)
    restarts: int = 0
    go_at: float = 0.0


async def policy_version(admin: str, http: httpx.AsyncClient) -> Any:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return (await http.get(admin + "/policies", timeout=5.0)).json().get("version")
    return None


def make_injector(
    proxy: LoadProxy,
    upstream: str,
    http_upstream: HttpUpstream | None,
    journal: Path,
    policies: Path,
    total: int,
    kills: int,
    faults: Faults,
    rng: random.Random,
) -> Callable[[Progress], Any]:
    kill_at = [int((i + 1) * total / (kills + 1)) for i in range(kills)]
    reload_at = total // 2

    async def inject(progress: Progress) -> None:
        tail = JournalTail(journal)
        busy: collections.deque[int] = collections.deque(maxlen=20)  # pids of recent executions
        async with httpx.AsyncClient() as http:
            version0 = await policy_version(proxy.admin, http)
            next_sample = due = 0.0
            while True:
                now = time.monotonic()
                if now >= next_sample:
                    rss, _ = rss_kib(proxy.pid)
                    faults.rss_samples.append(rss)
                    faults.fd_samples.append(fd_count(proxy.pid))
                    next_sample = now + 0.5
                if http_upstream is not None and http_upstream.ensure():
                    faults.restarts += 1
                if upstream == "stdio":
                    busy.extend(e["pid"] for e in tail.new() if e.get("event") == "started" and "pid" in e)
                if kill_at and progress.done >= kill_at[0]:
                    due = due or now
                    # the HTTP server is killed once its standby is warm, or a second later regardless
                    victim = pick_victim(proxy, http_upstream, list(busy), rng, force=now - due > 1.0)
                    if victim is not None:  # else: tried again at the next turn
                        kill_at.pop(0)
                        due = 0.0
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(victim, signal.SIGKILL)
                        faults.kills.append((time.time(), victim))
                if faults.reload_written_at is None and progress.done >= reload_at:
                    name, text = RELOADED
                    tmp = policies / f".{name}.tmp"
                    tmp.write_text(text)
                    os.replace(tmp, policies / name)  # atomic, as an editor or a ConfigMap swap
                    faults.reload_written_at = time.time()
                if faults.reload_written_at is not None and faults.reload_seen_at is None:
                    version = await policy_version(proxy.admin, http)
                    if version is not None and version != version0:
                        faults.reload_seen_at = time.time()
                        progress.reloaded.set()
                await anyio.sleep(0.05)

    return inject


def pick_victim(
    proxy: LoadProxy, http_upstream: HttpUpstream | None, busy: list[int], rng: random.Random, *, force: bool
) -> int | None:
    """The HTTP server (once its standby is warm, or when `force`); or a stdio server of the proxy
    that executed a call a moment ago, else any of them."""
    if http_upstream is not None:
        ok = (http_upstream.killable() or force) and http_upstream.proc and http_upstream.proc.poll() is None
        return http_upstream.proc.pid if ok and http_upstream.proc else None
    kids = [p for p in descendants(proxy.pid) if cmdline_has(p, b"scripted_server.py")]
    recent = [p for p in busy if p in kids]
    if recent:
        return int(rng.choice(recent))
    return rng.choice(kids) if kids else None


# --------------------------------------------------------------------------- the journal


def journal_by_call(events: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    out: dict[str, dict[str, list[dict[str, Any]]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in events:
        if e.get("call") is not None:
            out[str(e["call"])][str(e.get("event"))].append(e)
    return out


def attempt_fates(events: list[dict[str, Any]], killed: set[int]) -> dict[str, list[str]]:
    """Per call, the fate of each executed attempt (a `started` line): completed | failed |
    cancelled | crashing (its own scripted crash) | killed (its process died: a crash of another
    call or our SIGKILL) | open (still running, or never ended)."""
    dead = killed | {e["pid"] for e in events if e.get("event") == "crashing"}
    ends: dict[tuple[Any, ...], str] = {}
    for e in events:
        if e.get("event") in ("completed", "failed", "cancelled", "crashing"):
            rid = json.dumps((e.get("attempt_key") or {}).get("request_id"))
            ends.setdefault((e.get("call"), e.get("pid"), rid), e["event"])
    out: dict[str, list[str]] = collections.defaultdict(list)
    for e in events:
        if e.get("event") != "started" or e.get("call") is None:
            continue
        rid = json.dumps((e.get("attempt_key") or {}).get("request_id"))
        fate = ends.get((e["call"], e.get("pid"), rid)) or ("killed" if e.get("pid") in dead else "open")
        out[str(e["call"])].append(fate)
    return out


def drain(journal: Journal, call_ids: set[str], killed: set[int], bound_s: float) -> tuple[list[dict[str, Any]], float]:
    """Wait (bounded) until no attempt of ours is still open in the journal."""
    t0 = time.monotonic()
    while True:
        events = journal.all()
        fates = attempt_fates(events, killed)
        if not any(f == "open" for cid in call_ids for f in fates.get(cid, ())) or time.monotonic() - t0 >= bound_s:
            return events, time.monotonic() - t0
        time.sleep(0.2)


# --------------------------------------------------------------------------- judging a load leg


def judge_calls(
    rep: Report,
    name: str,
    plan: Sequence[Spec],
    outcomes: Sequence[Outcome],
    events: list[dict[str, Any]],
    faults: Faults,
    killed: set[int],
    probe: Sequence[dict[str, Any]] = (),
    *,
    quick: bool = False,
) -> dict[str, Any]:
    """The counts of one load leg, each from the journal or the callers' results (`probe`: the
    lines of bench/deadline_probe.py run beside the leg). A `quick` leg can end before any probe
    call does: its overshoot is then reported as not measured, not as a failed check."""
    by_call = journal_by_call(events)
    fates = attempt_fates(events, killed)
    spec_of = {s.call_id: s for s in plan}
    data: dict[str, Any] = {"calls": len(plan)}

    # 1. every call answered exactly once, with its own answer
    answers = collections.Counter(o.call_id for o in outcomes if o.answer in ("result", "jsonrpc_error"))
    unanswered = [o for o in outcomes if o.answer not in ("result", "jsonrpc_error")]
    wrong = [o for o in outcomes if o.right_answer is False]
    twice = [cid for cid, n in answers.items() if n > 1]
    data["answered"] = len(answers)
    data["unanswered"] = len(unanswered)
    data["answered_more_than_once"] = len(twice)
    data["wrong_answer"] = len(wrong)
    results = collections.Counter(
        ("success" if not o.is_error else (o.stop_reason or "isError, no report")) if o.answer == "result" else o.answer
        for o in outcomes
    )
    data["results"] = dict(results)
    rep.say(
        f"  calls {len(plan)}: answered {len(answers)}, not answered {len(unanswered)}, answered twice {len(twice)}, "
        f"someone else's answer {len(wrong)}"
    )
    rep.say(f"    results: {dict(results.most_common())}")
    for o in unanswered[:10]:
        rep.say(f"    NOT ANSWERED {o.call_id} ({o.mode}, {o.answer}, {o.elapsed_s:.1f}s): {o.detail}")
    for o in wrong[:10]:
        rep.say(f"    WRONG ANSWER {o.call_id} ({o.mode})")
    rep.check(
        f"{name}: calls answered exactly once, each with its own answer",
        f"{len(answers) - len(wrong)} / {len(plan)}",
        "all",
        len(answers) == len(plan) and not twice and not wrong and not unanswered,
    )

    # 1b. outcomes their kind cannot have: a read that never fails on its own, or fails only
    # transiently, must not come back as a refusal (a session the proxy broke answered 400, say)
    transient_only = ("echo", "slow", "reset", "flaky_recovered", "flaky_jsonrpc", "flaky_crash", "exhausted", "hang")
    refused = ("not_retryable", "upstream_declined", "ledger_exhausted")
    misread = [o for o in outcomes if o.kind in transient_only and o.answer == "result" and o.stop_reason in refused]
    data["wrong_outcome"] = len(misread)
    for o in misread[:5]:
        rep.say(f"    WRONG OUTCOME {o.call_id} ({o.mode}): {o.stop_reason}: {o.detail[:160]}")
    rep.check(
        f"{name}: reads that fail only transiently reported as refusals (not_retryable, declined)",
        str(len(misread)),
        "0",
        not misread,
    )

    # 2. duplicate executions of state-changing tools: more than one effect for one call
    charges = [s for s in plan if s.tool in STATE_CHANGING]
    dups = {s.call_id: len(by_call[s.call_id]["effect"]) for s in charges if len(by_call[s.call_id]["effect"]) > 1}
    data["state_changing_calls"] = len(charges)
    data["state_changing_effects"] = sum(len(by_call[s.call_id]["effect"]) for s in charges)
    data["duplicates"] = len(dups)
    for cid, n in list(dups.items())[:10]:
        rep.say(f"    DUPLICATE {cid}: {n} effects")
    rep.say(f"  state-changing calls {len(charges)}, effects journaled {data['state_changing_effects']}")
    rep.check(f"{name}: duplicate executions of state-changing tools", str(len(dups)), "0", not dups)

    # 3. attempts beyond the budget, and repeats of ineligible failures
    reload_seen = faults.reload_seen_at
    over: list[str] = []
    ineligible: list[str] = []
    for o in outcomes:
        spec = spec_of[o.call_id]
        seen = len(by_call[o.call_id]["started"]) + len(by_call[o.call_id]["http_refused"])
        budget = spec.max_attempts
        if spec.tool == "always_fail" and reload_seen is not None and o.t_start >= reload_seen:
            budget = 2  # the reloaded policy: a call that started after the reload was applied
        if seen > budget:
            over.append(f"{o.call_id}: {seen} attempts upstream, budget {budget}")
        executed = len(by_call[o.call_id]["started"])
        if spec.kind in (*NON_TRANSIENT, "declined") and executed > 1:
            # allowed only when the earlier attempt's answer never reached the proxy (a transport
            # failure of a read-only tool: timeout, reset, process gone)
            saw = [st.get("outcome") for st in o.steps[:-1]]
            # (a call with no result at all fails the answered-once check instead)
            if o.answer == "result" and (any(s != "transport_error" for s in saw) or len(o.steps) < executed):
                ineligible.append(f"{o.call_id}: {executed} executions, caller's steps {o.steps}")
        if spec.tool in STATE_CHANGING and executed > 1:
            ineligible.append(f"{o.call_id}: state-changing, executed {executed} times")
    data["over_budget"] = len(over)
    data["ineligible_retries"] = len(ineligible)
    for line in (over + ineligible)[:10]:
        rep.say(f"    {line}")
    if reload_seen is not None:
        after = [
            o
            for o in outcomes
            if spec_of[o.call_id].kind == "exhausted" and o.t_start >= reload_seen and o.answer == "result"
        ]
        two = sum(1 for o in after if o.max_attempts == 2)
        rep.say(
            f"  policy reload: written at +{(faults.reload_written_at or 0) - faults.go_at:.1f}s, applied "
            f"(seen on /policies) {reload_seen - (faults.reload_written_at or reload_seen):.2f}s later; always_fail "
            f"calls started after it: {len(after)}, reporting maxAttempts 2: {two}"
        )
        data["reload"] = {"calls_after": len(after), "new_budget_reported": two}
    else:
        rep.say("  policy reload: NOT seen applied")
        data["reload"] = None
    rep.check(
        f"{name}: attempts beyond the budget + repeats of ineligible failures",
        f"{len(over)} + {len(ineligible)}",
        "0 + 0",
        not over and not ineligible and reload_seen is not None,
    )

    # 4. attempts that never ended (neither answered, nor cancelled, nor killed with their process)
    fate_counts = collections.Counter(f for cid in spec_of for f in fates.get(cid, ()))
    data["attempt_fates"] = dict(fate_counts)
    data["attempts_open"] = fate_counts.get("open", 0)
    rep.say(f"  attempts executed upstream: {dict(fate_counts.most_common())}")
    hangs = [s for s in plan if s.kind in ("hang", "charge_hang")]
    hang_fates = collections.Counter(f for s in hangs for f in fates.get(s.call_id, ()))
    rep.say(f"    of hanging calls ({len(hangs)}): {dict(hang_fates.most_common())}")
    rep.check(f"{name}: attempts left running upstream", str(fate_counts.get("open", 0)), "0", not fate_counts["open"])

    # 4b. per path (the caller's era over this upstream), through the upstream's restarts (kills,
    # crashes): tool calls answered outside the engine (a JSON-RPC error other than the 2026
    # protocol errors the engine keeps as they came, or an isError result without the engine's
    # report), and attempts the proxy stopped waiting for that were not cancelled upstream (a
    # hanging attempt outlives every deadline of the mix: one that ran to its end was never
    # cancelled; one whose process died is `killed`, not counted)
    outside: dict[str, int] = {mode: 0 for mode in MODES}
    uncancelled: dict[str, int] = {mode: 0 for mode in MODES}
    for o in outcomes:
        kept = o.answer == "jsonrpc_error" and o.detail.split(":", 1)[0] in KEPT_PROTOCOL_ERRORS
        if (o.answer == "jsonrpc_error" and not kept) or (
            o.answer == "result" and o.is_error and o.stop_reason is None
        ):
            outside[o.mode] += 1
            rep.say(f"    ANSWERED OUTSIDE THE ENGINE {o.call_id} ({o.mode}, {o.answer}): {o.detail[:160]}")
        if o.kind in ("hang", "charge_hang"):
            ran_out = sum(1 for f in fates.get(o.call_id, ()) if f in ("completed", "failed"))
            uncancelled[o.mode] += ran_out
            if ran_out:
                rep.say(f"    NOT CANCELLED {o.call_id} ({o.mode}): {ran_out} attempt(s) ran to their end")
    data["answered_outside_engine"] = outside
    data["attempts_not_cancelled"] = uncancelled
    for mode in MODES:
        rep.check(
            f"{name} [{mode}]: tool calls answered outside the engine + attempts not cancelled",
            f"{outside[mode]} + {uncancelled[mode]}",
            "0 + 0",
            not outside[mode] and not uncancelled[mode],
        )

    # 5. deadline overshoot: time after the policy deadline at which a call stopped by it was
    # answered. The check is the probe's (bench/deadline_probe.py: a process of its own, a few
    # calls in flight), a caller's view of the proxy; the load generator's own clients and the
    # proxy's `elapsedMs - deadlineMs` are printed beside it.
    hit = [o for o in outcomes if o.answer == "result" and o.stop_reason == "deadline_exhausted" and o.deadline_ms]
    caller = [o.elapsed_s * 1000 - float(o.deadline_ms or 0) for o in hit]
    proxy_side = [float(o.elapsed_ms) - float(o.deadline_ms or 0) for o in hit if o.elapsed_ms is not None]
    probed = [p for p in probe if p.get("stopReason") == "deadline_exhausted" and p.get("deadlineMs")]
    # Judged over the load itself: from the callers' start signal until the last load call ended.
    # The probe also runs while the hundred clients open their sessions and close them (fifty stdio
    # children started, then stopped, within seconds), which the load calls never see; those
    # calls are printed apart.
    window = (faults.go_at, max((o.t_start + o.elapsed_s for o in outcomes if o.t_start), default=math.inf))
    inside = [p for p in probed if window[0] <= p.get("t", 0) and p.get("t", 0) + p["caller_ms"] / 1000 <= window[1]]
    probe_all = [float(p["caller_ms"]) - float(p["deadlineMs"]) for p in probed]
    probe_over = [float(p["caller_ms"]) - float(p["deadlineMs"]) for p in inside]
    probe_errors = [p for p in probe if p.get("error")]
    # Where a probe call's overshoot went: within the proxy's own clock (its deadline timer and the
    # engine: elapsedMs - deadlineMs), or outside it (the request's way in before the engine's clock
    # starts, the answer's way out after it stops, and both processes' waits for a CPU).
    probe_own = [float(p["elapsedMs"]) - float(p["deadlineMs"]) for p in inside if p.get("elapsedMs") is not None]
    probe_outside = [float(p["caller_ms"]) - float(p["elapsedMs"]) for p in inside if p.get("elapsedMs") is not None]
    data["overshoot_ms"] = {
        "calls": len(hit),
        "caller_p50": pct(caller, 50),
        "caller_p99": pct(caller, 99),
        "caller_max": max(caller, default=math.nan),
        "proxy_p99": pct(proxy_side, 99),
        "probe_calls": len(inside),
        "probe_all_calls": len(probed),
        "probe_all_p99": pct(probe_all, 99),
        "probe_p50": pct(probe_over, 50),
        "probe_p99": pct(probe_over, 99),
        "probe_max": max(probe_over, default=math.nan),
        "probe_other": len(probe) - len(probed),
        "probe_own_p50": pct(probe_own, 50),
        "probe_own_p99": pct(probe_own, 99),
        "probe_outside_p50": pct(probe_outside, 50),
        "probe_outside_p99": pct(probe_outside, 99),
    }
    rep.say(
        f"  deadline overshoot ({len(hit)} load calls stopped by their deadline): load generator's clients p50 "
        f"{fmt(pct(caller, 50))} ms, p99 {fmt(pct(caller, 99))} ms, max {fmt(max(caller, default=math.nan))} ms; "
        f"proxy-reported (elapsedMs - deadlineMs) p99 {fmt(pct(proxy_side, 99))} ms"
    )
    rep.say(
        f"  deadline probe ({len(inside)} calls during the load stopped by their deadline, {len(probe_errors)} "
        f"errors): p50 {fmt(pct(probe_over, 50))} ms, p99 {fmt(pct(probe_over, 99))} ms, max "
        f"{fmt(max(probe_over, default=math.nan))} ms; with the clients' opening and closing ({len(probed)} of "
        f"{len(probe)} calls): p99 {fmt(pct(probe_all, 99))} ms, max {fmt(max(probe_all, default=math.nan))} ms"
    )
    rep.say(
        f"    of which within the proxy's own clock (elapsedMs - deadlineMs) p50 {fmt(pct(probe_own, 50))} ms, p99 "
        f"{fmt(pct(probe_own, 99))} ms; outside it (caller's time - elapsedMs: the way in and out, CPU waits) p50 "
        f"{fmt(pct(probe_outside, 50))} ms, p99 {fmt(pct(probe_outside, 99))} ms"
    )
    for p in probe_errors[:3]:
        rep.say(f"    probe error: {p['error']}")
    if quick and not probe_over:
        rep.say(f"  [----] {name}: deadline overshoot p99 not measured: the quick leg ended before a probe call did")
        return data
    rep.check(
        f"{name}: deadline overshoot p99, a caller's view (bench/deadline_probe.py)",
        f"{fmt(pct(probe_over, 99))} ms",
        f"<= {OVERSHOOT_TARGET_MS:.0f} ms (timing: rough on a loaded machine)",
        bool(probe_over) and pct(probe_over, 99) <= OVERSHOOT_TARGET_MS,
    )
    return data


def judge_shutdown(
    rep: Report,
    name: str,
    proxy: LoadProxy,
    code: int | None,
    exit_s: float,
    child_pids: set[int],
    http_upstream: HttpUpstream | None,
    grace_s: float,
    at_exit: int | None = None,
) -> dict[str, Any]:
    """After the proxy exited: its children gone, the HTTP upstream's fds back to their count at start.
    `at_exit`: how many were still there the moment it exited (else counted now)."""
    end = time.monotonic() + 5.0
    left = [p for p in child_pids if alive(p) and is_ours(p)]
    if at_exit is None:
        at_exit = len(left)  # still there once the proxy had exited: it did not stop them
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    data: dict[str, Any] = {
        "exit_code": code,
        "exit_s": exit_s,
        "children_left": len(left),
        "children_at_exit": at_exit,
    }
    fds_left = 0
    if http_upstream is not None and http_upstream.proc is not None and http_upstream.proc.poll() is None:
        http_upstream.poll()
        pid = http_upstream.proc.pid
        fds_left = upstream_connections(http_upstream.port)
        while fds_left and time.monotonic() < end:  # the upstream closes its side after our FIN
            time.sleep(0.05)
            fds_left = upstream_connections(http_upstream.port)
        data["upstream_fds"] = {"at_start": http_upstream.start_fds.get(pid, -1), "after_shutdown": fd_count(pid)}
    data["upstream_fds_left"] = fds_left
    over = f" + {exit_s - grace_s:.1f}s" if exit_s > grace_s else ""
    rep.say(
        f"  shutdown: exit code {code} after {exit_s:.1f}s (grace {grace_s:.0f}s{over}), processes "
        f"left (upstream servers and their guards) {len(left)} of {len(child_pids)} seen ({at_exit} still there "
        "the moment the proxy exited)"
        + (
            f"; HTTP upstream: connections still open {fds_left}, its fds {data['upstream_fds']['at_start']} at "
            f"its start, {data['upstream_fds']['after_shutdown']} after the proxy's shutdown"
            if "upstream_fds" in data
            else ""
        )
    )
    rep.check(
        f"{name}: processes and upstream fds left after shutdown",
        f"{len(left)} + {fds_left}",
        "0 + 0",
        not left and not at_exit and not fds_left and code == 0,
    )
    return data


# --------------------------------------------------------------------------- legs


def write_policies(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():
        stale.unlink()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def proxy_flags(clients: int, grace_s: float) -> list[str]:
    # every client is 127.0.0.1, as a sidecar's agent is: the shipped session and per-client
    # defaults serve it (a run that had to raise them would hide a default that refuses users)
    return [
        "--shutdown-grace-s",
        str(grace_s),
        # a hundred SDK clients in one Python process on a loaded machine can take longer than the
        # default 10 s between `initialize` and `notifications/initialized`: the bench's own lag
        "--session-init-timeout-s",
        "120",
    ]


def start_leg(
    args: argparse.Namespace,
    work: Path,
    upstream: str,
    tag: str,
    policies: dict[str, str],
    grace_s: float,
    clients: int,
) -> tuple[LoadProxy, HttpUpstream | None, Path, Path]:
    folder = write_policies(work / f"{tag}-policies", policies)
    journal = work / f"{tag}-journal.jsonl"
    state = work / f"{tag}-state.json"
    for stale in (journal, state):
        stale.unlink(missing_ok=True)
    http_upstream: HttpUpstream | None = None
    flags = ["--policies", str(folder), *proxy_flags(clients, grace_s)]
    if upstream == "http":
        http_upstream = HttpUpstream(
            journal, state, work / f"{tag}-upstream.log", extra=["--http-fail-every", str(args.fail_every)]
        ).start()
        proxy = LoadProxy(
            upstream_url=http_upstream.url, extra=flags, log_path=work / f"{tag}-proxy.log", repo=args.repo
        )
    else:
        proxy = LoadProxy(
            upstream=scripted_stdio_command(journal, state),
            extra=flags,
            log_path=work / f"{tag}-proxy.log",
            repo=args.repo,
        )
    proxy.start()
    return proxy, http_upstream, journal, folder


def run_niced(nice: int, work: Callable[[], T]) -> T:
    """`work()` in a thread of its own at `nice` (Linux: a thread's own priority), returning its
    result. `--callers-nice`: the hundred clients of the load generator, the machine's biggest CPU
    user, yield the CPU to the proxy as a proxy's own CPU allocation would give it in production;
    what they measure is then the proxy, not their share of two cores. Whatever that thread starts
    (the HTTP upstream's restarts after a kill) runs at that priority too."""
    if nice <= 0:
        return work()
    box: dict[str, Any] = {}

    def body() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        try:
            box["result"] = work()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=body, name="callers", daemon=True)  # --max-seconds ends the run
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


AUTOGROUP = Path("/proc/self/autogroup")


def in_own_session(argv: list[str] | None) -> int:
    """Run this bench again as the leader of a session of its own and return its exit code.
    `--callers-nice` on a host with autogroup scheduling (each session one group, weighed as one
    task whatever its threads' nice): the thread's nice alone leaves the callers' group as heavy
    as the proxy's, so the run lowers its own session's group too (`main`). The proxy, its
    children, the HTTP upstream and the deadline probe are sessions of their own, out of it."""
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)],
        start_new_session=True,
    )
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        return child.wait()


class DeadlineProbe:
    """bench/deadline_probe.py in a process of its own beside a load leg (see judge_calls, 5),
    stopped by its pid."""

    def __init__(self, url: str, out: Path, rate: float, seconds: float) -> None:
        argv = [PYTHON, str(REPO / "bench" / "deadline_probe.py"), url, str(out), "--rate", str(rate)]
        with open(out.with_suffix(".log"), "ab") as log:
            # a session of its own: a caller elsewhere, out of the callers' lowered group (main)
            self.proc = subprocess.Popen(
                [*argv, "--seconds", str(seconds)], stdout=log, stderr=log, start_new_session=True
            )

    def stop(self) -> None:
        terminate(self.proc, timeout_s=40)  # its calls in flight end within their deadline


def load_leg(args: argparse.Namespace, work: Path, rep: Report, upstream: str, cleanup: list[Any]) -> dict[str, Any]:
    name = f"load/{upstream}"
    calls = args.calls // len(args.upstreams)
    plan = make_plan(
        calls, args.clients, args.crashes, args.seed, f"L{upstream}", LOAD_WEIGHTS, after_reload=AFTER_RELOAD_CALLS
    )
    proxy, http_upstream, journal, policies = start_leg(
        args, work, upstream, f"load-{upstream}", LOAD_POLICIES, args.grace, args.clients
    )
    cleanup += [proxy, http_upstream]
    rep.say()
    rep.say(
        f"Leg {name}: {len(plan)} calls, {args.clients} clients ({args.clients - args.clients // 2} legacy, "
        f"{args.clients // 2} 2026-07-28), one call in flight each; {args.kills} SIGKILLs, {args.crashes} scripted "
        f"crashes, a policy reload at half-way"
        + (f", a 503 every {args.fail_every}th tools/call" if upstream == "http" else "")
    )
    faults = Faults()
    injector = make_injector(
        proxy, upstream, http_upstream, journal, policies, len(plan), args.kills, faults, random.Random(args.seed)
    )
    bound = 30.0 + args.slack
    load0 = os.getloadavg()[0]
    probe_out = work / f"load-{upstream}-probe.jsonl"
    probe = DeadlineProbe(proxy.url, probe_out, args.probe_rate, args.max_seconds)
    cleanup.append(probe)
    try:
        outcomes, wall, progress = run_niced(
            args.callers_nice, lambda: anyio.run(lambda: run_clients(proxy.url, plan, args.clients, bound, injector))
        )
    finally:
        probe.stop()
    probed = [json.loads(line) for line in probe_out.read_text().splitlines()] if probe_out.exists() else []
    faults.go_at = progress.go_at
    rss_final, rss_peak = rss_kib(proxy.pid)
    fds_final = fd_count(proxy.pid)
    rep.say(
        f"  wall {wall:.0f}s ({len(plan) / wall:.0f} calls/s), load {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
        f"kills {len(faults.kills)}, HTTP upstream restarts {faults.restarts}"
    )
    killed = {pid for _, pid in faults.kills}
    # the drain needs the stdio children alive: take it before the shutdown
    events, drained = drain(Journal(journal), {s.call_id for s in plan}, killed, args.drain)
    children = {int(e["pid"]) for e in events if e.get("event") == "boot" and isinstance(e.get("pid"), int)}
    if upstream == "http":
        children = set()
    children |= set(descendants(proxy.pid))
    code, exit_s = stop_proxy(proxy, args.grace + EXIT_BOUND_S + 30)
    data = judge_calls(rep, name, plan, outcomes, events, faults, killed, probed, quick=args.quick)
    data["wall_s"] = wall
    data["sessions_broken"] = len(progress.broken)
    data["open_failures"] = len(progress.open_failures)
    if progress.open_failures:
        rep.say(f"  clients that failed to open and were retried: {len(progress.open_failures)}")
        for line in progress.open_failures[:3]:
            rep.say(f"    {line}")
    if progress.broken:
        rep.say(f"  client sessions that broke under their client (then replaced): {len(progress.broken)}")
        for line in collections.Counter(progress.broken).most_common(5):
            rep.say(f"    {line[1]} x {line[0]}")
    data["rss_kib"] = {
        "peak": rss_peak,
        "final": rss_final,
        "samples_max": max(faults.rss_samples, default=0),
        "first_sample": faults.rss_samples[0] if faults.rss_samples else 0,
    }
    data["proxy_fds"] = {
        "first": faults.fd_samples[0] if faults.fd_samples else -1,
        "max": max(faults.fd_samples, default=-1),
        "final": fds_final,
    }
    rep.say(
        f"  proxy RSS: peak {rss_peak / 1024:.0f} MiB, final {rss_final / 1024:.0f} MiB (first sample under load "
        f"{data['rss_kib']['first_sample'] / 1024:.0f} MiB); proxy fds first {data['proxy_fds']['first']}, max "
        f"{data['proxy_fds']['max']}, final {fds_final}"
    )
    data["shutdown"] = judge_shutdown(rep, name, proxy, code, exit_s, children, http_upstream, args.grace)
    data["kills"] = len(faults.kills)
    data["restarts"] = faults.restarts
    data["drain_s"] = drained
    (work / f"load-{upstream}-results.jsonl").write_text("".join(json.dumps(asdict(o)) + "\n" for o in outcomes))
    if http_upstream is not None:
        http_upstream.stop()
    return data


def outage_leg(args: argparse.Namespace, work: Path, rep: Report, cleanup: list[Any]) -> dict[str, Any]:
    rep.say()
    rep.say(
        f"Leg outage/http: every tools/call answered 503 for {args.outage_s:.0f}s; {args.outage_clients} clients send "
        f"{args.outage_rate:.0f} calls/s open-loop (echo, read-only: every failure eligible)"
    )
    out: dict[str, Any] = {}
    for i, (variant, defaults) in enumerate(OUTAGE_VARIANTS.items()):
        tag = f"outage{i}"
        files = {"defaults.yaml": defaults, "reads.yaml": "tools: [echo]\nside_effect: read_only\n"}
        folder = write_policies(work / f"{tag}-policies", files)
        journal = work / f"{tag}-journal.jsonl"
        journal.unlink(missing_ok=True)
        switch = work / f"{tag}-down"
        switch.unlink(missing_ok=True)
        upstream = HttpUpstream(
            journal,
            work / f"{tag}-state.json",
            work / f"{tag}-upstream.log",
            extra=["--outage-file", str(switch)],
            standby=False,
        ).start()
        cleanup.append(upstream)
        proxy = LoadProxy(
            upstream_url=upstream.url,
            extra=["--policies", str(folder), *proxy_flags(args.outage_clients, args.grace)],
            log_path=work / f"{tag}-proxy.log",
            repo=args.repo,
        )
        cleanup.append(proxy)
        proxy.start()
        window = anyio.run(open_loop, proxy.url, args, switch, tag)
        stop_proxy(proxy, args.grace + EXIT_BOUND_S + 30)
        upstream.stop()
        t0, t1, issued, results = window
        events = Journal(journal).all()
        refused = [e for e in events if e.get("event") == "http_refused" and t0 <= e["t"] <= t1]
        # calls let through while the switch was on: decided (not started: a call admitted just
        # before the switch may start after it on a loaded machine) within the window
        admitted = {e["call"] for e in events if e.get("event") == "http_admitted" and t0 <= e["checked_at"] <= t1}
        executed = [e for e in events if e.get("event") == "started" and e.get("call") in admitted]
        per_s = len(refused) / (t1 - t0)
        calls_per_s = issued / (t1 - t0)
        out[variant] = {
            "upstream_attempts_per_s": per_s,
            "calls_per_s": calls_per_s,
            "amplification": per_s / calls_per_s if calls_per_s else math.nan,
            "executed_during_outage": len(executed),
            "results": dict(results),
        }
        rep.say(
            f"  {variant:<30} upstream attempts {per_s:6.1f}/s for {calls_per_s:5.1f} calls/s = "
            f"{out[variant]['amplification']:.2f} per call; callers got {dict(results.most_common())}"
        )
    off = out["budget and breaker off"]["upstream_attempts_per_s"]
    budget = out["retry budget on (20% + 10/s)"]["upstream_attempts_per_s"]
    breaker = out["retry budget and breaker on"]["upstream_attempts_per_s"]
    rep.check(
        "outage: the retry budget and the breaker each cut the load on a dead upstream",
        f"{off:.0f}/s off, {budget:.0f}/s budget, {breaker:.0f}/s budget+breaker",
        "off > budget > budget+breaker",
        off > budget > breaker,
    )
    return out


async def open_loop(url: str, args: argparse.Namespace, switch: Path, tag: str) -> tuple[float, float, int, Any]:
    """Healthy for 1 s, the outage for `--outage-s`, healthy for 1 s; calls sent at a fixed rate
    whatever the answers (a closed loop would slow down with the upstream and hide the retries)."""
    results: collections.Counter[str] = collections.Counter()
    window = [0.0, 0.0]
    issued_in_window = 0
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for c in range(args.outage_clients):
            client = await stack.enter_async_context(Client(url, mode=MODES[c % 2]))
            with anyio.fail_after(120):
                await client.list_tools()
            clients.append(client)
        async with anyio.create_task_group() as tg:

            async def one(i: int) -> None:
                spec = Spec(i, "echo", "echo", {"text": f"{tag}-{i}", "call_id": f"{tag}-{i}"}, 0, 3)
                o = await call_once(clients[i % len(clients)], spec, "", 30.0)
                results[
                    ("success" if not o.is_error else str(o.stop_reason)) if o.answer == "result" else o.answer
                ] += 1

            total_s = args.outage_s + 2.0
            start = time.monotonic()
            i = 0
            while (now := time.monotonic() - start) < total_s:
                if not window[0] and now >= 1.0:
                    switch.touch()  # noqa: ASYNC240 - one local file, the outage switch
                    window[0] = time.time()
                if window[0] and not window[1] and now >= 1.0 + args.outage_s:
                    # the window is what the switch certainly covered: opened after it is on,
                    # closed before it goes off
                    window[1] = time.time()
                    switch.unlink()  # noqa: ASYNC240
                if window[0] and not window[1]:
                    issued_in_window += 1
                tg.start_soon(one, i)
                i += 1
                await anyio.sleep(max(0.0, start + i / args.outage_rate - time.monotonic()))
    return window[0], window[1], issued_in_window, results


def sigterm_leg(args: argparse.Namespace, work: Path, rep: Report, upstream: str, cleanup: list[Any]) -> dict[str, Any]:
    name = f"sigterm/{upstream}"
    clients = args.sigterm_clients
    calls = clients * 200  # more than can finish before S: the callers are stopped by the SIGTERM
    plan = make_plan(calls, clients, 0, args.seed, f"T{upstream}", SIGTERM_WEIGHTS, sigterm=True)
    rng = random.Random(args.seed)
    for i, spec in enumerate(plan):
        # only every third client runs into calls that outlive the grace: the others keep short
        # calls in flight until the SIGTERM, which must then finish within the grace
        if spec.client % 3 and spec.kind in ("hang", "charge_hang"):
            plan[i] = spec = make_spec(spec.index, "echo", spec.call_id, rng, spec.client)
        spec.max_attempts = 2 if spec.tool == "hang" else 3  # the SIGTERM leg's policies
    proxy, http_upstream, journal, _ = start_leg(
        args, work, upstream, f"sigterm-{upstream}", SIGTERM_POLICIES, args.sigterm_grace, clients
    )
    cleanup += [proxy, http_upstream]
    rep.say()
    rep.say(
        f"Leg {name}: {clients} clients, the load mix with hangs of {SIGTERM_HANG_S:.0f}s (beyond the grace), "
        f"SIGTERM {args.sigterm_at:.0f}s in, --shutdown-grace-s {args.sigterm_grace:.0f}"
    )
    timing: dict[str, Any] = {}
    children: set[int] = set()

    async def terminate_later(progress: Progress) -> None:
        await anyio.sleep(args.sigterm_at)
        children.update(descendants(proxy.pid))
        progress.stop.set()
        timing["in_flight_from"] = time.time()
        timing["sent_at"] = time.monotonic()
        os.kill(proxy.pid, signal.SIGTERM)
        with anyio.fail_after(args.sigterm_grace + EXIT_BOUND_S + 30):
            while proxy.proc is not None and proxy.proc.poll() is None:  # noqa: ASYNC110 - a process, no event
                await anyio.sleep(0.02)
        timing["exit_s"] = time.monotonic() - timing["sent_at"]
        timing["at_exit"] = sum(1 for p in children if alive(p) and is_ours(p))
        await anyio.sleep(3600)  # cancelled when the clients are done

    outcomes, wall, progress = anyio.run(
        lambda: run_clients(proxy.url, plan, clients, SIGTERM_HANG_S + 60, terminate_later)
    )
    if "exit_s" not in timing:  # the callers ended first: wait (bounded) for the exit here
        with contextlib.suppress(subprocess.TimeoutExpired):
            assert proxy.proc is not None
            proxy.proc.wait(timeout=args.sigterm_grace + EXIT_BOUND_S + 30)
        timing["exit_s"] = time.monotonic() - timing.get("sent_at", time.monotonic())
    code = proxy.proc.poll() if proxy.proc else None
    sent = [o for o in outcomes if o.answer != "not_sent"]
    answers = collections.Counter(
        ("success" if not o.is_error else (o.stop_reason or "isError, no report"))
        if o.answer == "result"
        else ("refused: shutting down" if o.answer == "jsonrpc_error" and "-32000" in o.detail else o.answer)
        for o in sent
    )
    unanswered = [o for o in sent if o.answer not in ("result", "jsonrpc_error")]
    wrong = [o for o in sent if o.right_answer is False]
    events, drained = drain(Journal(journal), {s.call_id for s in plan}, set(), args.drain)
    fates = attempt_fates(events, set())
    fate_counts = collections.Counter(f for s in plan for f in fates.get(s.call_id, ()))
    by_call = journal_by_call(events)
    dups = [s.call_id for s in plan if s.tool in STATE_CHANGING and len(by_call[s.call_id]["effect"]) > 1]
    if upstream == "stdio":
        children |= {int(e["pid"]) for e in events if e.get("event") == "boot" and isinstance(e.get("pid"), int)}
    rep.say(
        f"  calls sent {len(sent)} (then the callers stopped), answered {len(sent) - len(unanswered)}: "
        f"{dict(answers.most_common())}; someone else's answer {len(wrong)}"
    )
    for o in unanswered[:10]:
        rep.say(f"    NOT ANSWERED {o.call_id} ({o.mode}, {o.answer}, {o.elapsed_s:.1f}s): {o.detail}")
    rep.check(
        f"{name}: calls in flight at SIGTERM answered (success, unresolved, or refused at the door)",
        f"{len(sent) - len(unanswered)} / {len(sent)}",
        "all",
        not unanswered and not wrong and answers.get("shutdown", 0) > 0,
    )
    rep.say(f"  attempts executed upstream: {dict(fate_counts.most_common())} (drained {drained:.1f}s)")
    rep.check(
        f"{name}: attempts started upstream and never ended (cancelled or completed)",
        str(fate_counts.get("open", 0)),
        "0",
        not fate_counts.get("open", 0) and fate_counts.get("cancelled", 0) > 0,
    )
    rep.check(f"{name}: duplicate executions of state-changing tools", str(len(dups)), "0", not dups)
    data = judge_shutdown(
        rep, name, proxy, code, timing["exit_s"], children, http_upstream, args.sigterm_grace, timing.get("at_exit")
    )
    within = timing["exit_s"] <= args.sigterm_grace + EXIT_BOUND_S
    rep.check(
        f"{name}: exit after SIGTERM",
        f"{timing['exit_s']:.1f}s",
        f"<= grace {args.sigterm_grace:.0f}s + {EXIT_BOUND_S:.0f}s (timing)",
        within,
    )
    data.update(
        {
            "sent": len(sent),
            "unanswered": len(unanswered),
            "wrong_answer": len(wrong),
            "answers": dict(answers),
            "shutdown_results": answers.get("shutdown", 0),
            "attempt_fates": dict(fate_counts),
            "attempts_open": fate_counts.get("open", 0),
            "duplicates": len(dups),
            "wall_s": wall,
            "sessions_broken": len(progress.broken),
        }
    )
    if http_upstream is not None:
        http_upstream.stop()
    return data


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the CI size: 10 clients, 400 calls, SIGTERM at 4 s")
    p.add_argument("--clients", type=int, default=None, help="concurrent clients (full 100, quick 10)")
    p.add_argument("--calls", type=int, default=None, help="calls in all, shared by the upstreams (full 20000)")
    p.add_argument("--upstreams", default="stdio,http", help="comma-separated: stdio, http")
    p.add_argument("--kills", type=int, default=None, help="external SIGKILLs of the upstream per leg (full 5)")
    p.add_argument("--crashes", type=int, default=None, help="scripted crashes mid-call per leg (full 6)")
    p.add_argument("--fail-every", type=int, default=40, help="HTTP upstream: a 503 for every K-th tools/call")
    p.add_argument("--grace", type=float, default=5.0, help="--shutdown-grace-s of the load legs' proxies")
    p.add_argument("--outage-s", type=float, default=None, help="outage length (full 10, quick 3)")
    p.add_argument("--outage-rate", type=float, default=None, help="open-loop calls/s in the outage leg")
    p.add_argument("--outage-clients", type=int, default=None)
    p.add_argument("--no-outage", dest="outage", action="store_false")
    p.add_argument("--sigterm-at", type=float, default=None, help="run the SIGTERM leg: SIGTERM S seconds in")
    p.add_argument("--sigterm-grace", type=float, default=None, help="its --shutdown-grace-s (default 3)")
    p.add_argument("--sigterm-clients", type=int, default=None)
    p.add_argument("--sigterm-upstreams", default=None, help="default: stdio with --quick, else --upstreams")
    p.add_argument(
        "--callers-nice", type=int, default=0, help="run the load generator's clients at this nice (0: as the proxy)"
    )
    p.add_argument("--probe-rate", type=float, default=2.0, help="bench/deadline_probe.py calls/s beside a load leg")
    p.add_argument("--slack", type=float, default=30.0, help="a call's client-side bound beyond 30 s")
    p.add_argument("--drain", type=float, default=30.0, help="longest wait for late journal lines, seconds")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--repo", type=Path, default=REPO, help="run the proxy from this checkout")
    p.add_argument("--max-seconds", type=float, default=None, help="bound of the whole run (full 1800, quick 600)")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    q = args.quick
    args.clients = args.clients or (10 if q else 100)
    args.calls = args.calls or (400 if q else 20000)
    args.kills = args.kills if args.kills is not None else (1 if q else 5)
    args.crashes = args.crashes if args.crashes is not None else (2 if q else 6)
    args.outage_s = args.outage_s or (4.0 if q else 15.0)
    args.outage_rate = args.outage_rate or (30.0 if q else 50.0)
    args.outage_clients = args.outage_clients or (6 if q else 20)
    args.sigterm_grace = args.sigterm_grace or 3.0
    args.sigterm_clients = args.sigterm_clients or (10 if q else 100)
    if q and args.sigterm_at is None:
        args.sigterm_at = 4.0
    args.max_seconds = args.max_seconds or (600.0 if q else 1800.0)
    args.upstreams = [u for u in args.upstreams.split(",") if u]
    args.sigterm_upstreams = (
        [u for u in args.sigterm_upstreams.split(",") if u]
        if args.sigterm_upstreams
        else (["stdio"] if q else args.upstreams)
    )

    if args.callers_nice > 0 and AUTOGROUP.exists() and os.getsid(0) != os.getpid():
        return in_own_session(argv)
    if args.callers_nice > 0 and AUTOGROUP.exists():
        with contextlib.suppress(OSError):
            AUTOGROUP.write_text(str(args.callers_nice))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(
        signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(f"run exceeded --max-seconds {args.max_seconds}"))
    )
    signal.setitimer(signal.ITIMER_REAL, args.max_seconds)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-load-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    rep = Report()
    cleanup: list[Any] = []
    load_start = os.getloadavg()
    rep.say(
        f"bench/load_faults.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  cores {os.cpu_count()}  "
        f"load {' '.join(f'{x:.1f}' for x in load_start)}  proxy from {args.repo}  work {work}"
    )
    started = time.monotonic()
    data: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "load_start": load_start}
    code = 0
    try:
        for upstream in args.upstreams:
            data[f"load/{upstream}"] = load_leg(args, work, rep, upstream, cleanup)
        if args.outage and "http" in args.upstreams:
            data["outage"] = outage_leg(args, work, rep, cleanup)
        if args.sigterm_at is not None:
            for upstream in args.sigterm_upstreams:
                data[f"sigterm/{upstream}"] = sigterm_leg(args, work, rep, upstream, cleanup)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process started here", file=sys.stderr)
        code = 130
    except Exception as exc:
        rep.say(f"RUN FAILED: {exc!r}")
        data["error"] = repr(exc)
        code = 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for thing in reversed(cleanup):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.stop()
    failed = [c for c in rep.checks if not c.ok]
    data["load_end"] = os.getloadavg()
    data["wall_s"] = time.monotonic() - started
    data["checks"] = [asdict(c) for c in rep.checks]
    rep.say()
    rep.say(
        f"Summary ({data['wall_s']:.0f}s, load {' '.join(f'{x:.1f}' for x in load_start)} -> "
        f"{' '.join(f'{x:.1f}' for x in data['load_end'])}): {len(rep.checks) - len(failed)} of {len(rep.checks)} "
        "checks pass" + (f"; FAIL: {', '.join(c.name for c in failed)}" if failed else "")
    )
    if args.json:
        args.json.write_text(json.dumps(data, indent=2, default=str))
    if failed or code or args.workdir:
        rep.say(f"journals, results and logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
