"""bench/byte_relay.py, the Python-floor row of bench/relay.py (`--rows pyhop`), copies bytes both
ways unchanged, a large transfer included (its write-buffer back-pressure), and closes the
upstream connection when the client leaves."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tests.fixtures.helpers import REPO_ROOT, free_port, terminate, wait_port

pytestmark = pytest.mark.slow

BYTE_RELAY = REPO_ROOT / "bench" / "byte_relay.py"


def test_bytes_pass_both_ways_and_a_close_reaches_the_upstream() -> None:
    async def go(relay_port: int, up_port: int) -> None:
        closed = asyncio.Event()

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()
            closed.set()

        server = await asyncio.start_server(echo, "127.0.0.1", up_port)
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", relay_port)
            writer.write(b"POST /mcp HTTP/1.1\r\n\r\n")
            assert await asyncio.wait_for(reader.readexactly(22), 10) == b"POST /mcp HTTP/1.1\r\n\r\n"
            big = bytes(range(256)) * 16384  # 4 MiB: beyond the relay's write-buffer high-water mark

            async def send() -> None:
                writer.write(big)
                await writer.drain()

            sender = asyncio.create_task(send())
            assert await asyncio.wait_for(reader.readexactly(len(big)), 30) == big
            await sender
            writer.close()
            await asyncio.wait_for(closed.wait(), 10)

    relay_port, up_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, str(BYTE_RELAY), str(relay_port), str(up_port)])
    try:
        wait_port(relay_port, timeout_s=20)
        asyncio.run(go(relay_port, up_port))
    finally:
        terminate(proc)
