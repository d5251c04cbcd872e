"""Per-client limits count by the verified principal when the proxy authenticates (the
`ClientIdentity.key` seam of proxy/frontend/clients.py), not by address alone.

End to end: the real proxy process with `--auth tokens` in front of the scripted HTTP upstream,
raw HTTP from several loopback source addresses (127.0.0.1, .2, .3 are all this host). A caller
whose requests come from many addresses is one client; two callers behind one address are two.
A unit table covers the modes whose key stays the address (none, passthrough: a credential the
proxy does not verify cannot be a key, or a made-up token per request would be a new client).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from proxy.auth.base import ANONYMOUS, Principal
from proxy.frontend.clients import ClientIdentity
from tests.fixtures.helpers import ScriptedHTTP
from tests.proxy_process import ProxyProcess

pytestmark = pytest.mark.slow

BOUND_S = 30.0
ALICE = "alice-token-51c7e0d29a3f"
BOB = "bob-token-0c4e7a92d1b6"
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    extra = ["--auth", "tokens", "--auth-tokens-file", str(tokens), "--max-sessions-per-client", "2"]
    with ScriptedHTTP(tmp_path / "journal.jsonl") as server:
        with ProxyProcess(upstream_url=server.url, extra=extra, log_path=tmp_path / "proxy.log") as p:
            yield p


def from_address(address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=10, transport=httpx.AsyncHTTPTransport(local_address=address))


async def initialize(http: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
    auth = {"authorization": f"Bearer {token}"}
    r = await http.post(url, json=INIT, headers={**HEADERS, **auth})
    if r.status_code == 200:  # initialized, so the session is not closed as a silent one meanwhile
        session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, json=INITIALIZED, headers={**HEADERS, **auth, **session})
    return r


@pytest.mark.anyio
async def test_a_principal_is_one_client_from_every_address_and_two_principals_share_no_address_limit(
    proxy: ProxyProcess,
) -> None:
    with anyio.fail_after(BOUND_S):
        async with (
            from_address("127.0.0.1") as one,
            from_address("127.0.0.2") as two,
            from_address("127.0.0.3") as three,
        ):
            # alice from three addresses: her third session is over her cap of 2 (keyed by address,
            # each address would still have had room), so her least recently used one gives way
            a1 = await initialize(one, proxy.url, ALICE)
            a2 = await initialize(two, proxy.url, ALICE)
            a3 = await initialize(three, proxy.url, ALICE)
            assert a3.status_code == 200, a3.text
            assert await ping(one, proxy.url, ALICE, a1) == 404, "alice's oldest closed for her third"
            assert await ping(two, proxy.url, ALICE, a2) == 200
            # bob from 127.0.0.1, where alice held one: he has his own 2 (keyed by address,
            # 127.0.0.1 would have had room for one more only) and takes none of alice's
            b1 = await initialize(one, proxy.url, BOB)
            b2 = await initialize(one, proxy.url, BOB)
            assert b1.status_code == b2.status_code == 200
            assert await ping(two, proxy.url, ALICE, a2) == 200
            assert await ping(three, proxy.url, ALICE, a3) == 200
            await initialize(two, proxy.url, BOB)  # bob's third: his own oldest gives way
            assert await ping(one, proxy.url, BOB, b1) == 404
            assert await ping(one, proxy.url, BOB, b2) == 200
            assert await ping(three, proxy.url, ALICE, a3) == 200


async def ping(http: httpx.AsyncClient, url: str, token: str, opened: httpx.Response) -> int:
    headers = {**HEADERS, "authorization": f"Bearer {token}", "mcp-session-id": opened.headers["mcp-session-id"]}
    r = await http.post(url, json={"jsonrpc": "2.0", "id": 9, "method": "ping"}, headers=headers)
    return r.status_code


SCOPE = {"client": ("127.0.0.7", 50000)}


@pytest.mark.parametrize(
    ("by_principal", "principal", "key"),
    [
        (True, Principal("token:alice"), "principal:token:alice"),
        (True, Principal("jwt:https://issuer.example#u1"), "principal:jwt:https://issuer.example#u1"),
        (True, None, "127.0.0.7"),  # no principal (a request auth did not reach)
        (False, Principal("passthrough:0123456789abcdef0123456789abcdef", scopes_known=False), "127.0.0.7"),
        (False, ANONYMOUS, "127.0.0.7"),
        (False, None, "127.0.0.7"),
    ],
    ids=["tokens", "jwt", "jwt-no-principal", "passthrough", "none-anonymous", "none"],
)
def test_the_key_is_the_verified_principal_else_the_address(
    by_principal: bool, principal: Principal | None, key: str
) -> None:
    assert ClientIdentity(trusts_proxies=False, by_principal=by_principal).key(SCOPE, {}, principal) == key
