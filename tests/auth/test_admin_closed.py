"""The admin port is as closed as the MCP port: with `--auth` on and no `--admin-token-file`, call
data (status page, /status.json, /status/explain, /policies, /metrics) is refused (403) on a bind
that is not loopback, and served on a loopback bind; the start-up log says which. `/healthz` and
`/readyz` stay open and name no principal. Before: an admin port on 0.0.0.0 told anyone who
called what (principal ids, tools, outcomes), and nothing warned.

The non-loopback bind runs in a network namespace of its own (`unshare -n`: only loopback
exists there), so nothing is reachable from outside. The real proxy process, bounded waits.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.helpers import PYTHON, REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
CALL_DATA = ("/metrics", "/policies", "/status.json", "/", "/status/explain?tool=echo")


def admin_paths(tmp: Path, bind: str, *, namespace: bool) -> dict[str, dict[str, bool | int] | str]:
    argv = [PYTHON, "-m", "tests.auth.admin_bind", str(tmp), bind]
    if namespace:
        if shutil.which("unshare") is None or shutil.which("ip") is None:
            pytest.fail("unshare and ip (util-linux, iproute2) are needed for a private network")
        argv = ["unshare", "-n", *argv]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_call_data_on_an_admin_port_bound_beyond_loopback_needs_the_admin_token(tmp_path: Path) -> None:
    seen = admin_paths(tmp_path, "0.0.0.0", namespace=True)
    for path in CALL_DATA:
        assert seen[path] == {"status": 403, "alice": False}, (path, seen[path])
    for path in ("/healthz", "/readyz"):
        assert seen[path] == {"status": 200, "alice": False}, (path, seen[path])
    assert "call data (status page, /metrics, /policies) refused (403)" in str(seen["log"])
    assert "--admin-token-file" in str(seen["log"])


def test_call_data_on_a_loopback_admin_port_is_served_and_the_log_says_why(tmp_path: Path) -> None:
    seen = admin_paths(tmp_path, "127.0.0.1", namespace=False)
    for path in ("/metrics", "/policies", "/status.json", "/"):
        assert seen[path]["status"] == 200, (path, seen[path])  # type: ignore[index]
    assert seen["/status.json"]["alice"] is True  # type: ignore[index]  # call data: who called
    for path in ("/healthz", "/readyz"):
        assert seen[path] == {"status": 200, "alice": False}, (path, seen[path])
    assert "call data served on the loopback bind 127.0.0.1 only (--auth tokens" in str(seen["log"])
