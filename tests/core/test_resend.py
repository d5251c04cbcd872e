"""The re-send table (proxy/core/resend.py): what it lists, keeps, hands out and drops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.core.resend import RESEND_KEY, Abandoned, Flight, Resends, as_resent
from proxy.jsonrpc import dumps_out
from proxy.telemetry.shed import SHED


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answer(n: int, size: int = 10) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "result": {"content": [{"type": "text", "text": "x" * size}]}}


def table(clock: Clock, **bounds: Any) -> Resends:
    return Resends(clock=clock, measure=lambda m: len(m["result"]["content"][0]["text"]), **bounds)


def flight(resends: Resends, op: str) -> Flight:
    return resends.flight(lambda: op)


def test_a_delivered_answer_is_never_listed_and_its_digest_never_computed() -> None:
    resends = table(Clock())
    computed: list[str] = []
    f = resends.flight(lambda: computed.append("op") or "op")  # type: ignore[func-returns-value]
    f.answered(answer(1))
    f.delivered()
    f.stranded()  # the finally of a delivered request: nothing happens
    assert not resends
    assert computed == []


def test_a_stranded_call_is_found_while_it_runs_and_its_answer_kept_after() -> None:
    clock = Clock()
    resends = table(clock, keep_s=60)
    f = flight(resends, "op")
    f.stranded()
    assert resends.find("op") is f and resends.running == {"op": f}
    f.answered(answer(1, 30))
    assert resends.find("op") is f and list(resends.kept) == ["op"] and resends.kept_bytes == 30
    clock.now += 59.9
    assert resends.find("op") is f
    clock.now += 0.2
    assert resends.find("op") is None and resends.kept_bytes == 0 and not f.listed


def test_delivery_to_a_resend_unlists_the_flight_so_a_repeat_is_a_new_call() -> None:
    resends = table(Clock())
    f = flight(resends, "op")
    f.answered(answer(1))
    f.stranded()
    assert resends.find("op") is f
    f.delivered()  # the re-send's stream wrote it
    assert resends.find("op") is None and resends.kept_bytes == 0


def test_one_flight_per_operation() -> None:
    resends = table(Clock())
    first, second = flight(resends, "op"), flight(resends, "op")
    first.stranded()
    second.stranded()
    assert resends.find("op") is first and not second.listed


def test_an_abandoned_flight_is_dropped_and_its_waiters_told() -> None:
    async def main() -> None:
        resends = table(Clock())
        f = flight(resends, "op")
        f.stranded()
        waiting = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)
        f.abandoned()
        with pytest.raises(Abandoned):
            await waiting
        assert resends.find("op") is None
        with pytest.raises(Abandoned):
            await f.wait()

    asyncio.run(main())


def test_waiters_get_the_answer_and_a_cancelled_waiter_leaves_the_flight_alone() -> None:
    async def main() -> None:
        resends = table(Clock())
        f = flight(resends, "op")
        f.stranded()
        gone = asyncio.ensure_future(f.wait())
        stays = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        f.answered(answer(7))
        assert (await stays)["id"] == 7
        assert (await f.wait())["id"] == 7  # answered: at once
        resends.close()

    asyncio.run(main())


def test_an_answer_after_abandonment_or_a_second_answer_changes_nothing() -> None:
    resends = table(Clock())
    f = flight(resends, "op")
    f.answered(answer(1))
    f.answered(answer(2))
    assert f.answer is not None and f.answer["id"] == 1
    g = flight(resends, "other")
    g.abandoned()
    g.answered(answer(3))
    g.stranded()
    assert g.answer is None and resends.find("other") is None


def test_the_byte_bounds_hold_under_a_flood_of_stranded_answers() -> None:
    resends = table(Clock(), max_total_bytes=1000, max_answer_bytes=400)
    before = SHED.get("resends", "evicted"), SHED.get("resends", "too_large")
    for n in range(200):
        f = flight(resends, f"op{n}")
        f.stranded()
        f.answered(answer(n, 100))
        assert resends.kept_bytes <= 1000
    big = flight(resends, "big")
    big.stranded()
    big.answered(answer(0, 401))
    assert resends.find("big") is None
    assert len(resends.kept) == 10 and next(iter(resends.kept)) == "op190"  # the oldest went first
    assert SHED.get("resends", "evicted") - before[0] == 190
    assert SHED.get("resends", "too_large") - before[1] == 1


def test_the_entry_bound_drops_kept_answers_first_and_never_a_running_call() -> None:
    resends = table(Clock(), max_entries=3)
    running = [flight(resends, f"run{n}") for n in range(2)]
    for f in running:
        f.stranded()
    kept = flight(resends, "kept")
    kept.answered(answer(1))
    kept.stranded()
    newest = flight(resends, "new")
    newest.stranded()
    assert resends.find("kept") is None and resends.find("new") is newest
    assert all(resends.find(f.op) is f for f in running)
    one_more = flight(resends, "more")
    one_more.stranded()  # every entry is running: not listed
    assert resends.find("more") is None and not one_more.listed


def test_the_expiry_timer_frees_kept_answers_on_an_idle_proxy() -> None:
    async def main() -> None:
        resends = Resends(keep_s=0.05)
        f = resends.flight(lambda: "op")
        f.answered(answer(1))
        f.stranded()
        assert resends.kept_bytes > 0
        for _ in range(100):
            if not resends.kept:
                break
            await asyncio.sleep(0.02)
        assert not resends.kept and resends.kept_bytes == 0
        resends.close()

    asyncio.run(main())


def test_a_resent_answer_carries_its_own_id_and_the_mark_and_an_error_goes_as_it_came() -> None:
    original = {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "_meta": {"k": 1}}}
    out = as_resent(original, "again")
    assert out == {
        "jsonrpc": "2.0",
        "id": "again",
        "result": {"content": [], "_meta": {"k": 1, RESEND_KEY: {"attached": True}}},
    }
    assert original["result"]["_meta"] == {"k": 1}  # not mutated: other re-sends get it too
    failed = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "no"}}
    assert as_resent(failed, 2) == {"jsonrpc": "2.0", "id": 2, "error": {"code": -32000, "message": "no"}}


class Told:
    """A shared table that writes down what the local table tells it (proxy/state/resends.py is
    the real one, tested against a real store in tests/state/test_resend_store.py)."""

    def __init__(self) -> None:
        self.said: list[tuple[Any, ...]] = []
        self.records: dict[str, Any] = {}
        self.on_gone: Any = None

    def __bool__(self) -> bool:
        return bool(self.records)

    def listed(self, op: str, keyed: bool, arguments_op: str | None, run_s: float) -> None:
        self.said.append(("listed", op, keyed, arguments_op, run_s))

    def answered(self, op: str, data: bytes, keep_s: float, keyed: bool, arguments_op: str | None) -> None:
        self.said.append(("answered", op, len(data), keep_s, keyed))

    def gone(self, op: str, own: bool) -> None:
        self.said.append(("gone", op, own))

    def find(self, op: str) -> Any:
        return self.records.get(op)

    async def answer(self, op: str, bound_s: float) -> Any:
        return None


def shared_table(**bounds: Any) -> tuple[Resends, Told]:
    resends = Resends(keep_s=60.0, **bounds)
    told = Told()
    resends.share(told)
    return resends, told


def test_a_shared_table_tells_the_store_of_a_listing_its_answer_and_its_delivery_in_order() -> None:
    resends, told = shared_table()
    f = resends.flight(lambda: "op", 40.0)
    f.stranded()
    f.answered(answer(1, 5))
    f.delivered()
    size = len(dumps_out(answer(1, 5)))
    listed, kept = ("listed", "op", False, None, 40.0), ("answered", "op", size, 60.0, False)
    assert told.said == [listed, kept, ("gone", "op", True)]
    resends.close()


def test_a_delivered_call_never_reaches_the_shared_store() -> None:
    resends, told = shared_table()
    f = resends.flight(lambda: "op", 40.0)
    f.answered(answer(1))
    f.delivered()
    assert told.said == []


def test_an_abandoned_or_too_large_call_leaves_the_store_and_a_keyed_one_stays_after_delivery() -> None:
    resends, told = shared_table(max_answer_bytes=100)
    cancelled = resends.flight(lambda: "cancelled", 40.0)
    cancelled.stranded()
    cancelled.abandoned()
    large = resends.flight(lambda: "large", 40.0)
    large.stranded()
    large.answered(answer(2, 200))
    keyed = resends.keyed("key-op", "args-op", 40.0)
    keyed.answered(answer(3, 5))
    keyed.delivered()
    assert [s for s in told.said if s[0] == "gone"] == [("gone", "cancelled", True), ("gone", "large", True)]
    assert ("listed", "key-op", True, "args-op", 40.0) in told.said
    assert resends.find("key-op") is keyed, "a keyed answer stays for its window"
    resends.close()


def test_a_re_send_answered_from_another_replica_ends_that_record_on_delivery_and_writes_nothing() -> None:
    resends, told = shared_table()

    class Record:
        keyed = False
        arguments_op = None

    f = resends.attach_remote("op", Record())
    f.stranded()  # its own stream broke too: listed here, not in the store
    f.answered(answer(4))
    assert resends.find("op") is f
    f.delivered()
    assert told.said == [("gone", "op", False)]
    assert resends.find("op") is None
    resends.close()


def test_an_answer_delivered_on_another_replica_is_forgotten_here_and_the_table_counts_remote_records() -> None:
    resends, told = shared_table()
    assert not resends
    told.records["elsewhere"] = object()
    assert resends, "a record of another replica: the engine looks operations up"
    f = resends.flight(lambda: "op", 40.0)
    f.stranded()
    f.answered(answer(5))
    assert told.on_gone is not None
    told.on_gone("op")  # a re-send took it on another replica
    assert resends.find("op") is None and f.ended
    assert ("gone", "op", True) not in told.said, "the store heard of it already"
    resends.close()
