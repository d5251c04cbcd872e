"""`--auth passthrough`: a caller spraying made-up credentials at a known session id does not
turn each request into an upstream `ping` (proxy/auth/vouch.py).

The real proxy process in front of the SDK's server with its own auth
(tests/fixtures/protected_server.py, which journals every request it receives with the
principal it carried: `requests.jsonl`), started with `--vouch-pings-burst 3
--vouch-pings-per-s 0.001` (one more ping per 1000 s after the burst, so the count of pings does
not depend on how fast the test runs). What is checked, in the upstream's own journal: a refused
credential repeated (one after another, and all at once) costs one ping; distinct made-up
credentials cost at most the burst, and every one beyond it gets 429 with `Retry-After`; the
owner's accepted credential costs none and is never limited, even once the budget is spent.
Before, every such request was one ping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.auth.rig import ACCEPT, bearer, open_session, protected_server
from tests.fixtures.helpers import free_port
from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
BOUND_S = 30.0
ALICE = "alice-00-token-5b7d1e93"
BOB = "bob-0000-token-0c4a8f62"
BURST = 3


class Rig:
    def __init__(self, proxy: ProxyProcess, requests: Path) -> None:
        self.proxy = proxy
        self.journal = Journal(requests)

    def requests(self) -> list[dict[str, Any]]:
        return self.journal.all()

    def pings(self, since: int) -> list[str | None]:
        """Who each `ping` the upstream received after the first `since` requests carried."""
        return [r["client"] for r in self.requests()[since:] if r["rpc"] == "ping"]

    async def refused_for_rate(self) -> float:
        async with httpx.AsyncClient(timeout=BOUND_S) as http:
            metrics = (await http.get(self.proxy.admin + "/metrics")).text
        wanted = 'mcp_recovery_http_refused_total{reason="vouch_rate"}'
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(wanted))


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("auth-vouch")
    tokens = tmp / "tokens"
    tokens.write_text(f"{ALICE} mcp:read\n{BOB} mcp:read\n")
    journal = tmp / "journal.jsonl"
    with protected_server("protected_server.py", tokens, journal, bound_s=BOUND_S) as port:
        proxy = ProxyProcess(upstream_url=f"http://127.0.0.1:{port}/mcp", log_path=tmp / "proxy.log")
        proxy.port = free_port()
        proxy.extra = [
            "--auth",
            "passthrough",
            "--public-url",
            f"http://127.0.0.1:{proxy.port}/mcp",
            "--vouch-pings-burst",
            str(BURST),
            "--vouch-pings-per-s",
            "0.001",
        ]
        proxy.start(timeout_s=BOUND_S * 2)
        try:
            yield Rig(proxy, tmp / "requests.jsonl")
        finally:
            proxy.stop()


def made_up() -> str:
    return f"made-up-{uuid.uuid4().hex}"


async def listen(http: httpx.AsyncClient, url: str, session: dict[str, str], token: str | None) -> httpx.Response:
    """A GET of the session's listen stream with `token` (None: no credential); its response,
    closed at once (only the status and headers matter here)."""
    headers = {**session, "accept": "text/event-stream", **(bearer(token) if token is not None else {})}
    async with http.stream("GET", url, headers=headers) as response:
        return response


async def test_a_refused_credential_repeated_costs_one_ping_and_gets_the_same_answer(rig: Rig) -> None:
    url = rig.proxy.url
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, url, ALICE)
        before = len(rig.requests())
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
        for _ in range(4):  # bob: the listen stream, a cancellation, DELETE, over and over
            assert (await listen(http, url, session, BOB)).status_code == 404
            refused = await http.post(url, json=cancel, headers={**ACCEPT, **session, **bearer(BOB)})
            assert refused.status_code == 404 and refused.json()["error"]["message"] == "Session not found"
            assert (await http.delete(url, headers={**session, **bearer(BOB)})).status_code == 404
        anonymous = [await listen(http, url, session, None) for _ in range(4)]
        assert [a.status_code for a in anonymous] == [401] * 4
        # each repeat carries the upstream's challenge, pointed at the proxy's metadata
        assert len({a.headers["www-authenticate"] for a in anonymous}) == 1
        assert "resource_metadata=" in anonymous[0].headers["www-authenticate"]
        assert f":{rig.proxy.port}/" in anonymous[0].headers["www-authenticate"]
        # a made-up token sent twelve times at once: one ping, twelve identical refusals
        token = made_up()
        with anyio.fail_after(BOUND_S):
            at_once = await asyncio.gather(*(listen(http, url, session, token) for _ in range(12)))
        assert [a.status_code for a in at_once] == [401] * 12
        assert rig.pings(before) == ["bob-0000", None, "?"]
        # alice's own credential, which the upstream accepted, asks nothing
        assert (await listen(http, url, session, ALICE)).status_code == 200
        assert (await http.delete(url, headers={**session, **bearer(ALICE)})).status_code == 200
    assert rig.pings(before) == ["bob-0000", None, "?"]
    assert ALICE not in rig.proxy.log_tail(1_000_000) and token not in rig.proxy.log_tail(1_000_000)


async def test_distinct_made_up_credentials_cost_at_most_the_burst_then_429_and_the_owner_is_not_limited(
    rig: Rig,
) -> None:
    url = rig.proxy.url
    sprayed = 12
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        session = await open_session(http, url, ALICE)
        before, limited_before = len(rig.requests()), await rig.refused_for_rate()
        answers = [await listen(http, url, session, made_up()) for _ in range(sprayed)]
        assert [a.status_code for a in answers] == [401] * BURST + [429] * (sprayed - BURST)
        for answer in answers[BURST:]:
            assert int(answer.headers["retry-after"]) >= 1
        assert len(rig.pings(before)) == BURST and set(rig.pings(before)) == {"?"}
        assert await rig.refused_for_rate() - limited_before == sprayed - BURST
        # the session's budget is spent, yet its owner is served as before, asking nothing
        mine = {**ACCEPT, **session, **bearer(ALICE)}
        listing = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=mine)
        assert listing.status_code == 200, listing.text
        assert (await listen(http, url, session, ALICE)).status_code == 200
        assert (await http.delete(url, headers={**session, **bearer(ALICE)})).status_code == 200
    assert len(rig.pings(before)) == BURST


async def test_another_sessions_budget_is_its_own(rig: Rig) -> None:
    """The budget is per session: a spray at one session does not refuse bob's own question about
    another (his first on it gets the upstream's verdict, not 429)."""
    url = rig.proxy.url
    async with httpx.AsyncClient(timeout=BOUND_S) as http:
        sprayed = await open_session(http, url, ALICE)
        for _ in range(BURST + 2):
            await listen(http, url, sprayed, made_up())
        other = await open_session(http, url, ALICE)
        assert (await listen(http, url, other, BOB)).status_code == 404
        for session in (sprayed, other):
            assert (await http.delete(url, headers={**session, **bearer(ALICE)})).status_code == 200
