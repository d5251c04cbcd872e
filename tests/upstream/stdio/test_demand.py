"""The warm pool's demand model and memory bound (proxy/upstream/stdio/demand.py), without processes:
the peak of children taken within one start time, its decay, and how many children memory allows."""

from __future__ import annotations

import os

from proxy.upstream.stdio.demand import (
    MIN_CHILD_BYTES,
    SpareDemand,
    available_bytes,
    session_rss_bytes,
    spares_memory_allows,
)


def test_a_burst_of_opens_within_one_start_time_is_the_peak() -> None:
    demand = SpareDemand(decay_s=600.0)
    for i in range(10):  # an agent opening ten sessions at once
        demand.opened(100.0 + i * 0.01, window_s=2.0)
    assert demand.peak(100.2) == 10


def test_opens_one_at_a_time_slower_than_a_start_keep_the_peak_at_one() -> None:
    """The Inspector CLI: one session per run, never closed, runs seconds apart."""
    demand = SpareDemand(decay_s=600.0)
    for i in range(30):
        demand.opened(100.0 + i * 3.0, window_s=2.0)
    assert demand.peak(200.0) == 1


def test_the_peak_is_counted_within_the_window_not_across_it() -> None:
    demand = SpareDemand(decay_s=600.0)
    for t in (0.0, 0.5, 1.0, 1.5, 2.5, 3.0):
        demand.opened(t, window_s=1.2)
    assert demand.peak(3.0) == 3, "at most three of the six fall within any 1.2 s"


def test_the_peak_decays_after_the_decay_time_to_what_came_since() -> None:
    demand = SpareDemand(decay_s=10.0)
    for i in range(8):
        demand.opened(0.0 + i * 0.01, window_s=1.0)
    demand.opened(5.0, window_s=1.0)
    demand.opened(5.1, window_s=1.0)
    assert demand.peak(9.0) == 8
    assert demand.peak(10.5) == 2, "the burst is past its decay: the two opens since are the peak"
    assert demand.peak(16.0) == 0, "nothing left within the decay"


def test_memory_allows_what_fits_in_the_share_and_never_counts_a_child_as_free() -> None:
    gib = 1 << 30
    assert spares_memory_allows(4 * gib, 64 << 20, 0.5) == 32
    assert spares_memory_allows(100 << 20, 64 << 20, 0.5) == 0
    assert spares_memory_allows(4 * gib, 0, 0.5) == (2 * gib) // MIN_CHILD_BYTES
    assert spares_memory_allows(0, 64 << 20, 0.5) == 0


def test_available_memory_and_a_sessions_resident_set_are_read_from_procfs() -> None:
    available = available_bytes()
    assert available is not None and available > 0
    assert session_rss_bytes(os.getsid(0)) >= 10 << 20, "this test's own session holds at least a Python process"
    assert session_rss_bytes(2**22 + 7) == 0, "no such session"
