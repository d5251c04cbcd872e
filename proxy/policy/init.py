"""`policies init DIR`: draft a policy folder from a live server's `tools/list`.

Contract:
- `list_tools(settings, timeout_s)` reaches the upstream the settings name (the proxy's own
  adapters: `proxy.core.upstreams.build_upstream`), opens one 2025 session (`initialize`,
  `notifications/initialized`; a server that refuses `initialize` but lists 2026-07-28 in its
  `server/discover` answer is asked in that revision), and returns every tool of every
  `tools/list` page (following `nextCursor`, at most `MAX_PAGES` pages and `MAX_TOOLS` tools). The
  whole exchange is bounded by `timeout_s`; the upstream (a spawned child included) is closed
  before it returns or raises.
  It raises `InitError` (one line, no traceback material) when the upstream cannot be reached,
  refuses `initialize` or `tools/list`, or answers something that is not a tool list; for a stdio
  server, the line ends with the last line it wrote to stderr (bounded, secrets scrubbed).
- `draft(tools)` is the folder as `init` would write it: `{file name: text}`. `defaults.yaml` is
  the shipped defaults byte for byte; each tool gets a file of its own naming it exactly, with its
  side-effect class inferred from its annotations (the same rule the proxy applies at run time:
  `proxy.policy.compiled.annotation_side_effect`) and a comment saying where the value came from,
  and its description's first line as a comment. A tool whose name the policy loader would read
  as a glob is not drafted (`Draft.skipped` says why).
- `write(folder, draft, dry_run)` never overwrites: a file that does not exist is written; a file
  that exists with the same text is left; one that differs is left untouched and a unified diff
  (existing -> drafted) is printed instead. A tool that a file of the folder already names is
  not drafted again (two files naming one tool is an error of the folder). Returns 0 when nothing
  was left undone, 1 when a file was left as it was.
- `run(...)` is the command: prints progress to stdout, errors as one line to stderr; exit 0 (all
  written or already equal), 1 (something left undone, diffs printed), 2 (could not list the
  tools, or DIR is not a folder).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import json
import logging
import re
import sys
import unicodedata
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from proxy.errors import UpstreamFailure
from proxy.jsonrpc import LATEST_MODERN, bounded
from proxy.policy.compile import DEFAULTS_NAMES, policy_file_names
from proxy.policy.compiled import SideEffect, annotation_side_effect, is_glob
from proxy.policy.source import parse_policy_file
from proxy.upstream.base import Era, Upstream, UpstreamLink, discover_request, initialize_request

if TYPE_CHECKING:
    from proxy.settings import Settings

MAX_PAGES = 100  # tools/list pages followed; a server with more is refused, not truncated silently
MAX_TOOLS = 10_000
DESCRIPTION_CHARS = 160  # of a description's first line, in a comment
SHOWN_CHARS = 300  # of anything the upstream said, in an error line
HINTS = ("readOnlyHint", "idempotentHint", "destructiveHint")
ORDER = (SideEffect.READ_ONLY, SideEffect.IDEMPOTENT, SideEffect.STATE_CHANGING)


class InitError(Exception):
    """A one-line reason `init` could not do its work."""


def _bounded(text: str, n: int = SHOWN_CHARS) -> str:
    return bounded(" ".join(str(text).split()), n)


# -- listing the tools -------------------------------------------------------------------------


async def list_tools(settings: Settings, timeout_s: float) -> list[dict[str, Any]]:
    from proxy.core.upstreams import build_upstream, upstream_secrets
    from proxy.secret_values import SECRETS

    SECRETS.set(upstream_secrets(settings))  # a failure's detail never shows a configured header
    try:
        upstream = build_upstream(settings)
    except (ValueError, OSError) as exc:
        raise InitError(_bounded(str(exc))) from None
    said = _StderrTail()
    try:
        return await _list(upstream, timeout_s)
    except InitError as exc:
        raise InitError(f"{exc}{said.suffix()}") from None
    finally:
        said.close()
        await upstream.aclose()


class _StderrTail(logging.Handler):
    """The last lines a stdio server wrote to stderr (the adapter logs them, bounded): a server
    that fails to start usually says why there, so a failure's one line ends with it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[str] = deque(maxlen=1)
        self.logger = logging.getLogger("proxy.upstream.stderr")
        self.saved = (self.logger.level, self.logger.propagate)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            text = record.getMessage()
            self.lines.append(text.split(": ", 1)[1] if ": " in text else text)  # without the child's name

    def suffix(self) -> str:
        from proxy.secret_values import SECRETS

        return f"; its stderr said: {_bounded(SECRETS.scrub(self.lines[-1]), 200)}" if self.lines else ""

    def close(self) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.saved[0])
        self.logger.propagate = self.saved[1]
        super().close()


