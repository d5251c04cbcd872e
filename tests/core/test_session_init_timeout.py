"""A 2025 session whose client stays silent after `initialize` is closed (`--session-init-timeout-s`),
counted from the answer to its initialize: a slow upstream start must not eat the client's time."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.core.relay import Relay
from proxy.core.service import Service
from proxy.jsonrpc import Message
from proxy.settings import Settings
from proxy.upstream.stdio import StdioUpstream
from tests.fixtures.journal import Journal
from tests.proxy_process import scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

INIT: Message = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


class Answers:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def closed(self) -> bool:
        return False


async def test_the_init_timeout_runs_from_the_answer_to_initialize_not_from_the_request(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    settings = Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x", session_init_timeout_s=30)
    upstream = StdioUpstream(scripted_stdio_command(journal.path, tmp_path / "state.json"), spares=0)
    service = Service(settings, upstream)
    try:
        session_id, relay = await service.new_session()
        assert isinstance(relay, Relay)
        answers = Answers()
        await relay.handle_request(INIT, answers)  # answered just now
        assert "result" in answers.messages[0]
        # The check the session's opening scheduled fires now, as it does when the child's start
        # took the whole timeout: the client has had no time to send notifications/initialized.
        service._check_initialized(session_id)
        assert session_id in service.sessions, "closed before its client could say anything"
        # Still silent a whole timeout after the answer: closed.
        relay.last_activity -= settings.session_init_timeout_s
        service._check_initialized(session_id)
        assert session_id not in service.sessions
        assert service.uninitialized_closed == 1
    finally:
        await service.aclose()
