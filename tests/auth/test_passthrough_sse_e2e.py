"""`--auth passthrough` in front of a legacy HTTP+SSE upstream that authenticates its callers (the
SDK's own resource-server support on its SSE transport: tests/fixtures/protected_sse_server.py,
which journals the credential of every GET and POST it receives).

What is checked, through the real proxy process with the SDK's client and raw HTTP: each caller's
session opens its own upstream stream with that caller's credential, and every POST of the
session carries it (two callers with different tokens at once, each answered as itself: the
server names the credential that opened the stream); a caller without a credential gets the
upstream's 401 with the challenge pointing at the proxy's metadata, which the proxy serves with
its own `resource`; a caller naming another caller's session gets the upstream's 404 after one
POST (a permission refusal, not a session to re-establish or a call to retry), without the stream
being moved to its credential; no token reaches the proxy's log. Before this, the proxy refused to start
with `--auth passthrough` in front of an SSE upstream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from tests.fixtures.helpers import free_port
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0
ALICE = "alice-sse-token-3e9c1a7f52"
BOB = "bob-sse-token-8b2d6f0e41"


class Rig:
    def __init__(self, proxy: ProxyProcess, upstream: str, journal: Path) -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.journal = journal

    def requests(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}/.well-known/oauth-protected-resource/mcp"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("auth-passthrough-sse")
    tokens = tmp / "tokens"
    tokens.write_text(f"{ALICE} alice\n{BOB} bob\n")
    journal = tmp / "journal.jsonl"
    with protected_server("protected_sse_server.py", tokens, journal, bound_s=BOUND_S) as port:
        proxy = ProxyProcess(upstream_url=f"sse+http://127.0.0.1:{port}/sse", log_path=tmp / "proxy.log")
        proxy.port = free_port()
        public = f"http://127.0.0.1:{proxy.port}/mcp"
        proxy.extra = ["--auth", "passthrough", "--public-url", public, "--call-log", "all"]
        proxy.start(timeout_s=BOUND_S * 2)
        try:
            yield Rig(proxy, f"http://127.0.0.1:{port}", journal)
        finally:
            proxy.stop()


async def test_without_a_token_the_sse_upstreams_401_reaches_the_caller_pointing_at_the_proxys_metadata(
    rig: Rig,
) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        refused = await http.post(rig.proxy.url, json=INIT, headers=ACCEPT)
        assert refused.status_code == 401, refused.text
        assert f'resource_metadata="{rig.metadata_url}"' in refused.headers["www-authenticate"]
        direct = (await http.get(f"{rig.upstream}/.well-known/oauth-protected-resource/sse")).json()
        for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
            served = await http.get(f"http://127.0.0.1:{rig.proxy.port}{path}")
            assert served.status_code == 200, path
            assert served.json() == {**direct, "resource": rig.proxy.url}
    assert not [r for r in rig.requests() if r["method"] == "POST" and r["client"] is None]


async def test_two_callers_each_get_a_stream_of_their_own_credential_and_their_own_answers(rig: Rig) -> None:
    async def session(token: str, tags: list[str]) -> list[str]:
        http = httpx2.AsyncClient(headers=bearer(token), timeout=BOUND_S)
        async with http, Client(streamable_http_client(rig.proxy.url, http_client=http), mode="legacy") as client:
            await client.list_tools()
            out = []
            for tag in tags:
                result = await client.call_tool("whoami", {"tag": tag})
                assert not result.is_error, result
                out.append(result.content[0].text)  # type: ignore[union-attr]
            return out

    before = len(rig.requests())
    answers: dict[str, list[str]] = {}

    async def run(name: str, token: str) -> None:
        answers[name] = await session(token, [f"{name}-{i}" for i in range(5)])

    with anyio.fail_after(BOUND_S * 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "alice", ALICE)
            tg.start_soon(run, "bob", BOB)
    assert answers == {name: [f"{name}:{name}-{i}" for i in range(5)] for name in ("alice", "bob")}
    seen = rig.requests()[before:]
    streams = sorted(r["client"] for r in seen if r["method"] == "GET" and r["path"] == "/sse")
    assert streams == ["alice", "bob"], seen  # one stream per session, each with its caller's credential
    posts = [r["client"] for r in seen if r["method"] == "POST"]
    # initialize, initialized, tools/list, 5 calls each (the SDK client may list tools again)
    assert posts.count("alice") >= 8 and posts.count("bob") >= 8, seen
    assert set(posts) == {"alice", "bob"}, seen  # never a POST without a credential, nor a wrong one
    log = rig.proxy.log_tail(1_000_000)
    assert ALICE not in log and BOB not in log


async def test_a_caller_naming_another_callers_session_is_refused_and_the_stream_stays_the_owners(
    rig: Rig,
) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, ALICE)
        before = len(rig.requests())

        stolen = await http.post(
            rig.proxy.url, json=tool_call("whoami", {"tag": "b"}, 2), headers={**ACCEPT, **session, **bearer(BOB)}
        )
        text = json.dumps(answer_of(stolen)) if stolen.status_code == 200 else stolen.text
        assert "alice:" not in text and "bob:" not in text, text  # not answered from either identity
        # The upstream's refusal reaches bob as it answered it (404, "no such session" for him,
        # as the proxy's own refusal in jwt/tokens), once: a refusal is not retried.
        assert stolen.status_code == 404, text
        assert stolen.json()["error"]["message"] == "Session not found" and stolen.json()["id"] == 2
        bobs = [r for r in rig.requests()[before:] if r["client"] == "bob"]
        assert [(r["method"], r["path"]) for r in bobs] == [("POST", "/messages/")], bobs
        # Any other request of his is refused the same way (the relay's path, not the engine's).
        listing = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
        listed = await http.post(rig.proxy.url, json=listing, headers={**ACCEPT, **session, **bearer(BOB)})
        assert listed.status_code == 404 and listed.json()["id"] == 4, listed.text
        mine = await http.post(
            rig.proxy.url, json=tool_call("whoami", {"tag": "a"}, 3), headers={**ACCEPT, **session, **bearer(ALICE)}
        )
        assert mine.status_code == 200, mine.text
        assert answer_of(mine)["result"]["content"][0]["text"] == "alice:a"
        await http.delete(rig.proxy.url, headers={**session, **bearer(ALICE)})
    seen = rig.requests()[before:]
    assert not [r for r in seen if r["method"] == "GET" and r["client"] == "bob"], seen  # the stream never moved


async def test_a_request_without_a_credential_on_a_session_is_not_lent_the_owners(rig: Rig) -> None:
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, ALICE)
        before = len(rig.requests())
        anonymous = await http.post(
            rig.proxy.url, json=tool_call("whoami", {"tag": "x"}, 2), headers={**ACCEPT, **session}
        )
        assert anonymous.status_code == 401, anonymous.text  # the upstream's own 401, relayed
        assert f'resource_metadata="{rig.metadata_url}"' in anonymous.headers["www-authenticate"]
        mine = await http.post(
            rig.proxy.url, json=tool_call("whoami", {"tag": "a"}, 3), headers={**ACCEPT, **session, **bearer(ALICE)}
        )
        assert answer_of(mine)["result"]["content"][0]["text"] == "alice:a"
    posts = [r["client"] for r in rig.requests()[before:] if r["method"] == "POST"]
    # it went without one, as it came (and the listing the engine made for it too), then alice's
    mine_from = posts.index("alice")
    assert set(posts[:mine_from]) == {None} and set(posts[mine_from:]) == {"alice"}, posts


async def test_another_credential_cannot_listen_on_or_delete_a_session(rig: Rig) -> None:
    """The proxy's own acts on a session (its listen stream, DELETE) need a credential the
    upstream accepts on it: bob's is put to the upstream (a ping on the session) and refused."""
    url = rig.proxy.url
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, url, ALICE)
        listen = {**session, "accept": "text/event-stream"}
        async with http.stream("GET", url, headers={**listen, **bearer(BOB)}) as got:
            assert got.status_code == 404
        deleted = await http.delete(url, headers={**session, **bearer(BOB)})
        assert deleted.status_code == 404, deleted.text
        mine = await http.post(
            url, json=tool_call("whoami", {"tag": "a"}, 2), headers={**ACCEPT, **session, **bearer(ALICE)}
        )
        assert answer_of(mine)["result"]["content"][0]["text"] == "alice:a"
        assert (await http.delete(url, headers={**session, **bearer(ALICE)})).status_code == 200


