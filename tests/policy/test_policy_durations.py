"""Durations read `250ms`, `10s`, `2m` (and plain seconds); bad ones name the key."""

from __future__ import annotations

import pytest

from proxy.policy.schema import parse_duration_s


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("10s", 10.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        (" 10s ", 10.0),
        ("3", 3.0),
        (3, 3.0),
        (0.5, 0.5),
        ("0s", 0.0),
    ],
)
def test_duration_reads(text: object, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10 sec", "ten seconds", "10S", "", "-1s", "s", "10ms5", True, None, [1]])
def test_bad_duration_is_refused_with_a_hint(text: object) -> None:
    with pytest.raises(ValueError, match="250ms, 10s, 2m"):
        parse_duration_s(text)


def test_bad_duration_names_the_key_and_line(problems) -> None:
    found = problems({"t.yaml": "tools: [a]\ndeadline: 10 sec\n"})
    assert found == [
        "policies/t.yaml:2: deadline: '10 sec' is not a duration; "
        "write it like 250ms, 10s, 2m or 1m30s (a plain number means seconds)"
    ]


def test_nested_bad_duration_names_the_dotted_key(problems) -> None:
    found = problems({"t.yaml": "tools: [a]\nbackoff:\n  max: soon\n"})
    assert found[0].startswith("policies/t.yaml:3: backoff.max: 'soon' is not a duration")


def test_zero_deadline_is_refused(problems) -> None:
    found = problems({"t.yaml": "tools: [a]\ndeadline: 0s\n"})
    assert found == [
        "policies/t.yaml:2: deadline: '0s' must be longer than zero; "
        "write it like 250ms, 10s, 2m or 1m30s (a plain number means seconds)"
    ]


def test_plain_numbers_are_seconds(policies) -> None:
    policy = policies({"t.yaml": "tools: [a]\ndeadline: 12\nattempt_timeout: 2.5\n"}).resolve("a")
    assert (policy.deadline_s, policy.attempt_timeout_s) == (12.0, 2.5)
