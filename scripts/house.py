#!/usr/bin/env python3
"""The state of the house: how proxy/ is laid out and whether it keeps its own rules.

Prints, for the modules under proxy/:

- every module with its line count, largest first, marking those above 600 lines;
- import cycles among proxy modules, from the static imports of each file (module level and
  inside functions alike; imports under ``if TYPE_CHECKING:`` are listed apart and make no cycle,
  since they never run);
- reads of another module's private names: ``from x import _name``, ``module._name`` on an
  imported proxy module, and ``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` is
  not defined in the reading module itself (an AST heuristic: it cannot know ``obj``'s type);
- the dependency-direction rules of the layout (docs/architecture.md, "Dependency direction");
- with ``--mypy``, the result of ``.venv/bin/mypy``;
- with ``--tiers``, the wall time of the fast test tier and the test counts of both tiers (the slow
  tier is only collected, never run).

Exits 1 when a cycle, a private read or a rule violation is found (or mypy fails, when asked);
0 otherwise. ``--json`` prints the same findings as one JSON object. Standard library only; reads
files, starts no process unless ``--mypy`` or ``--tiers`` asks for one.

An import names a module by what Python would load: ``from proxy.a import b`` is an import of the
module ``proxy.a.b`` when that file exists, else of ``proxy.a`` (the package's ``__init__``). The
implicit import of a module's parent packages is not counted.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "proxy"
AIM_LINES = 600

# What each import is: "module" runs on import, "function" runs when its function does,
# "type_checking" never runs (a type annotation's import).
MODULE, FUNCTION, TYPE_CHECKING = "module", "function", "type_checking"

# The modules the recovery core may import (tests/recovery/test_recovery_imports.py checks the same).
RECOVERY_ALLOWED = ("proxy.policy.compiled", "proxy.errors", "proxy.jsonrpc", "proxy.secret_values")
# The modules that run a tools/call's attempts: they know the upstream only by its Protocol.
CALL_MODULES = ("proxy.core.engine", "proxy.core.call")


@dataclass(frozen=True)
class Import:
    """One static import of a proxy module by another."""

    source: str  # the importing module
    target: str  # the module imported
    line: int
    kind: str  # MODULE, FUNCTION or TYPE_CHECKING
    path: str  # the importing file, relative to the repository


@dataclass(frozen=True)
class Finding:
    """One place that breaks a rule, with the file and line to look at."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@dataclass
class House:
    """Everything the script found; what --json prints."""

    sizes: list[tuple[str, int]] = field(default_factory=list)
    cycles: list[list[str]] = field(default_factory=list)
    type_checking: list[Import] = field(default_factory=list)
    private_reads: list[Finding] = field(default_factory=list)
    violations: list[Finding] = field(default_factory=list)


# --- modules -------------------------------------------------------------------------------------


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Every module under proxy/, by its dotted name (a package by its ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def module_sizes(root: Path = REPO) -> list[tuple[str, int]]:
    """(file relative to the repository, lines), largest first."""
    sizes = [(str(p.relative_to(root)), line_count(p)) for p in module_files(root).values()]
    return sorted(sizes, key=lambda s: (-s[1], s[0]))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


# --- imports -------------------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a file, with the kind of place it sits in."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, kind))
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, TYPE_CHECKING)
                for stmt in child.orelse:
                    visit_stmt(stmt, kind)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, TYPE_CHECKING if kind == TYPE_CHECKING else FUNCTION)
            else:
                visit(child, kind)

    def visit_stmt(stmt: ast.stmt, kind: str) -> None:
        wrapper = ast.Module(body=[stmt], type_ignores=[])
        visit(wrapper, kind)

    visit(tree, MODULE)
    return found


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The proxy module an imported dotted name loads: itself, or the nearest package above it."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = _package_of(module, path)
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    targets: list[str] = []
    for name in names:
        if name.split(".")[0] != PACKAGE:
            continue
        target = _resolve(name, modules)
        if target is not None and target != module and target not in targets:
            targets.append(target)
    return targets


