"""Header text of the HTTP/1.1 client: response headers as read, the origin's cookies, and the
bytes of each request head.

Contract: `Headers` keeps every response header in arrival order and looks names up
case-insensitively; its `repr` shows names only. `CookieJar` keeps one origin's cookies and never
fails on a server's bad `Set-Cookie`. `RequestWriter.encode` gives one request as the single
bytes object to write, or raises `ValueError` before anything is sent for a method, target,
header name or value that could smuggle a second line (CR, LF, NUL) or is not latin-1; its
messages never quote a header value (values can carry credentials).
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Iterator, Mapping
from http.cookies import CookieError, SimpleCookie
from typing import Final
from urllib.parse import quote

__all__ = ["CookieJar", "Headers", "RequestWriter", "check_header_text", "clean_target", "has_bad_host_characters"]

_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_KNOWN_METHODS: Final = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Header names the client writes itself: a request header with one of these names takes the slow path.
_MANAGED: Final = frozenset({"host", "content-length", "cookie"})
# Printable ASCII minus space: what `quote` may leave alone in a target with non-ASCII characters.
_TARGET_SAFE: Final = "".join(chr(c) for c in range(0x21, 0x7F))


class Headers:
    """Response headers, in arrival order, looked up case-insensitively.

    Not a `collections.abc.Mapping`: iteration yields `(name, value)` pairs, so that repeated
    headers (`Set-Cookie`) survive. The lookup index `first` (lower-case name → its first value;
    read it, never change it) is built once, in C, by a dict comprehension; `getall` scans the
    pairs (it is rarely needed). `repr` shows names only: values can carry credentials."""

    __slots__ = ("_items", "first")

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        self.first = {name.lower(): value for name, value in reversed(items)}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.first.get(name.lower(), default)

    def getall(self, name: str) -> list[str]:
        key = name.lower()
        return [value for n, value in self._items if n.lower() == key]

    def __getitem__(self, name: str) -> str:
        return self.first[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self.first

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def __repr__(self) -> str:
        return f"Headers({[name for name, _ in self._items]!r})"


class CookieJar:
    """The cookies of one origin, name → value.

    The upstream is a single origin, so `Path` and `Domain` are ignored (every cookie is sent on
    every request), as are `Secure`/`HttpOnly`/`SameSite`. `Max-Age` wins over `Expires` (RFC 6265
    §5.3); a Max-Age ≤ 0 or an Expires in the past deletes the cookie. A Set-Cookie the standard
    library cannot parse is ignored: a server's bad cookie must not fail the call."""

    __slots__ = ("_cookies",)

    def __init__(self) -> None:
        self._cookies: dict[str, tuple[str, float | None]] = {}

    def __bool__(self) -> bool:
        return bool(self._cookies)

    def update(self, set_cookies: list[str]) -> None:
        now = time.time()
        for raw in set_cookies:
            parsed = SimpleCookie()
            try:
                parsed.load(raw)
            except CookieError:
                continue
            for name, morsel in parsed.items():
                expires_at = _expiry(morsel["max-age"], morsel["expires"], now)
                if expires_at is not None and expires_at <= now:
                    self._cookies.pop(name, None)
                else:
                    self._cookies[name] = (morsel.coded_value, expires_at)

    def header(self) -> str:
        """The `Cookie` header value; drops the cookies that expired meanwhile."""
        now = time.time()
        expired = [name for name, (_, at) in self._cookies.items() if at is not None and at <= now]
        for name in expired:
            del self._cookies[name]
        return "; ".join(f"{name}={value}" for name, (value, _) in self._cookies.items())


def _expiry(max_age: str, expires: str, now: float) -> float | None:
    """The absolute expiry (time.time() scale) of a cookie, None for a session cookie."""
    if max_age:
        try:
            return now + int(max_age)
        except ValueError:
            pass  # RFC 6265: an unparseable Max-Age is ignored
    if expires:
        try:
            when = email.utils.parsedate_to_datetime(expires)
        except (TypeError, ValueError, IndexError):
            return None
        if when is not None:
            return when.timestamp()
    return None


