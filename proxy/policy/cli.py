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


# -- suggest -------------------------------------------------------------------------------------

FETCH_TIMEOUT_S = 10.0
SNAPSHOT_LIMIT = 32 * 1024 * 1024  # bytes of a /status.json read, at most


def _status_url(admin: str) -> str:
    url = admin if "://" in admin else f"http://{admin}"
    return url if url.rstrip("/").endswith("/status.json") else url.rstrip("/") + "/status.json"


def _snapshot(admin: str | None, token_file: str | None, from_file: str | None) -> dict[str, Any]:
    """The `observed` part of a proxy's /status.json, from its admin port or a saved copy; raises
    `ValueError` with a one-line reason."""
    import urllib.error
    import urllib.request

    if from_file is not None:
        try:
            with open(from_file, "rb") as f:
                raw = f.read(SNAPSHOT_LIMIT + 1)
        except OSError as exc:
            raise ValueError(f"--from-file {from_file}: {exc.strerror or exc}") from None
        where = from_file
    else:
        assert admin is not None
        url = _status_url(admin)
        request = urllib.request.Request(url, headers={"accept": "application/json"})
        if token_file is not None:
            try:
                token = open(token_file, encoding="utf-8").read().strip()
            except OSError as exc:
                raise ValueError(f"--admin-token-file {token_file}: {exc.strerror or exc}") from None
            request.add_header("authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as answer:
                raw = answer.read(SNAPSHOT_LIMIT + 1)
        except urllib.error.HTTPError as exc:
            hint = " (give --admin-token-file)" if exc.code in (401, 403) else ""
            raise ValueError(f"{url}: HTTP {exc.code}{hint}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ValueError(f"{url}: {getattr(exc, 'reason', None) or exc}") from None
        where = url
    if len(raw) > SNAPSHOT_LIMIT:
        raise ValueError(f"{where}: larger than {SNAPSHOT_LIMIT} bytes; not a /status.json")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{where}: not JSON; give a saved /status.json of the proxy") from None
    observed = doc.get("observed") if isinstance(doc, dict) else None
    if not isinstance(observed, dict):
        raise ValueError(f"{where}: has no 'observed' part; it comes from a proxy running with --admin")
    return observed


def _checked_plan(folder: str, planned: Any) -> list[str]:
    """The problems of the folder with the plan applied (in a temporary copy); [] when it loads."""
    import shutil
    import tempfile
    from pathlib import Path

    from proxy.policy.compile import policy_file_names

    with tempfile.TemporaryDirectory(prefix="policies-suggest-") as tmp:
        copy = Path(tmp)
        for name in policy_file_names(Path(folder)):
            shutil.copyfile(Path(folder) / name, copy / name)
        for name, (_, text) in planned.files.items():
            (copy / name).write_text(text, encoding="utf-8")
        try:
            load_policy_dir(copy)
        except PolicyError as exc:
            return list(exc.problems)
    return []


def suggest(
    folder: str,
    *,
    admin: str | None = None,
    admin_token_file: str | None = None,
    from_file: str | None = None,
    as_json: bool = False,
) -> int:
    """`policies suggest`: the diff on stdout (or everything as JSON), a summary on stderr. Exit
    0 (printed, also when nothing is to change), 1 (DIR is not a valid folder), 2 (no snapshot)."""
    from pathlib import Path

    from proxy.policy.patch import plan, unified_diff
    from proxy.policy.suggest import advice_dict, advise

    if (admin is None) == (from_file is None):
        print("mcp-recovery-proxy: policies suggest: give --admin URL or --from-file SNAPSHOT.json", file=sys.stderr)
        return 2
    policy_set = _load(folder)
    if policy_set is None:
        return 1
    try:
        observed = _snapshot(admin, admin_token_file, from_file)
    except ValueError as exc:
        print(f"mcp-recovery-proxy: policies suggest: {exc}", file=sys.stderr)
        return 2
    advice = advise(policy_set, observed)
    planned = plan(Path(folder), policy_set, advice)
    problems = _checked_plan(folder, planned)
    if problems:  # a bug of the planner: say so rather than print a patch that breaks the folder
        for problem in problems:
            print(f"mcp-recovery-proxy: policies suggest: the patched folder would fail: {problem}", file=sys.stderr)
        return 1
    diff = unified_diff(planned)
    if as_json:
        out = advice_dict(advice)
        out.update(folder=folder, notes=planned.notes, files=sorted(planned.files), patch=diff)
        print(json.dumps(out, indent=2))
        return 0
    for line in summary_lines(advice, planned.notes):
        print(line, file=sys.stderr)
    sys.stdout.write(diff)
    return 0


def summary_lines(advice: Any, notes: list[str]) -> list[str]:
    """What `suggest` found, for a person: one line per finding."""
    from proxy.policy.render import format_duration

    lines: list[str] = []
    for tool in advice.tools:
        if tool.successes:
            p50, p99, slowest = (
                format_duration(round(ms / 1000, 3)) for ms in (tool.p50_ms, tool.p99_ms, tool.slowest_ms)
            )
            lines.append(
                f"{tool.tool}: {tool.successes} successful attempt(s), p50 {p50}, p99 {p99}, slowest {slowest}; "
                f"{tool.timeouts} cut by a timer"
            )
        for timer in tool.timers:
            lines.append(
                f"{tool.tool}: {timer.setting} {format_duration(timer.current_s)} -> "
                f"{format_duration(timer.suggested_s)}: {timer.why}"
            )
        if tool.unclassified:
            lines.append(f"{tool.tool}: {tool.unclassified} unclassified error(s) seen")
        for rule in tool.rules:
            lines.append(f"{tool.tool}: suggested rule {rule.name} ({rule.category}), seen {rule.count} time(s)")
        if not tool.named and tool.note is None:
            lines.append(f"{tool.tool}: called, and no policy file names it: a file of its own is suggested")
    for never in advice.never_matched:
        called = ", ".join(never.called_tools) or "none of its tools was called"
        lines.append(f"{never.file}: rule {never.rule!r} never matched ({called})")
    if advice.dropped_tools:
        lines.append(f"the proxy kept no record of {advice.dropped_tools} event(s) of tools past its limit")
    lines.extend(f"note: {note}" for note in notes)
    if not lines:
        lines.append("nothing observed to suggest a change")
    return lines
