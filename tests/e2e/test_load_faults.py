"""The fault and load run (`bench/load_faults.py --quick`) as a test: real proxy processes, the
scripted SDK server over stdio and over HTTP, real SDK clients of both eras, every fault of the
run (SIGKILLs, scripted crashes, hangs, transient errors, answers cut mid-way, 503s, slow answers,
a policy reload, an outage, a SIGTERM under load).

It asserts the COUNTS the run takes from the upstream's journal and the callers' results, never a
duration: every call answered once with its own answer, no state-changing call executed twice, no
attempt beyond the policy's budget nor a repeat of an ineligible failure, no attempt left running
upstream, per era through the upstream's restarts no tool call answered outside the engine and no
attempt the proxy stopped waiting for left uncancelled, no process or upstream connection left after
shutdown, every call in flight at the SIGTERM answered (some with stop reason `shutdown`) and its
attempts cancelled. Deadline overshoot, exit time, RSS and rates are printed by the run, not
asserted here.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.fixtures.helpers import PYTHON, REPO_ROOT

pytestmark = pytest.mark.slow

RUN_BOUND_S = 900


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("load-faults")
    out = work / "figures.json"
    proc = subprocess.run(
        [PYTHON, "bench/load_faults.py", "--quick", "--json", str(out), "--workdir", str(work / "run")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
    )
    print(proc.stdout[-6000:])
    assert out.exists(), f"no figures (exit {proc.returncode}): {proc.stdout[-3000:]} {proc.stderr[-3000:]}"
    data: dict[str, Any] = json.loads(out.read_text())
    assert "error" not in data, data["error"]
    data["report"] = proc.stdout  # the run's own report: what an assertion message shows
    return data


def report_of(run: dict[str, Any], leg: str) -> str:
    """The run's report from the line that opens `leg` on (bounded): what a failed count came from."""
    report: str = run["report"]
    at = report.find(f"Leg {leg}")
    return report[at if at >= 0 else 0 :][:6000]


@pytest.mark.timeout(RUN_BOUND_S + 60)
@pytest.mark.parametrize("upstream", ["stdio", "http"])
def test_every_call_is_answered_once_without_duplicates_or_retries_beyond_budget(
    run: dict[str, Any], upstream: str
) -> None:
    leg = run[f"load/{upstream}"]
    assert leg["answered"] == leg["calls"] > 0
    assert leg["unanswered"] == 0
    assert leg["answered_more_than_once"] == 0
    assert leg["wrong_answer"] == 0
    assert leg["wrong_outcome"] == 0
    assert leg["state_changing_effects"] > 0  # charges did run...
    assert leg["duplicates"] == 0  # ...and none twice
    assert leg["over_budget"] == 0
    assert leg["ineligible_retries"] == 0
    assert leg["attempts_open"] == 0
    # through the upstream's restarts, on each path (era): every tool call answered by the engine,
    # every attempt it stopped waiting for cancelled upstream
    assert leg["answered_outside_engine"] == {"legacy": 0, "2026-07-28": 0}
    assert leg["attempts_not_cancelled"] == {"legacy": 0, "2026-07-28": 0}
    # the faults happened: a SIGKILL, the scripted crashes, hangs cancelled, the reload applied
    assert leg["kills"] >= 1
    assert leg["attempt_fates"].get("crashing", 0) >= 1
    assert leg["attempt_fates"].get("cancelled", 0) >= 1
    assert leg["reload"] is not None and leg["reload"]["calls_after"] >= 1
    assert leg["reload"]["new_budget_reported"] == leg["reload"]["calls_after"]


@pytest.mark.timeout(RUN_BOUND_S + 60)
@pytest.mark.parametrize("upstream", ["stdio", "http"])
def test_nothing_is_left_after_the_proxy_stops(run: dict[str, Any], upstream: str) -> None:
    shutdown = run[f"load/{upstream}"]["shutdown"]
    assert shutdown["exit_code"] == 0
    assert shutdown["children_left"] == 0
    assert shutdown["upstream_fds_left"] == 0


@pytest.mark.timeout(RUN_BOUND_S + 60)
def test_sigterm_under_load_answers_every_call_in_flight_and_cancels_its_attempts(run: dict[str, Any]) -> None:
    leg = run["sigterm/stdio"]
    seen = report_of(run, "sigterm/stdio")
    assert leg["sent"] > 0, seen
    assert leg["unanswered"] == 0, seen
    assert leg["wrong_answer"] == 0, seen
    assert leg["shutdown_results"] >= 1, seen  # calls that outlived the grace: unresolved `shutdown`
    assert leg["attempts_open"] == 0, seen
    assert leg["attempt_fates"].get("cancelled", 0) >= leg["shutdown_results"], seen
    assert leg["duplicates"] == 0, seen
    assert leg["exit_code"] == 0, seen
    assert leg["children_left"] == 0, seen


@pytest.mark.timeout(RUN_BOUND_S + 60)
def test_the_breaker_keeps_retries_off_a_dead_upstream(run: dict[str, Any]) -> None:
    outage = run["outage"]
    off = outage["budget and breaker off"]["amplification"]
    breaker = outage["retry budget and breaker on"]["amplification"]
    assert outage["budget and breaker off"]["executed_during_outage"] == 0  # the outage was total
    assert breaker < off
