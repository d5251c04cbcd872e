"""Real stores for the shared-state tests, started on free loopback ports with no persistence,
awaited with PING (bounded) and stopped by their pids:

- `RedisServer`: one `redis-server` (Debian's package), plain or TLS-only (`tls=` a `TlsFiles`:
  a throwaway CA and server certificate made with `openssl`), or one `valkey-server` (`binary=`
  `VALKEY_SERVER`: Debian bookworm-backports' `valkey-tools`, extracted by
  scripts/setup-valkey.sh into .cache/valkey, or any `valkey-server` on PATH or in
  `MCP_VALKEY_SERVER`).
- `RedisCluster`: three `redis-server --cluster-enabled yes` masters joined with
  `redis-cli --cluster create`, awaited until every node reports `cluster_state:ok`; optionally
  with a replica each (`replicas=1`, awaited until every replica's link to its primary is up) and
  a short `cluster-node-timeout` for quick failovers, or over TLS only (`tls=`: `--tls-cluster` and
  `--tls-replication` too). It reads its own topology (`CLUSTER NODES`) to find the primary that
  holds a key, that primary's replica, and to await a replica's promotion after a kill.

`MCP_REDIS_REQUIRED=1` (CI) turns a missing binary into an error instead of a skip; so does
`MCP_VALKEY_REQUIRED=1` for valkey-server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from tests.fixtures.helpers import free_port, terminate

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
REPO = Path(__file__).resolve().parents[2]


def _valkey_server() -> str | None:
    for candidate in (
        os.environ.get("MCP_VALKEY_SERVER", ""),
        str(REPO / ".cache" / "valkey" / "usr" / "bin" / "valkey-server"),
        shutil.which("valkey-server") or "",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


VALKEY_SERVER = _valkey_server()


def _required(variable: str) -> bool:
    return os.environ.get(variable, "") not in ("", "0", "false", "no")


def require_redis() -> str:
    if REDIS_SERVER is None:
        if _required("MCP_REDIS_REQUIRED"):
            raise pytest.UsageError("MCP_REDIS_REQUIRED is set but redis-server is not installed")
        pytest.skip("redis-server is not installed (scripts/setup-redis.sh installs it)")
    return REDIS_SERVER


def require_valkey() -> str:
    if VALKEY_SERVER is None:
        if _required("MCP_VALKEY_REQUIRED"):
            raise pytest.UsageError("MCP_VALKEY_REQUIRED is set but no valkey-server was found")
        pytest.skip("valkey-server is not installed (scripts/setup-valkey.sh extracts it into .cache/valkey)")
    return VALKEY_SERVER


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA, a server certificate it signed (for 127.0.0.1 and localhost), a client
    certificate it signed, and a second CA that signed nothing here (the wrong CA)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_server_cert: Path | None = None  # signed by `other_ca` (server and client use)
    other_server_key: Path | None = None

    @classmethod
    def make(cls, folder: Path) -> TlsFiles:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("openssl is not installed")
        folder.mkdir(parents=True, exist_ok=True)

        def run(*argv: str) -> None:
            subprocess.run([openssl, *argv], check=True, capture_output=True, timeout=60)

        def ca(name: str) -> None:
            run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                "-subj", f"/CN=test {name}", "-keyout", str(folder / f"{name}.key"),
                "-out", str(folder / f"{name}.pem"),
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")  # fmt: skip

        def leaf(name: str, ext: str, signer: str = "ca") -> None:
            (folder / f"{name}.ext").write_text(ext)
            run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.csr"))  # fmt: skip
            run("x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA", str(folder / f"{signer}.pem"),
                "-CAkey", str(folder / f"{signer}.key"), "-CAcreateserial", "-days", "2",
                "-extfile", str(folder / f"{name}.ext"), "-out", str(folder / f"{name}.pem"))  # fmt: skip

        ca("ca")
        ca("other-ca")
        # server certificates serve as client ones too: cluster nodes present them to each other
        both = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
        leaf("server", both)
        leaf("client", "extendedKeyUsage=clientAuth\n")
        leaf("other-server", both, signer="other-ca")
        return cls(
            ca=folder / "ca.pem",
            server_cert=folder / "server.pem",
            server_key=folder / "server.key",
            client_cert=folder / "client.pem",
            client_key=folder / "client.key",
            other_ca=folder / "other-ca.pem",
            other_server_cert=folder / "other-server.pem",
            other_server_key=folder / "other-server.key",
        )

    def of_other_ca(self) -> TlsFiles:
        """The same set as seen from the other CA: servers (and their clients) whose certificates
        `other_ca` signed, and which `ca` did not."""
        assert self.other_server_cert is not None and self.other_server_key is not None
        return TlsFiles(
            ca=self.other_ca,
            server_cert=self.other_server_cert,
            server_key=self.other_server_key,
            client_cert=self.other_server_cert,
            client_key=self.other_server_key,
            other_ca=self.ca,
        )


@dataclass
class RedisServer:
    log_path: Path
    port: int = 0
    binary: str | None = None  # None: Debian's redis-server
    tls: TlsFiles | None = None  # TLS only (no plain port); clients need not present a certificate
    tls_auth_clients: str = "optional"  # redis' tls-auth-clients: yes | optional | no
    tls_protocols: str | None = None  # redis' tls-protocols, e.g. "TLSv1.2" (None: its default)
    cluster: bool = False
    cluster_node_timeout_ms: int = 5000
    cluster_full_coverage: bool = True  # Redis' default: one unserved slot stops the whole cluster
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def scheme(self) -> str:
        kind = "valkey" if self.binary is not None and "valkey" in Path(self.binary).name else "redis"
        return kind + ("s" if self.tls is not None else "")

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        if self.tls is None:
            return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=5,
            ssl=True,
            ssl_ca_certs=str(self.tls.ca),
            ssl_certfile=str(self.tls.client_cert),
            ssl_keyfile=str(self.tls.client_key),
        )

    def argv(self) -> list[str]:
        binary = self.binary or require_redis()
        argv = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.tls is None:
            argv += ["--port", str(self.port)]
        else:
            argv += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.server_cert)]
            argv += ["--tls-key-file", str(self.tls.server_key), "--tls-ca-cert-file", str(self.tls.ca)]
            argv += ["--tls-auth-clients", self.tls_auth_clients]
            if self.tls_protocols is not None:
                argv += ["--tls-protocols", self.tls_protocols]
        if self.cluster:
            folder = self.log_path.parent
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", str(folder / f"nodes-{self.port}.conf")]
            argv += ["--cluster-node-timeout", str(self.cluster_node_timeout_ms), "--dir", str(folder)]
            # a replica may always be promoted, however long it was cut off (the fault tests cut
            # one off on purpose); the default refuses one whose link broke long before
            argv += ["--cluster-replica-validity-factor", "0"]
            # a replica's first sync at once (the default waits 5 s for more replicas to share it)
            argv += ["--repl-diskless-sync-delay", "0"]
            argv += ["--cluster-require-full-coverage", "yes" if self.cluster_full_coverage else "no"]
            if self.tls is not None:
                argv += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        argv += ["--enable-debug-command", "local"]  # DEBUG SLEEP: a slow store, for the fault tests
        return argv

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.port = self.port or (free_cluster_port() if self.cluster else free_port())
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.argv()[0]} exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the store is not answering PING after {timeout_s}s")
            time.sleep(0.02)

    def stall(self, seconds: float) -> socket.socket:
        """Block the server for `seconds` (DEBUG SLEEP, sent on a raw connection of its own), and
        return once it is blocked: a PING on another connection then goes unanswered. The caller
        closes the returned socket after the server answered it (`+OK`). Plain servers only."""
        sleeper = socket.create_connection(("127.0.0.1", self.port), timeout=seconds + 10)
        sleeper.sendall(f"DEBUG SLEEP {seconds}\r\n".encode())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as probe:
                probe.settimeout(0.2)
                probe.sendall(b"PING\r\n")
                try:
                    probe.recv(16)
                except TimeoutError:
                    return sleeper  # unanswered: the server is asleep
        raise TimeoutError("the server never stalled")

    def kill(self) -> None:
        """SIGKILL: the store vanishes mid-run (connections reset, nothing flushed)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_cluster_port() -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of ports for a cluster node")


