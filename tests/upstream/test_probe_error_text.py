"""The reason /readyz and the log give for a failed upstream probe names what failed, even when the
exception carries no text: an upstream that accepts the connection and never answers timed the
probe out with `TimeoutError()`, and the reason read "upstream probe failed: " (seen with a stdio
child that got no CPU: the TS v2 client then showed that empty text in its HTTP 503)."""

from __future__ import annotations

import socket

import pytest

from proxy.service import Service
from proxy.settings import Settings
from proxy.upstream.http import HttpUpstream

pytestmark = pytest.mark.anyio


async def test_a_probe_that_times_out_says_so() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the backlog), never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
        settings = Settings(listen="http://127.0.0.1:1/mcp", upstream=url, ready_check_interval_s=600)
        service = Service(settings, HttpUpstream(url, connect_timeout_s=2))
        service._probe_timeout_s = 0.2  # the shipped bound is 15 s; what is tested is the text
        try:
            assert await service.ensure_probed(raise_on_failure=False) is None
            assert service.probe_error is not None
            assert service.probe_error.startswith("upstream probe failed: ")
            assert service.probe_error.removeprefix("upstream probe failed: ").strip(), service.probe_error
            assert "TimeoutError" in service.probe_error
        finally:
            await service.aclose()
