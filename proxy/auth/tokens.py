"""`--auth tokens`: named bearer tokens from a file, for simple internal deployments.

Contract:
- The file (`--auth-tokens-file`) holds one `NAME TOKEN` per line; blank lines and lines whose
  first non-blank character is `#` are ignored. A name is 1-64 of `A-Za-z0-9._-`; a token is
  16-512 visible ASCII characters (RFC 6750's b64token and more), no blanks. Names and tokens are
  unique. Anything else is a problem naming the line number and nothing of the line's text: not
  the token, and not the name either (a line written `TOKEN NAME` puts the secret in the name's
  place).
- A request's principal is `token:<name>` of the entry whose token it presents; scopes: none
  (`scopes_known`: a policy's `required_scopes` then refuse the call, since a named token grants
  no scope). Lookup is a keyed digest: the table maps HMAC-SHA256(per-process random key, token)
  to the name, and the presented token's digest is looked up in it. The key is secret, so an
  attacker cannot choose which digests to probe and the dict's timing tells nothing about any
  token (the same guarantee as `hmac.compare_digest` over every entry, at O(1)).
- Hot reload, like the policy folder (proxy/filewatch.py): the file's folder is watched (a
  Kubernetes Secret swaps its `..data` symlink); the file is read off the event loop, validated
  whole, then swapped in one assignment. A bad file at start refuses the start
  (`AuthConfigError`); a bad reload keeps the last good table, logs each problem and is recorded
  (`reloads_error`, `last_error`), like a refused policy reload.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from proxy.auth.base import AuthConfigError, AuthMode, AuthRefused, Principal, bearer_token
from proxy.filewatch import FolderWatcher, log_refused

log = logging.getLogger("proxy.auth")

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TOKEN = re.compile(r"[\x21-\x7e]{16,512}")
MAX_FILE_BYTES = 1024 * 1024


def parse_tokens(text: str, where: str) -> tuple[dict[str, str], list[str]]:
    """name -> token, and the problems (each naming `where` and a line, never a token)."""
    table: dict[str, str] = {}
    # where each name and token was first given, so a duplicate names that line instead of the text
    name_lines: dict[str, int] = {}
    token_lines: dict[str, int] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = stripped.split()
        if len(fields) != 2:
            problems.append(f"{where}:{number}: expected 'NAME TOKEN' (two fields), found {len(fields)}")
            continue
        # Neither field is quoted in a problem: a line written the wrong way round ('TOKEN NAME')
        # has the secret where the name belongs, and a problem goes to the log.
        name, token = fields
        if not _NAME.fullmatch(name):
            problems.append(f"{where}:{number}: a name is 1-64 of A-Za-z0-9._-")
        elif not _TOKEN.fullmatch(token):
            problems.append(
                f"{where}:{number}: the token must be 16-512 visible ASCII characters "
                "(the line is 'NAME TOKEN', in that order)"
            )
        elif name in name_lines:
            problems.append(f"{where}:{number}: the name is already given on line {name_lines[name]}")
        elif token in token_lines:
            problems.append(f"{where}:{number}: the token is already line {token_lines[token]}'s token")
        else:
            table[name] = token
            name_lines[name] = number
            token_lines[token] = number
    if not table and not problems:
        problems.append(f"{where}: no tokens (every caller would be refused)")
    return table, problems


class TokensAuthenticator:
    mode: AuthMode = "tokens"

    def __init__(self, path: Path, *, debounce_ms: int = 200, force_polling: bool | None = None) -> None:
        self.path = path
        self._key = secrets.token_bytes(32)
        self._by_digest: dict[bytes, Principal] = {}
        self.names: tuple[str, ...] = ()
        self.reloads_ok = 0
        self.reloads_error = 0
        self.last_error: str | None = None
        self._watcher = FolderWatcher(
            [path.parent],
            self.reload,
            what="tokens file",
            debounce_ms=debounce_ms,
            force_polling=force_polling,
            reads=lambda name: name == path.name,
        )
        self._lock = asyncio.Lock()
        problems = self._apply(self._read())
        if problems:
            raise AuthConfigError("--auth-tokens-file is invalid: " + "; ".join(problems))

    def _digest(self, token: str) -> bytes:
        return hmac.new(self._key, token.encode("ascii", "surrogateescape"), hashlib.sha256).digest()

    def _read(self) -> tuple[dict[str, str], list[str]]:
        where = str(self.path)
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            return {}, [f"{where}: cannot be read ({exc.strerror or type(exc).__name__})"]
        if len(raw) > MAX_FILE_BYTES:
            return {}, [f"{where}: larger than {MAX_FILE_BYTES} bytes"]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return {}, [f"{where}: not UTF-8 text"]
        return parse_tokens(text, where)

    def _apply(self, parsed: tuple[dict[str, str], list[str]]) -> list[str]:
        table, problems = parsed
        if problems:
            return problems
        self._by_digest = {self._digest(token): Principal(f"token:{name}") for name, token in table.items()}
        self.names = tuple(sorted(table))
        return []

    async def reload(self, reason: str = "manual") -> bool:
        """Read and validate the file off the event loop; swap, or keep the last good table."""
        async with self._lock:
            parsed = await asyncio.to_thread(self._read)
            before = self.names
            problems = self._apply(parsed)
        if problems:
            self.reloads_error += 1
            self.last_error = log_refused(log, "tokens file", reason, f"{len(self.names)} tokens", problems)
            return False
        self.reloads_ok += 1
        self.last_error = None
        if before != self.names:
            log.info("tokens file reload (%s): %d tokens (%s)", reason, len(self.names), ", ".join(self.names))
        return True

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        token = bearer_token(headers)
        principal = self._by_digest.get(self._digest(token))
        if principal is None:
            raise AuthRefused(401, "unknown_token", "the token is not valid")
        return principal

    async def start(self) -> None:
        self._watcher.start()

    async def aclose(self) -> None:
        await self._watcher.aclose()


def read_secret_file(path: Path, what: str) -> str:
    """One secret from a file (its first non-blank line, trimmed); `AuthConfigError` if unusable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4097)
    except OSError as exc:
        raise AuthConfigError(f"{what} {path} cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        lines = [line.strip() for line in raw.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise AuthConfigError(f"{what} {path} is not UTF-8 text") from None
    if len(raw) > 4096 or len(lines) != 1 or not _TOKEN.fullmatch(lines[0]):
        raise AuthConfigError(f"{what} {path} must hold one token of 16-512 visible ASCII characters")
    return lines[0]
