"""A short, reproducible coverage-guided run of each parser target of bench/fuzz.py (atheris).

Each target runs a fixed number of inputs with a fixed seed (`--runs`, `-seed=1`), so a run finds
the same things every time; `--seconds` only bounds it. The property is the fuzzer's own: no
exception other than the target's documented one (`SseError`, `PolicyError`), no hang; the h1
target adds the order of the response reader's events.
The long run is by hand: `bench/fuzz.py --seconds 300`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "bench" / "fuzz.py"
RUNS = 2000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("atheris") is None,
        reason="atheris is not installed for this Python (pip install atheris: Linux wheels for CPython 3.11+)",
    ),
]


@pytest.mark.parametrize("target", ["jsonrpc", "sse", "host", "policy", "h1", "http"])
def test_a_short_coverage_guided_run_finds_no_crash(target: str, tmp_path: Path) -> None:
    args = ["--target", target, "--runs", str(RUNS), "--seconds", "30", "--json", "--crash-dir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(FUZZ), *args],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    (result,) = json.loads(proc.stdout)["results"]
    assert result["executions"] == RUNS, result
    assert not result["fatal"], result
    assert not result["crashes"], result["crashes"]
