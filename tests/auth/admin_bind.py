"""Run inside a network namespace of its own (`unshare -n`, only loopback there): the real proxy
with `--auth tokens` and its admin port bound to 0.0.0.0 (every interface, i.e. not loopback
only), without `--admin-token-file`. A call is made as alice first; then every admin path is
fetched without credentials. Prints one JSON object: each path's status and whether its body
names alice, and the proxy's log. Used by tests/auth/test_admin_closed.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from tests.fixtures.helpers import free_port
from tests.proxy_process import ProxyProcess, scripted_stdio_command

ALICE = "alice-token-2b7d9e4f1a6c"
CLIENT = {"name": "t", "version": "1"}
PATHS = ("/healthz", "/readyz", "/metrics", "/policies", "/status.json", "/", "/status/explain?tool=echo")


def main(tmp: Path, bind: str) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    tokens = tmp / "tokens"
    tokens.write_text(f"alice {ALICE}\n")
    port = free_port()
    extra = ["--auth", "tokens", "--auth-tokens-file", str(tokens), "--admin", f"{bind}:{port}", "--call-log", "all"]
    proxy = ProxyProcess(
        upstream=scripted_stdio_command(tmp / "journal.jsonl"), extra=extra, log_path=tmp / "proxy.log"
    )
    proxy.admin_port = port
    out: dict[str, object] = {}
    with proxy:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        headers = {"accept": "application/json, text/event-stream", "authorization": f"Bearer {ALICE}"}
        with httpx.Client(timeout=30) as http:
            r = http.post(proxy.url, json=init, headers=headers)
            assert r.status_code == 200, r.text
            headers["mcp-session-id"] = r.headers["mcp-session-id"]
            http.post(proxy.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
            http.post(proxy.url, json=call, headers=headers)
            for path in PATHS:
                r = http.get(proxy.admin + path)
                out[path] = {"status": r.status_code, "alice": "alice" in r.text}
    out["log"] = proxy.log_tail(20000)
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
