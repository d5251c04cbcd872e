"""The house keeps its rules: no import cycle among proxy modules, no module reading another's
private names, the dependency direction of the layout, and no module in proxy/ above 600 lines.

The bound is the aim `scripts/house.py` marks modules against (600 lines); a module that must stay
above it while it is split is listed with its size, which it may not exceed (none today). The
findings `scripts/house.py` reports today and that need more than an import line to fix are listed
below, each with its reason: a new finding fails, and so does a listed one that is gone (remove it
from the list).
Fast: reads files, starts no process. The checks themselves are tried on small made-up trees.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.fixtures.helpers import REPO_ROOT

MAX_LINES = 600


def _load_house() -> ModuleType:
    spec = importlib.util.spec_from_file_location("house", REPO_ROOT / "scripts" / "house.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("house", module)  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return sys.modules["house"]


house = _load_house()

# Findings of today's tree, each needing a move or a new public name in more than one module.
KNOWN_CYCLES: set[tuple[str, ...]] = set()
KNOWN_PRIVATE_READS: set[tuple[str, str]] = set()
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


# Modules above 600 lines, each capped at its size until it is split (none today).
KNOWN_LARGE: dict[str, int] = {}


@functools.cache
def _edges() -> list[house.Import]:
    return house.imports()


def _violation_key(finding: house.Finding) -> tuple[str, str]:
    return (finding.path, finding.what.split()[1])


def test_no_import_cycle_among_proxy_modules() -> None:
    found = {tuple(sorted(set(cycle))) for cycle in house.cycles(_edges())}
    assert found - KNOWN_CYCLES == set(), f"new import cycles: {sorted(found - KNOWN_CYCLES)}"
    assert KNOWN_CYCLES - found == set(), f"fixed, remove from KNOWN_CYCLES: {sorted(KNOWN_CYCLES - found)}"


def test_no_module_reads_another_modules_private_names() -> None:
    reads = house.private_reads()
    new = [str(f) for f in reads if (f.path, f.what) not in KNOWN_PRIVATE_READS]
    assert not new, f"reads of another module's private names: {new}"
    gone = KNOWN_PRIVATE_READS - {(f.path, f.what) for f in reads}
    assert not gone, f"fixed, remove from KNOWN_PRIVATE_READS: {sorted(gone)}"


def test_imports_follow_the_dependency_direction() -> None:
    found = house.violations(_edges())
    new = [str(f) for f in found if _violation_key(f) not in KNOWN_VIOLATIONS]
    assert not new, f"imports against the dependency direction: {new}"
    gone = KNOWN_VIOLATIONS - {_violation_key(f) for f in found}
    assert not gone, f"fixed, remove from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_no_module_in_proxy_above_600_lines() -> None:
    sizes = house.module_sizes()
    assert len(sizes) > 50  # the survey sees the package
    too_big = [(name, lines) for name, lines in sizes if lines > KNOWN_LARGE.get(name, MAX_LINES)]
    assert not too_big, f"modules above {MAX_LINES} lines (the aim is {house.AIM_LINES}): {too_big}"
    split = [name for name in KNOWN_LARGE if dict(sizes).get(name, 0) <= MAX_LINES]
    assert not split, f"now within {MAX_LINES} lines, remove from KNOWN_LARGE: {split}"


# --- the checks on made-up trees ----------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"proxy/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_function_level_import_closes_a_cycle_and_a_type_checking_one_does_not(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "proxy/a.py": "from proxy import b\n",
            "proxy/b.py": "def f():\n    from proxy.a import thing\n",
            "proxy/c.py": "from proxy.d import x\n",
            "proxy/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n",
        },
    )
    edges = house.imports(root)
    assert house.cycles(edges) == [["proxy.a", "proxy.b", "proxy.a"]]
    assert [(e.source, e.target, e.kind) for e in edges if e.kind == house.TYPE_CHECKING] == [
        ("proxy.d", "proxy.c", house.TYPE_CHECKING)
    ]
    assert {(e.source, e.target, e.kind) for e in edges if e.kind != house.TYPE_CHECKING} == {
        ("proxy.a", "proxy.b", house.MODULE),
        ("proxy.b", "proxy.a", house.FUNCTION),
        ("proxy.c", "proxy.d", house.MODULE),
    }


def test_private_reads_of_another_module_are_found_and_own_ones_are_not(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "proxy/owner.py": "class Box:\n    def __init__(self):\n        self._items = []\n",
            "proxy/reader.py": (
                "import proxy.owner as owner\n"
                "from proxy.owner import _helper\n"
                "class Mine:\n"
                "    def __init__(self):\n"
                "        self._own = 1\n"
                "    def __eq__(self, other):\n"
                "        return self._own == other._own and self.__class__ is other.__class__\n"
                "def peek(box):\n"
                "    return box._items, owner._SECRET\n"
            ),
        },
    )
    assert [str(f) for f in house.private_reads(root)] == [
        "proxy/reader.py:2: imports _helper from proxy.owner",
        "proxy/reader.py:9: reads box._items",
        "proxy/reader.py:9: reads proxy.owner._SECRET",
    ]


def test_each_dependency_rule_is_enforced(tmp_path: Path) -> None:
    broken = {
        "proxy.recovery.decide": "proxy.telemetry.events",
        "proxy.core.engine": "proxy.upstream.stdio.link",
        "proxy.core.call": "proxy.upstream.h1",
        "proxy.core.relay": "proxy.frontend.http.app",
        "proxy.upstream.sse.link": "proxy.core.relay",
        "proxy.upstream.base": "proxy.frontend.stdio",
        "proxy.net.tls": "proxy.upstream.h1.tunnel",
    }
    for source, target in broken.items():
        assert house.rule_broken(source, target) is not None, (source, target)
    kept = {
        "proxy.recovery.decide": "proxy.policy.compiled",
        "proxy.recovery.report": "proxy.recovery.redact",
        "proxy.core.engine": "proxy.upstream.base",
        "proxy.core.call": "proxy.telemetry.events",
        "proxy.frontend.http.app": "proxy.core.relay",
        "proxy.upstream.h1.tunnel": "proxy.net.egress",
        "proxy.core.service": "proxy.upstream.stdio",
    }
    for source, target in kept.items():
        assert house.rule_broken(source, target) is None, (source, target)
