from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.state.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the tests that do not stop it (each uses its own key prefix)."""
    with RedisServer(tmp_path_factory.mktemp("redis") / "redis.log") as server:
        yield server


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for the tests that kill, restart or slow it."""
    with RedisServer(tmp_path_factory.mktemp("redis-own") / "redis.log") as server:
        yield server
