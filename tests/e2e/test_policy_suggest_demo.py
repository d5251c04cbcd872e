"""`policies suggest` closes the loop on the bundled demo server in chaos mode: the real proxy in
front of `python -m proxy.demo.server --chaos` (its `lookup_customer` fails with a plain text no
rule classifies; its `slow_report` takes 0.1 s per stage), with a folder drafted by the real
`policies init` whose `slow_report` file sets a short attempt timeout. Real SDK clients make the
traffic; the real CLI (`python -m proxy policies suggest --admin`) proposes a rule classifying
the text as transient and an attempt timeout above the observed p99; `git apply` applies the
patch inside the folder; once the proxy has reloaded it, the calls that failed before the patch
end as proposed: the unlabelled failure is retried away, and the slow call the old timer cut
succeeds."""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from proxy.demo.server import BUSY_TEXT
from tests.fixtures.forkserver import python_argv
from tests.fixtures.helpers import PYTHON, REPO_ROOT
from tests.proxy_process import ProxyProcess

pytestmark = pytest.mark.slow

DEMO = ("-m", "proxy.demo.server", "--chaos")
TIMER_S = 2.0  # slow_report's attempt timeout before the patch
STAGE_S = 0.1  # the demo's slow_report: one stage per 0.1 s
SEEN_STAGES = 16  # 1.6 s: under the timer, within 20% of it (a timer `suggest` raises)
UNRESOLVED = "io.mcp-recovery-proxy/unresolved"
COMMAND_BOUND_S = 120.0
CALL_BOUND_S = 60.0


def _cli(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "proxy", "policies", *args], cwd=cwd, capture_output=True, text=True, timeout=COMMAND_BOUND_S
    )


def _wait_until(predicate: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)
    return value


async def _calls(url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The calls in order, on one 2025 session (its own demo child, so its own failure counters)."""
    with anyio.fail_after(CALL_BOUND_S * len(calls)):
        async with Client(url, mode="legacy") as client:
            await client.list_tools()
            return [await client.call_tool(name, arguments) for name, arguments in calls]


def _report(result: Any) -> dict[str, Any]:
    """The unresolved report, from `_meta` (lookup_customer has an output schema, so it is never
    in `structuredContent` there)."""
    assert result.is_error, result
    report = (result.meta or {}).get(UNRESOLVED)
    assert isinstance(report, dict), result
    return report


def test_suggest_on_the_chaos_demo_classifies_its_unlabelled_failure_and_raises_the_timer_that_cut_a_slow_call(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "policies"
    drafted = _cli("init", str(folder), "--", *python_argv(*DEMO))
    assert drafted.returncode == 0, drafted.stdout + drafted.stderr
    with (folder / "slow_report.yaml").open("a") as f:
        f.write(f"attempt_timeout: {TIMER_S:g}s\n")
    assert _cli("check", str(folder)).returncode == 0

    upstream = python_argv(*DEMO)
    proxy = ProxyProcess(upstream=upstream, extra=["--policies", str(folder)], log_path=tmp_path / "proxy.log")
    with proxy:
        # Traffic: slow calls the timer lets through, and lookups failing with a text nothing classifies.
        seen = anyio.run(
            _calls,
            proxy.url,
            [("slow_report", {"steps": SEEN_STAGES})] * 3 + [("lookup_customer", {"customer_id": "c-1"})] * 2,
        )
        assert [r.is_error for r in seen] == [False, False, False, True, True]
        for failed in seen[3:]:
            report = _report(failed)
            assert report["classification"]["defaulted"] is True, report  # unclassified ...
            assert report["attemptCount"] == 1, report  # ... so never retried
            assert BUSY_TEXT in json.dumps(report)

        # Before the patch: a call slower than the timer is cut on every attempt; a fresh lookup
        # fails at once, unclassified.
        too_slow = math.floor(TIMER_S / STAGE_S) + 3
        before = anyio.run(
            _calls, proxy.url, [("slow_report", {"steps": too_slow}), ("lookup_customer", {"customer_id": "c-2"})]
        )
        cut, lookup = (_report(r) for r in before)
        assert cut["stopReason"] != "succeeded" and all(
            "attempt_timeout" in json.dumps(a) for a in cut["attemptedSteps"]
        ), cut
        assert lookup["classification"]["defaulted"] is True and lookup["attemptCount"] == 1, lookup

        found = _cli("suggest", str(folder), "--admin", proxy.admin, "--json")
        assert found.returncode == 0, found.stderr
        advice = json.loads(found.stdout)
        lookup_advice = next(t for t in advice["tools"] if t["tool"] == "lookup_customer")
        (rule,) = lookup_advice["rules"]
        assert rule["category"] == "transient" and rule["count"] == 3, rule
        assert BUSY_TEXT in rule["sample"], rule
        slow = next(t for t in advice["tools"] if t["tool"] == "slow_report")
        (timer,) = slow["timers"]
        assert (timer["setting"], timer["current_s"]) == ("attempt_timeout", TIMER_S), timer
        assert timer["suggested_s"] > slow["p99_ms"] / 1000 and timer["suggested_s"] > TIMER_S, slow

        printed = _cli("suggest", str(folder), "--admin", proxy.admin)
        assert printed.returncode == 0 and printed.stdout == advice["patch"], printed.stderr
        version = httpx.get(proxy.admin + "/policies", timeout=5).json()["version"]
        applied = subprocess.run(
            ["git", "apply", "-v"],
            cwd=folder,
            input=printed.stdout,
            capture_output=True,
            text=True,
            timeout=COMMAND_BOUND_S,
        )
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert _cli("check", str(folder)).returncode == 0
        _wait_until(lambda: httpx.get(proxy.admin + "/policies", timeout=5).json()["version"] != version)

        # After the reload: a call between the old timer and the new one succeeds, and a fresh
        # lookup's unlabelled failures are retried until it answers (the demo fails 2 of 3).
        # One stage past the old timer: the suggestion is a step of its ladder above it (2.5 s at
        # the least, on a quiet machine), so the call has 0.4 s or more to spare under the new
        # timer. Not the slower call cut before: an identical call would be refused by the ledger.
        between = math.floor(TIMER_S / STAGE_S) + 1
        assert between != too_slow
        assert TIMER_S < between * STAGE_S < timer["suggested_s"] - 0.3, (between, timer)
        after = anyio.run(
            _calls,
            proxy.url,
            [("slow_report", {"steps": between}), ("lookup_customer", {"customer_id": "c-3"})],
        )
        report_text, customer = after
        assert not report_text.is_error, report_text
        assert not customer.is_error and customer.structured_content["customer_id"] == "c-3", customer
        # The lookup's two failed attempts were classified by the new rule, none left unclassified.
        observed = httpx.get(proxy.admin + "/status.json", timeout=5).json()["observed"]
        (seen_lookup,) = [t for t in observed["tools"] if t["tool"] == "lookup_customer"]
        assert seen_lookup["rules_matched"] == {rule["name"]: 2}, seen_lookup
        assert seen_lookup["unclassified"] == 3, seen_lookup
