"""The suite's client command with the proxy in between: `auth_via_proxy.py CLIENT... SERVER_URL`.

The conformance suite runs its client command with the URL of its mock MCP server as the last
argument. This wrapper starts the real proxy (`--auth passthrough`, `--upstream SERVER_URL`, on a
free loopback port, `--public-url` its own URL), waits (bounded) for it to answer, runs
`CLIENT... PROXY_URL` with the suite's environment (the scenario name, its context), and returns
the client's exit status; the proxy is stopped by its pid whatever happens. Everything the client
does (OAuth discovery, authorization, token, MCP requests) then goes through the proxy or to the
suite's authorization server, exactly as it would without the proxy.

Runs inside the test's network namespace (the suite binds every interface), so loopback ports
are private to the run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script by the conformance suite
from tests.fixtures.ports import free_port  # noqa: E402

# Generous: a proxy starts per scenario, and on two busy cores a Python start has taken over 60 s.
START_TIMEOUT_S = float(os.environ.get("MCP_AUTH_PROXY_START_TIMEOUT", "150"))


def wait_ready(admin_port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"auth_via_proxy: the proxy exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", admin_port), timeout=1) as conn:
                conn.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                if conn.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.05)  # another process's start: nothing to wait on but its port
    raise SystemExit(f"auth_via_proxy: the proxy was not ready within {START_TIMEOUT_S:g} s")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: auth_via_proxy.py CLIENT... SERVER_URL", file=sys.stderr)
        return 2
    client, server_url = argv[:-1], argv[-1]
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    log_dir = os.environ.get("MCP_AUTH_PROXY_LOG_DIR")
    log = open(Path(log_dir) / f"proxy-{port}.log", "ab") if log_dir else subprocess.DEVNULL
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--listen",
            url,
            "--admin",
            f"127.0.0.1:{admin}",
            "--upstream",
            server_url,
            "--auth",
            "passthrough",
            "--public-url",
            url,
            "--allowed-host",
            "localhost:*",
        ],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    try:
        wait_ready(admin, proxy)
        return subprocess.run([*client, url], check=False).returncode
    finally:
        if proxy.poll() is None:
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
