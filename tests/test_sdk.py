"""proxy/sdk.py: the proxy's process loads the SDK's validation ladder and no other SDK module, and
a later import of the SDK by its own code gets that same module.

Each check runs in a fresh interpreter (the test process has imported the whole SDK already).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.fixtures.helpers import PYTHON, REPO_ROOT

pytestmark = pytest.mark.slow


def run(code: str) -> object:
    done = subprocess.run([PYTHON, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_proxy_server_and_http_frontend_import_no_sdk_module_but_the_validation_ladder() -> None:
    loaded = run(
        "import json, sys; import proxy.server, proxy.frontend.http.app; "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.'))))"
    )
    assert loaded == ["mcp.shared.inbound"]


def test_the_sdk_imported_after_the_proxy_uses_the_same_ladder_module_and_classes() -> None:
    same = run(
        "import json; from proxy.sdk import inbound; from proxy.frontend.http import checks; "
        "import mcp, mcp.server.runner as runner; import mcp.shared.inbound as sdk_inbound; "
        "print(json.dumps([sdk_inbound is inbound, runner.InboundLadderRejection is checks.InboundLadderRejection, "
        "runner.classify_inbound_request is inbound.classify_inbound_request, hasattr(mcp, 'Client')]))"
    )
    assert same == [True, True, True, True]
