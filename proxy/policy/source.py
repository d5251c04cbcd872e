"""One policy file read from disk: YAML with line marks, validated against `schema.PolicyFile`.

Contract:
- `parse_policy_file(display, content)` never raises for bad input (control characters, numbers
  Python cannot read, nesting deeper than `MAX_DEPTH` included); it returns a `ParsedFile` whose
  `problems` are printable lines `<file>:<line>: <key>: <what is wrong>; <how to fix it>`, one
  line each, repeating keys and values from the file only up to `SHOWN_CHARS`.
- YAML anchors and aliases (`&name`, `*name`, and so `<<` merges) are refused where they appear:
  an alias re-uses a node, so a 500-byte file of nested aliases ("billion laughs") expanded to
  gigabytes in the line walk and the validation (2+ GB for `policies check` and hot reload).
  Without them the node count is bounded by the file's size.
- `lines` maps every key path (`("backoff", "max")`, `("rules", 0, "text")`) to its 1-based line,
  taken from the YAML nodes' marks, so later checks can point at a line too.
- Every check of one file runs whatever else is wrong in it: a key left empty at any depth (but
  the switch-offs of `NULL_MEANS_OFF`) is a problem of its own, each schema problem is reported,
  and each rule that validates is checked across its fields and for a name used twice.
- A file with problems still has a `model`: of the keys that had none (a block keeps its good
  keys), so the loader can check the invariants that do not depend on a bad value; `unsure`
  names the keys whose value is not known: those with a problem, and the key an unknown key
  likely misspells (`""`: any key, for a file that could not be read).
"""

from __future__ import annotations

import difflib
import types
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from proxy.policy.schema import MERGED_BLOCKS, NULL_MEANS_OFF, SHOWN_CHARS, PolicyFile, RuleModel, shown

Loc = tuple[str | int, ...]

_EXPECTED = {
    "int": "a whole number",
    "bool": "true or false",
    "string": "text",
    "list": "a list, like [a, b]",
    "dict": "a block of key: value lines",
    "model": "a block of key: value lines",
    "float": "a number",
}


