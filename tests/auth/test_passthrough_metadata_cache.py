"""`--auth passthrough`: the upstream's protected-resource metadata is fetched once per its max-age.

Every client that meets the 401 fetches the metadata, unauthenticated; relayed as is, 100 such
GETs to the proxy made 200 fetches of the upstream. The upstream here is a small HTTP server of the
test's own (a thread, 127.0.0.1) that answers every MCP POST 401 with its challenge and serves the
metadata with `Cache-Control: max-age=300`, counting the GETs it gets; the proxy is the real process.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.fixtures.helpers import free_port
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Upstream(ThreadingHTTPServer):
    metadata_gets = 0
    lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: Upstream

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {**headers, "content-length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        port = self.server.server_address[1]
        challenge = f'Bearer resource_metadata="http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"'
        self._send(
            401, b'{"error":"invalid_token"}', {"www-authenticate": challenge, "content-type": "application/json"}
        )

    def do_GET(self) -> None:
        if not self.path.startswith("/.well-known/oauth-protected-resource"):
            self._send(404, b"", {})
            return
        with self.server.lock:
            self.server.metadata_gets += 1
        port = self.server.server_address[1]
        document = {"resource": f"http://127.0.0.1:{port}/mcp", "authorization_servers": ["https://as.example"]}
        headers = {"content-type": "application/json", "cache-control": "public, max-age=300"}
        self._send(200, json.dumps(document).encode(), headers)


@contextlib.contextmanager
def upstream() -> Iterator[Upstream]:
    server = Upstream(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_100_metadata_requests_cost_the_upstream_one_fetch(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    metadata = f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"
    with upstream() as server:
        up = f"http://127.0.0.1:{server.server_address[1]}/mcp"
        extra = ["--auth", "passthrough", "--public-url", url]
        with ProxyProcess(upstream_url=up, extra=extra, port=port, log_path=tmp_path / "proxy.log"):
            before = server.metadata_gets  # the start-up probe's refusal fetched nothing
            with httpx.Client(timeout=30) as http, ThreadPoolExecutor(10) as pool:
                answers = list(pool.map(lambda _: http.get(metadata), range(100)))
            assert all(r.status_code == 200 and r.json()["resource"] == url for r in answers)
            assert server.metadata_gets - before == 1, f"{server.metadata_gets - before} upstream fetches"
