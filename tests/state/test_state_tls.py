"""TLS to the shared store beyond one redis-server: a TLS-only Redis Cluster (`rediss+cluster://`)
reached through the one context built from `--state-ca` (never redis-py's own, which trusts the
system roots besides it), a TLS Valkey (`valkeys://`), and the store's CA and client certificate
renewed while the proxy runs. Real servers (tests/state/redis_server.py), certificates from a
throwaway CA made by openssl in the fixture.

The system-roots test points `SSL_CERT_FILE` (which OpenSSL reads for the default roots) at the
CA that signed the cluster's nodes, and `--state-ca` at another: a context that loads the system
roots then trusts the nodes, one built from `--state-ca` alone does not. That is what tells the
two apart on a machine whose real roots sign nothing here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from proxy.state import StateConfigError
from proxy.state.shared import RedisState
from tests.fixtures.helpers import free_port
from tests.state.redis_server import RedisCluster, RedisServer, TlsFiles
from tests.state.test_tls_cluster_valkey import exhaust_locally, started, two_replicas_share_one_approval, until

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


def serve(env: dict[str, str], *args: str, timeout_s: float = 90) -> tuple[int, str]:
    """`mcp-recovery-proxy serve` with `env` added, until it exits (bounded): exit code, stderr."""
    argv = [sys.executable, "-m", "proxy", "serve", "--listen", f"http://127.0.0.1:{free_port()}/mcp", *args]
    argv += ["--", sys.executable, "-c", "pass"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **env})
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
        pytest.fail(f"the proxy did not stop at start: it connected to the store; stderr: {err[-2000:]}")
    return done.returncode, done.stderr


# -- a TLS cluster -------------------------------------------------------------------------------


async def test_a_tls_cluster_is_reached_through_the_one_context_built_from_state_ca(
    tls_cluster: RedisCluster, tls_files: TlsFiles
) -> None:
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    a = await started(tls_cluster.url, prefix, ca=tls_files.ca)
    late: RedisState | None = None
    try:
        assert tls_cluster.url.startswith("rediss+cluster://") and a.tls is not None
        ops = exhaust_locally(a, 20)
        for op in ops:
            entry = a.ledger.check(op)
            assert entry is not None
            await a.recorded(entry)
        assert a.up and not any(a.errors.values()), a.last_error
        late = await started(tls_cluster.url, prefix, ca=tls_files.ca)  # SCAN of each primary over TLS
        assert all(late.ledger.check(op) is not None for op in ops)
        # every connection to every node was made with our context (redis-py's own would be a new
        # one per connection)
        nodes = list(a.client.nodes_manager.nodes_cache.values())
        connected = [c for n in nodes for c in n._connections if c.is_connected]
        assert len({n.port for n in nodes}) >= 3 and connected
        assert all(c.ssl_context.context is a.tls.context for c in connected)
    finally:
        await a.aclose()
        if late is not None:
            await late.aclose()


def test_a_tls_cluster_signed_by_another_ca_stops_the_start_even_where_the_system_roots_trust_it(
    tls_cluster: RedisCluster, tls_files: TlsFiles
) -> None:
    # the nodes' CA is among "the system roots" (SSL_CERT_FILE), and --state-ca names another
    trusting = {"SSL_CERT_FILE": str(tls_files.ca)}
    code, err = serve(trusting, "--state", tls_cluster.url, "--state-ca", str(tls_files.other_ca))
    assert code == 2, err
    assert "--state rediss+cluster://127.0.0.1" in err and "certificate does not verify" in err, err
    assert "--state-ca" in err


# -- valkeys:// ----------------------------------------------------------------------------------


async def test_valkeys_shares_the_ledger_over_tls_verified_against_state_ca(
    tls_valkey: RedisServer, tls_files: TlsFiles
) -> None:
    assert tls_valkey.url.startswith("valkeys://")
    info = tls_valkey.client().info("server")
    assert "valkey_version" in info or info.get("server_name") == "valkey", "a real Valkey, not redis-server"
    await two_replicas_share_one_approval(tls_valkey.url, ca=tls_files.ca)
    wrong = RedisState(tls_valkey.url, ca=tls_files.other_ca, timeout_s=1.0)
    try:
        with pytest.raises(StateConfigError, match="certificate does not verify"):
            await wrong.check()
    finally:
        await wrong.aclose()


def test_a_valkeys_store_whose_certificate_another_ca_signed_stops_the_start(
    tls_valkey: RedisServer, tls_files: TlsFiles
) -> None:
    code, err = serve({}, "--state", tls_valkey.url, "--state-ca", str(tls_files.other_ca))
    assert code == 2 and "--state valkeys://127.0.0.1" in err and "certificate does not verify" in err, err


# -- renewal without a restart -------------------------------------------------------------------


def put(src: Path, dest: Path) -> None:
    """Replace `dest` with `src`'s content in one rename (as a Secret's update or cert-manager does)."""
    tmp = dest.with_name(f".{dest.name}.new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


async def test_a_renewed_state_ca_and_client_certificate_take_effect_without_a_restart(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    mounted = tmp_path / "secret"
    mounted.mkdir()
    ca, cert, key = mounted / "ca.pem", mounted / "client.pem", mounted / "client.key"
    for src, dest in ((tls_files.ca, ca), (tls_files.client_cert, cert), (tls_files.client_key, key)):
        put(src, dest)
    renewed = tls_files.of_other_ca()
    # the store requires a client certificate, so both the CA and the client certificate matter
    with RedisServer(tmp_path / "store.log", tls=tls_files, tls_auth_clients="yes") as store:
        admin = store.client()
        admin.ping()  # connected now, with the first CA: it stays connected across the switch
        state = await started(store.url, "renew:", ca=ca, client_cert=cert, client_key=key)
        try:
            watcher = state.tls_watcher
            assert watcher is not None and state.up
            loaded_before = state.tls.context if state.tls else None

            # the store moves to certificates of another CA (its own and its clients'); the
            # proxy's mounted files are renewed to match
            put(renewed.ca, ca)
            put(renewed.client_cert, cert)
            put(renewed.client_key, key)
            await until(state, lambda: watcher.reloads_ok >= 1 and watcher.files.fingerprint() == watcher._loaded)
            assert state.tls is not None and state.tls.context is not loaded_before
            admin.execute_command(  # in one CONFIG SET: a certificate alone would not fit the old key
                "CONFIG", "SET", "tls-cert-file", str(renewed.server_cert), "tls-key-file", str(renewed.server_key),
                "tls-ca-cert-file", str(renewed.ca),
            )  # fmt: skip
            reconciles = state.reconciles
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal")  # the proxy's open connections
            admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            # new connections, with the renewed context, work: the proxy resubscribes and reconciles
            await until(state, lambda: state.up and state.reconciles > reconciles)
            (op,) = exhaust_locally(state, 1)
            entry = state.ledger.check(op)
            assert entry is not None
            await state.recorded(entry)
            assert state.up and admin.exists(f"renew:ledger:{{{op}}}") == 1

            # a bad renewal (a half-written CA) is refused: the last good context stays in use
            good = state.tls.context
            ca.write_text("-----BEGIN CERTIFICATE-----\nnot finished")
            await until(state, lambda: watcher.reloads_error >= 1)
            assert state.tls.context is good and "--state-ca" in (watcher.last_error or "")
            assert state.status()["tls"]["refused"] >= 1
            reconciles = state.reconciles
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal")
            admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await until(state, lambda: state.up and state.reconciles > reconciles)
            (op,) = exhaust_locally(state, 1)
            entry = state.ledger.check(op)
            assert entry is not None
            await state.recorded(entry)
            assert state.up and admin.exists(f"renew:ledger:{{{op}}}") == 1
        finally:
            await state.aclose()
