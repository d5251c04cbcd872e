"""`--auth passthrough` end to end: the real proxy process in front of an SDK server that does
its own authentication (tests/fixtures/protected_server.py: the SDK's resource-server support, 401
and 403 with `WWW-Authenticate`, RFC 9728 metadata), with raw HTTP and the SDK's own client.

What is checked: the caller's `Authorization` reaches the upstream unchanged on every attempt of
a call (the upstream's journal names the token on each execution) and on every request of a 2025
session, a refreshed token included (same principal, another token); a caller naming another
caller's session (another principal's token, or none) is refused by the upstream and that refusal
reaches it (404, or 401), the session neither moved to it nor lent the owner's credential, also
with both callers' requests on the session at once (the upstream's own journal of every request:
which principal each reached it as); the upstream's 401 and 403 reach the caller as the same HTTP
status with its challenge (`resource_metadata` rewritten to the proxy's public URL), never as a
tool result, never retried; the upstream's metadata is served by the proxy with `resource`
rewritten; principals are keyed hashes (never the token) in the call log; the start is refused
in front of a stdio upstream.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.auth.rig import (
    ACCEPT,
    INIT,
    answer_of,
    answer_the_servers_request,
    bearer,
    open_session,
    protected_server,
    tool_call,
)
from tests.fixtures.helpers import PYTHON, REPO_ROOT, free_port
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0
# The upstream's principal is a token's first 8 characters: FRESH is GOOD refreshed (one user).
GOOD = "good-token-4f1a9c2e7b"
FRESH = "good-tok-refreshed-8d3b6e0a15"
ALICE = "alice-00-token-3c8e5a91"
BOB = "bob-0000-token-7d1f9b24"
WEAK = "weak-token-2c7e9f4b81"
REVOKED = "revoked-token-6a0d3f8c27"
POLICIES = {
    "defaults.yaml": "attempts: 3\ndeadline: 5s\nattempt_timeout: 2s\nbackoff: {initial: 10ms, max: 20ms}\n",
    "hold.yaml": "tools: [hold, ask]\nattempts: 1\ndeadline: 40s\nattempt_timeout: 35s\nidle_timeout: 35s\n",
}


class Rig:
    def __init__(self, proxy: ProxyProcess, upstream: str, journal: Path, tokens: Path) -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.journal = journal
        self.tokens = tokens

    def executions(self, call_id: str) -> list[dict[str, str | None]]:
        if not self.journal.exists():
            return []
        lines = [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]
        return [line for line in lines if line["call"] == call_id]

    def clients(self, call_id: str) -> list[str | None]:
        """Which principal (the token's first 8 characters) each execution of `call_id` ran as."""
        return [line["client"] for line in self.executions(call_id)]

    def tails(self, call_id: str) -> list[str | None]:
        """Which token (its last 4 characters) each execution of `call_id` carried."""
        return [line["tail"] for line in self.executions(call_id)]

    def requests(self) -> list[dict[str, str | None]]:
        """Every request the upstream received, as it arrived: method, principal, JSON-RPC method, tag."""
        path = self.journal.parent / "requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    async def requests_through_delete(self, since: int) -> list[dict[str, str | None]]:
        """The requests the upstream received after the first `since`, once a DELETE is among them.
        The proxy answers a client's DELETE at once and closes the upstream session behind it
        (`Service.close_session`), so the upstream's DELETE can arrive a moment later."""
        await until(lambda: any(r["method"] == "DELETE" for r in self.requests()[since:]), "the upstream's DELETE")
        return self.requests()[since:]

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}/.well-known/oauth-protected-resource/mcp"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("auth-passthrough")
    tokens = tmp / "tokens"
    tokens.write_text(
        f"{GOOD} mcp:read\n{FRESH} mcp:read\n{WEAK} -\n{REVOKED} mcp:read\n{ALICE} mcp:read\n{BOB} mcp:read\n"
    )
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
        before = len(rig.requests())
        await http.delete(rig.proxy.url, headers={**session, **bearer(FRESH)})
    # one principal throughout (a refresh, not another user), each request with its own token
    assert rig.clients(first) == [GOOD[:8]] and rig.clients(second) == [GOOD[:8]]
    assert rig.tails(first) == [GOOD[-4:]] and rig.tails(second) == [FRESH[-4:]]
    closing = [r for r in await rig.requests_through_delete(before) if r["method"] == "DELETE"]
    assert [r["client"] for r in closing] == [GOOD[:8]], closing
    log = rig.proxy.log_tail(1_000_000)
    principals = {line.split("principal=")[1].split()[0] for line in log.splitlines() if "principal=" in line}
    # keyed hashes, never a token (other tests of the module also call without one: anonymous)
    assert principals and all(p.startswith("passthrough:") or p == "anonymous" for p in principals), principals
    for token in (GOOD, FRESH, WEAK, REVOKED, ALICE, BOB):
        assert token not in log


