"""Shipped classification rules: what real MCP servers and their runtimes say when a call fails.

Contract (docs/recovery.md, "Shipped rules"):
- `SHIPPED_RULES` is an ordered table; `shipped_rule_for(text)` returns the first rule whose pattern
  is found in the text (case-insensitive), or None. `classify` consults it after the upstream's own
  `errorCategory` and the tool's policy rules, and before *unclassified*: a policy rule that
  matches the same text always wins, so every row here is overridable per tool.
- Each rule has a stable `id` that shows in the result's evidence (`classification.rule`, source
  `shipped`) and in docs/recovery.md's table, whose examples are the tests' examples.
- A rule whose `category` is None recognises a text that deliberately stays unclassified (a
  server's own output-validation failure is neither the caller's input nor temporary); it keeps a
  later, broader row from claiming it.
- Patterns are literal alternations with at most one bounded quantifier per branch and no nested
  quantifiers or back-references, so a search is linear in the text and every pattern is valid
  for RE2-style engines as well.

The phrasings come from the sources of the reference SDKs and servers: the TypeScript SDK
(`McpError` prefixes "MCP error -32602: "; `Input validation error: Invalid arguments for tool X`,
`Tool X not found`), the Python SDK (`Unknown tool: X`, pydantic's `1 validation error for
XArguments ... Field required`), server-filesystem (`Access denied - path outside allowed
directories`, ENOENT, `Could not find exact match for edit`), server-memory (`Entity with name X
not found`), mcp-server-time (`Invalid timezone`), mcp-server-git (`Invalid path`, git's `did not
match any file(s) known to git`), and the Node/POSIX error codes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from proxy.policy.compiled import Category


@dataclass(frozen=True, slots=True)
class ShippedRule:
    id: str
    category: Category | None  # None: recognised, and deliberately left unclassified
    pattern: re.Pattern[str]
    examples: tuple[str, ...]  # real texts it matches (docs/recovery.md shows them; tests run them)


def _rule(id_: str, category: Category | None, pattern: str, *examples: str) -> ShippedRule:
    return ShippedRule(id_, category, re.compile(pattern, re.IGNORECASE), examples)


V, P, T = Category.VALIDATION, Category.PERMISSION, Category.TRANSIENT

SHIPPED_RULES: Final[tuple[ShippedRule, ...]] = (
    _rule(
        "sdk-output-validation",
        None,
        r"output validation error|does not match the tool's output schema|has an output schema but",
        "MCP error -32602: Output validation error: Invalid structured content for tool get_time",
    ),
    _rule(
        "sdk-input-validation",
        V,
        r"input validation error|invalid arguments|validation errors? for |field required|input should be "
        r"|missing required (?:argument|parameter|property|field)|invalid request parameters|invalid params",
        "MCP error -32602: Input validation error: Invalid arguments for tool echo: expected string, received number",
        "Error executing tool add: 1 validation error for addArguments\nb\n  Field required [type=missing]",
        "Missing required argument: timezone",
        "Invalid request parameters",
    ),
    _rule(
        "sdk-unknown-tool",
        V,
        r"unknown tool|tool [^ ]{1,200} (?:not found|disabled)",
        "MCP error -32602: Tool nosuch not found",
        "Unknown tool: nosuch",
    ),
    _rule(
        "permission-denied",
        P,
        r"permission denied|access denied|access is denied|\beacces\b|\beperm\b|operation not permitted"
        r"|\bforbidden\b|\bunauthori[sz]ed\b|not authori[sz]ed|insufficient (?:permissions|privileges|scope)",
        "Access denied - path outside allowed directories: /etc/passwd not in /tmp/work",
        "EACCES: permission denied, open '/srv/data/locked.txt'",
        "EPERM: operation not permitted, unlink '/srv/data/x'",
    ),
    _rule(
        "timeout",
        T,
        r"timed out|\betimedout\b|deadline exceeded|\btimeout (?:error|exceeded|expired)|gateway timeout",
        "connect ETIMEDOUT 10.0.0.7:443",
        "upstream request timed out after 30000 ms",
        "504 Gateway Timeout",
    ),
    _rule(
        "connection-failure",
        T,
        r"\beconnreset\b|\beconnrefused\b|\beconnaborted\b|connection (?:reset|refused|aborted)"
        r"|\bepipe\b|broken pipe|socket hang up|\beai_again\b|temporary failure in name resolution",
        "read ECONNRESET",
        "connect ECONNREFUSED 127.0.0.1:5432",
        "[Errno 104] Connection reset by peer",
    ),
    _rule(
        "overloaded",
        T,
        r"too many requests|rate limit|service unavailable|temporarily unavailable"
        r"|\b(?:http|status|status code|error|code)[ :=]{1,3}(?:429|503)\b",
        "429 Too Many Requests",
        "Rate limit exceeded, retry in 20s",
        "503 Service Unavailable",
        "upstream answered status 503",
    ),
    _rule(
        "not-found",
        V,
        r"not found|no such file|no such (?:directory|repository|branch|ref)|\benoent\b|does not exist"
        r"|could not find|cannot find|did not match any|did not resolve to an object",
        "ENOENT: no such file or directory, open '/tmp/work/missing.txt'",
        "Entity with name Alice not found",
        "Parent directory does not exist: /tmp/work/a",
        "Could not find exact match for edit:\nold text",
        "error: pathspec 'nosuch' did not match any file(s) known to git",
        "Ref 'no-such-branch' did not resolve to an object",
    ),
    _rule(
        "invalid-input",
        V,
        r"\binvalid\b|\bmalformed\b|cannot specify both",
        "Invalid timezone: 'Mars/Olympus'",
        "Invalid time format. Expected HH:MM [24-hour format]",
        "Cannot specify both head and tail parameters simultaneously",
    ),
)

_ID_PATTERN: Final = re.compile(r"[a-z][a-z0-9-]*")
assert all(_ID_PATTERN.fullmatch(rule.id) for rule in SHIPPED_RULES)
assert len({rule.id for rule in SHIPPED_RULES}) == len(SHIPPED_RULES)


def shipped_rule_for(text: str) -> ShippedRule | None:
    """The first shipped rule found in `text` (callers bound its length), or None."""
    if not text:
        return None
    for rule in SHIPPED_RULES:
        if rule.pattern.search(text) is not None:
            return rule
    return None
