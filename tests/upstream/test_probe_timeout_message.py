"""A start-up probe that runs out of time says so, with its bound, on /readyz and in the log.

A TimeoutError's own text is empty: the reason read "upstream probe failed: " with nothing after
it (seen with a TypeScript SDK v2 stdio server starting slowly on a loaded machine,
tests/interop/test_ts2_server.py). A real child under the proxy's guard that reads and never
answers; the probe's bound is shortened (rather than waiting out the default 15 s) so that it,
not the child's start timeout, is what runs out.
"""

from __future__ import annotations

import sys

import pytest

from proxy.service import Service
from proxy.settings import Settings
from proxy.upstream.stdio import StdioUpstream

pytestmark = pytest.mark.anyio
SILENT = "import sys\nfor _ in sys.stdin: pass\n"


async def test_a_probe_timeout_names_its_bound() -> None:
    upstream = StdioUpstream([sys.executable, "-c", SILENT], spares=0, handshake_timeout_s=30.0)
    service = Service(Settings(listen="http://127.0.0.1:1/mcp", upstream_command="x"), upstream)
    service._probe_timeout_s = 0.5  # the probe's own bound runs out before the child's start bound
    try:
        assert await service.ensure_probed(raise_on_failure=False) is None
        assert service.probe_error == "upstream probe failed: no answer within 0.5 s"
        assert upstream.health.why == service.probe_error
    finally:
        await service.aclose()
