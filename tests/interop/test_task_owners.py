"""A task belongs to the principal that created it (`--auth tokens`), through the real proxy in
front of the reference server's tasks (`@modelcontextprotocol/server-everything` over stdio,
`simulate-research-query`), its 2025 sessions on one shared child (`--stdio-sessions shared`), so
both callers' requests reach the same task store. The upstream sees one client (the proxy): before,
bob could read, await and cancel alice's task by its id, and `tasks/list` showed him hers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.interop.harness import Prerequisites, started
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
ALICE = "alice-token-1111222233334444"
BOB = "bob-token-5555666677778888"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
CLIENT = {"name": "t", "version": "1"}


def answer(r: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a response, JSON or an event stream (its last message with an id)."""
    if r.headers.get("content-type", "").startswith("application/json"):
        return r.json()  # type: ignore[no-any-return]
    messages = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return next(m for m in reversed(messages) if "id" in m)


def session(http: httpx.Client, url: str, token: str) -> dict[str, str]:
    headers = {**HEADERS, "authorization": f"Bearer {token}"}
    init = {"protocolVersion": "2025-11-25", "capabilities": {"tasks": {}}, "clientInfo": CLIENT}
    r = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers=headers)
    assert r.status_code == 200, r.text
    headers |= {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


def test_a_task_belongs_to_the_principal_that_created_it(prereq: Prerequisites, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    extra = ["--auth", "tokens", "--auth-tokens-file", str(tokens), "--stdio-sessions", "shared"]
    extra += ["--stdio-shared-children", "1"]
    proxy = ProxyProcess(
        upstream=[prereq.node, prereq.server_everything, "stdio"],
        extra=extra,
        env=prereq.node_env(),
        log_path=tmp_path / "proxy.log",
    )
    with started(proxy) as p, httpx.Client(timeout=60) as http:
        alice, bob = session(http, p.url, ALICE), session(http, p.url, BOB)
        call = {"name": "simulate-research-query", "arguments": {"topic": "owls"}, "task": {"ttl": 60000}}
        body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
        created = answer(http.post(p.url, json=body, headers=alice))
        task_id = created["result"]["task"]["taskId"]

        def ask(headers: dict[str, str], method: str, params: dict[str, Any]) -> dict[str, Any]:
            body = {"jsonrpc": "2.0", "id": 3, "method": method, "params": params}
            return answer(http.post(p.url, json=body, headers=headers))

        for method in ("tasks/get", "tasks/cancel", "tasks/result"):
            refused = ask(bob, method, {"taskId": task_id})
            assert refused.get("error", {}).get("message") == "task not found", (method, refused)
        assert ask(bob, "tasks/list", {})["result"]["tasks"] == []
        assert ask(alice, "tasks/get", {"taskId": task_id})["result"]["taskId"] == task_id
        assert [t["taskId"] for t in ask(alice, "tasks/list", {})["result"]["tasks"]] == [task_id]
        assert ask(alice, "tasks/get", {"taskId": task_id})["result"]["status"] != "cancelled", "bob's cancel"
