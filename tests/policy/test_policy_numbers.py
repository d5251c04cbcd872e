"""Numeric keys take YAML numbers only: `true` is not 1 (pydantic's lax float and int read it so,
and `anti_storm.retry_budget_ratio: true` resolved to a ratio of 1), a quoted number is text, and
.nan / .inf are no limit. Checked by loading a real folder and by `policies check`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.policy.compiled import PolicySet

from .conftest import write_files

# (key as the problem names it, the file with `{v}` where the value goes)
NUMERIC_KEYS = [
    ("attempts", "attempts: {v}\n"),
    ("deadline", "deadline: {v}\n"),
    ("attempt_timeout", "attempt_timeout: {v}\n"),
    ("min_attempt_time", "min_attempt_time: {v}\n"),
    ("idle_timeout", "idle_timeout: {v}\n"),
    ("retry_after_cap", "retry_after_cap: {v}\n"),
    ("ledger_window", "ledger_window: {v}\n"),
    ("backoff.initial", "backoff:\n  initial: {v}\n"),
    ("backoff.max", "backoff:\n  max: {v}\n"),
    ("backoff.multiplier", "backoff:\n  multiplier: {v}\n"),
    ("backoff.reconnect", "backoff:\n  reconnect: {v}\n"),
    ("anti_storm.retry_budget_ratio", "anti_storm:\n  retry_budget_ratio: {v}\n"),
    ("anti_storm.retry_budget_min_per_s", "anti_storm:\n  retry_budget_min_per_s: {v}\n"),
    ("anti_storm.breaker_failures", "anti_storm:\n  breaker_failures: {v}\n"),
    ("anti_storm.breaker_cooldown", "anti_storm:\n  breaker_cooldown: {v}\n"),
    ("rules[0].jsonrpc_codes[0]", "rules:\n  - {{name: r, category: transient, jsonrpc_codes: [{v}]}}\n"),
    ("rules[0].http_statuses[0]", "rules:\n  - {{name: r, category: transient, http_statuses: [{v}]}}\n"),
]


@pytest.mark.parametrize("boolean", ["true", "false"])
@pytest.mark.parametrize(("key", "text"), NUMERIC_KEYS, ids=[k for k, _ in NUMERIC_KEYS])
def test_a_boolean_is_not_a_number(problems: Callable[..., list[str]], key: str, text: str, boolean: str) -> None:
    [found] = problems({"t.yaml": "tools: [a]\n" + text.format(v=boolean)})
    assert found.startswith("policies/t.yaml:"), found
    assert f": {key}: " in found, found
    assert boolean.capitalize() in found, found  # the value as read, so a person sees what was wrong


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("true", "expected a number, got True"),
        ("'0.5'", "expected a number, got '0.5'"),
        (".nan", "nan is not a usable number; write a finite number like 0.2 or 10"),
        (".inf", "inf is not a usable number; write a finite number like 0.2 or 10"),
    ],
)
@pytest.mark.parametrize("key", ["retry_budget_ratio", "retry_budget_min_per_s"])
def test_the_retry_budget_takes_numbers_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, message: str
) -> None:
    folder = write_files(tmp_path / "p", {"t.yaml": f"tools: [a]\nanti_storm:\n  {key}: {value}\n"})
    assert main(["policies", "check", str(folder)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [f"{folder}/t.yaml:3: anti_storm.{key}: {message}", f"FAILED {folder}: 1 problem"]


def test_whole_numbers_and_fractions_still_pass(policies: Callable[..., PolicySet]) -> None:
    policy_set = policies(
        {
            "t.yaml": "tools: [a]\nattempts: 2\nbackoff: {multiplier: 3}\n"
            "anti_storm: {retry_budget_ratio: 1, retry_budget_min_per_s: 0.5, breaker_failures: 4}\n"
        }
    )
    storm = policy_set.resolve("a").anti_storm
    assert (storm.retry_budget_ratio, storm.retry_budget_min_per_s, storm.breaker_failures) == (1.0, 0.5, 4)
    assert policy_set.resolve("a").backoff.multiplier == 3.0
