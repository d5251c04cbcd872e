"""Backoff math with an injected rand, Retry-After parsing, retryAfterMs reading."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from email.utils import format_datetime

import orjson
import pytest

from proxy.policy.compiled import Backoff
from proxy.recovery.backoff import (
    MAX_RETRY_AFTER_S,
    backoff_cap_s,
    backoff_delay_s,
    is_negative_pushback,
    parse_retry_after,
    retry_after_ms_s,
)

B = Backoff(initial_s=0.2, max_s=2.0, multiplier=2.0, jitter="full")


@pytest.mark.parametrize(
    ("retry_index", "cap"),
    [(0, 0.2), (1, 0.4), (2, 0.8), (3, 1.6), (4, 2.0), (50, 2.0), (10_000, 2.0), (-1, 0.2)],
)
def test_cap_is_exponential_from_the_first_retry_and_capped(retry_index, cap):
    assert backoff_cap_s(B, retry_index) == pytest.approx(cap)


@pytest.mark.parametrize(("r", "expected"), [(0.0, 0.0), (0.5, 0.4), (0.999, 0.7992), (1.0, 0.8)])
def test_full_jitter_is_rand_times_the_cap(r, expected):
    assert backoff_delay_s(B, 2, lambda: r) == pytest.approx(expected)


@pytest.mark.parametrize("r", [-3.0, 7.0, math.nan, math.inf])
def test_out_of_range_rand_is_clamped(r):
    assert 0.0 <= backoff_delay_s(B, 1, lambda: r) <= 0.4


def test_no_jitter_is_the_cap_and_does_not_call_rand():
    def boom() -> float:
        raise AssertionError("rand must not be called")

    assert backoff_delay_s(Backoff(0.5, 3.0, 3.0, "none"), 1, boom) == pytest.approx(1.5)


NOW = 1_700_000_000.0


def _http_date(epoch_s: float) -> str:
    return format_datetime(datetime.fromtimestamp(epoch_s, UTC), usegmt=True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # delay-seconds
        ("0", 0.0),
        ("7", 7.0),
        ("120", 120.0),
        ("  7 ", 7.0),
        ("007", 7.0),
        ("1.5", 1.5),  # a fraction, read leniently
        ("31536000", MAX_RETRY_AFTER_S),  # the maximum itself
        # huge: the maximum, neither 1e20 s nor an overflow nor ignored
        ("31536001", MAX_RETRY_AFTER_S),
        ("99999999999999999999", MAX_RETRY_AFTER_S),
        ("9" * 5000, MAX_RETRY_AFTER_S),
        ("00000000000000000000000000000007", 7.0),  # leading zeros do not make it huge
        ("99999999999999999999.5", MAX_RETRY_AFTER_S),
        # HTTP-date, in each of its three forms
        (_http_date(NOW + 30), 30.0),
        (_http_date(NOW + 30).replace("GMT", "-0000"), 30.0),
        (time.strftime("%a, %d-%b-%y %H:%M:%S GMT", time.gmtime(NOW + 30)), 30.0),  # RFC 850
        (time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(NOW + 30)), 30.0),  # asctime: GMT
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: now
        (_http_date(NOW), 0.0),
        (_http_date(NOW + 2 * 365 * 24 * 3600), MAX_RETRY_AFTER_S),  # beyond the maximum
        ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_S),
        # garbage: ignored
        ("-5", None),
        ("-0", None),
        ("+5", None),
        ("5s", None),
        ("5 s", None),
        ("1.", None),
        (".5", None),
        ("", None),
        ("   ", None),
        (None, None),
        ("soon", None),
        ("1e3", None),
        ("NaN", None),
        ("inf", None),
        ("Infinity", None),
        ("\u0661\u0662", None),  # Arabic-Indic digits: not delay-seconds
        ("\u00b2", None),  # superscript two: a digit to str.isdigit, not to float
        ("Wed, 99 Foo 2015 07:28:00 GMT", None),
        ("Wed, 21 Oct 99999 07:28:00 GMT", None),  # a year Python's dates cannot hold
    ],
)
def test_parse_retry_after(value, expected):
    got = parse_retry_after(value, NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_parse_retry_after_rejects_non_strings():
    assert parse_retry_after(5, NOW) is None  # type: ignore[arg-type]


def test_the_longest_retry_after_is_a_year_and_its_milliseconds_encode_as_json():
    """What reports and relayed failures carry (`retryAfterMs`) is an integer of milliseconds:
    past 64 bits, the JSON encoder refuses it, and the whole answer with it."""
    assert MAX_RETRY_AFTER_S == 365 * 24 * 3600
    longest = parse_retry_after("99999999999999999999", NOW)
    assert longest == MAX_RETRY_AFTER_S
    assert orjson.loads(orjson.dumps({"retryAfterMs": int(longest * 1000)})) == {"retryAfterMs": 31_536_000_000}


@pytest.mark.parametrize(
    ("value", "seconds", "negative"),
    [
        (1500, 1.5, False),
        (0, 0.0, False),
        (2.5, 0.0025, False),
        (-1, None, True),
        (True, None, False),
        ("100", None, False),
        (None, None, False),
        (math.inf, None, False),
        (math.nan, None, False),
        (10**23, 365 * 24 * 3600.0, False),  # clamped to a year: the report echoes it in 64-bit milliseconds
    ],
)
def test_retry_after_ms(value, seconds, negative):
    assert retry_after_ms_s(value) == (pytest.approx(seconds) if seconds is not None else None)
    assert is_negative_pushback(value) is negative


def test_reconnect_delay_has_a_floor_of_half_its_step_and_is_capped():
    from proxy.recovery.backoff import reconnect_delay_s

    b = Backoff(initial_s=0.2, max_s=2.0, multiplier=2.0, reconnect_s=3.5)
    assert [reconnect_delay_s(b, i, 30.0, lambda: 0.0) for i in range(4)] == [1.75, 3.5, 7.0, 14.0]
    assert [reconnect_delay_s(b, i, 30.0, lambda: 1.0) for i in range(4)] == [3.5, 7.0, 14.0, 28.0]
    assert reconnect_delay_s(b, 9, 30.0, lambda: 1.0) == 30.0  # capped by the longest wait honoured
    assert reconnect_delay_s(Backoff(reconnect_s=2.0, jitter="none"), 1, 30.0, lambda: 0.0) == 4.0
