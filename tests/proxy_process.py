"""Start the real proxy as a subprocess (`python -m proxy serve ...`) for end-to-end tests.

Readiness is awaited on the admin endpoint's `/readyz` with a hard bound; the process is stopped
by its pid (SIGTERM, then SIGKILL after a bound).

The warm pool of stdio children is off unless a test asks for the shipped defaults
(`shipped_defaults=True`) or sets it (`--stdio-spares`, or the variable in `env`): a spare is a
process start (about a second of CPU for an SDK server) that most tests never take, and the slow
tier is CPU-bound on two cores. The pool's own tests, and those whose claim is "at the shipped
defaults", run it as shipped.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.fixtures.helpers import PYTHON, REPO_ROOT, free_port, scripted_args, terminate


@dataclass
class ProxyProcess:
    upstream: Sequence[str] = ()  # a stdio command, or empty when `upstream_url` is set
    upstream_url: str | None = None
    listen: str = "http"  # "http" or "stdio" (then tests spawn it themselves)
    extra: Sequence[str] = ()
    log_path: Path | None = None
    port: int = 0
    admin_port: int = 0
    env: Mapping[str, str] | None = None  # added to the inherited environment
    shipped_defaults: bool = False  # False: the warm pool is off (see above)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def argv(self) -> list[str]:
        self.port = self.port or free_port()
        self.admin_port = self.admin_port or free_port()
        listen = self.url if self.listen == "http" else "stdio"
        argv = [PYTHON, "-m", "proxy", "serve", "--listen", listen, "--admin", f"127.0.0.1:{self.admin_port}"]
        if self.upstream_url:
            argv += ["--upstream", self.upstream_url]
        argv += list(self.extra)
        if self.upstream:
            argv += ["--", *self.upstream]
        return argv

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process and return at once (`start` also waits for readiness)."""
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.argv(), cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.environment()
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]  # the child has its own copy
        return self.proc

    def start(self, timeout_s: float = 60.0) -> ProxyProcess:
        self.spawn()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {self.proc.returncode}; log: {self.log_tail()}")
            try:
                if httpx.get(self.admin + "/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"proxy not ready after {timeout_s}s; log: {self.log_tail()}")
            time.sleep(0.05)

    def environment(self) -> dict[str, str]:
        tuned = {} if self.shipped_defaults else {"MCP_RECOVERY_STDIO_SPARES": "0"}
        return {**os.environ, **tuned, **(self.env or {})}

    def log_tail(self, n: int = 4000) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def stop(self) -> int | None:
        return terminate(self.proc) if self.proc else None

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scripted_stdio_command(journal: Path, state: Path | None = None, extra: Sequence[str] = ()) -> list[str]:
    return [PYTHON, *scripted_args("stdio", journal, state, extra=extra)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return False
