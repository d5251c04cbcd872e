"""The fault-injection benchmark: >= 1,000 mixed tools/call through the real proxy, judged from the
upstream's own journal and the callers' results (never from the proxy's metrics or logs).

    .venv/bin/python bench/faults.py                       # 1,000 fault calls + CPU leg (6 x 600 echo per proxy)
    .venv/bin/python bench/faults.py --calls 2000 --seed 11 --json bench-faults.json
    .venv/bin/python bench/faults.py --skip-cpu --keep     # fault leg only; keep journal, results, logs

Not a test and not in CI (two shared cores, about a minute or two). What it does:

1. **Fault leg.** Starts `python -m proxy serve --policies DIR -- python tests/fixtures/scripted_server.py
   --transport stdio --journal J --state S` (DIR is written here with short timeouts: attempt 300 ms,
   deadline 1.5 s, backoff 10-50 ms; flaky_read 500 ms / 3 s so a crashed child can restart inside
   the budget; hang retried until the deadline; charge state-changing, status check `echo`). Then
   runs a randomised (fixed seed) mix, every call with a unique `call_id`: echo successes, flaky
   reads recovered after 1-2 failures (isError transient or JSON-RPC -32603), reads that always
   fail transiently (exhausted), validation / business / permission failures, an upstream that
   declines a retry, `charge` that succeeds, fails after its effect or hangs (outcome unknown),
   reads that hang (timeout + cancellation), and a few process crashes (`flaky_read mode=crash`,
   `charge then=crash`) spaced through the run. Calls go through the SDK `Client` over several
   sessions of both eras (`legacy` and `2026-07-28`), a few concurrent calls per session, each
   bounded on the client side by its deadline + `--slack`.
2. **Drain.** Waits (bounded) until every attempt the journal shows `started` has ended
   (`completed`/`failed`/`cancelled`, its own crash, or killed by another call's crash).
3. **CPU leg.** The same proxy against the plain relay (`bench/_plain_relay.py`: the same CLI,
   frontend and upstream supervision with `Service(tool_calls=None)`, i.e. no engine), both in
   front of the same scripted upstream, with a success-only mix (`echo`), same sessions and
   concurrency, in alternating rounds. CPU is utime+stime of the proxy process from
   /proc/PID/stat around each round (sessions opened and warmed up before the first reading);
   its stdio children are not counted. Target: engine CPU per call at most 10% above the plain
   relay's (median of the rounds).

Every process started here is stopped by its pid (SIGTERM, then SIGKILL), also on Ctrl-C; the
whole run is bounded by `--max-seconds`.
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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
import httpx  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from tests.fixtures.journal import Journal  # noqa: E402
from tests.proxy_process import ProxyProcess, scripted_stdio_command  # noqa: E402

PLAIN_RELAY = REPO / "bench" / "_plain_relay.py"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
MODES = ("legacy", "2026-07-28")
CPU_TARGET = 0.10  # engine CPU per call at most 10% above the plain relay's
OVERSHOOT_TARGET_MS = 100.0  # the target: an unresolved result within its deadline + 100 ms
HANG_S = 8.0  # how long `hang` / `charge then=hang` sleep: far beyond any attempt timeout

DEADLINE_S = {"default": 1.5, "flaky_read": 3.0}
POLICIES = {
    "defaults.yaml": """\
# bench/faults.py: short timeouts so that 1,000 calls with faults take about a minute
retry_on: [transient]
attempts: 3
deadline: 1500ms
attempt_timeout: 300ms
min_attempt_time: 50ms
backoff: {initial: 10ms, max: 50ms, multiplier: 2, jitter: full}
unclassified: transient
ledger_window: 60s
# The mix is a deliberate storm (over half the calls fail, ~60 calls/s): the built-in retry budget
# would rightly stop many retries. This bench checks the per-call rules against the journal, so
# the budget is lifted here; tests/recovery/test_antistorm.py covers the budget itself.
anti_storm: {retry_budget_ratio: 1, retry_budget_min_per_s: 1000}
""",
    "reads.yaml": """\
tools: [echo, always_fail]
side_effect: read_only
""",
    "flaky_read.yaml": """\
# a crashed stdio child takes about 1 s to restart: leave room for it inside one budget
tools: [flaky_read]
side_effect: read_only
deadline: 3s
attempt_timeout: 500ms
""",
    "hang.yaml": """\
# retried until the deadline stops it: every attempt times out and must be cancelled upstream
tools: [hang]
side_effect: read_only
attempts: 10
""",
    "charge.yaml": """\
tools: [charge]
side_effect: state_changing
report:
  status_check_tool: echo