class RequestWriter:
    """The request heads of one origin: its target, Host, default headers and cookies.

    Default headers are written on every request; a request header of the same name
    (case-insensitive) replaces the default. Raises `ValueError` when built for a default header
    with CR, LF or NUL or not latin-1 encodable. `fixed` is the constant part of every head (Host
    and the default headers, already joined); `keep_alive` whether the defaults allow it."""

    __slots__ = ("_default_names", "_defaults", "cookies", "fixed", "keep_alive", "target")

    def __init__(self, target: str, host_header: str, headers: Mapping[str, str] | None, cookies: CookieJar) -> None:
        self.target = target
        defaults: dict[str, tuple[str, str]] = {"host": ("Host", host_header)}
        for name, value in (headers or {}).items():
            defaults[name.lower()] = (name, value)
        self._default_names = frozenset(defaults) | _MANAGED
        self.keep_alive = "close" not in defaults.get("connection", ("", ""))[1].lower()
        self._defaults = defaults
        self.fixed = "".join(f"{name}: {value}\r\n" for name, value in defaults.values())
        check_header_text(self.fixed, len(defaults))
        try:
            self.fixed.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError("a default header is not latin-1 encodable") from None
        self.cookies = cookies

    def encode(
        self, method: str, target: str | None, headers: Mapping[str, str] | None, body: bytes | None
    ) -> tuple[bytes, bool]:
        """The request line, headers and body as one bytes object, and whether to keep alive."""
        if method not in _KNOWN_METHODS and not _TOKEN.fullmatch(method):
            raise ValueError("invalid HTTP method")
        target = self.target if target is None else clean_target(target)
        keep_alive = self.keep_alive
        parts = [method, " ", target, " HTTP/1.1\r\n", self.fixed]
        if headers:
            lowered = [name.lower() for name in headers]
            if len(set(lowered)) != len(lowered) or not self._default_names.isdisjoint(lowered):
                parts[4] = self._merged_fixed(headers)
            else:
                extra = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
                check_header_text(extra, len(lowered))
                parts.append(extra)
            if "connection" in lowered:
                value = [v for k, v in headers.items() if k.lower() == "connection"][-1]
                keep_alive = "close" not in value.lower()
        if body is not None:
            parts.append(f"Content-Length: {len(body)}\r\n")
        elif method == "POST" or method == "PUT" or method == "PATCH":
            parts.append("Content-Length: 0\r\n")
        if self.cookies:
            parts.append(self._cookie_line(headers))
        parts.append("\r\n")
        try:
            head = "".join(parts).encode("latin-1")
        except UnicodeEncodeError:
            # from None: the encoding error would carry the whole header value along.
            raise ValueError("a request header is not latin-1 encodable") from None
        return (head + body if body else head), keep_alive

    def _merged_fixed(self, headers: Mapping[str, str]) -> str:
        """The slow path: request headers replacing defaults (or each other) by name."""
        merged = dict(self._defaults)
        for name, value in headers.items():
            merged[name.lower()] = (name, value)
        merged.pop("content-length", None)  # the client writes the body's own length
        if self.cookies:
            merged.pop("cookie", None)  # folded into the jar's line by `_cookie_line`
        text = "".join([f"{name}: {value}\r\n" for name, value in merged.values()])
        check_header_text(text, len(merged))
        return text

    def _cookie_line(self, headers: Mapping[str, str] | None) -> str:
        value = self.cookies.header()
        if headers:
            own = [v for k, v in headers.items() if k.lower() == "cookie"]
            if own:
                value = "; ".join([*own, value]) if value else "; ".join(own)
        if not value:
            return ""
        check_header_text(value, 0)
        return f"Cookie: {value}\r\n"


def check_header_text(text: str, lines: int) -> None:
    """`text` is `lines` header lines each ending in CRLF: any other CR, LF or NUL is an injection.

    Counting is three C-level scans over the whole block instead of a check per name and value.
    The message never quotes the text: header values can carry credentials."""
    if text.count("\r") != lines or text.count("\n") != lines or "\x00" in text:
        raise ValueError("a header name or value contains CR, LF or NUL")


def clean_target(target: str) -> str:
    """A request target as written: non-ASCII percent-encoded; `ValueError` for spaces or
    control characters (they would end the request line early)."""
    if not target.isascii():
        target = quote(target, safe=_TARGET_SAFE)
    if not target or _BAD_TARGET.search(target):
        raise ValueError("the request target contains spaces or control characters")
    return target


def has_bad_host_characters(host: str) -> bool:
    """Whether a host name has a space or control character (it cannot be written in a head)."""
    return _BAD_TARGET.search(host) is not None
