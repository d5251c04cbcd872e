"""Shared pytest configuration: async tests run on asyncio (via anyio's pytest plugin)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_sessionstart(session: pytest.Session) -> None:
    """In CI (MCP_PROMETHEUS_REQUIRED=1, MCP_REDIS_REQUIRED=1) a missing promtool/prometheus or
    redis-server is an error, not a skip."""
    import os
    import shutil

    if os.environ.get("MCP_REDIS_REQUIRED", "") not in ("", "0", "false", "no") and not shutil.which("redis-server"):
        raise pytest.UsageError("MCP_REDIS_REQUIRED is set but redis-server is not installed (scripts/setup-redis.sh)")

    if os.environ.get("MCP_PROMETHEUS_REQUIRED", "") in ("", "0", "false", "no"):
        return
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if missing:
        raise pytest.UsageError(f"MCP_PROMETHEUS_REQUIRED is set but {', '.join(missing)} is not installed")
