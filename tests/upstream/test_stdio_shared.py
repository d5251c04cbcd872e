"""`--stdio-sessions shared`, over a real child (a small stdio server over real pipes): the child is
initialized once however many sessions open, each session's `initialize` is answered from that
answer with the session's own revision and without the per-session capabilities, per-session
requests are refused without reaching the child, and a crashed shared child is respawned with the
proxy's handshake replayed."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.upstream.base import Era
from proxy.upstream.stdio import StdioUpstream
from proxy.upstream.stdio_shared import SessionLink

pytestmark = pytest.mark.anyio

SERVER = textwrap.dedent(
    """
    import json, sys
    log = open(sys.argv[1], "a")
    for line in sys.stdin:
        msg = json.loads(line)
        log.write(json.dumps({"method": msg.get("method")}) + "\\n"); log.flush()
        if "id" not in msg or "method" not in msg:
            continue
        if msg["method"] == "initialize":
            caps = {"tools": {}, "logging": {}, "resources": {"subscribe": True, "listChanged": True}}
            result = {"protocolVersion": "2025-11-25", "serverInfo": {"name": "s", "version": "1"},
                      "capabilities": caps}
        else:
            result = {"echo": msg["method"]}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\\n")
        sys.stdout.flush()
    """
)


def seen(path: Path) -> list[str]:
    return [json.loads(line)["method"] for line in path.read_text().splitlines()] if path.exists() else []


async def request(link: SessionLink, method: str, params: dict | None = None) -> dict:  # type: ignore[type-arg]
    message = {"jsonrpc": "2.0", "id": link.new_id(), "method": method, "params": params or {}}
    ex = await link.send_request(message)
    return await ex.response


async def test_sessions_share_one_child_initialized_once(tmp_path: Path) -> None:
    script, journal = tmp_path / "server.py", tmp_path / "seen.jsonl"
    script.write_text(SERVER)
    upstream = StdioUpstream([sys.executable, str(script), str(journal)], shared_sessions=True)
    try:
        sessions = [await upstream.open(Era.LEGACY) for _ in range(3)]
        assert all(isinstance(s, SessionLink) for s in sessions)
        for n, session in enumerate(sessions):
            asked = ["2025-03-26", "2025-11-25", "1999-01-01"][n]
            answer = await request(session, "initialize", {"protocolVersion": asked, "capabilities": {}})  # type: ignore[arg-type]
            result = answer["result"]
            assert result["protocolVersion"] == (asked if n < 2 else "2025-11-25")
            assert "logging" not in result["capabilities"]
            assert result["capabilities"]["resources"] == {"listChanged": True}
            await session.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        refused = await request(sessions[0], "logging/setLevel", {"level": "debug"})  # type: ignore[arg-type]
        assert refused["error"]["code"] == -32601
        refused = await request(sessions[1], "resources/subscribe", {"uri": "x://y"})  # type: ignore[arg-type]
        assert refused["error"]["code"] == -32601
        assert (await request(sessions[2], "tools/list"))["result"] == {"echo": "tools/list"}  # type: ignore[arg-type]
        assert seen(journal) == ["initialize", "notifications/initialized", "tools/list"]
        assert upstream.children == 1 and upstream.spares == 0, "one child, and no warm pool beside it"
        # a crash: the next request respawns the child and replays the proxy's own handshake
        shared = upstream._shared
        assert shared is not None and shared.link._child is not None
        child = shared.link._child
        os.killpg(child.pid, signal.SIGKILL)
        await child.exited.wait()
        assert (await request(sessions[0], "ping"))["result"] == {"echo": "ping"}  # type: ignore[arg-type]
        assert seen(journal)[3:] == ["initialize", "notifications/initialized", "ping"]
    finally:
        await upstream.aclose()
