"""`policies check` reports every problem of a folder in one run (docs/policies.md, "What the loader
reads"): each file's schema problems, keys left empty and rule checks even where other keys of the
file are wrong, the claims, and the invariants of every file even where other files have problems.
Before, a schema problem in a file hid its rule checks and empty keys, and any problem anywhere hid
every invariant. An invariant is left out only where one of its values is a value with a problem."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.cli import main
from tests.fixtures.helpers import PYTHON, REPO_ROOT

from .conftest import write_files

FOLDER = {
    "defaults.yaml": "deadline: 5s\nattempt_timeout: 3x\n",
    "a.yaml": "tools: [a]\nattempts: true\nrules:\n  - {name: r, category: business}\n"
    "  - {name: r, category: fatal, text: y}\n  - {name: s, category: transient, text: z, equals: 1}\n"
    "anti_storm:\n  retry_budget_ratio:\n",
    "b.yaml": "tools: [b]\nattempt_timeout: 8s\n",
    "c.yaml": "tools: [c]\nbackoff: {initial: 5s, max: 1s, multiplier: true}\natempts: 3\n",
    "d.yaml": "tools: [b]\ndeadline: 1s\n",
}
EXPECTED = [
    "{f}/a.yaml:2: attempts: expected a whole number, got True",
    "{f}/a.yaml:4: rules[0].name: rule 'r' matches nothing; set at least one of text, path, jsonrpc_codes or "
    "http_statuses",
    "{f}/a.yaml:5: rules[1].category: 'fatal' is not allowed; use 'transient', 'validation', 'business' or "
    "'permission'",
    "{f}/a.yaml:5: rules[1].name: 'r' is used by an earlier rule too; give each rule its own name",
    "{f}/a.yaml:6: rules[2].equals: equals needs a path; add path: <dotted key> to say what to compare",
    "{f}/a.yaml:8: anti_storm.retry_budget_ratio: has no value; write a value, or remove the line",
    "{f}/c.yaml:2: backoff.multiplier: expected a number, got True",
    "{f}/c.yaml:3: atempts: unknown key; did you mean 'attempts'? allowed here: tools, side_effect, retry_on, "
    "attempts, deadline, attempt_timeout, min_attempt_time, idle_timeout, backoff, retry_after_cap, rules, trust, "
    "unclassified, idempotency_key, ledger_window, jsonrpc_errors_as_results, report, anti_storm, required_scopes",
    "{f}/d.yaml:1: tools[0]: 'b' is also claimed by {f}/b.yaml:1; a tool name (or glob) may appear in one file only, "
    "remove it from one",
    "{f}/defaults.yaml:2: attempt_timeout: '3x' is not a duration; write it like 250ms, 10s, 2m or 1m30s (a plain "
    "number means seconds)",
    "{f}/b.yaml:2: attempt_timeout: attempt_timeout 8s ({f}/b.yaml:attempt_timeout) is longer than deadline 5s "
    "({f}/defaults.yaml:deadline); lower attempt_timeout or raise deadline (for tool 'b')",
    "{f}/c.yaml:2: backoff.initial: backoff.initial 5s ({f}/c.yaml:backoff.initial) is longer than backoff.max 1s "
    "({f}/c.yaml:backoff.max); lower backoff.initial or raise backoff.max (for tool 'c')",
]


def _expected(folder: Path | str) -> list[str]:
    return [line.format(f=folder) for line in EXPECTED]


def test_the_loader_reports_every_problem_of_every_file(problems: Callable[..., list[str]]) -> None:
    assert problems(FOLDER) == _expected("policies")


def test_check_prints_every_problem_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_files(tmp_path / "p", FOLDER)
    assert main(["policies", "check", str(folder)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [*_expected(folder), f"FAILED {folder}: 12 problems"]


@pytest.mark.slow
def test_the_check_command_prints_every_problem_in_one_run(tmp_path: Path) -> None:
    folder = write_files(tmp_path / "p", FOLDER)
    run = subprocess.run(
        [PYTHON, "-m", "proxy", "policies", "check", str(folder)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr.splitlines() == [*_expected(folder), f"FAILED {folder}: 12 problems"]


def test_an_invariant_on_a_value_with_a_problem_waits_for_it(problems: Callable[..., list[str]]) -> None:
    # c's attempt_timeout comes from the defaults, whose value is wrong: whether it exceeds c's
    # deadline is known once it is fixed; b's attempt_timeout is its own, against a good deadline
    found = problems(
        {
            "defaults.yaml": "attempt_timeout: nope\n",
            "b.yaml": "tools: [b]\nattempt_timeout: 70s\n",
            "c.yaml": "tools: [c]\ndeadline: 1s\n",
        }
    )
    assert [p.split(": ")[0] for p in found] == ["policies/defaults.yaml:1", "policies/b.yaml:2"]
    assert found[1].endswith("(for tool 'b')")


def test_a_misspelt_key_holds_back_only_the_invariant_of_what_it_likely_meant(
    problems: Callable[..., list[str]],
) -> None:
    found = problems({"t.yaml": "tools: [t]\ndeadline: 1s\natempt_timeout: 5s\nbackoff: {initial: 3s, max: 2s}\n"})
    assert [p.split(": ")[:2] for p in found] == [
        ["policies/t.yaml:3", "atempt_timeout"],
        ["policies/t.yaml:4", "backoff.initial"],
    ]


def test_a_file_that_is_not_yaml_hides_no_other_file(problems: Callable[..., list[str]]) -> None:
    found = problems({"a.yaml": "tools: [a\n", "b.yaml": "tools: [b]\ndeadline: 2s\nattempt_timeout: 3s\n"})
    assert [p.split(": ")[0] for p in found] == ["policies/a.yaml:2", "policies/b.yaml:3"]
