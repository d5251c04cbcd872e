"""The official MCP conformance suite (server mode) against the SDK everything-server, directly
and through our proxy (stdio upstream and Streamable HTTP upstream), on three legs:
``--suite all --spec-version 2025-11-25``, ``--suite all --spec-version 2026-07-28`` and the
suite's default active suite; the 2026-07-28 leg through the proxy's era bridge, in front of the
same server restricted to the 2025 revisions (everything_stdio_2025_only.py); and the 2025-11-25
leg through the bridge's other direction, in front of it restricted to 2026-07-28
(everything_stdio_2026_only.py). Scores are
scenarios, not checks. See docs/conformance.md.
"""

from __future__ import annotations

import pytest
from conformance_harness import (
    EXPECTED_SCENARIO_COUNT,
    LEG_OPTIONS,
    STARTUP_TIMEOUT,
    SUITE_TIMEOUT,
    ConformanceTools,
    dump_json,
    run_suite,
)

LEGS = tuple(LEG_OPTIONS)

# Scenarios allowed to fail, with the reason, per (target, leg). Direct must stay empty (the
# everything-server scores 33/33, 40/40, 31/31 here); the proxy's goal is the direct score,
# so add an entry only with a reason someone has agreed to. A listed scenario that passes
# fails the test, so the table cannot go stale.
_SERVER_2026_ONLY = (
    "the everything-server's input-required-result tools return the 2026 InputRequiredResult from their "
    "handler, which its SDK cannot send on a 2025 session (it answers -32603 'Handler returned an invalid "
    "result' there): a feature of the 2026 revision only, with no 2025 request for the bridge to translate "
    "(docs/conformance.md)"
)
_NO_BACK_CHANNEL = (
    "the server's tool asks its client mid-call with a 2025 server-to-client request, which a 2026-07-28 "
    "connection has no channel for (the SDK raises 'no back-channel' and the tool answers without asking): "
    "a 2026-only server asks through an input-required result, which the bridge does turn into this request "
    "(tests/e2e/test_era_bridge_legacy.py)"
)
KNOWN_FAILURES: dict[tuple[str, str], dict[str, str]] = {
    ("proxy-bridge-2026-only-upstream", "2025-11-25"): {
        "tools-call-sampling": _NO_BACK_CHANNEL,
        "tools-call-elicitation": _NO_BACK_CHANNEL,
        "elicitation-sep1034-defaults": _NO_BACK_CHANNEL,
        "elicitation-sep1330-enums": _NO_BACK_CHANNEL,
    },
    ("proxy-bridge-2025-only-upstream", "2026-07-28"): {
        f"input-required-result-{name}": _SERVER_2026_ONLY
        for name in (
            "basic-elicitation",
            "basic-sampling",
            "basic-list-roots",
            "request-state",
            "multiple-input-requests",
            "multi-round",
            "missing-input-response",
            "non-tool-request",
            "result-type",
            "tampered-state",
            "capability-check",
        )
    },
}
# Scenarios whose outcome depends on how fast this machine starts a process, with the reason:
# neither their pass nor their failure fails the test (the summary says which it was).
TIMING_DEPENDENT: dict[tuple[str, str], dict[str, str]] = {}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.conformance,
    pytest.mark.timeout(SUITE_TIMEOUT + 3 * STARTUP_TIMEOUT + 60),
]


@pytest.mark.parametrize("leg", LEGS)
def test_conformance(
    conformance_target: tuple[str, str],
    leg: str,
    conformance_tools: ConformanceTools,
    tmp_path,
    record_property,
    record_score,
) -> None:
    target, url = conformance_target
    if target == "proxy-bridge-2025-only-upstream" and leg != "2026-07-28":
        pytest.skip("a 2025 client in front of a 2025-only server is the proxy-stdio-upstream target's 2025 legs")
    if target == "proxy-bridge-2026-only-upstream" and leg != "2025-11-25":
        pytest.skip("a 2026 client in front of a 2026-only server is the proxy-stdio-upstream target's 2026 leg")
    run = run_suite(conformance_tools, url, leg, tmp_path)
    known = KNOWN_FAILURES.get((target, leg), {})
    timing = TIMING_DEPENDENT.get((target, leg), {})

    summary = f"conformance {target} {leg}: {len(run.passed)}/{run.total} scenarios"
    if len(run.suite_passed) != len(run.passed):
        summary += f" (suite's own count, warnings allowed: {len(run.suite_passed)}/{run.total})"
    if known:
        summary += f" ({len(known)} known failures listed)"
    for name in timing:
        outcome = next((("passed" if r.passed else "failed") for r in run.results if r.scenario == name), "not run")
        summary += f" ({name}, timing-dependent: {outcome})"
    summary += f" [{run.elapsed:.1f}s]"
    record_score(summary)
    record_property("conformance_score", f"{len(run.passed)}/{run.total}")
    dump_json(tmp_path / "results.json", {"target": target, "url": url, **run.as_json()})

    where = f"results: {tmp_path / 'results.json'}; suite log: {run.stdout_path}, {run.stderr_path}"
    problems: list[str] = []
    if run.returncode is None:
        problems.append(f"the suite did not finish within {SUITE_TIMEOUT:.0f}s and was killed")
    if run.total != EXPECTED_SCENARIO_COUNT[leg]:
        problems.append(
            f"expected {EXPECTED_SCENARIO_COUNT[leg]} scenarios on leg {leg}, the suite reported "
            f"{run.total} (announced {run.announced}); did the suite version or options change?"
        )
    if run.skipped:
        problems.append(f"scenarios skipped by the suite: {', '.join(run.skipped)}")

    unexpected = [r for r in run.failed if r.scenario not in known and r.scenario not in timing]
    if unexpected:
        lines = [f"{len(unexpected)} scenario(s) failed:"]
        for r in unexpected:
            lines.append(f"  - {r.scenario}")
            lines.extend(f"      {line}" for line in r.failure_lines())
        problems.append("\n".join(lines))
    ran = {r.scenario: r for r in run.results}
    fixed = [name for name in known if name in ran and ran[name].passed]
    if fixed:
        problems.append(f"listed in KNOWN_FAILURES[{(target, leg)!r}] but passed, remove: {', '.join(fixed)}")
    missing = [name for name in known if name not in ran]
    if missing:
        problems.append(f"listed in KNOWN_FAILURES[{(target, leg)!r}] but not run: {', '.join(missing)}")
    if not problems and run.returncode not in (0, None) and not known:
        problems.append(f"every scenario passed but the suite exited {run.returncode}; see {run.stderr_path}")

    if problems:
        pytest.fail(f"{summary}\n" + "\n".join(problems) + f"\n{where}", pytrace=False)