async def whoami(
    http: httpx.AsyncClient, rig: Rig, session: dict[str, str], token: str | None, tag: str, id_: int
) -> httpx.Response:
    headers = {**ACCEPT, **session, **(bearer(token) if token is not None else {})}
    return await http.post(rig.proxy.url, json=tool_call("whoami", {"tag": tag}, id_), headers=headers)


def whoami_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(answer_of(response)["result"]["content"][0]["text"])


async def test_a_caller_naming_another_callers_session_is_refused_and_the_session_stays_the_owners(
    rig: Rig,
) -> None:
    tag = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, ALICE)
        assert whoami_text(await whoami(http, rig, session, ALICE, f"{tag}-a1", 2)) == f"alice-00:{tag}-a1"
        before = len(rig.requests())
        stolen = await whoami(http, rig, session, BOB, f"{tag}-b", 3)
        # The upstream's refusal reaches bob as it answered it (404, "no such session" for him),
        # once: not a session to re-establish under his credential, nor a call to retry.
        assert stolen.status_code == 404, stolen.text
        assert stolen.json()["error"]["message"] == "Session not found" and stolen.json()["id"] == 3
        listing = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
        listed = await http.post(rig.proxy.url, json=listing, headers={**ACCEPT, **session, **bearer(BOB)})
        assert listed.status_code == 404 and listed.json()["id"] == 4, listed.text  # the relay's path too
        # The session is still alice's, at the upstream: her next call reaches it as her.
        assert whoami_text(await whoami(http, rig, session, ALICE, f"{tag}-a2", 5)) == f"alice-00:{tag}-a2"
        await http.delete(rig.proxy.url, headers={**session, **bearer(ALICE)})
    seen = await rig.requests_through_delete(before)
    bobs = [(r["method"], r["rpc"]) for r in seen if r["client"] == BOB[:8]]
    assert bobs == [("POST", "tools/call"), ("POST", "tools/list")], seen  # never an initialize as bob
    assert {r["client"] for r in seen} == {ALICE[:8], BOB[:8]}, seen
    assert rig.clients(f"{tag}-b") == [] and rig.clients(f"{tag}-a2") == [ALICE[:8]]
    assert [r["client"] for r in seen if r["method"] == "DELETE"] == [ALICE[:8]], seen


async def test_a_request_without_a_credential_on_a_session_is_not_lent_the_owners(rig: Rig) -> None:
    tag = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, ALICE)
        before = len(rig.requests())
        anonymous = await whoami(http, rig, session, None, f"{tag}-x", 2)
        assert anonymous.status_code == 401, anonymous.text  # the upstream's own 401, relayed
        assert f'resource_metadata="{rig.metadata_url}"' in anonymous.headers["www-authenticate"]
        assert whoami_text(await whoami(http, rig, session, ALICE, f"{tag}-a", 3)) == f"alice-00:{tag}-a"
        await http.delete(rig.proxy.url, headers={**session, **bearer(ALICE)})
    seen = await rig.requests_through_delete(before)
    assert [(r["client"], r["tag"]) for r in seen if r["rpc"] == "tools/call"] == [
        (None, f"{tag}-x"),
        ("alice-00", f"{tag}-a"),
    ]
    assert rig.clients(f"{tag}-x") == []


async def test_two_principals_at_once_on_one_session_each_request_carries_its_own_token(rig: Rig) -> None:
    tag = uuid.uuid4().hex[:8]
    rounds = 12
    with anyio.fail_after(BOUND_S * 2):
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            session = await open_session(http, rig.proxy.url, ALICE)
            before = len(rig.requests())
            calls = []
            for i in range(rounds):  # interleaved, all in flight together
                calls.append(whoami(http, rig, session, ALICE, f"{tag}-alice-{i}", 100 + 2 * i))
                calls.append(whoami(http, rig, session, BOB, f"{tag}-bob-{i}", 101 + 2 * i))
            answers = await asyncio.gather(*calls)
            last = await whoami(http, rig, session, ALICE, f"{tag}-alice-last", 99)
            await http.delete(rig.proxy.url, headers={**session, **bearer(ALICE)})
    alices, bobs = answers[0::2], answers[1::2]
    assert [whoami_text(a) for a in alices] == [f"alice-00:{tag}-alice-{i}" for i in range(rounds)]
    assert [b.status_code for b in bobs] == [404] * rounds, [b.text for b in bobs]
    assert whoami_text(last) == f"alice-00:{tag}-alice-last"
    seen = rig.requests()[before:]
    # At the upstream: each call went out with its own caller's token, never the other's.
    went = [(r["tag"], r["client"]) for r in seen if r["rpc"] == "tools/call"]
    assert sorted(went) == sorted(
        [(f"{tag}-alice-{i}", ALICE[:8]) for i in range(rounds)]
        + [(f"{tag}-bob-{i}", BOB[:8]) for i in range(rounds)]
        + [(f"{tag}-alice-last", ALICE[:8])]
    ), went
    # bob's reached it only as refused calls (and the engine's tool listing for them while the
    # catalog lacked the tool), never as an initialize re-establishing the session for him
    assert {r["rpc"] for r in seen if r["client"] == BOB[:8]} <= {"tools/call", "tools/list"}, seen
    assert not [r for r in seen if r["client"] not in (ALICE[:8], BOB[:8])], seen
    for i in range(rounds):
        assert rig.clients(f"{tag}-alice-{i}") == [ALICE[:8]] and rig.clients(f"{tag}-bob-{i}") == []


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


