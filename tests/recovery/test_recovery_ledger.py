"""The ledger: one budget per operation, window expiry, single-use approval, bounded size, digests."""

from __future__ import annotations

import hashlib
import json

import pytest

from proxy.recovery.ledger import InMemoryLedger, canonical_json, new_budget_id, operation_digest
from proxy.recovery.reasons import StopReason

EXHAUSTED = StopReason.ATTEMPTS_EXHAUSTED


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_exhausted_operation_is_blocked_within_the_window_and_expires_after():
    clock = Clock()
    ledger = InMemoryLedger(clock)
    entry = ledger.record_exhausted("op", "b1", EXHAUSTED, 60.0, summary={"attemptCount": 3})
    assert entry.expires_at_s == 1060.0 and entry.summary["attemptCount"] == 3
    clock.now = 1059.9
    hit = ledger.check("op")
    assert hit is not None and hit.budget_id == "b1" and hit.retry_after_s(clock.now) == pytest.approx(0.1)
    assert ledger.check("other") is None
    clock.now = 1060.0
    assert ledger.check("op") is None
    assert len(ledger) == 0


def test_explicit_now_s_works_without_a_clock():
    ledger = InMemoryLedger()
    ledger.record_exhausted("op", "b1", EXHAUSTED, 10.0, now_s=0.0)
    assert ledger.check("op", now_s=9.0) is not None
    assert ledger.check("op", now_s=10.0) is None
    with pytest.raises(ValueError):
        ledger.check("op")


def test_an_approval_opens_exactly_one_fresh_budget():
    ledger = InMemoryLedger()
    ledger.record_exhausted("op", "b1", EXHAUSTED, 60.0, now_s=0.0)
    assert ledger.approve("op", "wrong", now_s=1.0) is False
    assert ledger.approve("op", "b1", now_s=1.0) is True
    assert ledger.approve("op", "b1", now_s=2.0) is False  # single use
    hit = ledger.check("op", now_s=2.0)
    assert hit is not None and hit.approved  # other identical calls stay blocked
    # the fresh budget runs out too: a new entry, a new id, and the old approval stays spent
    ledger.record_exhausted("op", "b2", StopReason.DEADLINE_EXHAUSTED, 60.0, now_s=5.0)
    assert ledger.approve("op", "b1", now_s=6.0) is False
    assert ledger.approve("op", "b2", now_s=6.0) is True


def test_approval_of_an_expired_or_unknown_budget_is_refused():
    ledger = InMemoryLedger()
    ledger.record_exhausted("op", "b1", EXHAUSTED, 60.0, now_s=0.0)
    assert ledger.approve("op", "b1", now_s=60.0) is False
    assert ledger.approve("nope", "b1", now_s=1.0) is False


def test_clear_forgets_an_operation_that_later_succeeded():
    ledger = InMemoryLedger()
    ledger.record_exhausted("op", "b1", EXHAUSTED, 60.0, now_s=0.0)
    ledger.clear("op")
    ledger.clear("never-there")
    assert ledger.check("op", now_s=1.0) is None


def test_size_is_bounded_and_the_oldest_entries_go_first():
    ledger = InMemoryLedger(max_entries=3)
    for i in range(5):
        ledger.record_exhausted(f"op{i}", f"b{i}", EXHAUSTED, 60.0, now_s=float(i))
    assert len(ledger) == 3
    assert [ledger.check(f"op{i}", now_s=5.0) is not None for i in range(5)] == [False, False, True, True, True]
    # re-recording refreshes an operation's place
    ledger.record_exhausted("op2", "b9", EXHAUSTED, 60.0, now_s=6.0)
    ledger.record_exhausted("op5", "b5", EXHAUSTED, 60.0, now_s=7.0)
    assert ledger.check("op2", now_s=8.0) is not None and ledger.check("op3", now_s=8.0) is None


def test_default_bound_is_ten_thousand():
    ledger = InMemoryLedger()
    for i in range(10_050):
        ledger.record_exhausted(str(i), "b", EXHAUSTED, 60.0, now_s=0.0)
    assert len(ledger) == 10_000
    assert ledger.check("0", now_s=1.0) is None and ledger.check("10049", now_s=1.0) is not None


def test_max_entries_must_be_positive():
    with pytest.raises(ValueError):
        InMemoryLedger(max_entries=0)


def test_digest_is_sha256_of_canonical_json():
    digest = operation_digest("search", {"q": "héllo", "n": 1}, upstream="up")
    text = '{"arguments":{"n":1,"q":"héllo"},"tool":"search","upstream":"up"}'
    assert canonical_json({"upstream": "up", "tool": "search", "arguments": {"q": "héllo", "n": 1}}) == text
    assert digest == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_digest_ignores_key_order_and_whitespace_but_not_values():
    a = operation_digest("t", json.loads('{"a": 1, "b": {"y": [1, 2], "x": null}}'))
    b = operation_digest("t", json.loads('{"b":{"x":null,"y":[1,2]},"a":1}'))
    assert a == b
    assert a != operation_digest("t", {"a": 1, "b": {"y": [2, 1], "x": None}})
    assert a != operation_digest("u", {"a": 1, "b": {"y": [1, 2], "x": None}})
    assert operation_digest("t", None) == operation_digest("t", {})


def test_digest_leaves_out_the_proxy_idempotency_key_only():
    base = operation_digest("pay", {"amount": 5}, "idempotency_key")
    assert operation_digest("pay", {"amount": 5, "idempotency_key": "k1"}, "idempotency_key") == base
    assert operation_digest("pay", {"amount": 5, "idempotency_key": "k2"}, "idempotency_key") == base
    assert operation_digest("pay", {"amount": 5, "idempotency_key": "k1"}) != base
    nested = {"amount": 5, "meta": {"idempotency_key": "k1"}}
    assert operation_digest("pay", nested, "idempotency_key") != base


def test_digest_includes_the_caller_and_the_upstream_when_given():
    plain = operation_digest("t", {"a": 1})
    assert operation_digest("t", {"a": 1}, caller="alice") != plain
    assert operation_digest("t", {"a": 1}, caller="alice") != operation_digest("t", {"a": 1}, caller="bob")
    assert operation_digest("t", {"a": 1}, upstream="u1") != operation_digest("t", {"a": 1}, upstream="u2")


def test_digest_does_not_mutate_the_arguments():
    args = {"a": 1, "idempotency_key": "k"}
    operation_digest("t", args, "idempotency_key")
    assert args == {"a": 1, "idempotency_key": "k"}


def test_budget_ids_are_short_and_url_safe():
    bid = new_budget_id(b"\xff\xfe\xfd\x00\x01\x02\x03\x04\x05")
    assert bid == "__79AAECAwQF" and len(bid) == 12
    assert new_budget_id(bytes(range(9))) != bid
    with pytest.raises(ValueError):
        new_budget_id(b"abc")
