"""The recovery core depends only on the standard library and three proxy modules (DESIGN.md)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

RECOVERY = Path(__file__).resolve().parents[2] / "proxy" / "recovery"
# proxy.secret_values: the stdlib-only registry of secret values redact() removes first.
ALLOWED_PROXY = {"proxy.policy.compiled", "proxy.errors", "proxy.jsonrpc", "proxy.secret_values"}
FORBIDDEN_STDLIB = {"asyncio", "time", "random", "socket", "subprocess", "threading", "os", "secrets"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.append("proxy.recovery." + (node.module or ""))
            else:
                names.append(node.module or "")
    return names


MODULES = sorted(RECOVERY.glob("*.py"))


def test_recovery_package_has_modules():
    assert {p.name for p in MODULES} >= {
        "outcome.py",
        "classify.py",
        "decide.py",
        "backoff.py",
        "ledger.py",
        "report.py",
    }


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_recovery_imports_only_stdlib_and_the_allowed_proxy_modules(path: Path):
    for name in _imports(path):
        top = name.split(".")[0]
        if top == "proxy":
            assert name in ALLOWED_PROXY or name.startswith("proxy.recovery"), f"{path.name} imports {name}"
        else:
            assert top in sys.stdlib_module_names or top == "__future__", f"{path.name} imports {name}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_recovery_does_no_io_sleeping_or_hidden_randomness(path: Path):
    for name in _imports(path):
        assert name.split(".")[0] not in FORBIDDEN_STDLIB, f"{path.name} imports {name}"
