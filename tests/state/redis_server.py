"""Real stores for the shared-state tests, started on free loopback ports with no persistence,
awaited with PING (bounded) and stopped by their pids:

- `RedisServer`: one `redis-server` (Debian's package), plain or TLS-only (`tls=` a `TlsFiles`:
  a throwaway CA and server certificate made with `openssl`), or one `valkey-server` (`binary=`
  `VALKEY_SERVER`: Debian bookworm-backports' `valkey-tools`, extracted by
  scripts/setup-valkey.sh into .cache/valkey, or any `valkey-server` on PATH or in
  `MCP_VALKEY_SERVER`).
- `RedisCluster`: three `redis-server --cluster-enabled yes` masters joined with
  `redis-cli --cluster create` (no replicas), awaited until every node reports `cluster_state:ok`.

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

        def leaf(name: str, ext: str) -> None:
            (folder / f"{name}.ext").write_text(ext)
            run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.csr"))  # fmt: skip
            run("x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA", str(folder / "ca.pem"),
                "-CAkey", str(folder / "ca.key"), "-CAcreateserial", "-days", "2",
                "-extfile", str(folder / f"{name}.ext"), "-out", str(folder / f"{name}.pem"))  # fmt: skip

        ca("ca")
        ca("other-ca")
        leaf("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
        leaf("client", "extendedKeyUsage=clientAuth\n")
        return cls(
            ca=folder / "ca.pem",
            server_cert=folder / "server.pem",
            server_key=folder / "server.key",
            client_cert=folder / "client.pem",
            client_key=folder / "client.key",
            other_ca=folder / "other-ca.pem",
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
            argv += ["--cluster-node-timeout", "5000", "--dir", str(folder)]
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


@dataclass
class RedisCluster:
    """Three masters on loopback, every slot assigned (`redis-cli --cluster create`)."""

    folder: Path
    masters: int = 3
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout_s: float = 60.0) -> RedisCluster:
        require_redis()
        if REDIS_CLI is None:
            pytest.skip("redis-cli is not installed (Debian's redis-tools, a dependency of redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.masters):
                self.nodes.append(RedisServer(self.folder / f"node{i}.log", cluster=True).start())
            argv = [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
            argv += ["--cluster-replicas", "0", "--cluster-yes"]
            done = subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                why = f"{done.stdout[-2000:]!r} {done.stderr[-2000:]!r}"
                raise RuntimeError(f"redis-cli --cluster create failed: {why}")
            deadline = time.monotonic() + timeout_s
            while not all(b"cluster_state:ok" in n.client().execute_command("CLUSTER", "INFO") for n in self.nodes):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the cluster did not reach cluster_state:ok in {timeout_s}s")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
