"""`--auth passthrough` end to end: the real proxy process in front of an SDK server that does
its own authentication (tests/fixtures/protected_server.py: the SDK's resource-server support, 401
and 403 with `WWW-Authenticate`, RFC 9728 metadata), with raw HTTP and the SDK's own client.

What is checked: the caller's `Authorization` reaches the upstream unchanged on every attempt of
a call (the upstream's journal names the token on each execution) and on every request of a 2025
session, a refreshed token included; the upstream's 401 and 403 reach the caller as the same HTTP
status with its challenge (`resource_metadata` rewritten to the proxy's public URL), never as a
tool result, never retried; the upstream's metadata is served by the proxy with `resource`
rewritten; principals are keyed hashes (never the token) in the call log; the start is refused
in front of a stdio upstream.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.auth.rig import ACCEPT, INIT, bearer, open_session, protected_server, tool_call
from tests.fixtures.helpers import PYTHON, REPO_ROOT, free_port
from tests.proxy_process import ProxyProcess

pytestmark = pytest.mark.anyio
BOUND_S = 30.0
GOOD = "good-token-4f1a9c2e7b"
FRESH = "fresh-token-8d3b6e0a15"
WEAK = "weak-token-2c7e9f4b81"
REVOKED = "revoked-token-6a0d3f8c27"
POLICIES = {"defaults.yaml": "attempts: 3\ndeadline: 5s\nattempt_timeout: 2s\nbackoff: {initial: 10ms, max: 20ms}\n"}


class Rig:
    def __init__(self, proxy: ProxyProcess, upstream: str, journal: Path, tokens: Path) -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.journal = journal
        self.tokens = tokens

    def clients(self, call_id: str) -> list[str | None]:
        """Which token (its first 8 characters) each execution of `call_id` carried."""
        if not self.journal.exists():
            return []
        lines = [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]
        return [line["client"] for line in lines if line["call"] == call_id]

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}/.well-known/oauth-protected-resource/mcp"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("auth-passthrough")
    tokens = tmp / "tokens"
    tokens.write_text(f"{GOOD} mcp:read\n{FRESH} mcp:read\n{WEAK} -\n{REVOKED} mcp:read\n")
    journal = tmp / "journal.jsonl"
    with protected_server("protected_server.py", tokens, journal, bound_s=BOUND_S) as port:
        policies = tmp / "policies"
        policies.mkdir()
        for name, text in POLICIES.items():
            (policies / name).write_text(text)
        proxy = ProxyProcess(upstream_url=f"http://127.0.0.1:{port}/mcp", log_path=tmp / "proxy.log")
        proxy.port = free_port()
        public = f"http://127.0.0.1:{proxy.port}/mcp"
        proxy.extra = [
            "--policies",
            str(policies),
            "--auth",
            "passthrough",
            "--public-url",
            public,
            "--call-log",
            "all",
        ]
        proxy.start(timeout_s=BOUND_S * 2)  # a loaded CI machine starts Python slowly
        try:
            yield Rig(proxy, f"http://127.0.0.1:{port}", journal, tokens)
        finally:
            proxy.stop()


async def test_without_a_token_the_upstreams_401_reaches_the_caller_pointing_at_the_proxys_metadata(
    rig: Rig,
) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        refused = await http.post(rig.proxy.url, json=INIT, headers=ACCEPT)
    assert refused.status_code == 401
    challenge = refused.headers["www-authenticate"]
    assert challenge == (
        'Bearer error="invalid_token", error_description="Authentication required", '
        f'resource_metadata="{rig.metadata_url}"'
    )
    assert refused.json()["error"] == "invalid_token"


async def test_the_upstreams_metadata_is_served_at_both_paths_with_the_proxys_resource(rig: Rig) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        direct = (await http.get(f"{rig.upstream}/.well-known/oauth-protected-resource/mcp")).json()
        for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
            answer = await http.get(f"http://127.0.0.1:{rig.proxy.port}{path}")
            assert answer.status_code == 200, path
            assert answer.json() == {**direct, "resource": rig.proxy.url}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_callers_token_reaches_the_upstream_on_every_attempt(rig: Rig, mode: str) -> None:
    cid = uuid.uuid4().hex[:12]
    with anyio.fail_after(BOUND_S):
        http = httpx2.AsyncClient(headers=bearer(GOOD), timeout=BOUND_S)
        async with http, Client(streamable_http_client(rig.proxy.url, http_client=http), mode=mode) as client:
            await client.list_tools()
            result = await client.call_tool("flaky", {"call_id": cid, "fail_times": 2})
    assert not result.is_error, result
    assert result.meta is not None and result.meta["io.mcp-recovery-proxy/attempts"] == 3
    assert rig.clients(cid) == [GOOD[:8]] * 3


async def test_a_token_refreshed_mid_session_is_the_one_the_upstream_gets(rig: Rig) -> None:
    first, second = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, GOOD)
        one = await http.post(
            rig.proxy.url,
            json=tool_call("echo", {"text": "a", "call_id": first}),
            headers={**ACCEPT, **session, **bearer(GOOD)},
        )
        two = await http.post(
            rig.proxy.url,
            json=tool_call("echo", {"text": "b", "call_id": second}, 3),
            headers={**ACCEPT, **session, **bearer(FRESH)},
        )
        assert one.status_code == 200 and two.status_code == 200, (one.text, two.text)
        await http.delete(rig.proxy.url, headers={**session, **bearer(FRESH)})
    assert rig.clients(first) == [GOOD[:8]] and rig.clients(second) == [FRESH[:8]]
    log = rig.proxy.log_tail(1_000_000)
    principals = {line.split("principal=")[1].split()[0] for line in log.splitlines() if "principal=" in line}
    assert principals and all(p.startswith("passthrough:") for p in principals), principals
    for token in (GOOD, FRESH, WEAK, REVOKED):
        assert token not in log


async def test_a_tool_call_the_upstream_refuses_is_that_http_status_never_a_tool_result_nor_retried(
    rig: Rig,
) -> None:
    cid = uuid.uuid4().hex[:12]
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, REVOKED)
        original = rig.tokens.read_text()
        rig.tokens.write_text(original.replace(f"{REVOKED} mcp:read\n", ""))  # revoked mid-session
        try:
            refused = await http.post(
                rig.proxy.url,
                json=tool_call("flaky", {"call_id": cid}),
                headers={**ACCEPT, **session, **bearer(REVOKED)},
            )
        finally:
            rig.tokens.write_text(original)
        weak = await http.post(rig.proxy.url, json=INIT, headers={**ACCEPT, **bearer(WEAK)})
    assert refused.status_code == 401, refused.text
    assert f'resource_metadata="{rig.metadata_url}"' in refused.headers["www-authenticate"]
    assert rig.clients(cid) == [], "refused before executing, and not retried"
    assert weak.status_code == 403
    assert weak.headers["www-authenticate"] == (
        'Bearer error="insufficient_scope", error_description="Required scope: mcp:read", '
        f'resource_metadata="{rig.metadata_url}"'
    )
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        metrics = (await http.get(rig.proxy.admin + "/metrics")).text
    counts = {
        line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("mcp_recovery_auth_failures_total{")
    }
    assert counts["upstream_401"] >= 1 and counts["upstream_403"] >= 1


def test_passthrough_is_refused_at_start_in_front_of_a_stdio_upstream(tmp_path: Path) -> None:
    argv = [PYTHON, "-m", "proxy", "serve", "--auth", "passthrough", "--public-url", "http://127.0.0.1:1/mcp"]
    done = subprocess.run([*argv, "--", PYTHON, "-c", "pass"], cwd=REPO_ROOT, capture_output=True, timeout=BOUND_S)
    assert done.returncode == 2
    assert b"--auth passthrough needs a network upstream" in done.stderr
