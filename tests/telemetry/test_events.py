"""The Telemetry fan-out: routing by event type, start events only when wanted, contained failures."""

from __future__ import annotations

from typing import Any

from proxy.telemetry.events import CallFinished, CallStarted, CallSucceeded, Telemetry, UpstreamStatus
from tests.telemetry import scenarios


class Everything:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_event(self, event: Any) -> None:
        self.seen.append(event)


class FinishedOnly:
    needs_starts = False

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def handler_for(self, event_type: type) -> Any:
        return self.seen.append if event_type in (CallFinished, CallSucceeded) else None


class Broken:
    def on_event(self, event: Any) -> None:
        raise RuntimeError("observer bug")


def test_events_reach_only_the_observers_that_route_them() -> None:
    everything, finished = Everything(), FinishedOnly()
    telemetry = Telemetry([everything, finished])
    events = [*scenarios.success("c1"), *scenarios.unresolved("c2"), UpstreamStatus("u", True)]
    for event in events:
        telemetry.emit(event)
    assert everything.seen == events
    assert [type(e) for e in finished.seen] == [CallSucceeded, CallFinished]


def test_start_events_are_wanted_only_if_some_observer_lacks_the_declaration() -> None:
    assert Telemetry([FinishedOnly()]).starts is False
    assert Telemetry([FinishedOnly(), Everything()]).starts is True
    assert Telemetry().active is False and Telemetry().starts is False


def test_a_failing_observer_is_contained_and_the_others_still_get_the_event(caplog: Any) -> None:
    everything = Everything()
    telemetry = Telemetry([Broken(), everything])
    started = scenarios.started("c1", "echo")
    telemetry.emit(started)
    telemetry.emit(started)
    assert everything.seen == [started, started]
    assert isinstance(started, CallStarted)
    assert sum("observer bug" in r.getMessage() or r.exc_info is not None for r in caplog.records) == 1


def test_emit_success_routes_like_emit_and_contains_a_failing_observer(caplog: Any) -> None:
    succeeded = CallSucceeded("c1", "echo", 0.01, 0.012)
    finished = FinishedOnly()
    Telemetry([finished]).emit_success(succeeded)  # the one observer that takes it, called directly
    assert finished.seen == [succeeded]
    everything, finished = Everything(), FinishedOnly()
    Telemetry([everything, finished, Broken()]).emit_success(succeeded)  # several: as emit
    assert everything.seen == finished.seen == [succeeded]
    broken = Telemetry([Broken()])
    broken.emit_success(succeeded)
    broken.emit_success(succeeded)
    assert sum(r.exc_info is not None for r in caplog.records) == 2  # once per Telemetry and event type
    Telemetry([]).emit_success(succeeded)  # nobody takes it
