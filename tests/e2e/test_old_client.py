"""An old client through the proxy sees nothing its revision lacks (the relay follows each client's
negotiated revision).

The Python SDK 1.9 client (revision 2025-03-26, its own venv from scripts/setup-interop.sh)
talks to the scripted server directly over Streamable HTTP, then through the real proxy in front
of the same server over stdio and over HTTP. Its answers must be the same, and it must log nothing
through the proxy that it does not log directly: the proxy's SSE priming event (an empty `data:`
event, SEP-1699, 2025-11-25) made it log an error and a traceback for every streamed answer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.interop_env import mcp19_python
from tests.fixtures.helpers import ScriptedHTTP
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
BOUND_S = 60.0


def run_old_client(url: str) -> tuple[dict[str, object], list[str]]:
    """(what it got, the lines it logged) for one run of the 1.9 client against `url`."""
    done = subprocess.run(
        [str(mcp19_python()), str(HERE / "mcp19_client.py"), url],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr.splitlines()


@pytest.mark.parametrize("upstream", ["stdio", "http"])
def test_the_sdk_1_9_client_logs_nothing_through_the_proxy_that_it_does_not_log_directly(
    tmp_path: Path, upstream: str
) -> None:
    mcp19_python()  # skip (or fail under MCP_INTEROP_REQUIRED) before starting anything
    with ScriptedHTTP(tmp_path / "journal.jsonl", tmp_path / "state.json") as server:
        direct, direct_logged = run_old_client(server.url)
        if upstream == "stdio":
            proxy = ProxyProcess(
                upstream=scripted_stdio_command(tmp_path / "journal-stdio.jsonl", tmp_path / "state-stdio.json"),
                log_path=tmp_path / "proxy.log",
            )
        else:
            proxy = ProxyProcess(upstream_url=server.url, log_path=tmp_path / "proxy.log")
        with proxy:
            proxied, proxied_logged = run_old_client(proxy.url)

    assert direct["protocolVersion"] == "2025-03-26" and direct["progress"] == [1, 2, 3]
    assert proxied == direct
    extra = [line for line in proxied_logged if line not in direct_logged]
    assert not extra, "logged through the proxy only:\n" + "\n".join(extra[:40])
