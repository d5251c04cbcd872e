"""The process-wide registry of secret values: the proxy's own credentials, removed by exact match
from everything the proxy writes or returns.

Contract:
- `SECRETS.set(values)` is called once at start with the values of `--upstream-header`
  (proxy/server.py); tests set and clear it themselves. Pattern-based redaction
  (proxy/recovery/redact.py) cannot know that an opaque `X-Api-Key: 7f3a…` is a secret; the
  registry does, and it runs first.
- The few places where text leaves the proxy apply it, and nothing else needs to: the log
  formatter (proxy/telemetry/logsetup.py), the admin responses (proxy/admin/app.py), span attributes
  (proxy/telemetry/tracing.py), `UpstreamFailure` (proxy/errors.py: every failure detail and the
  JSON-RPC error body relayed with an HTTP error), `redact()` (unresolved reports and attempt
  details), and every message written to a caller (`jsonrpc.dumps_out`, used by both frontends).
- Every match becomes `[redacted]`. `head()` cuts text without leaving a secret's prefix behind.
- With nothing registered (a stdio upstream, no headers), every function returns its input as is.

Standard library only: `proxy.recovery` may import it (tests/recovery/test_recovery_imports.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

REDACTED: Final = "[redacted]"


class SecretValues:
    """Exact secret values, removed from text (str or UTF-8 bytes) and from JSON-like values.

    A value is matched as given, as the credential after an auth scheme (`Bearer abc` also removes
    `abc` on its own, which is what an upstream that prints the token shows), and as it reads
    inside JSON text (quotes and backslashes escaped). Values shorter than `MIN_LENGTH` are not
    registered: replacing every `ab` in every log line would destroy the logs while protecting
    nothing (a 3-character credential is guessable anyway).
    """

    MIN_LENGTH: Final = 4
    _DEPTH: Final = 64  # deeper JSON values are replaced whole: only an attacker nests that far

    __slots__ = ("_byte_values", "_bytes", "_text", "_values")

    def __init__(self) -> None:
        self._values: tuple[str, ...] = ()
        self._text: re.Pattern[str] | None = None
        self._bytes: re.Pattern[bytes] | None = None
        self._byte_values: tuple[bytes, ...] = ()

    def set(self, values: Iterable[str]) -> None:
        """Replace the registry with `values` (the configured header values)."""
        variants: set[str] = set()
        for raw in values:
            value = raw.strip()
            forms = [value]
            _scheme, sep, credential = value.partition(" ")
            if sep and credential.strip():
                forms.append(credential.strip())
            for form in forms:
                if len(form) >= self.MIN_LENGTH:
                    variants.add(form)
                    variants.add(json.dumps(form, ensure_ascii=False)[1:-1])
                    variants.add(json.dumps(form)[1:-1])
        # Longest first: a value that contains another is replaced whole.
        ordered = sorted(variants, key=len, reverse=True)
        self._values = tuple(ordered)
        self._byte_values = tuple(v.encode() for v in ordered)
        self._text = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._bytes = re.compile(b"|".join(re.escape(v.encode()) for v in ordered)) if ordered else None

    def clear(self) -> None:
        self.set(())

    @property
    def active(self) -> bool:
        return self._text is not None

    # A substring test per value (a fast memory search) before the regex: almost every text has
    # none of them, and a regex alternation walks every position (10x the cost on a 2 KB message).
    def scrub(self, text: str) -> str:
        pattern = self._text
        if pattern is None or not any(value in text for value in self._values):
            return text
        return pattern.sub(REDACTED, text)

    def head(self, text: str, n: int) -> str:
        """`text[:n]` scrubbed, cut before a secret that straddles position n (never a prefix of one)."""
        pattern = self._text
        if pattern is None:
            return text[:n]
        cut = n
        for match in pattern.finditer(text, 0, n + len(self._values[0])):
            if match.start() < n < match.end():
                cut = match.start()
                break
        return pattern.sub(REDACTED, text[:cut])

    def scrub_bytes(self, data: bytes) -> bytes:
        pattern = self._bytes
        if pattern is None or not any(value in data for value in self._byte_values):
            return data
        return pattern.sub(REDACTED.encode(), data)

    def scrub_value(self, value: Any, depth: int = 0) -> Any:
        """A copy of a JSON-like value with every string (keys included) scrubbed."""
        if self._text is None:
            return value
        if depth > self._DEPTH:
            return REDACTED
        match value:
            case str():
                return self.scrub(value)
            case Mapping():
                return {self.scrub(str(k)): self.scrub_value(v, depth + 1) for k, v in value.items()}
            case list() | tuple():
                return [self.scrub_value(v, depth + 1) for v in value]
            case _:
                return value


SECRETS: Final = SecretValues()
