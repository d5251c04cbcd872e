"""Where the interop prerequisites live (installed by scripts/setup-interop.sh) and what a test
does without them: skip, or fail when `MCP_INTEROP_REQUIRED=1` (.ci/run sets it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.fixtures.helpers import REPO_ROOT

CACHE = REPO_ROOT / ".cache" / "interop"
MCP19_PYTHON = CACHE / "venv-mcp19" / "bin" / "python"
EVERYTHING_JS = CACHE / "npm" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist"


def missing(reason: str) -> None:
    reason += " (run scripts/setup-interop.sh)"
    if os.environ.get("MCP_INTEROP_REQUIRED", "") not in ("", "0", "false", "no"):
        pytest.fail(f"{reason}; MCP_INTEROP_REQUIRED is set, so this is an error", pytrace=False)
    pytest.skip(reason)


def mcp19_python() -> Path:
    if not MCP19_PYTHON.exists():
        missing(f"no Python SDK 1.9 venv at {MCP19_PYTHON.parent.parent}")
    return MCP19_PYTHON


def server_everything_argv() -> list[str]:
    """`node dist/index.js stdio` of the pinned npm server-everything."""
    node = shutil.which("node")
    if node is None or not (EVERYTHING_JS / "index.js").exists():
        missing(f"no node, or no server-everything at {EVERYTHING_JS}")
    assert node is not None
    return [node, str(EVERYTHING_JS / "index.js"), "stdio"]