def imports(root: Path = REPO) -> list[Import]:
    """Every static import of one proxy module by another."""
    modules = module_files(root)
    found: list[Import] = []
    for module, path in modules.items():
        rel = str(path.relative_to(root))
        for node, kind in _walk_imports(_parse(path)):
            for target in _targets(node, module, path, modules):
                found.append(Import(module, target, node.lineno, kind, rel))
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The import cycles among modules, one per strongly connected component of the imports that
    run (TYPE_CHECKING imports excluded); each listed as one closed path through it."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if edge.kind != TYPE_CHECKING:
            graph.setdefault(edge.source, set()).add(edge.target)
            graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm, iterative so depth is no limit
        work = [(node, iter(sorted(graph[node])))]
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[current] = min(low[current], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[current])
                if low[current] == index[current]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == current:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(_closed_path(component, graph) for component in components)


def _closed_path(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first), closed on itself."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return [*component, start]  # not reached: a component of two or more has a cycle


# --- private names -------------------------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines itself: functions, classes, assigned names and
    attributes, parameters and keyword names (a dataclass field is set by its class's module)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)  # __slots__ = ("_x",), setattr(self, "_x", ...)
    return {n for n in names if _private(n)}


def _module_aliases(tree: ast.Module, module: str, path: Path, modules: dict[str, Path]) -> dict[str, str]:
    """Local names bound to a proxy module: ``import proxy.a.b as m``, ``from proxy.a import b``."""
    aliases: dict[str, str] = {}
    for node, _kind in _walk_imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
        else:
            for alias, target in zip(node.names, _from_names(node, module, path), strict=True):
                if target in modules:
                    aliases[alias.asname or alias.name] = target
    return aliases


def _from_names(node: ast.ImportFrom, module: str, path: Path) -> list[str]:
    base = node.module or ""
    if node.level:
        package = _package_of(module, path)
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" for alias in node.names]


def private_reads(root: Path = REPO) -> list[Finding]:
    """Where one proxy module reads a private name of another (see the module's docstring)."""
    modules = module_files(root)
    found: list[Finding] = []
    for module, path in modules.items():
        rel = str(path.relative_to(root))
        tree = _parse(path)
        own = _own_private_names(tree)
        aliases = _module_aliases(tree, module, path, modules)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias, full in zip(node.names, _from_names(node, module, path), strict=True):
                    if _private(alias.name):
                        found.append(Finding(rel, node.lineno, f"imports {alias.name} from {full.rpartition('.')[0]}"))
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                value = node.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    found.append(Finding(rel, node.lineno, f"reads {aliases[value.id]}.{node.attr}"))
                elif isinstance(value, ast.Name) and value.id in ("self", "cls"):
                    continue
                elif node.attr not in own:
                    found.append(Finding(rel, node.lineno, f"reads {ast.unparse(value)[:60]}.{node.attr}"))
    return sorted(found, key=lambda f: (f.path, f.line, f.what))


# --- dependency direction ------------------------------------------------------------------------


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def rule_broken(source: str, target: str) -> str | None:
    """Which dependency rule an import of ``target`` by ``source`` breaks, or None."""
    if _within(source, "proxy.recovery") and not (_within(target, "proxy.recovery") or target in RECOVERY_ALLOWED):
        return "the recovery core imports only " + ", ".join(RECOVERY_ALLOWED) + " and itself"
    if source in CALL_MODULES and _within(target, "proxy.upstream") and target != "proxy.upstream.base":
        return "the engine and the call know the upstream only by its Protocol (proxy.upstream.base)"
    if _within(source, "proxy.core") and _within(target, "proxy.frontend"):
        return "core never imports a frontend"
    if _within(source, "proxy.upstream") and (_within(target, "proxy.core") or _within(target, "proxy.frontend")):
        return "upstream never imports core or a frontend"
    if _within(source, "proxy.net") and _within(target, "proxy.upstream"):
        return "net imports no upstream"
    return None


def violations(edges: list[Import]) -> list[Finding]:
    """Every import, TYPE_CHECKING ones included (a type is knowledge too), that breaks a rule."""
    found: list[Finding] = []
    for edge in edges:
        rule = rule_broken(edge.source, edge.target)
        if rule is not None:
            found.append(Finding(edge.path, edge.line, f"imports {edge.target} ({edge.kind}): {rule}"))
    return sorted(found, key=lambda f: (f.path, f.line, f.what))


# --- the whole house -----------------------------------------------------------------------------


def survey(root: Path = REPO) -> House:
    edges = imports(root)
    return House(
        sizes=module_sizes(root),
        cycles=cycles(edges),
        type_checking=[e for e in edges if e.kind == TYPE_CHECKING],
        private_reads=private_reads(root),
        violations=violations(edges),
    )


def run_mypy(root: Path = REPO) -> dict[str, object]:
    started = time.monotonic()
    proc = subprocess.run([str(root / ".venv/bin/mypy")], cwd=root, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    return {
        "ok": proc.returncode == 0,
        "summary": lines[-1] if lines else proc.stderr.strip()[-300:],
        "errors": [line for line in lines if ": error:" in line],
        "seconds": round(time.monotonic() - started, 1),
    }


COLLECTED = re.compile(r"(\d+)(?:/(\d+))? tests? collected")


def _collected(args: list[str], root: Path) -> int | None:
    proc = subprocess.run(
        [str(root / ".venv/bin/pytest"), "--collect-only", "-q", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    match = COLLECTED.search(proc.stdout)
    return int(match.group(1)) if match else None


def run_tiers(root: Path = REPO) -> dict[str, object]:
    """The fast tier's wall time and result line; both tiers' test counts (the slow one collected only)."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(root / ".venv/bin/pytest"), "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = round(time.monotonic() - started, 1)
    lines = proc.stdout.strip().splitlines()
    return {
        "fast_ok": proc.returncode == 0,
        "fast_seconds": seconds,
        "fast_result": lines[-1] if lines else "",
        "fast_count": _collected([], root),
        "slow_count": _collected(["-m", "slow"], root),
    }


def failed(house: House) -> bool:
    return bool(house.cycles or house.private_reads or house.violations)


def report(house: House, extra: dict[str, dict[str, object]]) -> str:
    out: list[str] = []
    big = [s for s in house.sizes if s[1] > AIM_LINES]
    out.append(f"Modules in {PACKAGE}/: {len(house.sizes)}, {len(big)} above {AIM_LINES} lines")
    for name, lines in house.sizes:
        out.append(f"  {lines:5d}  {name}{'  <-- above ' + str(AIM_LINES) if lines > AIM_LINES else ''}")
    out.append("")
    out.append(f"Import cycles: {len(house.cycles) or 'none'}")
    out.extend("  " + " -> ".join(cycle) for cycle in house.cycles)
    out.append(f"TYPE_CHECKING-only imports (no cycle): {len(house.type_checking)}")
    out.extend(f"  {e.path}:{e.line}: {e.source} -> {e.target}" for e in house.type_checking)
    out.append("")
    out.append(f"Reads of another module's private names: {len(house.private_reads) or 'none'}")
    out.extend(f"  {f}" for f in house.private_reads)
    out.append("")
    out.append(f"Dependency-direction violations: {len(house.violations) or 'none'}")
    out.extend(f"  {f}" for f in house.violations)
    if "mypy" in extra:
        mypy = extra["mypy"]
        out.append("")
        out.append(f"mypy: {mypy['summary']} ({mypy['seconds']} s)")
        out.extend(f"  {line}" for line in mypy["errors"])  # type: ignore[attr-defined]
    if "tiers" in extra:
        tiers = extra["tiers"]
        out.append("")
        out.append(f"Fast tier: {tiers['fast_count']} tests, {tiers['fast_seconds']} s wall: {tiers['fast_result']}")
        out.append(f"Slow tier: {tiers['slow_count']} tests (collected, not run)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    parser.add_argument("--mypy", action="store_true", help="also run .venv/bin/mypy")
    parser.add_argument("--tiers", action="store_true", help="also time the fast test tier and count both tiers")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository (default: this script's)")
    args = parser.parse_args(argv)
    house = survey(args.root)
    extra: dict[str, dict[str, object]] = {}
    if args.mypy:
        extra["mypy"] = run_mypy(args.root)
    if args.tiers:
        extra["tiers"] = run_tiers(args.root)
    if args.json:
        print(json.dumps({**asdict(house), **extra}, indent=2))
    else:
        print(report(house, extra))
    mypy_failed = "mypy" in extra and not extra["mypy"]["ok"]
    return 1 if failed(house) or mypy_failed else 0


if __name__ == "__main__":
    sys.exit(main())