""",
}

# kind -> relative weight in the random mix (crashes are placed, not drawn)
WEIGHTS = {
    "echo": 34,
    "flaky_recovered": 18,
    "flaky_jsonrpc": 5,
    "exhausted": 8,
    "validation": 4,
    "business": 4,
    "permission": 4,
    "declined": 3,
    "charge_ok": 4,
    "charge_fail": 5,
    "charge_hang": 3,
    "hang": 3,
}
NON_TRANSIENT = ("validation", "business", "permission")
CRASH_KINDS = ("flaky_crash", "charge_crash")
# what the caller should get back, per kind: None = a success, else the unresolved stopReason
EXPECTED_STOP: dict[str, str | None] = {
    "echo": None,
    "flaky_recovered": None,
    "flaky_jsonrpc": None,
    "flaky_crash": None,
    "exhausted": "attempts_exhausted",
    "validation": "not_retryable",
    "business": "not_retryable",
    "permission": "not_retryable",
    "declined": "upstream_declined",
    "charge_ok": None,
    "charge_fail": "outcome_unknown",
    "charge_hang": "outcome_unknown",
    "charge_crash": "outcome_unknown",
    "hang": "deadline_exhausted",
}


# --------------------------------------------------------------------------- the plan


@dataclass
class Spec:
    index: int
    kind: str
    tool: str
    args: dict[str, Any]
    session: int
    deadline_s: float
    expected_executions: int | None  # None: not fixed (hang: as many as the deadline allows)


def _spec(index: int, kind: str, cid: str, rng: random.Random, session: int) -> Spec:
    deadline = DEADLINE_S["default"]
    expected: int | None = 1
    if kind == "echo":
        tool, args = "echo", {"text": f"hello {cid}"}
    elif kind == "flaky_recovered":
        n = rng.choice((1, 2))
        tool, args, expected = "flaky_read", {"key": cid, "fail_times": n, "mode": "tool_error"}, n + 1
    elif kind == "flaky_jsonrpc":
        tool, args, expected = "flaky_read", {"key": cid, "fail_times": 1, "mode": "jsonrpc"}, 2
    elif kind == "flaky_crash":
        tool, args, expected = "flaky_read", {"key": cid, "fail_times": 1, "mode": "crash"}, 2
    elif kind == "exhausted":
        tool, args, expected = "always_fail", {"category": "transient", "retryable": True}, 3
    elif kind in NON_TRANSIENT:
        tool, args = "always_fail", {"category": kind, "retryable": False}
    elif kind == "declined":
        tool, args = "always_fail", {"category": "transient", "retryable": False}
    elif kind.startswith("charge_"):
        then = kind.removeprefix("charge_").replace("_", "")
        then = {"ok": "ok", "fail": "fail", "hang": "hang", "crash": "crash"}[then]
        tool, args = "charge", {"account": f"acct-{cid}", "amount": round(rng.uniform(1, 500), 2), "then": then}
        if then == "hang":
            args["hang_s"] = HANG_S
    elif kind == "hang":
        tool, args, expected = "hang", {"seconds": HANG_S}, None
    else:
        raise ValueError(kind)
    if tool == "flaky_read":
        deadline = DEADLINE_S["flaky_read"]
    args["call_id"] = cid
    return Spec(index, kind, tool, args, session, deadline, expected)


def make_plan(calls: int, crashes: int, sessions: int, seed: int) -> list[Spec]:
    rng = random.Random(seed)
    kinds = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=calls)
    # crashes spaced evenly through the run (not at the very start), alternating the two kinds
    crash_session = {}
    for i in range(crashes):
        at = int((i + 0.5) * calls / crashes)
        kinds[at] = CRASH_KINDS[i % 2]
        crash_session[at] = i % sessions  # one crash per session in turn: each era's link gets some
    plan = []
    for i, kind in enumerate(kinds):
        cid = f"s{seed}-{i:05d}-{kind}"
        plan.append(_spec(i, kind, cid, rng, session=crash_session.get(i, i % sessions)))
    return plan


def echo_plan(calls: int, sessions: int, tag: str) -> list[Spec]:
    rng = random.Random(0)
    return [_spec(i, "echo", f"{tag}-{i:05d}", rng, session=i % sessions) for i in range(calls)]


# --------------------------------------------------------------------------- processes


class BenchProxy(ProxyProcess):
    """The real proxy in a session of its own (Ctrl-C reaches only this script, which stops it by
    pid); `variant` plain / engine-quiet runs bench/_plain_relay.py instead of `-m proxy`."""

    def __init__(
        self, *args: Any, variant: str = "engine", callgrind: Path | None = None, repo: Path = REPO, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.variant = variant  # engine (`-m proxy`) | plain | engine-quiet (bench/_plain_relay.py)
        self.callgrind = callgrind  # a folder: run under callgrind and meter instructions, not CPU time
        self.repo = repo  # the checkout whose proxy runs (an A/B against another commit)

    def argv(self) -> list[str]:
        argv = super().argv()
        if self.variant != "engine":
            argv[1:3] = [str(PLAIN_RELAY)]  # [PYTHON, "-m", "proxy", "serve", ...]
        if self.callgrind is not None:
            out = self.callgrind / f"cg-{self.variant}.%p"
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *argv]
        return argv

    def meter_start(self) -> float:
        """Start metering the proxy: its CPU seconds so far, or (callgrind) counting from zero."""
        assert self.proc is not None
        if self.callgrind is None:
            return proc_cpu_s(self.proc.pid)
        for switch in (["-z"], ["-i", "on"]):
            subprocess.run(["callgrind_control", *switch, str(self.proc.pid)], check=True, capture_output=True)
        return 0.0

    def meter_stop(self, start: float) -> float:
        """CPU seconds since `meter_start`, or (callgrind) instructions executed since then."""
        assert self.proc is not None
        if self.callgrind is None:
            return proc_cpu_s(self.proc.pid) - start
        pid = str(self.proc.pid)
        for switch in (["-i", "off"], ["-d"]):
            subprocess.run(["callgrind_control", *switch, pid], check=True, capture_output=True)
        dumps = sorted(self.callgrind.glob(f"cg-{self.variant}.{pid}.*"), key=lambda f: f.stat().st_mtime)
        for line in dumps[-1].read_text(errors="replace").splitlines():
            if line.startswith("totals:"):  # the dump's own total ("summary:" can read 0 after -z)
                return float(line.split()[1])
        raise RuntimeError(f"no total in {dumps[-1]}")

    def start(self, timeout_s: float = 30.0) -> BenchProxy:
        assert self.log_path is not None
        with open(self.log_path, "ab") as log:
            env = {**os.environ, "BENCH_RELAY": self.variant}
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=self.repo,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {self.proc.returncode}; log: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.admin + "/readyz", timeout=1.0).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"proxy not ready after {timeout_s}s; log: {self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> int | None:
        """SIGTERM the proxy by pid (it stops its upstream children), SIGKILL after a bound; then
        make sure of the descendants seen just before, by pid, if they are still ours."""
        if self.proc is None:
            return None
        below = descendants(self.proc.pid)
        code = super().stop()
        end = time.monotonic() + 5.0
        for pid in below:
            while alive(pid) and time.monotonic() < end:
                time.sleep(0.05)
            if alive(pid) and is_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return code


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat", "rb") as f:
                    out[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
    return out


def descendants(root: int) -> list[int]:
    """Every process below `root` (the proxy's stdio children run under a guard process)."""
    parents = _ppid_map()
    found, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    """Running (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def cmdline_has(pid: int, needle: bytes) -> bool:
    with contextlib.suppress(OSError):
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def is_ours(pid: int) -> bool:
    """A process this bench may kill by pid: the scripted upstream or the proxy's guard of it."""
    return cmdline_has(pid, b"scripted_server.py") or cmdline_has(pid, b"_guard.py")


# --------------------------------------------------------------------------- calling


@dataclass
class Outcome:
    index: int
    kind: str
    call_id: str
    mode: str
    session: int
    deadline_s: float
    answer: str = "none"  # result | jsonrpc_error | no_answer | exception
    elapsed_s: float = 0.0
    is_error: bool | None = None
    stop_reason: str | None = None
    error_category: str | None = None
    elapsed_ms: float | None = None  # the report's elapsedMs
    deadline_ms: float | None = None  # the report's deadlineMs
    attempt_count: int | None = None
    outcome_unknown: bool | None = None
    attempts_meta: int | None = None
    structured_executions: int | None = None
    detail: str | None = None
    t_start: float = 0.0  # wall clock (time.time()), comparable with the journal's `t`
    t_end: float = 0.0
    steps: list[dict[str, Any]] = field(default_factory=list)  # attemptedSteps, abridged


async def _one(client: Client, spec: Spec, mode: str, slack_s: float) -> Outcome:
    out = Outcome(spec.index, spec.kind, spec.args["call_id"], mode, spec.session, spec.deadline_s)
    started = time.monotonic()
    out.t_start = time.time()
    try:
        with anyio.fail_after(spec.deadline_s + slack_s):
            result = await client.call_tool(spec.tool, spec.args)
        out.answer = "result"
        out.is_error = bool(result.is_error)
        meta = result.meta or {}
        # the unresolved report always travels in _meta (structuredContent only where valid)
        report = meta.get("io.mcp-recovery-proxy/unresolved")
        sc = report if isinstance(report, dict) else {}
        out.attempts_meta = meta.get("io.mcp-recovery-proxy/attempts")
        if result.is_error:
            out.stop_reason = sc.get("stopReason")
            out.error_category = sc.get("errorCategory")
            out.elapsed_ms = sc.get("elapsedMs")
            out.deadline_ms = sc.get("deadlineMs")
            out.attempt_count = sc.get("attemptCount")
            out.outcome_unknown = sc.get("outcomeUnknown")
            for step in sc.get("attemptedSteps") or []:
                if isinstance(step, dict):
                    out.steps.append(
                        {k: step.get(k) for k in ("number", "outcome", "category", "dispatched")}
                        | {"detail": str(step.get("detail"))[:120]}
                    )
            text = result.content[0].text if result.content and hasattr(result.content[0], "text") else ""
            out.detail = text[:300]
        else:
            out.structured_executions = sc.get("executions")
    except TimeoutError:
        out.answer = "no_answer"
    except MCPError as exc:  # a JSON-RPC error answer is still an answer
        out.answer = "jsonrpc_error"
        out.detail = f"{exc.code}: {exc.message}"[:300]
    except Exception as exc:
        out.answer = "exception"
        out.detail = repr(exc)[:300]
    out.elapsed_s = time.monotonic() - started
    out.t_end = time.time()
    return out


async def run_calls(
    url: str,
    plan: Sequence[Spec],
    sessions: int,
    per_session: int,
    slack_s: float,
    *,
    warmup: int = 0,
    cpu_of: BenchProxy | None = None,
) -> tuple[list[Outcome], float, float]:
    """Run `plan` over `sessions` SDK clients (alternating eras), `per_session` calls in flight on
    each. Returns (outcomes, wall seconds, proxy CPU seconds of the measured part)."""
    outcomes: list[Outcome] = []
    by_session: dict[int, list[Spec]] = collections.defaultdict(list)
    for spec in plan:
        by_session[spec.session].append(spec)
    counts = {"ready": 0, "done": 0}
    all_ready, go, all_done = anyio.Event(), anyio.Event(), anyio.Event()

    async def session(s: int) -> None:
        mode = MODES[s % len(MODES)]
        async with Client(url, mode=mode) as client:  # its opening is bounded by --max-seconds
            with anyio.fail_after(30):
                await client.list_tools()
                for i in range(warmup):
                    await client.call_tool("echo", {"text": "warm", "call_id": f"warmup-{s}-{i}-{time.time_ns()}"})
            counts["ready"] += 1
            if counts["ready"] == sessions:
                all_ready.set()
            await go.wait()
            queue = iter(by_session[s])  # shared by this session's workers

            async def worker() -> None:
                for spec in queue:
                    outcomes.append(await _one(client, spec, mode, slack_s))

            async with anyio.create_task_group() as workers:
                for _ in range(per_session):
                    workers.start_soon(worker)
            counts["done"] += 1
            if counts["done"] == sessions:
                all_done.set()

    async with anyio.create_task_group() as tg:
        for s in range(sessions):
            tg.start_soon(session, s)
        await all_ready.wait()
        cpu0 = cpu_of.meter_start() if cpu_of else 0.0
        t0 = time.monotonic()
        go.set()
        await all_done.wait()
        wall = time.monotonic() - t0
        cpu = cpu_of.meter_stop(cpu0) if cpu_of else 0.0
    outcomes.sort(key=lambda o: o.index)
    return outcomes, wall, cpu


# --------------------------------------------------------------------------- the journal


@dataclass
class Attempt:
    call: str
    tool: str
    pid: int
    request_id: Any
    fate: str = "open"  # completed | failed | cancelled | crashing (its own) | killed (another's crash) | open


def attempts_by_call(events: list[dict[str, Any]]) -> dict[str, list[Attempt]]:
    crashed = {e["pid"] for e in events if e.get("event") == "crashing"}
    ends: dict[tuple[Any, ...], str] = {}
    for e in events:
        if e.get("event") in ("completed", "failed", "cancelled", "crashing"):
            key = (e.get("call"), e.get("pid"), json.dumps((e.get("attempt_key") or {}).get("request_id")))
            ends.setdefault(key, e["event"])
    out: dict[str, list[Attempt]] = collections.defaultdict(list)
    for e in events:
        if e.get("event") != "started" or e.get("call") is None:
            continue
        rid = (e.get("attempt_key") or {}).get("request_id")
        a = Attempt(e["call"], e.get("tool"), e.get("pid"), rid)
        fate = ends.get((a.call, a.pid, json.dumps(rid)))
        a.fate = fate or ("killed" if a.pid in crashed else "open")
        out[a.call].append(a)
    return out


def drain(journal: Journal, call_ids: set[str], bound_s: float) -> tuple[dict[str, list[Attempt]], float]:
    """Wait (bounded) until no attempt of ours is still open in the journal."""
    started = time.monotonic()
    while True:
        attempts = attempts_by_call(journal.all())
        open_ = [a for cid in call_ids for a in attempts.get(cid, []) if a.fate == "open"]
        if not open_ or time.monotonic() - started >= bound_s:
            return attempts, time.monotonic() - started
        time.sleep(0.1)


# --------------------------------------------------------------------------- figures


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile; nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def fmt(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.1f}{unit}"


@dataclass
class Check:
    name: str
    value: str
    target: str
    ok: bool


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def say(self, line: str = "") -> None:
        self.lines.append(line)
        print(line, flush=True)

    def check(self, name: str, value: str, target: str, ok: bool) -> None:
        self.checks.append(Check(name, value, target, ok))
        self.say(f"  [{'PASS' if ok else 'FAIL'}] {name}: {value}   (target {target})")


def _link(spec: Spec) -> tuple[Any, ...]:
    """The proxy's upstream link a call went through: one stdio child per legacy session, one shared
    child for every 2026-07-28 session."""
    return ("legacy", spec.session) if MODES[spec.session % len(MODES)] == "legacy" else ("modern",)


def crash_affected(
    events: list[dict[str, Any]], plan: list[Spec], outcomes: list[Outcome], attempts: dict[str, list[Attempt]]
) -> set[str]:
    """Calls in flight on an upstream link while its process had crashed and was restarting: from the
    crash until 1 s after the successor process's first tool execution (a fresh child is slow at
    first on a busy machine). Plus every call with an attempt killed by a crash."""
    spec_of = {sp.args["call_id"]: sp for sp in plan}
    pid_link: dict[int, tuple[Any, ...]] = {}
    first_t: dict[int, float] = {}
    for e in events:
        sp = spec_of.get(e.get("call"))
        if sp is not None and isinstance(e.get("pid"), int):
            pid_link.setdefault(e["pid"], _link(sp))
            first_t.setdefault(e["pid"], e["t"])
    windows: list[tuple[tuple[Any, ...], float, float]] = []
    for e in events:
        if e.get("event") != "crashing" or e.get("pid") not in pid_link:
            continue
        link, t = pid_link[e["pid"]], e["t"]
        successors = [first_t[p] for p, lk in pid_link.items() if lk == link and first_t[p] > t]
        windows.append((link, t, (min(successors) + 1.0) if successors else t + 5.0))
    hit = {cid for cid, atts in attempts.items() if any(a.fate == "killed" for a in atts)}
    for o in outcomes:
        link = _link(spec_of[o.call_id])
        if any(lk == link and o.t_start <= end and o.t_end >= start for lk, start, end in windows):
            hit.add(o.call_id)
    return hit


def analyse(
    rep: Report,
    plan: list[Spec],
    outcomes: list[Outcome],
    journal: Journal,
    attempts: dict[str, list[Attempt]],
    drained_s: float,
) -> None:
    events = journal.all()
    by_cid = {o.call_id: o for o in outcomes}
    spec_of = {s.args["call_id"]: s for s in plan}
    per_call: dict[str, dict[str, list[dict[str, Any]]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for e in events:
        if e.get("call") in spec_of:
            per_call[e["call"]][e["event"]].append(e)
    crash_hit = crash_affected(events, plan, outcomes, attempts)
    pids = journal.pids()

    # 1. every call answered
    answered = [o for o in outcomes if o.answer in ("result", "jsonrpc_error")]
    unanswered = [o for o in outcomes if o.answer not in ("result", "jsonrpc_error")]
    rep.say("Calls")
    rep.say(
        f"  made {len(plan)}, answered {len(answered)} (results {sum(o.answer == 'result' for o in outcomes)}, "
        f"JSON-RPC errors {sum(o.answer == 'jsonrpc_error' for o in outcomes)}), "
        f"no answer within deadline + slack {sum(o.answer == 'no_answer' for o in outcomes)}, "
        f"client exceptions {sum(o.answer == 'exception' for o in outcomes)}"
    )
    for o in unanswered[:20]:
        rep.say(f"    NOT ANSWERED {o.call_id} ({o.mode}, {o.answer}, {o.elapsed_s:.2f}s): {o.detail}")
    rep.check(
        "calls answered = calls made",
        f"{len(answered)} / {len(plan)}",
        "equal",
        len(answered) == len(plan) == len(outcomes),
    )
    rep.data["calls"] = {"made": len(plan), "answered": len(answered), "unanswered": [asdict(o) for o in unanswered]}

    # 2. duplicate state-changing executions
    charges = [s for s in plan if s.tool == "charge"]
    dups = {s.args["call_id"]: len(per_call[s.args["call_id"]]["effect"]) for s in charges}
    dup_ids = {cid: n for cid, n in dups.items() if n > 1}
    effects_total = sum(dups.values())
    rep.say("State-changing calls (charge)")
    rep.say(
        f"  calls {len(charges)}, effects journaled {effects_total}, calls with no effect "
        f"{sum(1 for n in dups.values() if n == 0)}"
    )
    for cid, n in list(dup_ids.items())[:20]:
        rep.say(
            f"    DUPLICATE {cid}: {n} effects: {per_call[cid]['effect']}; "
            f"result: {asdict(by_cid[cid]) if cid in by_cid else None}"
        )
    rep.check("duplicate state-changing executions", str(len(dup_ids)), "0", not dup_ids)
    rep.data["duplicates"] = dup_ids

    # 3. retries of non-transient categories
    rep.say("Non-transient failures (validation, business, permission; and `isRetryable: false`)")
    bugs: dict[str, Any] = {}
    for kind in (*NON_TRANSIENT, "declined"):
        specs = [sp for sp in plan if sp.kind == kind]
        repeated = []
        for sp in specs:
            cid = sp.args["call_id"]
            n = len(per_call[cid]["started"])
            if n <= 1:
                continue
            o = by_cid.get(cid)
            steps = o.steps if o is not None else []
            # A repetition is allowed only when the earlier attempt's answer never reached the proxy
            # (timeout, closed, not running: a transport failure of a read-only tool). It is a bug when
            # the caller saw a non-transient attempt followed by another, or when the proxy reported
            # fewer attempts than the upstream executed.
            saw_non_transient = any(
                st.get("category") in NON_TRANSIENT or st.get("outcome") not in ("transport_error",)
                for st in steps[:-1]
            )
            why = "bug" if (o is None or o.answer != "result" or saw_non_transient or len(steps) < n) else "transport"
            repeated.append(cid)
            detail = {
                "executions": n,
                "crash_affected": cid in crash_hit,
                "answers_written_upstream": len(per_call[cid]["failed"]),
                "steps": steps,
                "stop_reason": o.stop_reason if o else None,
                "mode": o.mode if o else None,
            }
            if why == "bug":
                bugs[cid] = detail
            rep.say(
                f"    {'RETRIED (bug)' if why == 'bug' else 'repeated'} {cid}: {n} executions, "
                f"{'crash-affected' if cid in crash_hit else 'no crash nearby'}, "
                f"upstream wrote {len(per_call[cid]['failed'])} answers; "
                f"caller's steps: {[(st.get('outcome'), st.get('category'), st.get('detail')) for st in steps]}"
            )
        rep.say(f"  {kind:<11} calls {len(specs):>4}, executed more than once {len(repeated)}")
    rep.say(
        "  (`repeated` = the earlier attempt's answer did not reach the proxy in time — attempt timeout on a "
        "slow or restarting upstream, or the process died — so the proxy saw a transport failure of a read-only "
        "tool, which the recovery rules allow to repeat (docs/recovery.md); the upstream's journal shows the answer "
        "written too late)"
    )
    rep.check(
        "retries of non-transient categories (after the proxy saw the non-transient answer)",
        str(len(bugs)),
        "0",
        not bugs,
    )
    rep.data["non_transient_retries"] = bugs

    # 4. executions per kind, and whether the caller got what the kind should give
    rep.say("Executions per kind (journal `started` lines per call) and outcomes (caller's results)")
    rep.say(
        f"  {'kind':<16}{'calls':>6}{'execs':>7}  {'per call':<22}{'expected':>9}{'off':>5}{'crash-hit':>10}"
        "  outcome as expected"
    )
    kinds_data: dict[str, Any] = {}
    off_unexplained: list[str] = []
    for kind in list(WEIGHTS) + list(CRASH_KINDS):
        specs = [s for s in plan if s.kind == kind]
        if not specs:
            continue
        execs = [len(per_call[s.args["call_id"]]["started"]) for s in specs]
        dist = collections.Counter(execs)
        expected = specs[0].expected_executions
        off = [
            s
            for s, n in zip(specs, execs, strict=True)
            if s.expected_executions is not None and n != s.expected_executions
        ]
        if kind == "flaky_recovered":
            off = [s for s, n in zip(specs, execs, strict=True) if n != s.expected_executions]
            exp_txt = "f+1"
        else:
            exp_txt = "-" if expected is None else str(expected)
        hit = [s for s in off if s.args["call_id"] in crash_hit]
        off_unexplained += [s.args["call_id"] for s in off if s.args["call_id"] not in crash_hit]
        want = EXPECTED_STOP[kind]
        got = collections.Counter(
            ("success" if not by_cid[s.args["call_id"]].is_error else by_cid[s.args["call_id"]].stop_reason)
            if s.args["call_id"] in by_cid and by_cid[s.args["call_id"]].answer == "result"
            else "no result"
            for s in specs
        )
        as_expected = got.get(want or "success", 0)
        other = {k: v for k, v in got.items() if k != (want or "success")}
        dist_txt = " ".join(f"{k}x{v}" for k, v in sorted(dist.items()))
        rep.say(
            f"  {kind:<16}{len(specs):>6}{sum(execs):>7}  {dist_txt:<22}{exp_txt:>9}{len(off):>5}{len(hit):>10}  "
            f"{as_expected}/{len(specs)} {want or 'success'}" + (f"; other: {dict(other)}" if other else "")
        )
        kinds_data[kind] = {
            "calls": len(specs),
            "executions": sum(execs),
            "distribution": dict(dist),
            "expected": exp_txt,
            "off": [s.args["call_id"] for s in off],
            "crash_hit": len(hit),
            "outcomes": dict(got),
        }
    rep.say(
        "  (execs = fail_times + 1 when recovered; `off` = calls whose count differs; crash-hit = of those, calls "
        "in flight on an upstream process that crashed or was restarting, where an extra or a missing attempt is "
        "legitimate)"
    )
    if off_unexplained:
        rep.say(f"  execution counts off without a crash nearby: {len(off_unexplained)}")
        for cid in off_unexplained[:12]:
            o = by_cid.get(cid)
            rep.say(
                f"    {cid}: {len(per_call[cid]['started'])} executions; caller: "
                + (
                    f"{o.stop_reason or 'success'}, attempts meta {o.attempts_meta}, steps "
                    f"{[(st.get('outcome'), st.get('detail')) for st in o.steps]}"
                    if o
                    else "no result"
                )
            )
    rep.data["kinds"] = kinds_data
    rep.data["upstream_processes"] = len(pids)
    rep.say(
        f"  upstream processes seen in the journal: {len(pids)} "
        f"(crashes journaled: {sum(1 for e in events if e.get('event') == 'crashing')})"
    )

    # 5. cancellation of timed-out attempts
    timed = [s for s in plan if s.kind in ("hang", "charge_hang")]
    fates = collections.Counter(a.fate for s in timed for a in attempts.get(s.args["call_id"], []))
    not_cancelled = fates.get("completed", 0) + fates.get("failed", 0) + fates.get("open", 0)
    rep.say("Timed-out attempts (hang, charge then=hang)")
    rep.say(
        f"  calls {len(timed)}, attempts started {sum(fates.values())}: cancelled {fates.get('cancelled', 0)}, "
        f"killed by a crash {fates.get('killed', 0)}, ran to completion (never cancelled) "
        f"{fates.get('completed', 0) + fates.get('failed', 0)}, still open after {drained_s:.1f}s of drain "
        f"{fates.get('open', 0)}"
    )
    all_open = [a for cid in spec_of for a in attempts.get(cid, []) if a.fate == "open"]
    rep.check("timed-out attempts not cancelled", str(not_cancelled), "0", not_cancelled == 0)
    if all_open:
        rep.say(
            "  attempts of any kind still open after the drain: "
            f"{[(a.call, a.pid, a.request_id) for a in all_open[:20]]}"
        )
    rep.data["timed_out_attempts"] = dict(fates)

    # 6. deadline overshoot of unresolved results
    unresolved = [o for o in outcomes if o.answer == "result" and o.is_error and o.elapsed_ms is not None]
    server_over = [o.elapsed_ms - o.deadline_ms for o in unresolved if o.deadline_ms is not None]
    caller_over = [
        o.elapsed_s * 1000 - (o.deadline_ms if o.deadline_ms is not None else o.deadline_s * 1000) for o in unresolved
    ]
    dl = [o for o in unresolved if o.stop_reason == "deadline_exhausted"]
    dl_server = [o.elapsed_ms - o.deadline_ms for o in dl]
    dl_caller = [o.elapsed_s * 1000 - o.deadline_ms for o in dl]
    late = [o for o in unresolved if o.elapsed_s * 1000 > (o.deadline_ms or o.deadline_s * 1000) + OVERSHOOT_TARGET_MS]
    rep.say("Deadline overshoot of unresolved results, ms (negative = answered before the deadline)")
    rep.say(
        f"  all unresolved ({len(unresolved)}): elapsedMs - deadlineMs p50 {fmt(pct(server_over, 50))} "
        f"p99 {fmt(pct(server_over, 99))} max {fmt(max(server_over, default=math.nan))}; "
        f"caller-measured p50 {fmt(pct(caller_over, 50))} p99 {fmt(pct(caller_over, 99))} "
        f"max {fmt(max(caller_over, default=math.nan))}"
    )
    rep.say(
        f"  stopped by the deadline ({len(dl)}): elapsedMs - deadlineMs p50 {fmt(pct(dl_server, 50))} "
        f"p99 {fmt(pct(dl_server, 99))} max {fmt(max(dl_server, default=math.nan))}; "
        f"caller-measured p50 {fmt(pct(dl_caller, 50))} p99 {fmt(pct(dl_caller, 99))} "
        f"max {fmt(max(dl_caller, default=math.nan))}"
    )
    rep.say(
        f"  answered later than deadline + {OVERSHOOT_TARGET_MS:.0f} ms (caller-measured): {len(late)}"
        + (f": {[(o.call_id, round(o.elapsed_s * 1000)) for o in late[:10]]}" if late else "")
    )
    rep.check(
        "overshoot p99, proxy-reported (elapsedMs - deadlineMs)",
        f"{fmt(pct(server_over, 99))} ms",
        f"<= {OVERSHOOT_TARGET_MS:.0f} ms",
        bool(server_over) and pct(server_over, 99) <= OVERSHOOT_TARGET_MS,
    )
    rep.check(
        "overshoot p99, caller-measured (call_tool time - deadline)",
        f"{fmt(pct(caller_over, 99))} ms",
        f"<= {OVERSHOOT_TARGET_MS:.0f} ms",
        bool(caller_over) and pct(caller_over, 99) <= OVERSHOOT_TARGET_MS,
    )
    rep.data["overshoot_ms"] = {
        "unresolved": len(unresolved),
        "server": {"p50": pct(server_over, 50), "p99": pct(server_over, 99), "max": max(server_over, default=None)},
        "caller": {"p50": pct(caller_over, 50), "p99": pct(caller_over, 99), "max": max(caller_over, default=None)},
        "deadline_stopped": len(dl),
        "deadline_server": {"p50": pct(dl_server, 50), "p99": pct(dl_server, 99)},
        "deadline_caller": {"p50": pct(dl_caller, 50), "p99": pct(dl_caller, 99)},
        "later_than_target": len(late),
    }


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    busy = after[0] - before[0]
    total = after[1] - before[1]
    return busy / total if total else math.nan


def machine_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


# --------------------------------------------------------------------------- legs


def write_policies(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in POLICIES.items():
        (folder / name).write_text(text)
    return folder


def fault_leg(args: argparse.Namespace, work: Path, rep: Report, procs: list[BenchProxy]) -> None:
    policies = write_policies(work / "policies")
    journal = Journal(work / "faults-journal.jsonl")
    for stale in work.glob("faults-*"):
        stale.unlink()
    command = scripted_stdio_command(journal.path, work / "faults-state.json")
    proxy = BenchProxy(upstream=command, extra=["--policies", str(policies)], log_path=work / "faults-proxy.log")
    procs.append(proxy)
    proxy.start()
    plan = make_plan(args.calls, args.crashes, args.sessions, args.seed)
    rep.say(
        f"Fault leg: {len(plan)} calls, seed {args.seed}, {args.sessions} sessions "
        f"({', '.join(MODES[s % 2] for s in range(args.sessions))}) x {args.per_session} in flight, "
        f"client bound = deadline + {args.slack:.1f}s"
    )
    m0 = machine_jiffies()
    outcomes, wall, _ = anyio.run(run_calls, proxy.url, plan, args.sessions, args.per_session, args.slack)
    m1 = machine_jiffies()
    rep.say(f"  wall {wall:.1f}s ({len(plan) / wall:.0f} calls/s), machine busy {busy_fraction(m0, m1):.0%} of 2 cores")
    attempts, drained = drain(journal, {s.args["call_id"] for s in plan}, args.drain)
    proxy.stop()
    rep.say()
    analyse(rep, plan, outcomes, journal, attempts, drained)
    (work / "faults-results.jsonl").write_text("".join(json.dumps(asdict(o)) + "\n" for o in outcomes))


CPU_VARIANTS = ("engine", "plain", "engine-quiet")


def cpu_leg(args: argparse.Namespace, work: Path, rep: Report, procs: list[BenchProxy]) -> None:
    policies = write_policies(work / "policies")
    variants = CPU_VARIANTS if args.cpu_attribution else CPU_VARIANTS[:2]
    legs: dict[str, BenchProxy] = {}
    for name in variants:
        journal = work / f"cpu-{name}-journal.jsonl"
        for stale in work.glob(f"cpu-{name}-*"):
            stale.unlink()
        command = scripted_stdio_command(journal, work / f"cpu-{name}-state.json")
        proxy = BenchProxy(
            upstream=command,
            extra=["--policies", str(policies)],
            log_path=work / f"cpu-{name}-proxy.log",
            variant=name,
            callgrind=work if args.callgrind else None,
        )
        procs.append(proxy)
        legs[name] = proxy.start(timeout_s=300.0 if args.callgrind else 30.0)
    # Units: CPU milliseconds per call, or (--callgrind) thousands of instructions per call.
    unit, scale = ("k instr", 1e-3) if args.callgrind else ("ms", 1000.0)
    rep.say()
    rep.say(
        f"CPU leg: success-only mix (echo), {args.cpu_calls} calls a round, {args.cpu_rounds} rounds per proxy "
        f"in rotating order, {args.sessions} sessions x {args.per_session} in flight; proxies: " + ", ".join(variants)
    )
    for name in variants:  # a warm-up round per proxy, not measured (the first round is always slower)
        plan = echo_plan(args.cpu_warmup, args.sessions, f"cpu-{name}-warmup")
        anyio.run(lambda p=legs[name], pl=plan: run_calls(p.url, pl, args.sessions, args.per_session, args.slack))
    per_call: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.cpu_rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for name in order:
            proxy = legs[name]
            plan = echo_plan(args.cpu_calls, args.sessions, f"cpu-{name}-r{r}")
            m0 = machine_jiffies()
            outcomes, wall, cpu = anyio.run(
                lambda p=proxy, pl=plan: run_calls(
                    p.url, pl, args.sessions, args.per_session, args.slack, warmup=5, cpu_of=p
                )
            )
            m1 = machine_jiffies()
            ok = sum(1 for o in outcomes if o.answer == "result" and not o.is_error)
            per_call[name].append(cpu / max(ok, 1) * scale)
            rep.say(
                f"  round {r + 1} {name:<13} {ok}/{len(plan)} ok, wall {wall:.1f}s ({ok / wall:.0f} calls/s), "
                f"proxy {cpu * scale / 1000 if args.callgrind else cpu:.2f}{'M instr' if args.callgrind else 's'}"
                f" = {cpu / max(ok, 1) * scale:.3f} {unit}/call, "
                f"machine busy {busy_fraction(m0, m1):.0%}"
            )
            if ok != len(plan):
                rep.say(f"    not ok: {[asdict(o) for o in outcomes if o.answer != 'result' or o.is_error][:3]}")
    for proxy in legs.values():
        proxy.stop()
    med = {name: statistics.median(v) for name, v in per_call.items()}
    engine, plain = med["engine"], med["plain"]
    added = engine / plain - 1 if plain else math.nan
    ratios = [e / p - 1 for e, p in zip(per_call["engine"], per_call["plain"], strict=True) if p]
    rep.say(
        f"  per-rotation engine/plain: {', '.join(f'{x:+.0%}' for x in ratios)} "
        f"(median {statistics.median(ratios):+.1%})"
    )
    rep.say(
        f"  median proxy {'instructions' if args.callgrind else 'CPU'} per call: engine {engine:.3f} {unit}, "
        f"plain relay {plain:.3f} {unit}, engine adds {engine - plain:+.3f} {unit} ({added:+.1%})"
    )
    if "engine-quiet" in med:
        quiet = med["engine-quiet"]
        rep.say(
            f"  attribution: engine without observers (no call metrics/logs/spans) {quiet:.3f} {unit} "
            f"({quiet / plain - 1:+.1%} over plain); the engine's telemetry accounts for {engine - quiet:+.3f} {unit}"
        )
    what = "instructions (callgrind)" if args.callgrind else "CPU"
    rep.check(
        f"engine's added {what} per call vs plain relaying",
        f"{added:+.1%}",
        f"<= +{CPU_TARGET:.0%}",
        added <= CPU_TARGET,
    )
    key = "kinstr_per_call" if args.callgrind else "cpu_ms_per_call"
    rep.data[key] = {"rounds": per_call, "median": med, "added": added, "paired": ratios}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="fault-leg calls (default 1000)")
    p.add_argument("--crashes", type=int, default=6, help="upstream crashes placed in the mix (default 6)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--sessions", type=int, default=4, help="client sessions, alternating legacy / 2026-07-28")
    p.add_argument("--per-session", type=int, default=3, help="calls in flight per session (default 3)")
    p.add_argument("--slack", type=float, default=2.0, help="client-side bound per call = deadline + SLACK seconds")
    p.add_argument("--drain", type=float, default=15.0, help="longest wait for late journal lines, seconds")
    p.add_argument("--cpu-calls", type=int, default=600, help="echo calls per CPU round (default 600)")
    p.add_argument("--cpu-rounds", type=int, default=6, help="rounds per proxy in the CPU leg (default 6)")
    p.add_argument("--cpu-warmup", type=int, default=300, help="unmeasured echo calls per proxy first (default 300)")
    p.add_argument(
        "--no-cpu-attribution",
        dest="cpu_attribution",
        action="store_false",
        help="skip the third CPU proxy (the engine without observers)",
    )
    p.add_argument(
        "--callgrind",
        action="store_true",
        help="CPU leg under valgrind's callgrind: instructions per call instead of CPU time (deterministic, "
        "~50x slower; use small rounds, e.g. --cpu-calls 300 --cpu-rounds 2 --cpu-warmup 100)",
    )
    p.add_argument("--skip-cpu", action="store_true")
    p.add_argument("--skip-faults", action="store_true")
    p.add_argument("--max-seconds", type=float, default=900.0, help="bound of the whole run")
    p.add_argument("--workdir", type=Path, default=None, help="keep journals, results and logs here")
    p.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    args = p.parse_args(argv)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(
        signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(f"run exceeded --max-seconds {args.max_seconds}"))
    )
    signal.setitimer(signal.ITIMER_REAL, args.max_seconds)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    rep = Report()
    procs: list[BenchProxy] = []
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    rep.say(f"bench/faults.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  cores {os.cpu_count()}  load {load}  work {work}")
    started = time.monotonic()
    try:
        if not args.skip_faults:
            fault_leg(args, work, rep, procs)
        if not args.skip_cpu:
            cpu_leg(args, work, rep, procs)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process started here", file=sys.stderr)
        return 130
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for proxy in reversed(procs):
            with contextlib.suppress(Exception):
                proxy.stop()
    failed = [c for c in rep.checks if not c.ok]
    rep.say()
    rep.say(
        f"Summary ({time.monotonic() - started:.0f}s): "
        + ", ".join(f"{c.name}: {'PASS' if c.ok else 'FAIL'}" for c in rep.checks)
    )
    if args.json:
        args.json.write_text(json.dumps({"checks": [asdict(c) for c in rep.checks], **rep.data}, indent=2, default=str))
    if failed or args.keep or args.workdir:
        rep.say(f"journals, results and logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
