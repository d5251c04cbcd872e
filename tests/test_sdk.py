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
        "print(json.dumps([sdk_inbound is inbound, checks.inbound is inbound, "
        "runner.InboundLadderRejection is inbound.InboundLadderRejection, "
        "runner.classify_inbound_request is inbound.classify_inbound_request, hasattr(mcp, 'Client')]))"
    )
    assert same == [True, True, True, True, True]


def test_the_ladder_and_mcp_types_load_at_the_first_read_of_the_ladder_not_at_the_proxys_import() -> None:
    """A proxy serving 2025 clients never reads the ladder: importing the server, the HTTP
    frontend and the command line runs none of its code and loads no `mcp_types`; the first read
    of one of its names does, and gives the SDK's own value."""
    seen = run(
        "import json, sys; import proxy.cli, proxy.server, proxy.frontend.http.app; "
        "before = 'mcp_types' in sys.modules; from proxy.sdk import inbound; "
        "header = inbound.MCP_METHOD_HEADER; "
        "print(json.dumps([before, 'mcp_types' in sys.modules, header, "
        "inbound.classify_inbound_request.__module__]))"
    )
    assert seen == [False, True, "mcp-method", "mcp.shared.inbound"]


def test_ensure_loaded_runs_the_ladder_and_mcp_types_off_the_event_loops_thread() -> None:
    """The first 2026 request awaits `ensure_loaded()`: the load (a few hundred milliseconds) runs in
    a worker thread, so the requests in flight on the event loop go on meanwhile."""
    seen = run(
        "import asyncio, json, sys, threading\n"
        "where = []\n"
        "class Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mcp_types':\n"
        "            where.append(threading.current_thread() is threading.main_thread())\n"
        "        return None\n"
        "sys.meta_path.insert(0, Watch())\n"
        "from proxy import sdk\n"
        "asyncio.run(sdk.ensure_loaded())\n"
        "print(json.dumps([where, sdk.inbound.MCP_METHOD_HEADER]))\n"
    )
    assert seen == [[False], "mcp-method"]


def test_what_the_load_built_is_out_of_the_collectors_reach() -> None:
    """The SDK's models live as long as the process: frozen once loaded, a full collection does
    not walk them (before: some 10,000 objects, 2 ms per full collection, every call stopped)."""
    tracked = run(
        "import asyncio, gc, json; import proxy.server; from proxy import sdk; gc.collect(); gc.freeze(); "
        "asyncio.run(sdk.ensure_loaded()); "
        "print(json.dumps([len(gc.get_objects()), gc.get_freeze_count(), "
        "any(type(o).__module__.startswith('mcp_types') for o in gc.get_objects())]))"
    )
    assert isinstance(tracked, list)
    left, frozen, models_tracked = tracked
    assert left < 1000 and frozen > 10_000 and not models_tracked, tracked