async def _list(upstream: Upstream, timeout_s: float) -> list[dict[str, Any]]:
    """A 2025 session first (every server today answers `initialize`); a server that refuses it
    and lists 2026-07-28 in its `server/discover` answer is asked in that revision instead."""
    step = "starting"

    async def ask(link: UpstreamLink, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = link.new_id()
        if method == "initialize":
            message = initialize_request(request_id)
        elif method == "server/discover":
            message = discover_request(request_id)
        else:
            message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        ex = await link.send_request(message)
        return await ex.response

    async def pages(link: UpstreamLink, meta: dict[str, Any] | None) -> list[dict[str, Any]]:
        nonlocal step
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for page in range(1, MAX_PAGES + 1):
            step = f"tools/list (page {page})"
            params: dict[str, Any] = {"cursor": cursor} if cursor is not None else {}
            if meta is not None:
                params["_meta"] = meta
            answer = await ask(link, "tools/list", params)
            result = answer.get("result")
            if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
                if "error" in answer:
                    raise InitError(f"the server refused tools/list: {_error_text(answer)}")
                raise InitError("the server's tools/list answer has no list of tools")
            tools += [t for t in result["tools"] if isinstance(t, dict) and isinstance(t.get("name"), str)]
            if len(tools) > MAX_TOOLS:
                raise InitError(f"the server lists more than {MAX_TOOLS} tools; init drafts at most that many")
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                return tools
            if cursor in seen:
                raise InitError(f"tools/list page {page} repeats an earlier nextCursor; the listing does not end")
            seen.add(cursor)
        raise InitError(f"tools/list did not end within {MAX_PAGES} pages")

    async def modern() -> list[dict[str, Any]] | None:
        """The 2026-07-28 listing, or None when the server does not speak that revision."""
        nonlocal step
        step = "server/discover"
        link = await upstream.open(Era.MODERN)
        try:
            answer = await ask(link, "server/discover", {})
        except UpstreamFailure:
            return None
        result = answer.get("result")
        versions = result.get("supportedVersions") if isinstance(result, dict) else None
        if not isinstance(versions, list) or LATEST_MODERN not in versions:
            return None
        return await pages(link, discover_request(0)["params"]["_meta"])

    async def exchange() -> list[dict[str, Any]]:
        nonlocal step
        step = "initialize"
        link = await upstream.open(Era.LEGACY)
        answer = await ask(link, "initialize", {})
        if "result" not in answer:
            refused = f"the server refused initialize: {_error_text(answer)}"
            await link.aclose()
            tools = await modern()
            if tools is None:
                raise InitError(f"{refused}, and does not list {LATEST_MODERN} in an answer to server/discover")
            return tools
        await link.send_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return await pages(link, None)

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        raise InitError(f"{upstream.description}: no answer to {step} within {timeout_s:g} s") from None
    except UpstreamFailure as failure:
        raise InitError(f"{upstream.description}: {step} failed: {_bounded(failure.detail)}") from None
    except OSError as exc:
        raise InitError(f"{upstream.description}: {step} failed: {_bounded(str(exc))}") from None


def _error_text(answer: Mapping[str, Any]) -> str:
    error = answer.get("error")
    if isinstance(error, dict):
        return _bounded(f"{error.get('message', '')} (code {error.get('code')})")
    return _bounded(json.dumps(answer)[:SHOWN_CHARS])


# -- drafting the files ------------------------------------------------------------------------


@dataclass
class Draft:
    files: dict[str, str] = field(default_factory=dict)  # file name -> text, defaults.yaml first
    tools: dict[str, str] = field(default_factory=dict)  # tool name -> its file name
    classes: dict[str, SideEffect] = field(default_factory=dict)  # tool name -> class
    skipped: list[str] = field(default_factory=list)  # why a tool has no file


def shipped_defaults() -> str:
    return resources.files("proxy").joinpath("builtin_policies", "defaults.yaml").read_text(encoding="utf-8")


def side_effect_of(annotations: Any) -> tuple[SideEffect, str]:
    """The class the proxy would infer at run time, and a comment that says why."""
    hints = annotations if isinstance(annotations, dict) else None
    side_effect, _ = annotation_side_effect(hints)
    if side_effect is SideEffect.READ_ONLY:
        return side_effect, "readOnlyHint: true in tools/list"
    if side_effect is SideEffect.IDEMPOTENT:
        return side_effect, "idempotentHint: true in tools/list (readOnlyHint is not true)"
    if hints is None:
        return side_effect, "no annotations in tools/list: the MCP default"
    given = [f"{k}: {_bounded(json.dumps(hints[k]), 20)}" for k in HINTS if k in hints]
    if not given:
        return side_effect, "no readOnlyHint or idempotentHint in tools/list: the MCP default"
    if hints.get("destructiveHint") is True:
        return side_effect, f"{', '.join(given)} in tools/list"
    return side_effect, f"{', '.join(given)} in tools/list: neither read-only nor idempotent"


def comment_text(text: str) -> str:
    """One comment line's worth of `text`: no line breaks (YAML counts NEL, LS and PS as such) nor
    other control characters, bounded."""
    cleaned = "".join(" " if unicodedata.category(c)[0] in "CZ" and c != " " else c for c in text)
    return _bounded(cleaned, DESCRIPTION_CHARS)


def _first_line(description: Any) -> str:
    if not isinstance(description, str):
        return ""
    for line in description.splitlines():
        if line.strip():
            return comment_text(line.strip())
    return ""


def file_stem(name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip("._-")[:80]
    return stem or "tool"


def draft(tools: Sequence[Mapping[str, Any]], source: str = "the server") -> Draft:
    out = Draft()
    out.files["defaults.yaml"] = shipped_defaults()
    taken = {n.lower() for n in (*DEFAULTS_NAMES, "defaults")}
    seen_tools: set[str] = set()
    for tool in sorted(tools, key=lambda t: str(t.get("name"))):
        name = str(tool.get("name"))
        if name in seen_tools:
            continue  # a server listing a name twice: the first one is drafted
        seen_tools.add(name)
        if is_glob(name):
            out.skipped.append(f"{name!r}: its name has * ? or [, which a policy file reads as a glob")
            continue
        stem = file_stem(name)
        if stem.lower() in taken or f"{stem}.yaml".lower() in taken:
            stem = f"{stem}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        taken.add(stem.lower())
        side_effect, why = side_effect_of(tool.get("annotations"))
        description = _first_line(tool.get("description"))
        quoted = yaml.safe_dump([name], default_flow_style=True, width=10_000, allow_unicode=True).strip()
        lines = [
            f"# {comment_text(name)}: {description}" if description else f"# {comment_text(name)}: (no description)",
            f"# Drafted by `mcp-recovery-proxy policies init` from {source}'s tools/list. Review the",
            "# inferred value against what the tool really does, then add what it needs (deadline,",
            "# attempt_timeout, rules, report: docs/policies.md). side_effect set here wins over the",
            "# server's annotations; delete the line to follow them instead.",
            f"tools: {quoted}",
            f"side_effect: {side_effect.value}  # {why}",
        ]
        file_name = f"{stem}.yaml"
        out.files[file_name] = "\n".join(lines) + "\n"
        out.tools[name] = file_name
        out.classes[name] = side_effect
    return out


# -- writing beside what exists ----------------------------------------------------------------


def _claims(folder: Path) -> dict[str, str]:
    """Exact tool names the folder's files name already (also from a file that is invalid)."""
    claims: dict[str, str] = {}
    for file_name in policy_file_names(folder):
        try:
            content = (folder / file_name).read_bytes()
        except OSError:
            continue
        for tool in parse_policy_file(file_name, content).tools:
            claims.setdefault(tool, file_name)
    return claims


def _diff(old: str, new: str, shown: str, old_label: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=old_label,
            tofile=f"{shown} (drafted from tools/list)",
        )
    )


def write(folder: Path, planned: Draft, *, dry_run: bool = False) -> int:
    shown = str(folder)
    existing = folder.is_dir()
    claims = _claims(folder) if existing else {}
    defaults_present = next((n for n in DEFAULTS_NAMES if existing and (folder / n).is_file()), None)
    left = written = same = 0
    if not existing and not dry_run:
        folder.mkdir(parents=True)
    file_tools = {file_name: tool for tool, file_name in planned.tools.items()}
    for file_name, text in planned.files.items():
        path = folder / file_name
        tool = file_tools.get(file_name)
        if file_name == "defaults.yaml" and defaults_present is not None:
            path = folder / defaults_present  # a defaults.yml is the defaults file: never add a second
        elif tool is not None and tool in claims and claims[tool] != file_name:
            print(f"kept     {folder / claims[tool]}: names {tool!r} already; no file drafted for it")
            continue
        if path.exists() or path.is_symlink():
            try:
                old = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                print(f"left     {path}: exists and cannot be read ({exc}); not touched")
                left += 1
                continue
            if old == text:
                same += 1
                print(f"same     {path}")
                continue
            left += 1
            print(f"differs  {path}: not touched; what init would write instead:")
            sys.stdout.write(_diff(old, text, str(path), f"{path} (as it is)"))
            continue
        if dry_run:
            print(f"new      {path}:")
            sys.stdout.write(_diff("", text, str(path), "/dev/null"))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote    {path}{_what(tool, planned)}")
        written += 1
    verb = "would write" if dry_run else "wrote"
    print(
        f"{verb} {written} file(s) in {shown}, {same} already the same, {left} left as they are"
        + (" (diffs above)" if left else "")
    )
    return 1 if left else 0


def _what(tool: str | None, planned: Draft) -> str:
    if tool is None:
        return "  (the shipped defaults)"
    return f"  ({tool}: {planned.classes[tool].value})"


# -- the command -------------------------------------------------------------------------------


def run(folder: str, values: dict[str, Any], *, dry_run: bool = False, timeout_s: float = 60.0) -> int:
    from pydantic import ValidationError

    from proxy.settings import Settings

    path = Path(folder)
    if path.exists() and not path.is_dir():
        print(
            f"mcp-recovery-proxy: {folder}: is a file, not a folder; give the folder to write the policies to",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.ERROR, format="mcp-recovery-proxy: %(message)s")
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            print(f"mcp-recovery-proxy: --{where.replace('_', '-')}: {err['msg']}", file=sys.stderr)
        return 2
    if not timeout_s > 0:
        print("mcp-recovery-proxy: --timeout-s: must be more than 0 seconds", file=sys.stderr)
        return 2
    try:
        tools = asyncio.run(list_tools(settings, timeout_s))
    except InitError as exc:
        print(f"mcp-recovery-proxy: policies init: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the server was stopped on the way out (list_tools' finally)
        return 130
    planned = draft(tools)
    counts = {c: sum(1 for v in planned.classes.values() if v is c) for c in SideEffect}
    print(
        f"{len(tools)} tool(s) listed: "
        + ", ".join(
            f"{counts[c]} {c.value}" for c in (SideEffect.READ_ONLY, SideEffect.IDEMPOTENT, SideEffect.STATE_CHANGING)
        )
    )
    for why in planned.skipped:
        print(f"skipped  {why}")
    try:
        return write(path, planned, dry_run=dry_run)
    except OSError as exc:
        print(f"mcp-recovery-proxy: policies init: {folder}: {exc.strerror or exc}", file=sys.stderr)
        return 2
