"""bench/term_relay.py, the terminating-Python-floor row of bench/relay.py (`--rows pyterm`), relays
MCP calls between the SDK's own HTTP client and server in both eras: a 2026 `tools/call`, and a
2025 session (its initialize and its calls, answered by the server as event streams)."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from tests.fixtures.helpers import REPO_ROOT, free_port, terminate, wait_port

pytestmark = pytest.mark.slow

TERM_RELAY = REPO_ROOT / "bench" / "term_relay.py"
UPSTREAM = REPO_ROOT / "bench" / "upstream.py"


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_calls_of_either_era_pass_through_it(mode: str) -> None:
    async def go(url: str) -> list[str]:
        from mcp import Client

        texts = []
        with anyio.fail_after(30):
            async with Client(url, mode=mode) as client:  # type: ignore[arg-type]
                for word in ("one", "two"):
                    result = await client.call_tool("echo", {"text": word})
                    texts.append(result.content[0].text)  # type: ignore[union-attr]
        return texts

    up_port, relay_port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, str(UPSTREAM), "--transport", "http", "--port", str(up_port)])
    relay = subprocess.Popen([sys.executable, str(TERM_RELAY), str(relay_port), str(up_port)])
    try:
        wait_port(up_port, timeout_s=30)
        wait_port(relay_port, timeout_s=20)
        assert anyio.run(go, f"http://127.0.0.1:{relay_port}/mcp") == ["one", "two"]
    finally:
        terminate(relay)
        terminate(upstream)
