"""Hypothesis settings for the fuzz tests: bounded and reproducible by default.

The `ci` profile (the default) is derandomized (the same examples on every run, so a failure is a
real regression and not a flake) with a bounded count and a per-example deadline, which keeps the
whole set within about a minute on two cores. `HYPOTHESIS_PROFILE=long` explores more examples
with fresh randomness, for a hand run; a failure it finds prints the reproducing example.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

_COMMON = {
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    "print_blob": True,
}
settings.register_profile(
    "ci", max_examples=75, derandomize=True, database=None, deadline=timedelta(seconds=2), **_COMMON
)
settings.register_profile("long", max_examples=2000, deadline=timedelta(seconds=5), **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
