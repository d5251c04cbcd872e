from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.state.redis_server import RedisCluster, RedisServer, TlsFiles, require_valkey


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


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throwaway CA (and a second, wrong one), server and client certificates, made by openssl."""
    return TlsFiles.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[RedisServer]:
    """A redis-server that speaks TLS only (rediss://), signed by `tls_files.ca`."""
    with RedisServer(tmp_path_factory.mktemp("redis-tls") / "redis.log", tls=tls_files) as server:
        yield server


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real valkey-server (Debian bookworm-backports), reached as valkey://."""
    binary = require_valkey()
    with RedisServer(tmp_path_factory.mktemp("valkey") / "valkey.log", binary=binary) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """Three redis-server masters on loopback joined into one cluster (redis+cluster://)."""
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


@pytest.fixture
def replicated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """Three primaries with a replica each and a 1 s node timeout (a failover in a few seconds),
    the test's own: the fault tests kill its nodes."""
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster-r"), replicas=1, node_timeout_ms=1000) as cluster:
        yield cluster


@pytest.fixture
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """Three primaries, no replica, the test's own (it stops and restarts every node)."""
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster-own"), node_timeout_ms=1000) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[RedisCluster]:
    """Three primaries speaking TLS only (clients, cluster bus), certificates signed by `tls_files.ca`."""
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster-tls"), tls=tls_files) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tls_valkey(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[RedisServer]:
    """A real valkey-server speaking TLS only (valkeys://), signed by `tls_files.ca`."""
    binary = require_valkey()
    with RedisServer(tmp_path_factory.mktemp("valkey-tls") / "valkey.log", binary=binary, tls=tls_files) as server:
        yield server


@pytest.fixture
def partial_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """Three primaries, no replica, `cluster-require-full-coverage no`: the live primaries keep
    serving their slots while one is dead (the test's own: it kills one)."""
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster-p"), node_timeout_ms=1000, full_coverage=False) as c:
        yield c
