"""The regular-expression engine of policy rules (`rules[].text`): RE2, through `google-re2`.

Contract:
- `compile_rule_text(pattern)` returns a compiled pattern with `search(text)` and `pattern`, or
  raises `ValueError` whose text says what RE2 refused and how to rewrite it.
- Matching takes time linear in the text, whatever the pattern: a rule such as `(a+)+b` against
  an upstream error that echoes a caller's input blocked the event loop for 10 s at 28
  characters with Python's backtracking `re` (and every call and /healthz with it). RE2 has no
  backtracking, so it cannot; the price is that backreferences (`\\1`) and lookaround (`(?=`,
  `(?!`, `(?<=`, `(?<!`) do not exist, and `policies check` says so with the file, line and key.
- Why RE2 and not the `regex` module with a timeout: a timeout still burns its whole budget on
  the event loop for every matching attempt, and picking it is a trade between false refusals and
  stalls; RE2 removes the stall instead of bounding it.
"""

from __future__ import annotations

import re2

from proxy.policy.compiled import TextPattern

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print each refused pattern on stderr; the error says it


def compile_rule_text(pattern: str) -> TextPattern:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if any(token in pattern for token in ("(?=", "(?!", "(?<=", "(?<!")) or (
            "\\" in pattern and any(f"\\{d}" in pattern for d in "123456789")
        ):
            hint = (
                "policy regexes run on RE2, which has no backreferences (\\1) or lookaround ((?=, (?!, (?<=, (?<!) "
                "because it never backtracks; match the text directly (e.g. 'timed? ?out' instead of "
                "'(?=.*time)out'), or use path/equals on structuredContent"
            )
        else:
            hint = "escape special characters such as ( ) [ ] . * + ? with a backslash"
        # A problem line stays one bounded line, whatever the pattern's length.
        shown = repr(pattern) if len(pattern) <= 80 else repr(pattern[:79]) + "…"
        raise ValueError(f"{shown} is not a valid regular expression ({reason[:200]}); {hint}") from None
