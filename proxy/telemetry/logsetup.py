"""Logging set-up: plain lines or JSON lines on stderr (stdout may carry MCP over stdio).

Every line, whichever logger wrote it (ours, uvicorn's, a library's) and including tracebacks
and `extra` fields, passes one formatter that removes the proxy's own credentials by exact match
(proxy/secret_values.py) from the finished line: the one place that sees all log text.

The same formatter keeps a message to one bounded line: its control characters (line breaks
included) are written as escapes and it is cut at `MAX_MESSAGE_CHARS`, whatever a peer put in
the text a log call quotes (a method or tool name, an upstream's error): a caller's method name
holding a line break and a forged log line must not be written as two lines, the forged one
looking like the proxy's own. A traceback (the record's exception) keeps its lines.

An `extra` field (JSON lines write each as a key; the plain format writes none) is bounded too:
a string, or a value whose JSON is longer than `MAX_FIELD_CHARS`, is written cut to that many
characters (never inside a secret). A field may carry a peer's text (the tool name of the call
log is the upstream's), and one call's line must not carry 200,000 characters of it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from proxy.secret_values import SECRETS
from proxy.telemetry.budget import TokenBucket

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = _bounded_field(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


MAX_MESSAGE_CHARS = 16 * 1024
MAX_FIELD_CHARS = 1024


def _bounded_field(value: Any) -> Any:
    """`value` as a JSON log field of at most `MAX_FIELD_CHARS` characters (see the module doc)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if not isinstance(value, str):
        text = json.dumps(value, default=str)
        if len(text) <= MAX_FIELD_CHARS:
            return value
        value = text
    if len(value) > MAX_FIELD_CHARS:
        return SECRETS.head(value, MAX_FIELD_CHARS - 1) + "…"
    return value


# Every C0 control character but the tab, and DEL, as an escape (`str.translate`: C speed).
_ESCAPES = {i: f"\\x{i:02x}" for i in (*range(0x20), 0x7F) if i != 0x09} | {0x0A: "\\n", 0x0D: "\\r"}


def one_line(text: str) -> str:
    """`text` as one bounded line: control characters escaped, cut at `MAX_MESSAGE_CHARS`."""
    if len(text) > MAX_MESSAGE_CHARS:
        text = SECRETS.head(text, MAX_MESSAGE_CHARS - 1) + "…"  # never a secret's prefix at the cut
    return text.translate(_ESCAPES)


class SecretScrubbingFormatter(logging.Formatter):
    """Formats with `inner` a record whose message is `one_line`, then removes the registered
    secret values from the whole line."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        safe = one_line(message)
        if safe != message:
            record = logging.makeLogRecord({**record.__dict__, "msg": safe, "args": None})
        return SECRETS.scrub(self.inner.format(record))


class WarningBudget(logging.Filter):
    """A token bucket for a logger's WARNING records: `burst` at once, then `rate` a second; the
    next line let through after a drop says how many were not logged. Other levels pass.

    On uvicorn's error logger: its warnings come one per request or connection a peer got wrong
    ("Invalid HTTP request received."), with no text of the peer's but at the peer's pace: 500
    malformed requests were 500 lines in a third of a second. Its errors (an exception in the
    app, a port it cannot bind) are not limited."""

    def __init__(self, burst: int = 100, rate: float = 20.0) -> None:
        super().__init__()
        self.bucket = TokenBucket(burst, rate)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        bucket = self.bucket
        if not bucket.allow():
            return False
        dropped = bucket.take_dropped()
        if dropped:
            record.msg = f"{record.msg} ({dropped} more warnings of this logger were not logged before this one)"
        return True


UVICORN_WARNINGS = WarningBudget()


def configure(*, level: str = "info", json_lines: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    inner = JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(SecretScrubbingFormatter(inner))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's loggers get handlers of their own (and stop propagating) wherever uvicorn's default
    # logging config ran first, e.g. another server in the same process: their lines would then
    # bypass the scrubbing formatter. Route them through the root handler whatever ran before.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers[:] = []
        uvicorn_logger.propagate = True
    if UVICORN_WARNINGS not in logging.getLogger("uvicorn.error").filters:
        logging.getLogger("uvicorn.error").addFilter(UVICORN_WARNINGS)
    # The upstream's stderr is its own log: keep it, but one level quieter than ours by default.
    logging.getLogger("proxy.upstream.stderr").setLevel(max(root.level, logging.INFO))
    # httpx (the JWKS and issuer metadata fetches of --auth jwt) logs every request at INFO: a line
    # per key refresh that says nothing the proxy's own lines do not. Its warnings still come.
    logging.getLogger("httpx").setLevel(max(root.level, logging.WARNING))
