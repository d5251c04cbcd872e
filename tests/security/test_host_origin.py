"""Host and Origin checks, deep JSON and the admin port's Host check, on the running proxy (a
DNS-rebinding page must reach neither port). Requests are written on raw sockets: an HTTP client
library would refuse to send two Host headers or normalise what is under test. The parser's own
cases are in test_hostcheck.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = pytest.mark.slow

BOUND_S = 20.0
INIT = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }
).encode()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    tmp = tmp_path_factory.mktemp("host-origin")
    command = scripted_stdio_command(tmp / "journal.jsonl", tmp / "state.json")
    with ProxyProcess(upstream=command, log_path=tmp / "proxy.log") as p:
        yield p


def exchange(port: int, head: list[str], body: bytes = b"") -> tuple[int, bytes]:
    """One request on a fresh loopback connection; the status and the body (read to close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
        lines = [*head, f"Content-Length: {len(body)}", "Connection: close", "", ""]
        sock.sendall("\r\n".join(lines).encode("latin-1") + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def post(proxy: ProxyProcess, *headers: str, body: bytes = INIT) -> tuple[int, bytes]:
    head = [
        "POST /mcp HTTP/1.1",
        *headers,
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
    ]
    return exchange(proxy.port, head, body)


def test_an_ipv6_loopback_host_is_allowed(proxy: ProxyProcess) -> None:
    assert post(proxy, f"Host: [::1]:{proxy.port}")[0] == 200
    assert post(proxy, "Host: [::1]")[0] == 200
    assert post(proxy, f"Host: 127.0.0.1:{proxy.port}")[0] == 200


@pytest.mark.parametrize(
    "host",
    ["1:80", ":80", "127.0.0.1:1@evil.com", "evil.com", "127.0.0.1:99999", "127.0.0.1 :80", "[::2]:80", "localhost:x"],
)
def test_a_host_that_is_not_an_allowed_host_and_port_is_refused(proxy: ProxyProcess, host: str) -> None:
    assert post(proxy, f"Host: {host}")[0] == 421


@pytest.mark.parametrize(
    "origin", ["http://127.0.0.1:1@evil.com", "http://evil.com", "http://127.0.0.1.evil.com", "null", "http://[::1"]
)
def test_an_origin_that_is_not_an_allowed_origin_is_refused(proxy: ProxyProcess, origin: str) -> None:
    assert post(proxy, f"Host: 127.0.0.1:{proxy.port}", f"Origin: {origin}")[0] == 403


def test_allowed_origins_pass(proxy: ProxyProcess) -> None:
    for origin in ("http://127.0.0.1:3000", "http://[::1]:3000", "https://localhost"):
        assert post(proxy, f"Host: 127.0.0.1:{proxy.port}", f"Origin: {origin}")[0] == 200, origin


def test_duplicate_host_or_origin_headers_are_refused(proxy: ProxyProcess) -> None:
    host = f"Host: 127.0.0.1:{proxy.port}"
    assert post(proxy, host, "Host: evil.com")[0] == 400
    assert post(proxy, "Host: evil.com", host)[0] == 400
    assert post(proxy, host, "Origin: http://127.0.0.1", "Origin: http://evil.com")[0] == 400


def test_json_nested_deeply_gets_a_parse_error_not_a_500(proxy: ProxyProcess) -> None:
    host = f"Host: 127.0.0.1:{proxy.port}"
    for depth in (300, 900, 2000):  # orjson parsed up to 1024 levels but serialised only 254
        deep = b"[" * depth + b"]" * depth
        body = INIT[:-2] + b', "extra": ' + deep + b"}}"
        status, answer = post(proxy, host, body=body)
        assert status == 400, (depth, answer[:300])
        assert json.loads(answer)["error"]["code"] == -32700
    log = proxy.log_tail(200_000)
    assert "Traceback" not in log and "Recursion limit" not in log


def test_the_admin_port_checks_host(proxy: ProxyProcess) -> None:
    def get(path: str, host: str) -> int:
        return exchange(proxy.admin_port, [f"GET {path} HTTP/1.1", f"Host: {host}"])[0]

    port = proxy.admin_port
    for path in ("/readyz", "/policies", "/metrics", "/healthz"):
        assert get(path, f"rebind.evil.example:{port}") == 421, path
    assert get("/readyz", "1:80") == 421
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"10.1.2.3:{port}", "[fd00::5]"):
        # A Kubernetes probe or a Prometheus scrape names the pod by its IP: allowed.
        assert get("/readyz", host) == 200, host
    dup = exchange(port, ["GET /readyz HTTP/1.1", f"Host: 127.0.0.1:{port}", "Host: evil.example"])[0]
    assert dup == 400


def test_the_log_has_no_asgi_exception(proxy: ProxyProcess, tmp_path: Path) -> None:
    assert "Exception in ASGI application" not in proxy.log_tail(200_000)
