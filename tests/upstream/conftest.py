"""Shared fixtures for the upstream adapter tests (anyio on asyncio; servers on 127.0.0.1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # the repo root, whatever pytest's rootdir/import mode
    sys.path.insert(0, _ROOT)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