@dataclass(frozen=True)
class ClusterNodeInfo:
    """One line of `CLUSTER NODES`, as far as the tests need it."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]

    @property
    def primary(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return "fail" in self.flags


@dataclass
class RedisCluster:
    """Masters on loopback, every slot assigned (`redis-cli --cluster create`), optionally with
    `replicas` replicas each, a `node_timeout_ms` of their own, and TLS only (`tls`)."""

    folder: Path
    masters: int = 3
    replicas: int = 0
    node_timeout_ms: int = 5000
    tls: TlsFiles | None = None
    full_coverage: bool = True
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.url_via(self.nodes[0])

    def url_via(self, node: RedisServer) -> str:
        """The cluster's URL naming `node` (a client learns the others from the one it names)."""
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}+cluster://127.0.0.1:{node.port}"

    def start(self, timeout_s: float = 60.0) -> RedisCluster:
        require_redis()
        if REDIS_CLI is None:
            pytest.skip("redis-cli is not installed (Debian's redis-tools, a dependency of redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.masters * (1 + self.replicas)):
                node = RedisServer(
                    self.folder / f"node{i}.log",
                    cluster=True,
                    cluster_node_timeout_ms=self.node_timeout_ms,
                    cluster_full_coverage=self.full_coverage,
                    tls=self.tls,
                )
                self.nodes.append(node.start())
            argv = [REDIS_CLI, *self._cli_tls(), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
            argv += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                why = f"{done.stdout[-2000:]!r} {done.stderr[-2000:]!r}"
                raise RuntimeError(f"redis-cli --cluster create failed: {why}")
            self.wait_ok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _cli_tls(self) -> list[str]:
        if self.tls is None:
            return []
        tls = self.tls
        return ["--tls", "--cacert", str(tls.ca), "--cert", str(tls.client_cert), "--key", str(tls.client_key)]

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.alive]

    def wait_ok(self, timeout_s: float = 60.0) -> None:
        """Until every live node reports `cluster_state:ok` (with full coverage), agrees that each slot range has one
        live primary, and (with replicas) every live replica's link to its primary is up."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._settled():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not settle in {timeout_s}s: {self.topology()}")
            time.sleep(0.05)

    def _settled(self) -> bool:
        live = self.live()
        if not all(b"cluster_state:ok" in n.client().execute_command("CLUSTER", "INFO") for n in live):
            return False
        ports = {n.port for n in live}
        for node in live:
            info = node.client().info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        primaries = [n for n in self.topology() if n.primary and not n.failed and n.slots]
        return (
            all(p.port in ports for p in primaries)
            and sum(hi - lo + 1 for p in primaries for lo, hi in p.slots) == 16384
        )

    def topology(self, via: RedisServer | None = None) -> list[ClusterNodeInfo]:
        """`CLUSTER NODES` as one live node sees it."""
        node = via or self.live()[0]
        text = node.client().execute_command("CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else str(text)
        out = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            address = fields[1].split("@")[0]
            slots = []
            for part in fields[8:]:
                if part.startswith("["):
                    continue  # a slot being migrated
                lo, _, hi = part.partition("-")
                slots.append((int(lo), int(hi or lo)))
            out.append(
                ClusterNodeInfo(
                    node_id=fields[0],
                    port=int(address.rsplit(":", 1)[1]),
                    flags=frozenset(fields[2].split(",")),
                    master_id=None if fields[3] == "-" else fields[3],
                    slots=tuple(slots),
                )
            )
        return out

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def primary_holding(self, key: str) -> RedisServer:
        """The live primary whose slots include `key`'s."""
        slot = key_slot(key.encode())
        for info in self.topology():
            if info.primary and not info.failed and any(lo <= slot <= hi for lo, hi in info.slots):
                return self.node(info.port)
        raise LookupError(f"no primary holds slot {slot}")

    def replica_of(self, primary: RedisServer) -> RedisServer:
        topology = self.topology()
        primary_id = next(n.node_id for n in topology if n.port == primary.port)
        return self.node(next(n.port for n in topology if n.master_id == primary_id and not n.failed))

    def wait_promoted(self, replica: RedisServer, timeout_s: float = 60.0) -> None:
        """Until `replica` is a primary holding slots and the cluster has settled around it."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                info = next(n for n in self.topology(via=replica) if n.port == replica.port)
                if info.primary and info.slots and self._settled():
                    return
            except (redis.RedisError, StopIteration):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{replica.port} was not promoted in {timeout_s}s")
            time.sleep(0.05)

    def kill_all(self) -> None:
        for node in self.nodes:
            node.kill()

    def restart_all(self, timeout_s: float = 60.0) -> None:
        """Every node again on its port with its nodes.conf (the cluster's shape), none of its data
        (no persistence): the cluster restarted empty."""
        for node in self.nodes:
            node.start()
        self.wait_ok(timeout_s)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
