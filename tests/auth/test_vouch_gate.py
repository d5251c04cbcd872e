"""proxy/auth/vouch.py's bounds, on a clock the test moves (no sleeping, nothing timed)."""

from __future__ import annotations

from proxy.auth.base import AuthRefused
from proxy.auth.vouch import REFUSED_KEEP, REFUSED_TTL_S, VouchGate, VouchLimited


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_is_remembered_for_its_ttl_by_key_and_forgotten_once_accepted() -> None:
    clock = Clock()
    gate = VouchGate(clock=clock)
    refusal = AuthRefused(404, "session_owner", "another principal's session")
    gate.remember("passthrough:aa", refusal)
    again = gate.refused("passthrough:aa")
    # a new exception each time (one instance raised again and again would chain every raise's
    # frames onto it), with the same fields: the same answer for the caller
    assert again is not None and again is not refusal and again.__traceback__ is None
    assert vars(again) == vars(refusal)
    assert gate.refused("passthrough:bb") is None and gate.refused("anonymous") is None
    clock.now += REFUSED_TTL_S - 0.001
    assert gate.refused("passthrough:aa") is not None
    clock.now += 0.001
    assert gate.refused("passthrough:aa") is None
    gate.remember("passthrough:aa", refusal)
    gate.forget("passthrough:aa")
    assert gate.refused("passthrough:aa") is None


def test_the_remembered_refusals_are_bounded_the_oldest_forgotten_first() -> None:
    gate = VouchGate(clock=Clock())
    refusal = AuthRefused(401, "upstream_401", "refused")
    for i in range(REFUSED_KEEP + 10):
        gate.remember(f"passthrough:{i}", refusal)
    assert len(gate._refused) == REFUSED_KEEP
    assert gate.refused("passthrough:0") is None and gate.refused("passthrough:9") is None
    assert gate.refused("passthrough:10") is not None
    assert gate.refused(f"passthrough:{REFUSED_KEEP + 9}") is not None


def test_pings_are_a_token_bucket_per_gate() -> None:
    clock = Clock()
    gate = VouchGate(burst=3, per_s=2.0, clock=clock)
    assert [gate.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert gate.take() == 0.5  # the next token in half a second at 2 a second
    clock.now += 0.25
    assert gate.take() == 0.25
    clock.now += 0.25
    assert gate.take() == 0.0
    clock.now += 100.0  # a long quiet spell refills the burst, no more
    assert [gate.take() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    assert VouchGate(burst=3, per_s=2.0, clock=clock).take() == 0.0  # another session's own bucket


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert VouchLimited(0.01).retry_after_header == "1"
    assert VouchLimited(1.0).retry_after_header == "1"
    assert VouchLimited(1.2).retry_after_header == "2"
    assert VouchLimited(999.5).retry_after_header == "1000"
