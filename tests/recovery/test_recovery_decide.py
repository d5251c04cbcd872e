"""decide(): one row per stop reason (docs/recovery.md, "Decision"), in order; the first "no" wins."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import Dispatch
from proxy.policy.compiled import Backoff, Category, IdempotencyKey, SideEffect, ToolPolicy
from proxy.recovery.backoff import MAX_RETRY_AFTER_S, parse_retry_after
from proxy.recovery.decide import (
    CallState,
    Deliver,
    GiveUp,
    Refused,
    Retry,
    StopReason,
    attempt_timeout_s,
    decide,
    decide_first_attempt,
    describe_decision_table,
    effective_deadline_s,
)
from proxy.recovery.ledger import ExhaustedEntry
from proxy.recovery.outcome import Classified, Evidence, EvidenceSource

T, V, B, P = Category.TRANSIENT, Category.VALIDATION, Category.BUSINESS, Category.PERMISSION
NO, UNKNOWN, YES = Dispatch.NO, Dispatch.UNKNOWN, Dispatch.YES
RO, IDEM, SC = SideEffect.READ_ONLY, SideEffect.IDEMPOTENT, SideEffect.STATE_CHANGING
KEY = IdempotencyKey(location="meta", name="io.example/idempotencyKey")


def policy(**kw: Any) -> ToolPolicy:
    kw.setdefault("side_effect", RO)
    kw.setdefault("backoff", Backoff(initial_s=0.2, max_s=2.0, multiplier=2.0))
    return ToolPolicy(tool="t", **kw)


def failed(
    category: Category | None = T,
    dispatched: Dispatch = NO,
    *,
    hint: bool | None = None,
    retry_after_s: float | None = None,
    defaulted: bool = False,
    rule_retryable: bool | None = None,
) -> Classified:
    source = EvidenceSource.DEFAULT if defaulted else EvidenceSource.TRANSPORT
    return Classified(category, dispatched, Evidence(source), hint, retry_after_s, defaulted, rule_retryable)


def state(attempts_made: int = 1, *, started: float = 100.0, deadline: float = 10.0) -> CallState:
    return CallState(attempts_made, started, started + deadline, retry_index=attempts_made - 1)


HALF = 0.5


def run(p: ToolPolicy, s: CallState, c: Classified, *, now: float = 101.0, admission=None, cancelled=False):
    return decide(p, s, c, now_s=now, rand=lambda: HALF, admission=admission, cancelled=cancelled)


def refuse(reason: StopReason, after: float | None = None):
    return lambda now_s: Refused(reason, after)


# One row per reason: (id, policy kwargs, state, classified, decide kwargs, expected reason, retry_after)
ROWS = [
    ("validation", {}, state(), failed(V), {}, StopReason.NOT_RETRYABLE, None),
    ("permission", {}, state(), failed(P), {}, StopReason.NOT_RETRYABLE, None),
    ("business", {}, state(), failed(B), {}, StopReason.NOT_RETRYABLE, None),
    ("transient-not-in-retry_on", {"retry_on": frozenset()}, state(), failed(T), {}, StopReason.NOT_RETRYABLE, None),
    (
        "validation-listed-in-retry_on-still-not",
        {"retry_on": frozenset({T, V})},
        state(),
        failed(V),
        {},
        StopReason.NOT_RETRYABLE,
        None,
    ),
    ("unclassified", {}, state(), failed(T, YES, defaulted=True), {}, StopReason.NOT_RETRYABLE, None),
    ("rule-retryable-false", {}, state(), failed(T, rule_retryable=False), {}, StopReason.NOT_RETRYABLE, None),
    ("upstream-isRetryable-false", {}, state(), failed(T, YES, hint=False), {}, StopReason.UPSTREAM_DECLINED, None),
    ("state-changing-unknown", {"side_effect": SC}, state(), failed(T, UNKNOWN), {}, StopReason.OUTCOME_UNKNOWN, None),
    ("state-changing-yes", {"side_effect": SC}, state(), failed(T, YES), {}, StopReason.OUTCOME_UNKNOWN, None),
    ("attempts-3-of-3", {"attempts": 3}, state(3), failed(T), {}, StopReason.ATTEMPTS_EXHAUSTED, None),
    ("attempts-1-of-1", {"attempts": 1}, state(1), failed(T), {}, StopReason.ATTEMPTS_EXHAUSTED, None),
    (
        "deadline-no-room-after-backoff",
        {"min_attempt_s": 1.0},
        state(1, deadline=2.0),
        failed(T),
        {"now": 101.0},  # 1 s left, backoff 0.1 s -> 0.9 s < 1.0 s
        StopReason.DEADLINE_EXHAUSTED,
        None,
    ),
    (
        "deadline-retry-after-does-not-fit",
        {},
        state(),
        failed(T, retry_after_s=9.5),
        {},
        StopReason.DEADLINE_EXHAUSTED,
        9.5,
    ),
    (
        "deadline-retry-after-over-cap",
        {"retry_after_cap_s": 5.0, "deadline_s": 100.0},
        state(deadline=100.0),
        failed(T, retry_after_s=6.0),
        {},
        StopReason.DEADLINE_EXHAUSTED,
        6.0,
    ),
    (
        "retry-budget",
        {},
        state(),
        failed(T),
        {"admission": refuse(StopReason.RETRY_BUDGET)},
        StopReason.RETRY_BUDGET,
        None,
    ),
    (
        "circuit-open",
        {},
        state(),
        failed(T),
        {"admission": refuse(StopReason.CIRCUIT_OPEN, 30.0)},
        StopReason.CIRCUIT_OPEN,
        30.0,
    ),
    ("cancelled", {}, state(), failed(T), {"cancelled": True}, StopReason.CANCELLED, None),
]


@pytest.mark.parametrize(
    ("policy_kw", "st", "c", "kw", "reason", "retry_after"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_decision_table_rows(policy_kw, st, c, kw, reason, retry_after):
    d = run(policy(**policy_kw), st, c, **kw)
    assert d == GiveUp(reason, retry_after)


def test_every_stop_reason_is_in_the_described_table_and_documented():
    rows = describe_decision_table()
    assert {row.reason for row in rows} == set(StopReason)
    assert all(row.condition and row.example for row in rows)


@pytest.mark.parametrize(
    ("side_effect", "dispatched", "key"),
    [
        (RO, UNKNOWN, None),
        (RO, YES, None),
        (IDEM, UNKNOWN, None),
        (IDEM, YES, None),
        (SC, NO, None),  # provably not sent: safe to repeat even a state-changing call
        (SC, UNKNOWN, KEY),  # an idempotency key makes it retryable like an idempotent tool
        (SC, YES, KEY),
    ],
)
def test_eligible_transient_failures_retry(side_effect, dispatched, key):
    d = run(policy(side_effect=side_effect, idempotency_key=key), state(), failed(T, dispatched))
    assert isinstance(d, Retry)


def test_success_is_delivered_and_never_retried():
    assert run(policy(), state(), failed(None, YES)) == Deliver()
    assert run(policy(), state(3), failed(None, YES)) == Deliver()


def test_checks_run_in_order_first_no_wins():
    # not retryable beats everything after it
    c = failed(V, UNKNOWN, hint=False)
    assert run(policy(side_effect=SC, attempts=1), state(1), c).reason is StopReason.NOT_RETRYABLE
    # declined beats outcome unknown and exhaustion
    c = failed(T, UNKNOWN, hint=False)
    assert run(policy(side_effect=SC, attempts=1), state(1), c).reason is StopReason.UPSTREAM_DECLINED
    # outcome unknown beats exhaustion
    c = failed(T, UNKNOWN)
    assert run(policy(side_effect=SC, attempts=1), state(1), c).reason is StopReason.OUTCOME_UNKNOWN
    # attempts beat the deadline
    assert run(policy(attempts=2), state(2, deadline=0.1), failed(T)).reason is StopReason.ATTEMPTS_EXHAUSTED


def test_cancelled_beats_even_a_success():
    assert run(policy(), state(), failed(None, YES), cancelled=True) == GiveUp(StopReason.CANCELLED)


def test_admission_is_consulted_only_when_everything_else_says_yes():
    calls: list[float] = []

    def admission(now_s: float) -> Refused | None:
        calls.append(now_s)
        return None

    run(policy(), state(), failed(V), admission=admission)
    run(policy(attempts=1), state(1), failed(T), admission=admission)
    run(policy(), state(1, deadline=1.0), failed(T), admission=admission)
    assert calls == []
    assert isinstance(run(policy(), state(), failed(T), admission=admission, now=101.0), Retry)
    assert calls == [101.0]


def test_three_attempts_mean_one_call_and_two_retries():
    p = policy(attempts=3)
    s = CallState.start(p, now_s=0.0)
    retries = 0
    for _ in range(10):
        s = s.attempted()
        d = decide(p, s, failed(T), now_s=0.0, rand=lambda: 0.0)
        if not isinstance(d, Retry):
            assert d == GiveUp(StopReason.ATTEMPTS_EXHAUSTED)
            break
        retries += 1
        s = s.retried()
    assert (s.attempts_made, retries) == (3, 2)


def test_retry_carries_full_jitter_delay_and_the_next_attempt_timeout():
    p = policy(attempt_timeout_s=4.0)
    d = run(p, state(2), failed(T))  # retry_index 1: cap 0.4, rand 0.5 -> 0.2
    assert d == Retry(delay_s=pytest.approx(0.2), retry_index=1, attempt_timeout_s=4.0)
    d = run(p, state(1, deadline=3.0), failed(T), now=101.0)  # 2 s left, 0.1 s delay
    assert isinstance(d, Retry) and d.attempt_timeout_s == pytest.approx(1.9)


def test_retry_after_that_fits_is_honoured_as_a_floor():
    d = run(policy(), state(), failed(T, retry_after_s=3.0))
    assert d == Retry(delay_s=3.0, retry_index=0, attempt_timeout_s=4.0, retry_after_s=3.0)
    d = run(policy(), state(), failed(T, retry_after_s=0.0))
    assert isinstance(d, Retry) and d.delay_s == pytest.approx(0.1)


def test_non_retryable_give_up_still_reports_a_known_retry_after():
    assert run(policy(), state(), failed(P, retry_after_s=2.0)) == GiveUp(StopReason.NOT_RETRYABLE, 2.0)


def test_before_the_first_attempt():
    entry = ExhaustedEntry("op", "b1", StopReason.ATTEMPTS_EXHAUSTED, 90.0, 150.0)
    assert decide_first_attempt(now_s=100.0) is None
    assert decide_first_attempt(now_s=100.0, cancelled=True) == GiveUp(StopReason.CANCELLED)
    assert decide_first_attempt(now_s=100.0, exhausted=entry) == GiveUp(StopReason.LEDGER_EXHAUSTED, 50.0)
    assert decide_first_attempt(now_s=100.0, exhausted=entry, approved=True) is None
    assert decide_first_attempt(now_s=100.0, admission=refuse(StopReason.OVERLOADED, 1.0)) == GiveUp(
        StopReason.OVERLOADED, 1.0
    )
    assert decide_first_attempt(now_s=100.0, admission=refuse(StopReason.CIRCUIT_OPEN, 9.0)) == GiveUp(
        StopReason.CIRCUIT_OPEN, 9.0
    )
    # the ledger answers first: an exhausted operation points at its earlier budget
    got = decide_first_attempt(now_s=100.0, exhausted=entry, admission=refuse(StopReason.OVERLOADED))
    assert got is not None and got.reason is StopReason.LEDGER_EXHAUSTED


@pytest.mark.parametrize(
    ("caller_ms", "expected"),
    [
        (None, 10.0),
        (2500, 2.5),
        (60_000, 10.0),  # a caller can never lengthen the policy's deadline
        (0, 10.0),
        (-5, 10.0),
        (True, 10.0),
        ("2000", 10.0),
        (float("nan"), 10.0),
        (1.5, 0.0015),
    ],
)
def test_effective_deadline_can_only_be_shortened(caller_ms, expected):
    assert effective_deadline_s(policy(deadline_s=10.0), caller_ms) == pytest.approx(expected)


def test_call_state_start_and_attempt_timeout():
    p = policy(deadline_s=10.0, attempt_timeout_s=4.0)
    s = CallState.start(p, now_s=50.0, caller_deadline_ms=5000)
    assert (s.attempts_made, s.started_at_s, s.deadline_at_s, s.retry_index) == (0, 50.0, 55.0, 0)
    assert s.deadline_s == 5.0
    assert attempt_timeout_s(p, s, 50.0) == 4.0
    assert attempt_timeout_s(p, s, 53.5) == pytest.approx(1.5)
    assert attempt_timeout_s(p, s, 60.0) == 0.0
    assert s.deadline_left_s(60.0) == 0.0
    assert s.attempted().retried() == CallState(1, 50.0, 55.0, 1)


def unreachable(kind: str, dispatched: Dispatch = NO) -> Classified:
    return Classified(T, dispatched, Evidence(EvidenceSource.TRANSPORT, code=kind))


@pytest.mark.parametrize("kind", ["connect_failed", "not_running", "spawn_failed", "closed"])
def test_an_unreachable_upstream_is_retried_across_a_restart_not_within_it(kind):
    """The shipped defaults (3 attempts, reconnect 3.5 s, equal jitter): whatever the jitter draws,
    attempt 2 starts 1.75-3.5 s and attempt 3 5.25-10.5 s after the first failure, across a restart
    of 2-5 s, well inside the 58 s deadline; a failure with an answer keeps the short backoff."""
    p = ToolPolicy(
        tool="t",
        side_effect=RO,
        deadline_s=58.0,
        attempt_timeout_s=58.0,
        min_attempt_s=14.5,
        backoff=Backoff(reconnect_s=3.5),
    )
    for r, (first, second) in ((0.0, (1.75, 3.5)), (1.0, (3.5, 7.0))):
        waits = []
        s = CallState.start(p, now_s=0.0)
        now = 0.0
        for _ in range(2):
            s = s.attempted()
            d = decide(p, s, unreachable(kind, UNKNOWN if kind == "closed" else NO), now_s=now, rand=lambda r=r: r)
            assert isinstance(d, Retry), d
            waits.append(d.delay_s)
            now += d.delay_s
            s = s.retried()
        assert waits == [pytest.approx(first), pytest.approx(second)]
    answered = decide(p, CallState.start(p, now_s=0.0).attempted(), failed(T), now_s=0.0, rand=lambda: 1.0)
    assert isinstance(answered, Retry) and answered.delay_s == pytest.approx(0.2)


def test_a_huge_retry_after_gives_up_at_once_and_reports_the_longest_wait():
    """`Retry-After: 99999999999999999999` is the longest wait the parser reports, which is over
    any cap: the call stops now, reporting that wait, instead of sleeping or overflowing."""
    wait = parse_retry_after("99999999999999999999", 0.0)
    assert wait == MAX_RETRY_AFTER_S
    assert run(policy(), state(), failed(T, retry_after_s=wait)) == GiveUp(StopReason.DEADLINE_EXHAUSTED, wait)
