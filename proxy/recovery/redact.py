"""Make a detail safe to hand to a model or a log: no secrets, no argument values, bounded length.

Contract: `redact(text, limit=300, arguments=None)` returns a single-line string of at most `limit`
characters in which
- credentials are replaced by `[redacted]`: `Authorization:` header values, `Bearer <token>`,
  `key=value` / `"key": "value"` pairs whose key names a secret (api_key, token, secret,
  password, ...), JWTs, well-known token prefixes (sk-, ghp_, xox?-, AKIA), and long hex or
  base64-like runs (32+ characters);
- every string value of the call's arguments (4+ characters) and every number-like leaf is
  replaced by `[argument]`, so an upstream message that echoes the input does not leak it;
- control characters and runs of whitespace collapse to one space.

Before any of that, the exact values of the proxy's own credentials are removed
(`proxy.secret_values.SECRETS`), on the whole text, so the prefix cut cannot split one.

`scrub_arguments(value, arguments)` does the argument part for a JSON value the proxy carries in
its own report (the `data` of an upstream's JSON-RPC error): a copy in which every string holding
an argument value has it replaced by `[argument]`, and a number equal to a numeric argument is
`[argument]`; keys and structure are kept. Nesting past 32 levels is cut to `[argument]` too, as
it cannot be checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from proxy.secret_values import REDACTED, SECRETS

DETAIL_LIMIT: Final = 300
ARGUMENT: Final = "[argument]"

_SECRET_KEY = (
    r"(?:api[_-]?key|apikey|x-api-key|access[_-]?token|refresh[_-]?token|id[_-]?token|auth[_-]?token|"
    r"token|secret|client[_-]?secret|password|passwd|pwd|private[_-]?key|session[_-]?id|cookie)"
)

_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    (
        re.compile(r"(?i)\b(proxy-)?authorization\b(\s*[:=]\s*)(?:\"[^\"]*\"|'[^']*'|[^\r\n,;]*)"),
        r"\1Authorization\2" + REDACTED,
    ),
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{6,}"), r"\1 " + REDACTED),
    (
        re.compile(r"(?i)([\"']?\b" + _SECRET_KEY + r"\b[\"']?\s*[:=]\s*)(?:\"[^\"]*\"|'[^']*'|[^\s,;&}\]]+)"),
        r"\1" + REDACTED,
    ),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), REDACTED),
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\b[0-9a-fA-F]{32,}\b"), REDACTED),
    # base64-like runs need a digit and a letter, so long snake_case words survive
    (
        re.compile(r"(?<![A-Za-z0-9+/_-])(?=[A-Za-z+/_-]*[0-9])(?=[0-9+/_-]*[A-Za-z])[A-Za-z0-9+/_-]{32,}={0,2}"),
        REDACTED,
    ),
)


_SPACE = re.compile(r"[\s\x00-\x1f\x7f]+")


def _leaves(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 32:
        return
    match value:
        case bool() | None:
            return
        case str():
            if len(value) >= 4:
                yield value
        case int() | float():
            text = str(value)
            if len(text) >= 4:
                yield text
        case Mapping():
            for item in value.values():
                yield from _leaves(item, depth + 1)
        case list() | tuple():
            for item in value:
                yield from _leaves(item, depth + 1)
        case _:
            return


def _argument_leaves(arguments: Mapping[str, Any]) -> list[str]:
    # Longest first, so that a value containing another is replaced whole.
    return sorted(set(_leaves(arguments)), key=len, reverse=True)


def _replace_leaves(text: str, leaves: list[str]) -> str:
    for leaf in leaves:
        text = text.replace(leaf, ARGUMENT)
    return text


def scrub_arguments(value: Any, arguments: Mapping[str, Any] | None) -> Any:
    """A copy of the JSON value `value` without the string or numeric values of `arguments`."""
    if not arguments:
        return value
    leaves = _argument_leaves(arguments)
    if not leaves:
        return value

    def walk(item: Any, depth: int) -> Any:
        if depth > 32:
            return ARGUMENT
        match item:
            case bool() | None:
                return item
            case str():
                return _replace_leaves(item, leaves)
            case int() | float():
                return ARGUMENT if str(item) in leaves else item
            case Mapping():
                return {key: walk(v, depth + 1) for key, v in item.items()}
            case list() | tuple():
                return [walk(v, depth + 1) for v in item]
            case _:
                return item

    return walk(value, 0)


def bound(text: str, limit: int) -> str:
    """At most `limit` characters, ending with an ellipsis when cut."""
    if limit <= 0:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def redact(text: str, limit: int = DETAIL_LIMIT, arguments: Mapping[str, Any] | None = None) -> str:
    """A single-line, bounded, secret-free and argument-free version of `text`."""
    # Work on a bounded prefix: a megabyte of upstream text must not cost megabytes of regex work.
    # Exact secrets first: a plain prefix cut could leave the start of one behind.
    out = SECRETS.head(text, max(limit * 8, 4096))
    if arguments:
        out = _replace_leaves(out, _argument_leaves(arguments))
    for pattern, replacement in _PATTERNS:
        out = pattern.sub(replacement, out)
    out = _SPACE.sub(" ", out).strip()
    return bound(out, limit)
