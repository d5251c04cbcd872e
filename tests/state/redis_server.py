"""A real `redis-server` (Debian's package; Valkey speaks the same protocol) for the shared-state
tests: started on a free loopback port with no persistence, awaited with PING (bounded), stopped
by its pid. `MCP_REDIS_REQUIRED=1` (CI) turns a missing binary into an error instead of a skip.
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


def require_redis() -> str:
    if REDIS_SERVER is None:
        if os.environ.get("MCP_REDIS_REQUIRED", "") not in ("", "0", "false", "no"):
            raise pytest.UsageError("MCP_REDIS_REQUIRED is set but redis-server is not installed")
        pytest.skip("redis-server is not installed (scripts/setup-redis.sh installs it)")
    return REDIS_SERVER


@dataclass
class RedisServer:
    log_path: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        binary = require_redis()
        self.port = self.port or free_port()
        log = open(self.log_path, "ab")
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--enable-debug-command", "local"]  # DEBUG SLEEP: a slow store, for the fault tests
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server not answering PING after {timeout_s}s")
            time.sleep(0.02)

    def stall(self, seconds: float) -> socket.socket:
        """Block the server for `seconds` (DEBUG SLEEP, sent on a raw connection of its own), and
        return once it is blocked: a PING on another connection then goes unanswered. The caller
        closes the returned socket after the server answered it (`+OK`)."""
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
