"""The diff `policies suggest` prints applies inside the policy folder with the two tools a person
uses, `patch -p1` and `git apply`, and the folder they leave passes `policies check` (the command,
run as a process). Slow: it starts those programs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.helpers import PYTHON, REPO_ROOT
from tests.policy.suggest_cases import observation, write_folder

pytestmark = pytest.mark.slow

BOUND_S = 60.0


def _run(argv: list[str], cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, timeout=BOUND_S)


def _suggested(tmp_path: Path, odd_line_ends: bool) -> tuple[Path, bytes]:
    folder = write_folder(tmp_path / "policies")
    if odd_line_ends:  # a file written on Windows, and one without a final newline
        (folder / "slow.yaml").write_bytes((folder / "slow.yaml").read_bytes().replace(b"\n", b"\r\n"))
        (folder / "flaky.yaml").write_bytes((folder / "flaky.yaml").read_bytes().rstrip(b"\n"))
    saved = tmp_path / "status.json"
    saved.write_text(json.dumps({"observed": observation()}))
    printed = _run([PYTHON, "-m", "proxy", "policies", "suggest", str(folder), "--from-file", str(saved)], REPO_ROOT)
    assert printed.returncode == 0, printed.stderr.decode()
    assert printed.stdout.count(b"diff --git ") == 4
    return folder, printed.stdout


@pytest.mark.parametrize("odd_line_ends", [False, True], ids=["lf", "crlf-and-no-final-newline"])
@pytest.mark.parametrize("tool", [["patch", "-p1"], ["git", "apply", "-"]], ids=["patch", "git-apply"])
def test_the_printed_diff_applies_inside_the_folder_and_the_folder_passes_check(
    tmp_path: Path, tool: list[str], odd_line_ends: bool
) -> None:
    folder, diff = _suggested(tmp_path, odd_line_ends)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    applied = _run(tool, copy, diff)
    assert applied.returncode == 0, (applied.stdout + applied.stderr).decode()
    assert sorted(p.name for p in copy.iterdir()) == sorted(
        [*(p.name for p in folder.iterdir()), "newtool.yaml", "billing_refund.yaml"]
    )
    checked = _run([PYTHON, "-m", "proxy", "policies", "check", str(copy)], REPO_ROOT)
    assert checked.returncode == 0 and checked.stdout.startswith(b"OK "), checked.stderr.decode()
    # the timer the advice raised is the one the folder now gives the tool
    explained = _run([PYTHON, "-m", "proxy", "policies", "explain", str(copy), "slow", "--json"], REPO_ROOT)
    assert json.loads(explained.stdout)["settings"]["attempt_timeout_s"] > 1.48
    if odd_line_ends:
        assert (copy / "slow.yaml").read_bytes().count(b"\r\n") == 4, "its own line ends kept"
        assert (copy / "flaky.yaml").read_bytes().endswith(b"attempts: 2\n")
