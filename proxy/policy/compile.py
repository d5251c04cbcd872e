"""Loading a policy folder into a frozen `PolicySet` (docs/policies.md).

Contract:
- `load_policy_dir(folder)` reads the `*.yaml` / `*.yml` files directly in `folder`, following
  symlinks, and skips dot-entries (a ConfigMap mount's `..data`, `..2026_...`), subfolders (such as
  `examples/`) and every other file. It returns a `PolicySet` or raises `PolicyError` listing every
  problem at once, each naming the file, the line where known, the key, and a fix: every file's
  own problems, the claims, and the invariants, also where other files have problems (an
  invariant is left out only where one of its values, or what it derives from, is a value with a
  problem: `ParsedFile.unsure`).
- `defaults.yaml` (or `defaults.yml`) is the defaults file: it covers every tool and may not list
  `tools`. Every other file must list `tools` (exact names or globs).
- Two files claiming the same exact name (or the same glob) is an error naming both.
- Invariants are checked on the effective values of every exact tool, of every glob with the
  defaults, and of the defaults alone.
- `version` is a short SHA-256 over the sorted file names and contents: equal folders, equal version.
- `load_builtin_policies()` loads the defaults shipped inside the package (no folder given).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from proxy.errors import PolicyError
from proxy.policy.compiled import (
    SETTINGS,
    YAML_KEY,
    Category,
    IdempotencyKey,
    Layer,
    PolicySet,
    Rule,
    SideEffect,
    effective_values,
    glob_specificity,
    invariant_violations,
    is_glob,
    resolve_tool_policy,
    specific_layers,
)
from proxy.policy.regex import compile_rule_text
from proxy.policy.schema import MERGED_BLOCKS, PolicyFile, RuleModel
from proxy.policy.source import ParsedFile, parse_policy_file

__all__ = ["compile_files", "load_builtin_policies", "load_policy_dir", "policy_version", "resolve_tool_policy"]

DEFAULTS_NAMES = ("defaults.yaml", "defaults.yml")
BUILTIN_LABEL = "<built-in>"
Claims = dict[str, tuple[Layer, ParsedFile, int | None]]  # tool or glob -> (layer, file, line)


def policy_file_names(folder: Path) -> list[str]:
    """The names the loader reads: `*.yaml`/`*.yml` regular files (or symlinks to them), no dot-entries."""
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.lower().endswith((".yaml", ".yml")):
                continue
            if entry.is_file():  # follows symlinks; directories and dangling links are skipped
                names.append(entry.name)
    return sorted(names)


def load_policy_dir(folder: str | os.PathLike[str]) -> PolicySet:
    path = Path(folder)
    if not path.is_dir():
        raise PolicyError([f"{path}: is not a folder; pass the folder that holds the policy YAML files"])
    files = []
    for name in policy_file_names(path):
        try:
            files.append((name, str(path / name), (path / name).read_bytes()))
        except OSError as exc:  # vanished between listing and reading, or unreadable
            raise PolicyError(
                [f"{path / name}: cannot be read ({exc.strerror}); check it exists and is readable"]
            ) from None
    return compile_files(files)


def load_builtin_policies() -> PolicySet:
    folder = resources.files("proxy").joinpath("builtin_policies")
    files = [
        (entry.name, f"{BUILTIN_LABEL}/{entry.name}", entry.read_bytes())
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith((".yaml", ".yml")) and not entry.name.startswith(".")
    ]
    return compile_files(files)


def policy_version(files: Sequence[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for name, content in sorted(files):
        for part in (name.encode(), content):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()[:12]


def compile_files(files: Sequence[tuple[str, str, bytes]]) -> PolicySet:
    """Compile (file name, display path, content) triples; raise `PolicyError` on any problem."""
    problems: list[str] = []
    parsed = [(name, parse_policy_file(display, content)) for name, display, content in files]
    defaults_names = [name for name, _ in parsed if name in DEFAULTS_NAMES]
    if len(defaults_names) > 1:
        problems.append(
            f"{parsed[0][1].display.rsplit('/', 1)[0]}: both defaults.yaml and defaults.yml exist; keep one"
        )
    defaults: Layer | None = None
    exact: Claims = {}
    globs: Claims = {}
    for name, pf in parsed:
        layer = _layer(pf.model, pf) if pf.model is not None else Layer(file=pf.display)
        if name in DEFAULTS_NAMES:
            if ("tools",) in pf.lines:
                pf.problem(
                    ("tools",),
                    "the defaults file covers every tool that no other file names; "
                    "remove tools: here, or move these settings to a file of their own",
                )
            defaults = layer
        elif pf.keys is not None and "tools" not in pf.keys:
            pf.problem(
                ("tools",),
                "is required: list the exact tool names or globs this file covers, like tools: [refund, 'billing_*']",
            )
        for tool in dict.fromkeys(pf.tools if name not in DEFAULTS_NAMES else ()):
            _claim(globs if is_glob(tool) else exact, tool, layer, pf)
        problems.extend(pf.problems)
    policy_set = PolicySet(
        version=policy_version([(name, content) for name, _, content in files]),
        exact=MappingProxyType({tool: claim[0] for tool, claim in sorted(exact.items())}),
        globs=tuple((p, globs[p][0]) for p in sorted(globs, key=glob_specificity)),
        defaults=defaults,
        files=tuple(display for _, display, _ in sorted(files)),
    )
    problems += _invariant_problems(policy_set, {pf.display: pf for _, pf in parsed})
    if problems:
        raise PolicyError(problems)
    return policy_set


def _claim(claims: Claims, tool: str, layer: Layer, pf: ParsedFile) -> None:
    index = pf.tools.index(tool)
    line = pf.line_of(("tools", index))
    if tool not in claims:
        claims[tool] = (layer, pf, line)
        return
    _, other, other_line = claims[tool]
    other_where = f"{other.display}:{other_line}" if other_line else other.display
    pf.problem(
        ("tools", index),
        f"{tool!r} is also claimed by {other_where}; a tool name (or glob) may appear in one file only, "
        "remove it from one",
        line=line,
    )


def _layer(model: PolicyFile, pf: ParsedFile) -> Layer:
    values: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for key in model.model_fields_set:
        block = getattr(model, key)
        if key in MERGED_BLOCKS:
            for sub in block.model_fields_set if block is not None else ():
                raw[f"{key}.{sub}"] = getattr(block, sub)
        else:  # a key left empty is a problem of the file (source.py) and left out of its model
            raw[key] = block
    setting_of = {yaml_key: setting for setting, yaml_key in SETTINGS}
    for yaml_key, value in raw.items():
        if yaml_key in setting_of:
            values[setting_of[yaml_key]] = _compile_value(yaml_key, value, pf)
    lines = {s: line for s in values if (line := pf.line_of(tuple(YAML_KEY[s].split(".")))) is not None}
    return Layer(file=pf.display, values=MappingProxyType(values), lines=MappingProxyType(lines))


def _compile_value(yaml_key: str, value: Any, pf: ParsedFile) -> Any:
    match yaml_key:
        case "side_effect":
            return SideEffect(value)
        case "unclassified":
            return Category(value)
        case "retry_on":
            return frozenset(Category(item) for item in value)
        case "required_scopes":
            return frozenset(value)
        case "report.alternatives":
            return tuple(value)
        case "idempotency_key":
            return None if value is None else IdempotencyKey(location=value.location, name=value.name)
        case "rules":
            return tuple(_rule(rule) for rule in value)
    return value


def _rule(model: RuleModel) -> Rule:
    """A validated rule (its checks across fields and names ran as the file was read)."""
    equals = None
    if "equals" in model.model_fields_set:
        equals = tuple(model.equals) if isinstance(model.equals, list) else (model.equals,)
    return Rule(
        name=model.name,
        category=model.category,
        text=compile_rule_text(model.text) if model.text else None,
        path=tuple(model.path.split(".")) if model.path else None,
        equals=equals,
        jsonrpc_codes=frozenset(model.jsonrpc_codes),
        http_statuses=frozenset(model.http_statuses),
        retryable=model.retryable,
    )


def _invariant_problems(policy_set: PolicySet, files: dict[str, ParsedFile]) -> list[str]:
    chains: list[tuple[list[Layer], str]] = [([], "for every tool")]
    chains += [([layer], f"for tools matching {pattern!r}") for pattern, layer in policy_set.globs]
    chains += [(specific_layers(policy_set, tool), f"for tool {tool!r}") for tool in policy_set.exact]
    unsure = {pf.display: _unsure_settings(pf) for pf in files.values()}
    seen: dict[str, str] = {}
    for layers, scope in chains:
        values, sources, origin = effective_values(layers, policy_set.defaults, None)
        unknown = _unknown_settings(layers, policy_set.defaults, unsure, sources)
        for small, big in invariant_violations(values):
            if small in unknown or big in unknown:
                continue  # one side is a value with a problem: checked once that is fixed
            blame = small if small in origin else big
            layer = origin.get(blame)
            where = files[layer.file].display if layer else BUILTIN_LABEL
            line = layer.lines.get(blame) if layer else None
            core = (
                f"{YAML_KEY[small]} {values[small]:g}s ({sources[small]}) is longer than "
                f"{YAML_KEY[big]} {values[big]:g}s ({sources[big]}); lower {YAML_KEY[small]} or raise {YAML_KEY[big]}"
            )
            text = f"{where}:{line}: {YAML_KEY[blame]}: {core}" if line else f"{where}: {YAML_KEY[blame]}: {core}"
            seen.setdefault(text, f"{text} ({scope})")
    return list(seen.values())


def _unsure_settings(pf: ParsedFile) -> frozenset[str]:
    """The settings (ToolPolicy keys) of `pf` whose value is not known because of a problem."""
    return frozenset(
        setting
        for setting, yaml_key in SETTINGS
        if any(not part or yaml_key == part or yaml_key.startswith(part + ".") for part in pf.unsure)
    )


def _unknown_settings(
    layers: list[Layer], defaults: Layer | None, unsure: dict[str, frozenset[str]], sources: dict[str, str]
) -> set[str]:
    """The settings whose effective value in this chain could change once the files' problems are
    fixed: the first file in precedence order that sets it, or has a problem with it, has the
    problem; and a value derived from such a setting."""
    chain = [*layers, defaults] if defaults is not None else layers
    unknown: set[str] = set()
    for setting, _ in SETTINGS:
        for layer in chain:
            if setting in unsure.get(layer.file, ()):
                unknown.add(setting)
                break
            if setting in layer.values:
                break
    if sources["attempt_timeout_s"].startswith("derived:") and "deadline_s" in unknown:
        unknown.add("attempt_timeout_s")
    if sources["min_attempt_s"].startswith("derived:") and "attempt_timeout_s" in unknown:
        unknown.add("min_attempt_s")
    return unknown