async def test_a_notification_on_another_callers_session_is_refused_404_and_goes_no_further(rig: Rig) -> None:
    """The 2025 Streamable HTTP spec: a server that cannot accept a notification answers an HTTP
    error status. The upstream refused bob's notification on alice's session (its one POST), and
    the proxy answered him 202 all the same."""
    note = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, ALICE)
        before = len(rig.requests())
        refused = await http.post(rig.proxy.url, json=note, headers={**ACCEPT, **session, **bearer(BOB)})
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["message"] == "Session not found"
        # One POST upstream, which the server refused (it never processed it); not sent again,
        # with alice's credential or on a stream reopened with bob's.
        seen = rig.requests()[before:]
        assert [(r["method"], r["client"], r["rpc"]) for r in seen] == [
            ("POST", "bob", "notifications/roots/list_changed")
        ], seen
        mine = await http.post(rig.proxy.url, json=note, headers={**ACCEPT, **session, **bearer(ALICE)})
        assert mine.status_code == 202, mine.text
        call = await http.post(
            rig.proxy.url, json=tool_call("whoami", {"tag": "a"}, 3), headers={**ACCEPT, **session, **bearer(ALICE)}
        )
        assert answer_of(call)["result"]["content"][0]["text"] == "alice:a"
        await http.delete(rig.proxy.url, headers={**session, **bearer(ALICE)})
    assert not [r for r in rig.requests()[before:] if r["method"] == "GET" and r["client"] == "bob"]


