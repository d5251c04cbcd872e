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

The work is bounded whatever the caller sends (`ArgumentValues`): the values are prepared once
per report, and a text whose check would take the report's scrubbing past `WORK_BUDGET` is
replaced whole by `WITHHELD` rather than passed unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from proxy.jsonrpc import bounded
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


# Up to this many argument values, a text is searched for each of them; past it, only the values
# that can occur in the text are (see `ArgumentValues.replace`).
_FEW = 32
_KEY = 4  # every value is at least this long: its first characters index it
_INDEXED_TEXT = 64 * 1024  # a longer text is not indexed (its windows would cost more than they save)
# The scrubbing work one report may do, in characters searched (a value tried against a text costs
# the text's length): some tens of milliseconds. Past it the remaining texts are withheld whole.
WORK_BUDGET = 32 * 1024 * 1024
WITHHELD = "[withheld: the call's arguments hold too many values to check this text against]"


class ArgumentValues:
    """The values of one call's arguments, prepared once for every text scrubbed of them.

    A caller chooses how many values its arguments hold (a 4 MiB body carries ~400 000): trying
    each against every text was their count times the text's length, per text, and an unresolved
    report scrubs one text per attempt plus every string of the error's data. That held the event
    loop (every other caller) for seconds per call. Now the values are walked once per report and
    indexed by their first `_KEY` characters; a text with many values to look for is searched
    only for those whose first and last `_KEY` characters both appear in it. Values chosen to
    pass that test anyway (all alike, against a text made of the same) defeat the index, so the
    work is also bounded (`WORK_BUDGET`): a text that would take the report past it is withheld
    whole (fail closed: never a value left in).
    """

    __slots__ = ("_by_key", "_few", "_values", "spent")

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        self._values = frozenset(_leaves(arguments))
        # Few values: each is tried, longest first (so that a value containing another is
        # replaced whole). Many: indexed on first use (`replace`).
        self._few = sorted(self._values, key=len, reverse=True) if len(self._values) <= _FEW else None
        self._by_key: dict[str, list[str]] | None = None
        self.spent = 0  # characters searched so far, against WORK_BUDGET

    def __bool__(self) -> bool:
        return bool(self._values)

    @property
    def leaves(self) -> list[str]:
        """Every value, longest first."""
        return self._few if self._few is not None else sorted(self._values, key=len, reverse=True)

    def holds(self, text: str) -> bool:
        """Whether `text` is one of the values (a number's text)."""
        return text in self._values

    def replace(self, text: str) -> str:
        """`text` with every value in it replaced by `[argument]`, longest first; `WITHHELD`
        when that would take the work past its budget."""
        leaves = self._few
        if leaves is None:
            if len(text) > _INDEXED_TEXT:
                candidates: list[str] | None = None
                count = len(self._values)
            else:
                self.spent += len(text)  # its windows
                by_key = self._by_key
                if by_key is None:
                    by_key = self._by_key = {}
                    for leaf in self._values:
                        by_key.setdefault(leaf[:_KEY], []).append(leaf)
                windows = {text[i : i + _KEY] for i in range(len(text) - _KEY + 1)}
                # its first and its last characters must both occur in the text (a set lookup each)
                candidates = [leaf for w in windows if w in by_key for leaf in by_key[w] if leaf[-_KEY:] in windows]
                count = len(candidates)
        else:
            candidates, count = leaves, len(leaves)
        cost = count * len(text)
        if self.spent + cost > WORK_BUDGET:
            self.spent = WORK_BUDGET
            return WITHHELD
        self.spent += cost
        if candidates is None:
            candidates = list(self._values)
        if leaves is None:
            candidates.sort(key=len, reverse=True)
        for leaf in candidates:
            text = text.replace(leaf, ARGUMENT)
        return text


def argument_values(arguments: Mapping[str, Any] | ArgumentValues | None) -> ArgumentValues | None:
    """`arguments` prepared for scrubbing (None: nothing to scrub); prepare once per report."""
    if arguments is None or isinstance(arguments, ArgumentValues):
        return arguments
    return ArgumentValues(arguments) if arguments else None


def scrub_arguments(value: Any, arguments: Mapping[str, Any] | ArgumentValues | None) -> Any:
    """A copy of the JSON value `value` without the string or numeric values of `arguments`."""
    values = argument_values(arguments)
    if not values:
        return value

    def walk(item: Any, depth: int) -> Any:
        if depth > 32:
            return ARGUMENT
        match item:
            case bool() | None:
                return item
            case str():
                return values.replace(item)
            case int() | float():
                return ARGUMENT if values.holds(str(item)) else item
            case Mapping():
                return {key: walk(v, depth + 1) for key, v in item.items()}
            case list() | tuple():
                return [walk(v, depth + 1) for v in item]
            case _:
                return item

    return walk(value, 0)


def redact(text: str, limit: int = DETAIL_LIMIT, arguments: Mapping[str, Any] | ArgumentValues | None = None) -> str:
    """A single-line, bounded, secret-free and argument-free version of `text`. `arguments`: the
    call's arguments, or `argument_values` of them when several texts are redacted for one call."""
    # Work on a bounded prefix: a megabyte of upstream text must not cost megabytes of regex work.
    # Exact secrets first: a plain prefix cut could leave the start of one behind.
    out = SECRETS.head(text, max(limit * 8, 4096))
    values = argument_values(arguments)
    if values:
        out = values.replace(out)
    for pattern, replacement in _PATTERNS:
        out = pattern.sub(replacement, out)
    out = _SPACE.sub(" ", out).strip()
    return bounded(out, limit)
