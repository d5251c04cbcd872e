"""`--auth tokens` end to end: the real proxy process, a real stdio upstream (the scripted SDK
server), raw HTTP and the SDK's own client in both eras.

What is checked: every refusal's status and `WWW-Authenticate` challenge, the protected-resource
metadata at both paths a client probes, `required_scopes` (403 insufficient_scope), budgets that
belong to the principal that spent them (A exhausts, B's identical call runs, B cannot approve
A's budget, A can, once), 2025 sessions bound to their principal, the admin token, the failure
counter, hot reload (a good file swaps, a bad one keeps the last good set), and that no token
reaches the log, the metrics or any answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from proxy import jsonrpc
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0
ALICE = "alice-token-7c1f0e9a4b2d"
BOB = "bob-token-93ad61f2c0e4"
CAROL = "carol-token-5e8b7d6c4a31"
ADMIN = "admin-token-0f9e8d7c6b5a"
SECRETS = (ALICE, BOB, CAROL, ADMIN)
POLICIES = {
    "defaults.yaml": "attempts: 2\ndeadline: 4s\nattempt_timeout: 1s\nbackoff: {initial: 10ms, max: 20ms}\n",
    "charge.yaml": "tools: [charge]\nrequired_scopes: [payments]\n",
}
ACCEPT = {"accept": "application/json, text/event-stream"}


class Rig:
    def __init__(self, proxy: ProxyProcess, journal: Journal, tokens: Path) -> None:
        self.proxy = proxy
        self.journal = journal
        self.tokens = tokens


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("auth-tokens")
    policies = tmp / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / name).write_text(text)
    secrets = tmp / "secrets"
    secrets.mkdir()
    tokens = secrets / "tokens"
    tokens.write_text(f"# callers\nalice {ALICE}\n\nbob   {BOB}\n")
    admin = tmp / "admin-token"
    admin.write_text(ADMIN + "\n")
    journal = Journal(tmp / "journal.jsonl")
    extra = [
        "--policies",
        str(policies),
        "--auth",
        "tokens",
        "--auth-tokens-file",
        str(tokens),
        "--admin-token-file",
        str(admin),
        "--call-log",
        "all",
    ]
    command = scripted_stdio_command(journal.path, tmp / "state.json")
    proxy = ProxyProcess(upstream=command, extra=extra, log_path=tmp / "proxy.log")
    proxy.start(timeout_s=BOUND_S * 2)  # a loaded CI machine starts Python slowly
    try:
        yield Rig(proxy, journal, tokens)
    finally:
        proxy.stop()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def modern(id_: int, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    meta = {jsonrpc.META_PROTOCOL_VERSION: "2026-07-28", jsonrpc.META_CLIENT_CAPABILITIES: {}}
    body = {
        "jsonrpc": "2.0",
        "id": id_,
        "method": method,
        "params": {**params, "_meta": {**meta, **params.get("_meta", {})}},
    }
    headers = {**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": method}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    return body, headers


async def call_tool(rig: Rig, token: str | None, name: str, arguments: dict[str, Any], **meta: Any) -> httpx.Response:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta:
        params["_meta"] = meta
    body, headers = modern(1, "tools/call", params)
    if token is not None:
        headers.update(bearer(token))
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        return await http.post(rig.proxy.url, json=body, headers=headers)


def report(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert result["isError"] is True, result
    return result["_meta"]["io.mcp-recovery-proxy/unresolved"]


def metadata_url(rig: Rig) -> str:
    return f"http://127.0.0.1:{rig.proxy.port}/.well-known/oauth-protected-resource/mcp"


async def auth_failures(rig: Rig) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        page = await http.get(rig.proxy.admin + "/metrics", headers=bearer(ADMIN))
    assert page.status_code == 200
    out: dict[str, float] = {}
    for line in page.text.splitlines():
        if line.startswith("mcp_recovery_auth_failures_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


async def test_requests_without_a_valid_token_get_401_with_a_challenge_naming_the_metadata(rig: Rig) -> None:
    before = await auth_failures(rig)
    body, headers = modern(1, "tools/list", {})
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        none = await http.post(rig.proxy.url, json=body, headers=headers)
        wrong = await http.post(rig.proxy.url, json=body, headers={**headers, **bearer("not-a-token-at-all-1234")})
        basic = await http.post(rig.proxy.url, json=body, headers={**headers, "authorization": "Basic YTpi"})
        get = await http.get(rig.proxy.url, headers={"accept": "text/event-stream", "mcp-session-id": "x"})
    assert none.status_code == 401
    assert none.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata_url(rig)}"'
    assert wrong.status_code == 401
    challenge = wrong.headers["www-authenticate"]
    assert challenge.startswith('Bearer error="invalid_token", error_description="')
    assert challenge.endswith(f'resource_metadata="{metadata_url(rig)}"')
    assert wrong.json()["error"] == "invalid_token"
    assert basic.status_code == 401 and get.status_code == 401
    after = await auth_failures(rig)
    assert after["missing"] - before["missing"] == 3
    assert after["unknown_token"] - before["unknown_token"] == 1


async def test_the_protected_resource_metadata_is_served_at_both_probed_paths(rig: Rig) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
            answer = await http.get(f"http://127.0.0.1:{rig.proxy.port}{path}")
            assert answer.status_code == 200, path
            document = answer.json()
            assert document["resource"] == rig.proxy.url
            assert document["bearer_methods_supported"] == ["header"]
            assert document["scopes_supported"] == ["payments"]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_sdk_client_with_a_token_lists_and_calls_tools(rig: Rig, mode: str) -> None:
    with anyio.fail_after(BOUND_S):
        http = httpx2.AsyncClient(headers=bearer(ALICE), timeout=BOUND_S)
        async with http, Client(streamable_http_client(rig.proxy.url, http_client=http), mode=mode) as client:
            tools = await client.list_tools()
            assert "echo" in {tool.name for tool in tools.tools}
            result = await client.call_tool("echo", {"text": "hello"})
    assert not result.is_error and result.structured_content == {"text": "hello"}


async def test_a_tool_requiring_a_scope_the_token_lacks_gets_403_insufficient_scope(rig: Rig) -> None:
    cid = uuid.uuid4().hex[:12]
    answer = await call_tool(rig, ALICE, "charge", {"account": "a", "amount_cents": 1, "call_id": cid})
    assert answer.status_code == 403
    assert answer.headers["www-authenticate"] == (
        'Bearer error="insufficient_scope", error_description="this tool requires the scopes: payments", '
        f'scope="payments", resource_metadata="{metadata_url(rig)}"'
    )
    assert rig.journal.executions("charge", cid) == 0, "refused before the upstream saw it"


async def test_a_budget_belongs_to_the_principal_that_spent_it(rig: Rig) -> None:
    cid = uuid.uuid4().hex[:12]
    args = {"category": "transient", "retryable": True, "call_id": cid}
    alice = report(await call_tool(rig, ALICE, "always_fail", args))
    assert alice["stopReason"] == "attempts_exhausted" and rig.journal.executions("always_fail", cid) == 2
    assert report(await call_tool(rig, ALICE, "always_fail", args))["stopReason"] == "ledger_exhausted"

    bob = report(await call_tool(rig, BOB, "always_fail", args))
    assert bob["stopReason"] == "attempts_exhausted", "alice's exhausted budget does not refuse bob's call"
    assert rig.journal.executions("always_fail", cid) == 4
    assert bob["operation"]["budgetId"] != alice["operation"]["budgetId"]

    approve_alices = {"io.mcp-recovery-proxy/approveBudget": alice["operation"]["budgetId"]}
    stolen = report(await call_tool(rig, BOB, "always_fail", args, **approve_alices))
    assert stolen["stopReason"] == "ledger_exhausted", "bob cannot approve alice's budget"
    assert rig.journal.executions("always_fail", cid) == 4

    fresh = report(await call_tool(rig, ALICE, "always_fail", args, **approve_alices))
    assert fresh["stopReason"] == "attempts_exhausted"
    assert fresh["operation"]["approvedBudgetId"] == alice["operation"]["budgetId"]
    assert rig.journal.executions("always_fail", cid) == 6
    again = report(await call_tool(rig, ALICE, "always_fail", args, **approve_alices))
    assert again["stopReason"] == "ledger_exhausted", "an approval is single-use"
    assert rig.journal.executions("always_fail", cid) == 6

    log = rig.proxy.log_tail(200_000)
    lines = [line for line in log.splitlines() if "tools/call always_fail" in line and cid not in line]
    assert any("principal=token:alice" in line for line in lines), log[-3000:]
    assert any("principal=token:bob" in line for line in lines), log[-3000:]


async def test_a_2025_session_answers_only_the_principal_that_opened_it(rig: Rig) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        opened = await http.post(rig.proxy.url, json=init, headers={**ACCEPT, **bearer(ALICE)})
        assert opened.status_code == 200, opened.text
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (
            await http.post(rig.proxy.url, json=note, headers={**ACCEPT, **session, **bearer(ALICE)})
        ).status_code == 202
        other = await http.post(rig.proxy.url, json=listing, headers={**ACCEPT, **session, **bearer(BOB)})
        assert other.status_code == 404
        gone = await http.delete(rig.proxy.url, headers={**session, **bearer(BOB)})
        assert gone.status_code == 404
        own = await http.post(rig.proxy.url, json=listing, headers={**ACCEPT, **session, **bearer(ALICE)})
        assert own.status_code == 200 and "echo" in own.text
        assert (await http.delete(rig.proxy.url, headers={**session, **bearer(ALICE)})).status_code == 200


async def test_the_admin_token_guards_metrics_and_policies_but_not_the_probes(rig: Rig) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        for path in ("/metrics", "/policies"):
            refused = await http.get(rig.proxy.admin + path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"] == 'Bearer realm="mcp-recovery-proxy admin"'
            assert (await http.get(rig.proxy.admin + path, headers=bearer(ALICE))).status_code == 401
            assert (await http.get(rig.proxy.admin + path, headers=bearer(ADMIN))).status_code == 200
        for path in ("/healthz", "/readyz"):
            assert (await http.get(rig.proxy.admin + path)).status_code == 200, path
    assert (await auth_failures(rig))["admin"] >= 4


async def wait_for_status(rig: Rig, token: str, status: int) -> None:
    """Poll (bounded) until a request with `token` gets `status`: the reload is asynchronous."""
    body, headers = modern(1, "tools/list", {})
    with anyio.fail_after(BOUND_S):
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            while (  # noqa: ASYNC110 - another process reloads: nothing here to await
                await http.post(rig.proxy.url, json=body, headers={**headers, **bearer(token)})
            ).status_code != status:
                await anyio.sleep(0.05)


async def test_the_tokens_file_is_hot_reloaded_and_a_bad_file_keeps_the_last_good_set(rig: Rig) -> None:
    original = rig.tokens.read_text()
    try:
        rig.tokens.write_text(original + f"carol {CAROL}\n")
        await wait_for_status(rig, CAROL, 200)
        rig.tokens.write_text(f"alice {ALICE}\nthis line is not a name and a token\n")
        with anyio.fail_after(BOUND_S):
            while "tokens file reload (watch) refused" not in rig.proxy.log_tail(200_000):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        body, headers = modern(1, "tools/list", {})
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            for token in (ALICE, BOB, CAROL):  # the last good set: bob and carol are still in it
                answer = await http.post(rig.proxy.url, json=body, headers={**headers, **bearer(token)})
                assert answer.status_code == 200, token
    finally:
        rig.tokens.write_text(original)
    await wait_for_status(rig, CAROL, 401)


async def test_no_token_reaches_the_log_the_metrics_or_the_policies_page(rig: Rig) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        pages = [
            (await http.get(rig.proxy.admin + path, headers=bearer(ADMIN))).text for path in ("/metrics", "/policies")
        ]
    log = rig.proxy.log_tail(10_000_000)
    for where, text in [("log", log), ("metrics", pages[0]), ("policies", pages[1])]:
        for secret in SECRETS:
            assert secret not in text, f"{secret} in the {where}"
    assert "principal" not in pages[0], "no principal metric label"
    assert json.loads(pages[1])["version"]
