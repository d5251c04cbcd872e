"""Fixtures of the interop matrix (docs/interop.md): the installed parts, found once per session."""

from __future__ import annotations

import pytest

from tests.interop.harness import Prerequisites, prerequisites, skip_or_fail


@pytest.fixture(scope="session")
def prereq() -> Prerequisites:
    found = prerequisites()
    if isinstance(found, str):
        skip_or_fail(found)
    assert isinstance(found, Prerequisites)
    return found
