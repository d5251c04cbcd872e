"""The dependency lock is whole, current and installed.

Every install of ours (the README's set-up, .ci/run, both image variants) installs from
requirements/runtime.txt or requirements/dev.txt, the exports of uv.lock that scripts/lock.sh
writes. These tests fail when pyproject.toml changed without a re-lock, when an export was edited
by hand or left stale, and when the environment running them is not the one the lock describes
(scripts/test-newest.sh runs the suite on the newest versions on purpose and says so with
MCP_LOCK_UNPINNED=1).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXPORTS = {
    "requirements/runtime.txt": [],
    "requirements/dev.txt": ["--extra", "dev"],
}


def uv() -> str:
    found = Path(sys.executable).with_name("uv")
    if found.exists():
        return str(found)
    on_path = shutil.which("uv")
    if on_path is None:
        pytest.fail("uv is not installed: it comes with the dev set-up (pip install -r requirements/dev.txt)")
    return on_path


def run_uv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [uv(), *args, "--offline", "--no-progress", "--color", "never"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "UV_NO_CONFIG": "1"},
        check=False,
    )


def pins(text: str) -> list[Requirement]:
    """The `name==version ; marker` lines of a hashed requirements file (continuations dropped).

    A package may be pinned twice under exclusive markers (one version per Python range)."""
    return [
        Requirement(line.strip().removesuffix("\\").strip())
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(("#", "--"))
    ]


def without_header(text: str) -> str:
    lines = text.splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "\n".join(lines).strip()


def test_the_lock_matches_pyproject() -> None:
    result = run_uv("lock", "--check")
    assert result.returncode == 0, f"uv.lock is stale: run scripts/lock.sh\n{result.stderr[-2000:]}"


@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_each_export_is_what_the_lock_says(export: str) -> None:
    result = run_uv(
        "export", "--frozen", "--no-header", "--no-emit-project", "--format", "requirements-txt", *EXPORTS[export]
    )
    assert result.returncode == 0, result.stderr[-2000:]
    committed = (ROOT / export).read_text()
    assert without_header(committed) == without_header(result.stdout), f"{export} is stale: run scripts/lock.sh"
    blocks = re.split(r"\n(?=[A-Za-z0-9])", without_header(committed))
    assert blocks and all("--hash=sha256:" in block for block in blocks), "every pin carries its hashes"


def test_the_runtime_export_is_the_dev_export_without_the_dev_tools() -> None:
    runtime = {str(req) for req in pins((ROOT / "requirements/runtime.txt").read_text())}
    dev = {str(req) for req in pins((ROOT / "requirements/dev.txt").read_text())}
    assert runtime <= dev, f"pinned differently for runtime and dev: {sorted(runtime - dev)}"


@pytest.mark.skipif(os.environ.get("MCP_LOCK_UNPINNED") == "1", reason="scripts/test-newest.sh: unpinned on purpose")
def test_this_environment_is_the_one_the_lock_describes() -> None:
    # the same check deploy/smoke.sh runs in the image (there with --exact)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/check-installed.py"), "requirements/dev.txt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, "install from the lock: pip install -r requirements/dev.txt\n" + result.stdout
