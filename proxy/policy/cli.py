"""`policies check DIR` and `policies explain DIR TOOL`: what the command line calls.

Contract:
- `check(folder) -> int`: prints every problem (one per line: file:line: key: what; fix) to stderr
  and returns 1, or prints one OK line (version, files, tool entries) to stdout and returns 0.
- `explain(folder, tool, annotations_json, as_json=False) -> int`: prints the effective policy of
  one tool with, for each value, where it came from; 0 on success, 1 on a bad folder, 2 on bad
  `--annotations` input. `folder=None` explains the built-in defaults.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from proxy.errors import PolicyError
from proxy.policy.compile import load_builtin_policies, load_policy_dir
from proxy.policy.compiled import PolicySet, specific_layers
from proxy.policy.render import format_table, policy_as_dict, policy_rows

PathArg = str | os.PathLike[str] | None


def _load(folder: PathArg) -> PolicySet | None:
    try:
        return load_builtin_policies() if folder is None else load_policy_dir(folder)
    except PolicyError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        count = len(exc.problems)
        print(f"FAILED {folder}: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
        return None


def check(folder: PathArg) -> int:
    policy_set = _load(folder)
    if policy_set is None:
        return 1
    defaults = policy_set.defaults.file if policy_set.defaults else "built-in"
    print(
        f"OK {folder if folder is not None else '<built-in>'}: version {policy_set.version}, "
        f"{len(policy_set.files)} file(s), {len(policy_set.exact)} exact tool name(s), "
        f"{len(policy_set.globs)} glob(s), defaults from {defaults}"
    )
    return 0


def explain(folder: PathArg, tool: str, annotations_json: str | None = None, *, as_json: bool = False) -> int:
    annotations: dict[str, Any] | None = None
    if annotations_json is not None:
        try:
            annotations = json.loads(annotations_json)
        except json.JSONDecodeError as exc:
            print(f"--annotations: not JSON ({exc.msg}); write it like '{{\"readOnlyHint\": true}}'", file=sys.stderr)
            return 2
        if not isinstance(annotations, dict):
            print("--annotations: must be a JSON object, like '{\"readOnlyHint\": true}'", file=sys.stderr)
            return 2
    policy_set = _load(folder)
    if policy_set is None:
        return 1
    policy = policy_set.resolve(tool, annotations)
    matched = [layer.file for layer in specific_layers(policy_set, tool)]
    if policy_set.defaults is not None:
        matched.append(policy_set.defaults.file)
    if as_json:
        out = policy_as_dict(policy)
        out.update(version=policy_set.version, files_applied=matched, annotations=annotations)
        print(json.dumps(out, indent=2, sort_keys=False))
        return 0
    print(f"tool {tool!r}  (policies version {policy_set.version})")
    print(f"files applied, first wins: {', '.join(matched) or '(none: built-in defaults only)'}")
    if annotations is not None:
        print(f"annotations: {json.dumps(annotations, sort_keys=True)}")
    print()
    print(format_table(policy_rows(policy), ("setting", "value", "from")))
    return 0