async def until(condition: Callable[[], object], what: str) -> None:
    """Wait (bounded) for another process to do something a test can only see in a file."""
    with anyio.move_on_after(BOUND_S):
        while not condition():  # noqa: ASYNC110 - the other process writes a file, no event to await
            await anyio.sleep(0.05)
        return
    raise AssertionError(f"not within {BOUND_S} s: {what}")


async def test_another_credential_cannot_listen_on_answer_for_cancel_on_or_delete_a_session(rig: Rig) -> None:
    """What the proxy itself does for a session without a request the upstream judges (the
    listen stream, an answer to the server's request, a cancellation, DELETE) needs a credential
    the upstream accepts on that session: bob's gets the upstream's 404, none its 401. Before, any
    caller knowing the session id could read its listen stream (and resume its answers), answer
    the server's requests in its name, cancel its calls and end it."""
    tag = uuid.uuid4().hex[:8]
    url = rig.proxy.url
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, url, ALICE)
        before = len(rig.requests())
        listen = {**session, "accept": "text/event-stream"}
        answer_ = {"jsonrpc": "2.0", "id": "proxy-1", "result": {}}
        for token, status in ((BOB, 404), (None, 401)):
            credential = bearer(token) if token is not None else {}
            async with http.stream("GET", url, headers={**listen, **credential}) as got:
                assert got.status_code == status, token
            answered = await http.post(url, json=answer_, headers={**ACCEPT, **session, **credential})
            assert answered.status_code == status, answered.text
            deleted = await http.delete(url, headers={**session, **credential})
            assert deleted.status_code == status, deleted.text

        # bob's cancellation of alice's call in flight is refused; her call goes on
        held = asyncio.create_task(
            http.post(
                url, json=tool_call("hold", {"tag": f"{tag}-h"}, 7), headers={**ACCEPT, **session, **bearer(ALICE)}
            )
        )
        try:
            await until(lambda: rig.clients(f"{tag}-h") == [ALICE[:8]], "alice's call runs at the upstream")
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
            refused = await http.post(url, json=cancel, headers={**ACCEPT, **session, **bearer(BOB)})
            assert refused.status_code == 404, refused.text
        finally:
            (rig.journal.parent / f"release-{tag}-h").touch()
        assert whoami_text(await held) == f"held:{tag}-h"

        # alice's own credential, and her refreshed one once the upstream takes it, do all that
        async with http.stream("GET", url, headers={**listen, **bearer(ALICE)}) as mine:
            assert mine.status_code == 200
        assert (await http.post(url, json=answer_, headers={**ACCEPT, **session, **bearer(ALICE)})).status_code == 202
        closed = await http.delete(url, headers={**session, **bearer(ALICE)})
        assert closed.status_code == 200, closed.text
    seen = rig.requests()[before:]
    assert {r["rpc"] for r in seen if r["client"] in (BOB[:8], None)} == {"ping"}, seen  # asked, refused
    assert rig.clients(f"{tag}-h") == [ALICE[:8]]


async def test_an_answer_to_the_servers_request_from_another_credential_is_refused_and_the_owners_counts(
    rig: Rig,
) -> None:
    """The server asks alice a question mid-call (`elicitation/create`, on her call's stream);
    bob, then a caller without a credential, answer it on her session first. Each gets the
    upstream's refusal (404, 401), and the proxy keeps its record of the request, so alice's own
    answer is the one the server gets."""
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        before = len(rig.requests())
        refused, result = await answer_the_servers_request(
            http, rig.proxy.url, ALICE, [(BOB, 404), (None, 401)], BOUND_S
        )
    assert result == "from the owner"
    assert refused[0].json()["error"]["message"] == "Session not found"
    assert f'resource_metadata="{rig.metadata_url}"' in refused[1].headers["www-authenticate"]
    seen = await rig.requests_through_delete(before)
    assert [(r["client"], r["rpc"]) for r in seen if r["client"] != ALICE[:8]] == [(BOB[:8], "ping"), (None, "ping")]
    answers = [r["client"] for r in seen if r["method"] == "POST" and r["rpc"] is None]
    assert answers == [ALICE[:8]], seen  # one answer upstream: alice's
