"""A stdio server's environment: the proxy's, without the proxy's own settings. A server started
by the proxy gets the variables meant for it (its API keys, PATH, an egress proxy), never the
proxy's `MCP_RECOVERY_*` (the shared store's URL with its password, the admin token file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from proxy.upstream.stdio.upstream import _GUARD

pytestmark = pytest.mark.slow

DUMP = "import json, os, sys; sys.stdout.write(json.dumps(dict(os.environ)))"


def test_the_guard_passes_the_servers_variables_and_keeps_the_proxys_own() -> None:
    environ = {
        **os.environ,
        "MCP_RECOVERY_STATE": "redis://:S3CRET-pw@127.0.0.1:6390/0",
        "MCP_RECOVERY_ADMIN_TOKEN_FILE": "/run/secrets/admin",
        "GITHUB_TOKEN": "ghp_for_the_server",
        "HTTPS_PROXY": "http://egress:3128",
    }
    done = subprocess.run(
        [sys.executable, "-I", "-S", _GUARD, str(os.getpid()), "--", sys.executable, "-c", DUMP],
        env=environ,
        start_new_session=True,  # as the proxy starts it: the guard ends its own process group
        capture_output=True,
        timeout=30,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["GITHUB_TOKEN"] == "ghp_for_the_server" and seen["HTTPS_PROXY"] == "http://egress:3128"
    assert seen["PATH"] == environ["PATH"]
    assert not [name for name in seen if name.startswith("MCP_RECOVERY_")]
    assert "S3CRET-pw" not in done.stdout.decode()
