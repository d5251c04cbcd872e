"""docs/policies.md's walkthrough, run as written: every `$ ` command of its console blocks, in a
fresh folder, with the proxy's `mcp-recovery-proxy` and `python` first on PATH; each command's
output must be the one the page shows. The last command (`serve`) runs until its log shows the
lines the page shows (timestamps and the port aside: the test listens on a free port through
`MCP_RECOVERY_LISTEN`, the page shows the default), then is stopped by its pid."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.fixtures.helpers import REPO_ROOT, free_port, terminate

pytestmark = pytest.mark.slow

DOC = REPO_ROOT / "docs" / "policies.md"
SECTION = "## From a server to a reviewed policy folder in five minutes"
COMMAND_BOUND_S = 120.0
SERVE_BOUND_S = 60.0
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def walkthrough() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for every `$ ` line of the section's console blocks; a
    heredoc (`<<'EOF'`) takes the lines up to EOF into its command."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            assert lines[i].startswith("$ "), lines[i]
            command = lines[i][2:]
            i += 1
            if "<<'EOF'" in command:
                end = lines.index("EOF", i)
                command = "\n".join([command, *lines[i : end + 1]])
                i = end + 1
            output: list[str] = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            steps.append((command, output))
    return steps


def test_the_walkthrough_runs_as_written_with_the_output_it_shows(tmp_path: Path) -> None:
    steps = walkthrough()
    assert [c.split()[:3] for c, _ in steps if c.startswith("mcp-recovery-proxy")] == [
        ["mcp-recovery-proxy", "policies", "init"],
        ["mcp-recovery-proxy", "policies", "check"],
        ["mcp-recovery-proxy", "policies", "explain"],
        ["mcp-recovery-proxy", "serve", "--policies"],
    ]
    bindir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_RECOVERY_")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    *commands, (serve, serve_lines) = steps
    for command, expected in commands:
        run = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=COMMAND_BOUND_S
        )
        assert (run.returncode, run.stderr) == (0, ""), command
        assert run.stdout.splitlines() == expected, command

    port = free_port()
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {serve}"],
        cwd=tmp_path,
        env={**env, "MCP_RECOVERY_LISTEN": f"http://127.0.0.1:{port}/mcp"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    try:
        seen = [lines.get(timeout=SERVE_BOUND_S) for _ in serve_lines]
    finally:
        terminate(proc)
    shown = [STAMP.sub("", line).replace(f"127.0.0.1:{port}", "127.0.0.1:8080") for line in seen]
    assert shown == [STAMP.sub("", line) for line in serve_lines]