async def test_a_credential_refused_on_the_session_is_not_what_its_own_messages_carry_next(rig: Rig) -> None:
    """The link sends its own messages (here: the cancellation of alice's call in flight) with the
    session's latest credential. Bob's refused request made his the latest, so alice's
    cancellation went upstream with bob's token, was refused in turn, and her call ran on."""
    journal = Journal(rig.journal)
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, rig.proxy.url, ALICE)
        alice = {**ACCEPT, **session, **bearer(ALICE)}
        before = len(rig.requests())

        def posted(rpc: str) -> list[dict[str, Any]]:
            return [r for r in journal.all()[before:] if r["method"] == "POST" and r.get("rpc") == rpc]

        async def hold() -> None:
            await http.post(rig.proxy.url, json=tool_call("hold", {"seconds": 60}, 7), headers=alice)

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            running = [{"method": "TOOL", "path": "hold", "client": "alice"}]
            await journal.await_for(
                lambda j: [r for r in j.all()[before:] if r["method"] == "TOOL"] == running,
                timeout_s=BOUND_S,
                what="the call running upstream",
            )
            listing = {"jsonrpc": "2.0", "id": 8, "method": "tools/list"}
            stolen = await http.post(rig.proxy.url, json=listing, headers={**ACCEPT, **session, **bearer(BOB)})
            assert stolen.status_code == 404, stolen.text
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
            assert (await http.post(rig.proxy.url, json=cancel, headers=alice)).status_code == 202
            sent = await journal.await_for(
                lambda _: posted("notifications/cancelled"), timeout_s=BOUND_S, what="the cancellation upstream"
            )
            tg.cancel_scope.cancel()  # alice's POST of the call: ended by the proxy, or cut here
        assert [r["client"] for r in sent] == ["alice"], sent
        await http.delete(rig.proxy.url, headers={**session, **bearer(ALICE)})


async def test_an_answer_to_the_servers_request_from_another_credential_is_refused_and_the_owners_counts(
    rig: Rig,
) -> None:
    """The server asks alice a question mid-call (`elicitation/create`); bob, then a caller
    without a credential, post an answer to it on her session. Each gets the upstream's refusal
    (404, 401) and their answer goes no further: the proxy's record of the request stays, so
    alice's own answer, posted after theirs, is the one the server gets (the last session's
    note feared a 202 that used the record up, over this transport)."""
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        before = len(rig.requests())
        refused, result = await answer_the_servers_request(
            http, rig.proxy.url, ALICE, [(BOB, 404), (None, 401)], BOUND_S
        )
    assert result == "from the owner"
    assert refused[0].json()["error"]["message"] == "Session not found"
    assert f'resource_metadata="{rig.metadata_url}"' in refused[1].headers["www-authenticate"]
    seen = rig.requests()[before:]
    # bob and the anonymous caller reached the upstream only as the pings that asked about them
    assert [(r["client"], r.get("rpc")) for r in seen if r["client"] != "alice"] == [("bob", "ping"), (None, "ping")]
    answers = [r["client"] for r in seen if r["method"] == "POST" and r.get("rpc") is None]
    assert answers == ["alice"], seen  # one answer upstream: alice's
