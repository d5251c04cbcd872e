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
    cache_control: str | None = "public, max-age=300"
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
        headers = {"content-type": "application/json"}
        if self.server.cache_control is not None:
            headers["cache-control"] = self.server.cache_control
        self._send(200, json.dumps(document).encode(), headers)


@contextlib.contextmanager
def upstream(cache_control: str | None = "public, max-age=300") -> Iterator[Upstream]:
    server = Upstream(("127.0.0.1", 0), Handler)
    server.cache_control = cache_control
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


@pytest.mark.parametrize(
    ("upstream_says", "low", "high"),
    [
        ("public, max-age=300", 290, 300),
        ("max-age=5", 1, 5),
        ("no-store", None, None),
        ("no-cache", None, None),
        (None, None, None),
    ],
    ids=["max-age-300", "max-age-5", "no-store", "no-cache", "nothing"],
)
def test_the_metadata_answer_says_no_longer_a_lifetime_than_the_upstream_gave(
    tmp_path: Path, upstream_says: str | None, low: int | None, high: int | None
) -> None:
    """The proxy answered every metadata GET `max-age=300`, whatever the upstream said: a document
    the upstream served `no-store` (so that an authorization server migration reaches clients at
    once) was kept by clients for five minutes. The answer now carries what is left of the proxy's
    own lifetime for it, `no-store` when it keeps none."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with upstream(upstream_says) as server:
        up = f"http://127.0.0.1:{server.server_address[1]}/mcp"
        extra = ["--auth", "passthrough", "--public-url", url]
        with ProxyProcess(upstream_url=up, extra=extra, port=port, log_path=tmp_path / "proxy.log"):
            with httpx.Client(timeout=30) as http:
                answers = [
                    http.get(f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp") for _ in range(2)
                ]
    for answer in answers:
        assert answer.status_code == 200 and answer.json()["resource"] == url
        cache_control = answer.headers["cache-control"]
        if low is None:
            assert cache_control == "no-store", cache_control
        else:
            assert cache_control.startswith("max-age="), cache_control
            assert low <= int(cache_control.removeprefix("max-age=")) <= high, cache_control