@dataclass(slots=True)
class ParsedFile:
    """A file as read: its model when valid, the line of every key, and its problems."""

    display: str
    model: PolicyFile | None = None
    tools: list[str] = field(default_factory=list)  # read even when the file is invalid, for claims
    lines: dict[Loc, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # the top-level keys that have a value; None when the file is not a block of key: value lines
    keys: frozenset[str] | None = None
    # dotted keys (`deadline`, `backoff.max`, `rules`) whose value had a problem; "" for all of them
    unsure: frozenset[str] = frozenset({""})
    _problem_lines: list[int] = field(default_factory=list, repr=False)

    def line_of(self, loc: Loc) -> int | None:
        """The line of `loc`, or of its nearest ancestor that the file has."""
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return None

    def problem(self, loc: Loc, message: str, *, line: int | None = None) -> None:
        line = line if line is not None else self.line_of(loc)
        where = f"{self.display}:{line}" if line else self.display
        key = key_text(loc)
        self.problems.append(f"{where}: {key}: {message}" if key else f"{where}: {message}")
        self._problem_lines.append(line or 0)

    def sort_problems(self) -> None:
        """The problems so far in the order of their lines (a file's checks find them in turn)."""
        order = sorted(range(len(self.problems)), key=self._problem_lines.__getitem__)
        self.problems[:] = [self.problems[i] for i in order]
        self._problem_lines[:] = [self._problem_lines[i] for i in order]


def _shown_error(exc: Exception) -> str:
    """The first line of a YAML or value error (the rest names the parser's own input buffer)."""
    reason = str(getattr(exc, "problem", None) or exc).strip()
    first = reason.splitlines()[0] if reason else type(exc).__name__
    return first if len(first) <= 2 * SHOWN_CHARS else first[: 2 * SHOWN_CHARS - 1] + "…"


def _key_part(part: str) -> str:
    """A key as written when it is plain printable text, else quoted and escaped (a key with a
    line break must not break the one-problem-per-line output), bounded either way."""
    if part.isprintable() and part.strip() == part and part and len(part) <= SHOWN_CHARS:
        return part
    return shown(part)


def key_text(loc: Loc) -> str:
    """`("rules", 0, "text")` -> `rules[0].text`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = _key_part(str(part))
            out += f".{text}" if out else text
    return out


MAX_DEPTH = 32  # policy files nest a few levels; the composer and every later walk recurse per level


class _Loader(yaml.SafeLoader):
    """The safe loader, with two refusals raised as the composer meets them, before any expansion:
    YAML anchors and aliases, and nesting deeper than `MAX_DEPTH` (a RecursionError out of the
    composer or of the walks over the tree after it, otherwise)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "uses a YAML anchor or alias (&name, *name, <<: *name), which policy files do not allow "
                "(aliases can expand a small file into gigabytes); write the values out in full",
                event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_policy_file(display: str, content: bytes) -> ParsedFile:
    parsed = ParsedFile(display)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        parsed.problem((), f"is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8")
        return parsed
    try:
        # The reader checks the whole text for characters YAML does not allow (control
        # characters) as it is built, so building it is inside the guard too.
        loader = _Loader(text)
    except yaml.YAMLError as exc:
        parsed.problem((), f"is not valid YAML: {_shown_error(exc)}; remove control characters from the file")
        return parsed
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except RecursionError:
        parsed.problem((), "nests too deeply to be a policy file; a policy is a few levels of key: value lines")
        return parsed
    except yaml.composer.ComposerError as exc:
        mark = exc.problem_mark
        parsed.problem((), str(exc.problem), line=mark.line + 1 if mark else None)
        return parsed
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        parsed.problem(
            (),
            f"is not valid YAML: {_shown_error(exc)}; check the indentation and quote values that contain ': ' or '#'",
            line=mark.line + 1 if mark else None,
        )
        return parsed
    except ValueError as exc:
        # A scalar YAML resolves to a type Python cannot build from text (an integer of more than
        # 4300 digits): the constructor raises a plain ValueError.
        reason = _shown_error(exc).split(":", 1)[0]
        parsed.problem((), f"holds a value that cannot be read ({reason}); write a shorter number")
        return parsed
    finally:
        loader.dispose()
    if node is not None:
        _collect_lines(node, (), parsed)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        parsed.problem((), "must be a block of key: value lines at the top (see docs/policies.md)", line=1)
        return parsed
    tools = data.get("tools")
    if isinstance(tools, list):
        parsed.tools = [tool for tool in tools if isinstance(tool, str) and tool.strip()]
    parsed.keys = frozenset(str(key) for key, value in data.items() if value is not None)
    empty = _empty_keys(data, PolicyFile, ())
    for loc in empty:
        parsed.problem(loc, EMPTY_EQUALS if loc[-1] == "equals" else EMPTY)
    bad: set[Loc] = {_bad_part(loc) for loc in empty}
    unsure = {_unsure_part(loc) for loc in empty}
    try:
        parsed.model = PolicyFile.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            if loc in empty or not loc:  # said above, in the words for every empty key
                continue
            parsed.problem(loc, _message(err, loc))
            bad.add(_bad_part(loc))
            if err["type"] == "extra_forbidden":
                # a misspelt key: the setting it was likely meant for is not known either
                unsure.update(".".join(map(str, (*_bad_part(loc)[:-1], key))) for key in _close_keys(loc))
            else:
                unsure.add(_unsure_part(loc))
    _rule_problems(data, parsed, empty)
    if bad:
        parsed.model = _partial_model(data, bad)
    parsed.unsure = frozenset(unsure) if parsed.model is not None else frozenset({""})
    parsed.sort_problems()
    return parsed


EMPTY = "has no value; write a value, or remove the line"
EMPTY_EQUALS = "has no value; write a value (equals: [null] compares with null), or remove the line"


def _empty_keys(data: dict[Any, Any], model: type[BaseModel], loc: Loc) -> list[Loc]:
    """Every known key of `data` (and of the blocks and rules in it) that is left empty: YAML
    reads `key:` as null, which a block's or rule's optional key would take as *not set*."""
    found: list[Loc] = []
    for key, value in data.items():
        info = model.model_fields.get(key) if isinstance(key, str) else None
        if info is None:
            continue  # an unknown key: a problem of its own
        here = (*loc, key)
        if value is None:
            # a switch-off; a block whose every line is commented out (it sets nothing, as when
            # absent: a folder that loaded before must not stop the start for it); `tools` has
            # problems of its own
            top = len(here) == 1
            if here != ("tools",) and not (top and (key in NULL_MEANS_OFF or key in MERGED_BLOCKS)):
                found.append(here)
            continue
        inner = _model_in(info.annotation)
        if inner is None:
            continue
        if isinstance(value, dict):
            found += _empty_keys(value, inner, here)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    found += _empty_keys(item, inner, (*here, index))
    return found


def _bad_part(loc: Loc) -> Loc:
    """What to leave out of the partial model for a problem at `loc`: a key of a merged block by
    itself, anything else (a rule, the idempotency key) with its top-level key."""
    return loc[:2] if len(loc) >= 2 and loc[0] in MERGED_BLOCKS and isinstance(loc[1], str) else loc[:1]


def _unsure_part(loc: Loc) -> str:
    """The dotted key whose value a problem at `loc` leaves unknown."""
    return ".".join(str(p) for p in _bad_part(loc))


def _partial_model(data: dict[Any, Any], bad: set[Loc]) -> PolicyFile | None:
    """The file's model without the keys that had a problem, or None if that does not validate."""
    kept = dict(data)
    for part in bad:
        if len(part) == 2 and isinstance(kept.get(part[0]), dict):
            kept[part[0]] = {k: v for k, v in kept[part[0]].items() if k != part[1]}
        else:
            kept.pop(part[0], None)
    try:
        return PolicyFile.model_validate(kept)
    except ValidationError:
        return None


def _rule_problems(data: dict[Any, Any], parsed: ParsedFile, empty: list[Loc]) -> None:
    """A rule's checks across its fields, for each rule that validates by itself (whatever else is
    wrong in the file), and a name that an earlier rule uses too."""
    rules = data.get("rules")
    if not isinstance(rules, list):
        return
    names: set[str] = set()
    for index, item in enumerate(rules):
        if not isinstance(item, dict):
            continue
        name = item.get("name")
        if isinstance(name, str):
            if name in names:
                parsed.problem(
                    ("rules", index, "name"),
                    f"{shown(name)} is used by an earlier rule too; give each rule its own name",
                )
            names.add(name)
        if any(loc[:2] == ("rules", index) for loc in empty):
            continue  # a key left empty: its matchers are not what the file meant
        try:
            rule = RuleModel.model_validate(item)
        except ValidationError:
            continue  # its problems are reported with the file's
        for key, message in rule.check():
            parsed.problem(("rules", index, key), message)


def _collect_lines(node: yaml.Node, loc: Loc, parsed: ParsedFile) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                parsed.problem(
                    (*loc, key),
                    f"appears twice (lines {seen[key]} and {line}); keep one, YAML would silently use the last",
                    line=line,
                )
            seen[key] = line
            parsed.lines[(*loc, key)] = line
            _collect_lines(value_node, (*loc, key), parsed)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            parsed.lines[(*loc, index)] = item.start_mark.line + 1
            _collect_lines(item, (*loc, index), parsed)


def _message(err: Any, loc: Loc) -> str:
    kind: str = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind == "extra_forbidden":
        close = _close_keys(loc)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown key; {hint}allowed here: {', '.join(_allowed_keys(loc[:-1]))}"
    if kind == "missing":
        return "is required here; add it (see docs/policies.md)"
    if kind in ("enum", "literal_error"):
        return f"{shown(value)} is not allowed; use {ctx.get('expected', '')}"
    base = kind.split("_", 1)[0]
    if base in _EXPECTED:
        if value is None:
            return f"has no value; write {_EXPECTED[base]}, or remove the line"
        return f"expected {_EXPECTED[base]}, got {shown(value)}"
    return f"{err['msg']} (got {shown(value)})"


def _close_keys(loc: Loc) -> list[str]:
    """The key an unknown key at `loc` was most likely meant to be (none, or one)."""
    return difflib.get_close_matches(str(loc[-1])[:SHOWN_CHARS], _allowed_keys(loc[:-1]), n=1)


def _allowed_keys(loc: Loc) -> list[str]:
    model: type[BaseModel] | None = PolicyFile
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        model = _model_in(info.annotation) if info else None
    return list(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType, list):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found:
                return found
    return None
