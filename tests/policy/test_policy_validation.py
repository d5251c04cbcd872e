"""Every validation error, with the exact message a person sees (file:line: key: what; fix)."""

from __future__ import annotations

import pytest

CASES = [
    (
        "unknown key with a suggestion",
        "tools: [a]\natempts: 3\n",
        "policies/t.yaml:2: atempts: unknown key; did you mean 'attempts'? allowed here: tools, side_effect, "
        "retry_on, attempts, deadline, attempt_timeout, min_attempt_time, idle_timeout, backoff, "
        "retry_after_cap, rules, trust, unclassified, idempotency_key, ledger_window, "
        "jsonrpc_errors_as_results, report, anti_storm, required_scopes",
    ),
    (
        "unknown nested key",
        "tools: [a]\nbackoff:\n  maximum: 2s\n",
        "policies/t.yaml:3: backoff.maximum: unknown key; did you mean 'max'? "
        "allowed here: initial, max, multiplier, jitter, reconnect",
    ),
    (
        "retry_on lists a category that cannot be retried",
        "tools: [a]\nretry_on: [transient, validation]\n",
        "policies/t.yaml:2: retry_on: 'validation' cannot be retried: only transient may be listed "
        "(validation needs changed input, permission needs access, business needs an explanation); "
        "write retry_on: [transient], or [] to retry nothing",
    ),
    (
        "attempts above the cap",
        "tools: [a]\nattempts: 12\n",
        "policies/t.yaml:2: attempts: 12 is more than the cap of 10 total attempts; more retries make an "
        "outage worse. Use at most 10, or a longer deadline and backoff",
    ),
    (
        "attempts zero",
        "tools: [a]\nattempts: 0\n",
        "policies/t.yaml:2: attempts: 0 is too few: attempts counts every call, the first included; use 1 for no retry",
    ),
    (
        "attempts not a number",
        "tools: [a]\nattempts: three\n",
        "policies/t.yaml:2: attempts: expected a whole number, got 'three'",
    ),
    (
        "empty value",
        "tools: [a]\nattempts:\n",
        "policies/t.yaml:2: attempts: has no value; write a value, or remove the line",
    ),
    (
        "bad side effect",
        "tools: [a]\nside_effect: readonly\n",
        "policies/t.yaml:2: side_effect: 'readonly' is not allowed; use 'read_only', 'idempotent' or 'state_changing'",
    ),
    (
        "bad jitter",
        "tools: [a]\nbackoff: {jitter: half}\n",
        "policies/t.yaml:2: backoff.jitter: 'half' is not allowed; use 'full' or 'none'",
    ),
    (
        "multiplier below one",
        "tools: [a]\nbackoff: {multiplier: 0.5}\n",
        "policies/t.yaml:2: backoff.multiplier: 0.5 must be a number of at least 1 (2 doubles the wait each retry)",
    ),
    (
        "bad unclassified",
        "tools: [a]\nunclassified: fatal\n",
        "policies/t.yaml:2: unclassified: 'fatal' is not allowed; use 'transient', 'validation', 'business' "
        "or 'permission'",
    ),
    (
        "trust not a bool",
        "tools: [a]\ntrust: {annotations: maybe}\n",
        "policies/t.yaml:2: trust.annotations: expected true or false, got 'maybe'",
    ),
    (
        "invalid regex",
        "tools: [a]\nrules:\n  - name: r\n    category: transient\n    text: '(unclosed'\n",
        "policies/t.yaml:5: rules[0].text: '(unclosed' is not a valid regular expression (missing ): "
        "(unclosed); escape special characters such as ( ) [ ] . * + ? with a backslash",
    ),
    (
        "lookahead (RE2 has none)",
        "tools: [a]\nrules:\n  - name: r\n    category: transient\n    text: 'a(?=b)'\n",
        "policies/t.yaml:5: rules[0].text: 'a(?=b)' is not a valid regular expression (invalid perl operator: "
        "(?=); policy regexes run on RE2, which has no backreferences (\\1) or lookaround ((?=, (?!, (?<=, "
        "(?<!) because it never backtracks; match the text directly (e.g. 'timed? ?out' instead of "
        "'(?=.*time)out'), or use path/equals on structuredContent",
    ),
    (
        "backreference (RE2 has none)",
        "tools: [a]\nrules:\n  - name: r\n    category: transient\n    text: '(a)\\1'\n",
        "policies/t.yaml:5: rules[0].text: '(a)\\\\1' is not a valid regular expression (invalid escape "
        "sequence: \\1); policy regexes run on RE2, which has no backreferences (\\1) or lookaround ((?=, "
        "(?!, (?<=, (?<!) because it never backtracks; match the text directly (e.g. 'timed? ?out' instead "
        "of '(?=.*time)out'), or use path/equals on structuredContent",
    ),
    (
        "rule that matches nothing",
        "tools: [a]\nrules:\n  - name: r\n    category: business\n",
        "policies/t.yaml:3: rules[0].name: rule 'r' matches nothing; set at least one of text, path, "
        "jsonrpc_codes or http_statuses",
    ),
    (
        "equals without path",
        "tools: [a]\nrules:\n  - name: r\n    category: business\n    text: x\n    equals: 3\n",
        "policies/t.yaml:6: rules[0].equals: equals needs a path; add path: <dotted key> to say what to compare",
    ),
    (
        "retryable rule of a category that cannot be retried",
        "tools: [a]\nrules:\n  - {name: r, category: validation, text: x, retryable: true}\n",
        "policies/t.yaml:3: rules[0].retryable: only transient failures can be retried, but this rule says "
        "validation; remove retryable or set category: transient",
    ),
    (
        "rule without category",
        "tools: [a]\nrules:\n  - {name: r, text: x}\n",
        "policies/t.yaml:3: rules[0].category: is required here; add it (see docs/policies.md)",
    ),
    (
        "bad path",
        "tools: [a]\nrules:\n  - {name: r, category: business, path: 'error..code'}\n",
        "policies/t.yaml:3: rules[0].path: 'error..code' is not a dotted path; write keys of structuredContent "
        "joined by dots, like error.code",
    ),
    (
        "bad HTTP status",
        "tools: [a]\nrules:\n  - {name: r, category: transient, http_statuses: [5030]}\n",
        "policies/t.yaml:3: rules[0].http_statuses: 5030 is not an HTTP status; use numbers from 100 to 599",
    ),
    (
        "duplicate rule names",
        "tools: [a]\nrules:\n  - {name: r, category: transient, text: x}\n  - {name: r, category: business, text: y}\n",
        "policies/t.yaml:4: rules[1].name: 'r' is used by an earlier rule too; give each rule its own name",
    ),
    (
        "idempotency key location",
        "tools: [a]\nidempotency_key: {location: header, name: k}\n",
        "policies/t.yaml:2: idempotency_key.location: 'header' is not allowed; use 'argument' or 'meta'",
    ),
    (
        "missing tools",
        "attempts: 2\n",
        "policies/t.yaml: tools: is required: list the exact tool names or globs this file covers, "
        "like tools: [refund, 'billing_*']",
    ),
    (
        "empty tools",
        "tools: []\n",
        "policies/t.yaml:1: tools: the list is empty; name at least one tool, like tools: [refund]",
    ),
    (
        "anti-storm ratio",
        "tools: [a]\nanti_storm: {retry_budget_ratio: 2}\n",
        "policies/t.yaml:2: anti_storm.retry_budget_ratio: 2.0 must be between 0 and 1 "
        "(0.2 allows retries of 20% of calls)",
    ),
    (
        "duplicate YAML key",
        "tools: [a]\nattempts: 2\nattempts: 3\n",
        "policies/t.yaml:3: attempts: appears twice (lines 2 and 3); keep one, YAML would silently use the last",
    ),
    (
        "not a mapping",
        "- a\n- b\n",
        "policies/t.yaml:1: must be a block of key: value lines at the top (see docs/policies.md)",
    ),
    (
        "attempt_timeout longer than deadline in one file",
        "tools: [a]\ndeadline: 5s\nattempt_timeout: 8s\n",
        "policies/t.yaml:3: attempt_timeout: attempt_timeout 8s (policies/t.yaml:attempt_timeout) is longer "
        "than deadline 5s (policies/t.yaml:deadline); lower attempt_timeout or raise deadline (for tool 'a')",
    ),
    (
        "min attempt longer than attempt timeout",
        "tools: [a]\nattempt_timeout: 2s\nmin_attempt_time: 3s\n",
        "policies/t.yaml:3: min_attempt_time: min_attempt_time 3s (policies/t.yaml:min_attempt_time) is longer "
        "than attempt_timeout 2s (policies/t.yaml:attempt_timeout); lower min_attempt_time or raise "
        "attempt_timeout (for tool 'a')",
    ),
    (
        "backoff initial above max",
        "tools: [a]\nbackoff:\n  initial: 5s\n  max: 1s\n",
        "policies/t.yaml:3: backoff.initial: backoff.initial 5s (policies/t.yaml:backoff.initial) is longer "
        "than backoff.max 1s (policies/t.yaml:backoff.max); lower backoff.initial or raise backoff.max "
        "(for tool 'a')",
    ),
]


