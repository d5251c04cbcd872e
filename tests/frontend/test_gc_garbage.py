"""The HTTP frontend leaves no cyclic garbage per connection: a closed connection's protocol, its
request cycles, their scopes and the parser are freed by reference counting, not left for the
collector (whose full collections stop every call in flight).

A reference from a request's cycle back to its protocol (the protocol holds its cycle) once left
every closed connection's protocol, cycle, scope and parser state as cyclic garbage; the e2e test
(tests/e2e/test_gc_garbage.py, the serial slow tier) found it. This one runs in the fast tier:
the proxy's protocol (`LimitedHttpToolsProtocol`, its request cycle and keep-alive timer) in a real
uvicorn server on uvloop, real sockets, connections closed by the client and by the server."""

from __future__ import annotations

import asyncio

import pytest

from tests.frontend.test_h1_cycle import json_app, read_response, read_to_end, serving
from tests.upstream.test_gc_garbage import BOUND, cyclic_garbage

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    # uvloop, as the proxy runs: asyncio's own selector transport keeps a cycle per closed
    # connection of its own (tests/upstream/test_gc_garbage.py `uvloop_only`)
    return ("asyncio", {"use_uvloop": True})


REQUEST = b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n%b\r\n{}"


@pytest.mark.anyio
@pytest.mark.parametrize("closed_by", ["client", "server"])
async def test_a_closed_connection_leaves_no_cyclic_garbage(closed_by: str) -> None:
    async with serving(json_app) as port:

        async def once(_: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST % b"")  # answered, the connection kept (its keep-alive timer armed)
            await read_response(reader)
            if closed_by == "server":
                writer.write(REQUEST % b"connection: close\r\n")
                await read_response(reader)
                assert await read_to_end(reader) == b""
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(0.01)  # the server's side sees the close (`connection_lost`)

        found = await cyclic_garbage(once)
    assert sum(found.values()) < BOUND, str(sorted(found.items()))
