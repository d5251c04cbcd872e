"""The advice of `policies suggest` (proxy/policy/suggest.py) as edits to a policy folder, and those
edits as one unified diff a person applies inside the folder (`git apply`, `patch -p1`).

Contract:
- `plan(folder, policy_set, advice)` returns a `Plan`: `{file name: (old text or None, new text)}`
  for every file to change or create, and `notes` for what it could not write. `policy_set` must
  be the folder as loaded now (its lines are where the edits go). Nothing is written.
- Where an edit goes: a tool a file names exactly gets its changes in that file (a file that names
  several tools changes for all of them: the note says so); any other tool (named by no file, or
  only by a glob) gets a new file naming it exactly, `<tool>.yaml` (a suffix where that name is
  taken), which sets only what the advice changes, so everything else resolves as before (without
  `side_effect`, the server's annotations still decide it).
- A timer: the key's line is replaced where the file sets it at the top level, else a line is
  added at the end; the larger value wins when several tools of one file ask.
- Rules: appended to the file's `rules` block list (after its last item, in its indentation), or
  to `rules: []`. A file that does not set `rules` gets a `rules` block at its end holding first a
  copy of the rules the tool resolves to now (a file's list replaces the lists below it, so they
  would be lost otherwise), then the new ones. Rule names are made unique within the file.
- Every added value carries a comment saying what was observed; comments are one line, bounded,
  without control characters. Every changed or new text is parsed again with the loader's own
  reader; an edit it does not read back as written is left out, with a note. A file keeps its
  own line ends (CRLF stays CRLF); one without a final newline gets one.
- `unified_diff(plan)` is one git-style diff (`a/NAME`, `b/NAME`, `/dev/null` and `new file mode`
  for a new file), relative to the folder; "" when there is nothing to change.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from proxy.policy.compile import policy_file_names
from proxy.policy.compiled import Layer, PolicySet
from proxy.policy.init import comment_text, file_stem
from proxy.policy.render import format_duration, rule_dict
from proxy.policy.source import parse_policy_file
from proxy.policy.suggest import Advice, RuleAdvice, ToolAdvice

SAMPLE_CHARS = 120  # of an observed text, in a comment
_ATTRS = {"attempt_timeout": "attempt_timeout_s", "deadline": "deadline_s"}  # yaml key -> `Layer` key


@dataclass
class Plan:
    files: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Edits:
    """What one file gets."""

    layer: Layer | None  # None: a new file
    tools: list[str] = field(default_factory=list)
    timers: dict[str, tuple[float, str]] = field(default_factory=dict)  # yaml key -> (seconds, comment)
    rules: list[RuleAdvice] = field(default_factory=list)
    inherited: list[dict[str, Any]] = field(default_factory=list)  # rules to copy into a new `rules`
    inherited_from: str = ""


def _top_key_line(lines: list[str], index: int, key: str) -> bool:
    return 0 <= index < len(lines) and re.match(rf"{re.escape(key)}\s*:", lines[index]) is not None


def _rule_lines(rule: RuleAdvice, indent: str) -> list[str]:
    item: dict[str, Any] = {"name": rule.name, "category": rule.category}
    if rule.text is not None:
        item["text"] = rule.text
    if rule.jsonrpc_codes:
        item["jsonrpc_codes"] = rule.jsonrpc_codes
    if rule.http_statuses:
        item["http_statuses"] = rule.http_statuses
    sample = comment_text(rule.sample)[:SAMPLE_CHARS]
    head = [
        f"{indent}# seen {rule.count} time(s), unclassified: {json.dumps(sample, ensure_ascii=False)}",
        f"{indent}# {comment_text(rule.guessed)}",
    ]
    return head + _items([item], indent)


def _items(items: list[dict[str, Any]], indent: str) -> list[str]:
    """Block list items, one `key: value` line each (a list value in flow style: `[429, 503]`)."""
    out: list[str] = []
    for item in items:
        for i, (key, value) in enumerate(item.items()):
            if isinstance(value, list):
                flow = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True).strip()
                line = f"{key}: {flow}"
            else:
                line = yaml.safe_dump({key: value}, width=10_000, allow_unicode=True).rstrip("\n")
            out.append(f"{indent}{'- ' if i == 0 else '  '}{line}")
    return out


def _block_end(lines: list[str], start: int) -> int:
    """The index after the last line of the block that `lines[start]` opens (its deeper lines)."""
    end = start + 1
    last = start + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and not line.startswith((" ", "\t", "#")) and not line.startswith("-"):
            break
        if line.strip() and not line.lstrip().startswith("#"):
            last = end + 1
        end += 1
    return last


def _apply(name: str, old: str | None, edits: _Edits, notes: list[str]) -> str | None:
    lines = old.splitlines() if old is not None else []
    layer = edits.layer
    if old is None:
        quoted = yaml.safe_dump(edits.tools, default_flow_style=True, width=10_000, allow_unicode=True).strip()
        lines = [
            f"# {comment_text(', '.join(edits.tools))}: called through the proxy; drafted by",
            "# `mcp-recovery-proxy policies suggest` from what the proxy observed. Without side_effect",
            "# here the server's annotations decide it, as before; review, and add what the tool needs",
            "# (docs/policies.md).",
            f"tools: {quoted}",
        ]
    for key, (seconds, comment) in sorted(edits.timers.items()):
        new_line = f"{key}: {format_duration(seconds)}  # {comment_text(comment)}"
        at = layer.lines.get(_ATTRS[key]) if layer is not None and _ATTRS[key] in layer.values else None
        if at is not None and _top_key_line(lines, at - 1, key):
            lines[at - 1] = new_line
        elif at is not None:
            notes.append(f"{name}: {key} is not on a line of its own; set it to {format_duration(seconds)} by hand")
        else:
            lines.append(new_line)
    if edits.rules:
        taken = set()
        if layer is not None:
            taken = {r.name for r in layer.values.get("rules") or ()}
        taken.update(r["name"] for r in edits.inherited)
        for rule in edits.rules:
            base, n = rule.name, 2
            while rule.name in taken:
                rule.name, n = f"{base}-{n}", n + 1
            taken.add(rule.name)
        at = layer.lines.get("rules") if layer is not None and "rules" in layer.values else None
        if at is None:
            lines.append("rules:")
            if edits.inherited:
                lines.append(f"  # copied from {comment_text(edits.inherited_from)}: rules set here replace that list")
                lines += _items(edits.inherited, "  ")
            for rule in edits.rules:
                lines += _rule_lines(rule, "  ")
        elif _top_key_line(lines, at - 1, "rules"):
            value = lines[at - 1].split(":", 1)[1].split("#", 1)[0].strip()
            if value == "[]":
                lines[at - 1] = "rules:"
                new = [line for rule in edits.rules for line in _rule_lines(rule, "  ")]
                lines[at:at] = new
            elif value == "":
                end = _block_end(lines, at - 1)
                first = next((ln for ln in lines[at:end] if ln.lstrip().startswith("- ")), "  - ")
                indent = first[: len(first) - len(first.lstrip())]
                lines[end:end] = [line for rule in edits.rules for line in _rule_lines(rule, indent)]
            else:
                notes.append(f"{name}: its rules are a flow list; add the suggested rules by hand")
        else:
            notes.append(f"{name}: rules is not on a line of its own; add the suggested rules by hand")
    newline = "\r\n" if old is not None and "\r\n" in old else "\n"  # the file's own line ends
    text = newline.join(lines) + newline
    parsed = parse_policy_file(name, text.encode("utf-8"))
    if parsed.problems:
        notes.append(f"{name}: the edited file would not load ({parsed.problems[0]}); left as it is")
        return None
    return text


def plan(folder: Path, policy_set: PolicySet, advice: Advice) -> Plan:
    out = Plan()
    existing = {n.lower() for n in policy_file_names(folder)} if folder.is_dir() else set()
    by_file: dict[str, _Edits] = {}
    for tool in advice.tools:
        if tool.note is not None:
            if tool.timers or tool.rules:
                out.notes.append(f"{tool.tool}: {tool.note}")
            continue
        if not (tool.timers or tool.rules or not tool.named):
            continue
        layer = policy_set.exact.get(tool.tool)
        if layer is not None:
            name = Path(layer.file).name
        else:
            stem = file_stem(tool.tool)
            name, n = f"{stem}.yaml", 2
            while name.lower() in existing:
                name, n = f"{stem}-{n}.yaml", n + 1
            existing.add(name.lower())
        edits = by_file.setdefault(name, _Edits(layer))
        edits.tools.append(tool.tool)
        _add(edits, tool, policy_set)
    for name, edits in by_file.items():
        old: str | None = None
        if edits.layer is not None:
            try:
                old = (folder / name).read_bytes().decode("utf-8")  # its own line ends kept
            except (OSError, UnicodeDecodeError) as exc:
                out.notes.append(f"{name}: cannot be read ({exc}); left as it is")
                continue
            others = [t for t, layer in policy_set.exact.items() if layer is edits.layer and t not in edits.tools]
            if others:
                out.notes.append(f"{name}: names {', '.join(sorted(others))} too, whose policy changes with it")
        text = _apply(name, old, edits, out.notes)
        if text is not None and text != old:
            out.files[name] = (old, text)
    return out


def _add(edits: _Edits, tool: ToolAdvice, policy_set: PolicySet) -> None:
    for timer in tool.timers:
        current = edits.timers.get(timer.setting)
        comment = f"{tool.tool}: {timer.why} (was {format_duration(timer.current_s)})"
        if current is None or timer.suggested_s > current[0]:
            edits.timers[timer.setting] = (timer.suggested_s, comment)
    if tool.rules:
        edits.rules.extend(tool.rules)
        sets_rules = edits.layer is not None and "rules" in edits.layer.values
        if not sets_rules and not edits.inherited:
            policy = policy_set.resolve(tool.tool)
            edits.inherited = [rule_dict(rule) for rule in policy.rules]
            source = policy.sources.get("rules", "")
            edits.inherited_from = f"{Path(source.rpartition(':')[0]).name}:rules" if ":" in source else source


def unified_diff(planned: Plan) -> str:
    out: list[str] = []
    for name, (old, new) in sorted(planned.files.items()):
        out.append(f"diff --git a/{name} b/{name}\n")
        if old is None:
            out.append("new file mode 100644\n")
        body = difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{name}" if old is not None else "/dev/null",
            tofile=f"b/{name}",
        )
        for line in body:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