@pytest.mark.parametrize(("case", "text", "message"), CASES, ids=[c[0] for c in CASES])
def test_validation_message(problems, case: str, text: str, message: str) -> None:
    assert problems({"t.yaml": text}) == [message]


def test_yaml_syntax_error_names_the_line(problems) -> None:
    [found] = problems({"t.yaml": "tools: [a]\nattempts: 3\n  deadline: 2s\n"})
    assert found.startswith("policies/t.yaml:3: is not valid YAML: ")
    assert found.endswith("check the indentation and quote values that contain ': ' or '#'")


def test_every_problem_of_every_file_is_reported_at_once(problems) -> None:
    found = problems({"a.yaml": "tools: [a]\nattempts: 0\n", "b.yaml": "tools: [b]\ndeadline: x\n"})
    assert [p.split(":")[0] for p in found] == ["policies/a.yaml", "policies/b.yaml"]


def test_defaults_file_may_not_list_tools(problems) -> None:
    assert problems({"defaults.yaml": "tools: [a]\n"}) == [
        "policies/defaults.yaml:1: tools: the defaults file covers every tool that no other file names; "
        "remove tools: here, or move these settings to a file of their own"
    ]


def test_both_defaults_files_is_an_error(problems) -> None:
    assert problems({"defaults.yaml": "attempts: 2\n", "defaults.yml": "attempts: 3\n"}) == [
        "policies: both defaults.yaml and defaults.yml exist; keep one"
    ]


def test_invariant_across_files_names_both_sources(problems) -> None:
    found = problems({"defaults.yaml": "deadline: 5s\n", "slow.yaml": "tools: [slow]\nattempt_timeout: 8s\n"})
    assert found == [
        "policies/slow.yaml:2: attempt_timeout: attempt_timeout 8s (policies/slow.yaml:attempt_timeout) is "
        "longer than deadline 5s (policies/defaults.yaml:deadline); lower attempt_timeout or raise deadline "
        "(for tool 'slow')"
    ]


def test_invariant_in_defaults_is_reported_once(problems) -> None:
    found = problems(
        {"defaults.yaml": "deadline: 1s\nattempt_timeout: 2s\n", "a.yaml": "tools: [a, 'b*']\nattempts: 2\n"}
    )
    assert len(found) == 1
    assert found[0].endswith("(for every tool)")
