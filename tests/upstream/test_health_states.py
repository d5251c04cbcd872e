"""`UpstreamHealth`, the adapters' view of whether the upstream answers: its states and reports."""

from __future__ import annotations

from proxy.upstream.base import Health, UpstreamHealth


def test_health_walks_unknown_up_down_up_and_reports_each_change_once() -> None:
    health = UpstreamHealth()
    reports: list[tuple[Health, bool | None, str | None]] = []
    health.on_report = lambda: reports.append((health.state, health.up, health.why))
    assert (health.state, health.up) == (Health.UNKNOWN, None)
    health.answered()
    health.answered()  # no news
    assert health.failed("connect refused")
    assert not health.failed("connect refused again"), "already down: not news"
    assert health.why == "connect refused again"
    health.answered()
    assert reports == [
        (Health.UP, True, None),
        (Health.DOWN, False, "connect refused"),
        (Health.UP, True, None),
    ]


def test_a_first_verdict_of_down_is_news() -> None:
    health = UpstreamHealth()
    assert health.failed("spawn failed")
    assert (health.state, health.up) == (Health.DOWN, False)
