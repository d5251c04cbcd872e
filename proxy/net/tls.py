"""The TLS client context for an HTTPS upstream, built at start from the settings and rebuilt
when its files change.

Contract:
- `client_context(ca=..., cert=..., key=..., key_password=...)` returns one `ssl.SSLContext` that
  every connection to the upstream (direct or through an egress proxy's tunnel) uses;
  `read_key_password(file)` reads the passphrase.
  Certificate and hostname verification are always on: there is no switch to turn them off (a
  private CA, or a self-signed server certificate itself, given with `--upstream-ca` is the way
  to trust an upstream the system roots do not know).
- `--upstream-ca FILE` (PEM, one or more certificates) *replaces* the system roots: only what the
  file holds is trusted for the upstream, as with curl's `--cacert` and httpx's `verify=`. An
  internal upstream is then pinned to the private CA, and a public CA cannot vouch for it.
  Without it the system roots are used (`SSL_CERT_FILE`/`SSL_CERT_DIR` honoured, as OpenSSL does).
- `--upstream-client-cert FILE` with `--upstream-client-key FILE` (PEM; the key may also be in
  the certificate file) is the client certificate for mutual TLS. An encrypted key needs
  `--upstream-client-key-password-file FILE` (its first line is the passphrase); the proxy never
  prompts on a terminal.
- The shared store's TLS (`--state-ca`, `--state-client-cert`, `--state-client-key`, proxy/state/)
  uses the same checks with `flag="--state"`, so every message names the flag that was given, and
  the same watcher (`TlsFiles(flag="--state")`, `TlsWatcher(name="shared state")`).
- A file that is missing, unreadable or not what its setting expects raises `TlsConfigError`
  (a `ValueError`, so the command line prints it and exits 2) whose message names the setting and
  the file, and never repeats the file's content nor the passphrase.

- Renewal without a restart (`TlsWatcher`): the folders of the CA, client certificate, key and
  passphrase files are watched, like the policy folder (proxy/filewatch.py: a Kubernetes Secret
  or cert-manager swaps its `..data` link). When what the files hold changes, a new
  context is built from them off the event loop, whole, with the same checks as at start; a good
  one replaces the old for every connection opened from then on (connections already open keep
  their handshake), a bad one (a half-written renewal, a key that does not fit) is refused: the
  last good context stays, the problem is logged (naming the setting and file, never the
  content) and counted (`reloads_error`, `last_error`).

The context itself is the standard library's: what `asyncio` takes for `create_connection(ssl=...)`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxy.filewatch import FolderWatcher, log_refused

__all__ = ["TlsConfigError", "TlsFiles", "TlsWatcher", "client_context", "read_key_password"]

log = logging.getLogger("proxy.upstream.tls")


class TlsConfigError(ValueError):
    """A TLS setting names a file the proxy cannot use; the message names the setting."""


class _Encrypted(Exception):
    """Raised by the password callback when an encrypted key came without a passphrase."""


def read_key_password(path: Path | None, *, flag: str = "--upstream") -> str | None:
    """The passphrase in the first line of `path` (a mounted secret), None without a file."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsConfigError(f"{flag}-client-key-password-file {path}: cannot be read ({type(exc).__name__})") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise TlsConfigError(f"{flag}-client-key-password-file {path}: the file is empty")
    return password


def client_context(
    *,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    key_password: str | None = None,
    flag: str = "--upstream",
) -> ssl.SSLContext:
    """The verifying client context: the private CA (or the system roots) and the client cert.
    `flag` is the prefix of the settings' names in messages (`--upstream`, `--state`)."""
    if key is not None and cert is None:
        raise TlsConfigError(f"{flag}-client-key needs {flag}-client-cert (the certificate it belongs to)")
    if ca is not None:
        _readable(f"{flag}-ca", ca)
        try:
            # With a CA file, the standard library's default context loads that file and not the
            # system roots: the CA replaces them (see the docstring).
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
        except ssl.SSLError as exc:
            raise TlsConfigError(f"{flag}-ca {ca}: no PEM certificate could be read from it ({_reason(exc)})") from None
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    # The default context already verifies certificates and host names; stated, since it is the
    # guarantee this module gives.
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        _readable(f"{flag}-client-cert", cert)
        if key is not None:
            _readable(f"{flag}-client-key", key)
        _load_client_pair(context, cert, key, key_password, flag)
    return context


def _load_client_pair(context: ssl.SSLContext, cert: Path, key: Path | None, password: str | None, flag: str) -> None:
    def no_passphrase() -> str:
        raise _Encrypted

    where = f"{flag}-client-cert {cert}" + (f" with {flag}-client-key {key}" if key else "")
    try:
        context.load_cert_chain(str(cert), str(key) if key else None, password=password or no_passphrase)
    except _Encrypted:
        raise TlsConfigError(
            f"{flag}-client-key {key or cert}: the key is encrypted; give its passphrase with "
            f"{flag}-client-key-password-file"
        ) from None
    except ssl.SSLError as exc:
        reason = exc.reason or ""
        if reason == "KEY_VALUES_MISMATCH":
            raise TlsConfigError(f"{where}: the key does not belong to the certificate") from None
        if password is not None:
            # OpenSSL reports a wrong passphrase as a PEM error too: name both possibilities.
            raise TlsConfigError(
                f"{where}: cannot load the certificate and key (not PEM, or the passphrase in "
                f"{flag}-client-key-password-file does not decrypt the key: {_reason(exc)})"
            ) from None
        raise TlsConfigError(f"{where}: cannot load a PEM certificate and its private key ({_reason(exc)})") from None


def _readable(setting: str, path: Path) -> None:
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise TlsConfigError(f"{setting} {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason code (`NO_CERTIFICATE_OR_CRL_FOUND`), never anything from the file."""
    return exc.reason or exc.library or "unrecognised content"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The files a TLS context is built from (the `--upstream-ca`/`-client-*` settings, or
    `--state-…` with `flag="--state"`)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    password_file: Path | None = None
    flag: str = "--upstream"  # the settings' prefix, in every message

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.ca, self.cert, self.key, self.password_file) if p is not None)

    def build(self) -> ssl.SSLContext:
        """The context these files give now; `TlsConfigError` when they cannot give one."""
        return client_context(
            ca=self.ca,
            cert=self.cert,
            key=self.key,
            key_password=read_key_password(self.password_file, flag=self.flag),
            flag=self.flag,
        )

    def fingerprint(self) -> bytes:
        """A digest of what the files hold (a missing file counts as its own state)."""
        digest = hashlib.sha256()
        for path in self.paths:
            try:
                digest.update(path.read_bytes())
            except OSError as exc:
                digest.update(f"unreadable:{exc.errno}".encode())
            digest.update(b"\0")
        return digest.digest()


class TlsWatcher:
    """Rebuilds a TLS context when its files change; see the module docstring. `name` says whose
    files they are in the log ("upstream", "shared state")."""

    def __init__(
        self,
        files: TlsFiles,
        apply: Callable[[ssl.SSLContext], None],
        *,
        debounce_ms: int = 200,
        force_polling: bool | None = None,
        name: str = "upstream",
    ) -> None:
        self.files = files
        self.name = name
        self._apply = apply
        self._loaded = files.fingerprint()  # what the context built at start was made of
        self.reloads_ok = 0
        self.reloads_error = 0
        self.last_error: str | None = None
        # Called after a reload applied or refused a change (None: nobody asks; tests wait on it).
        self.on_done: Callable[[], None] | None = None
        self._lock = asyncio.Lock()
        self._watcher = FolderWatcher(
            (path.parent for path in files.paths),
            self.reload,
            what=f"{name} TLS files",
            debounce_ms=debounce_ms,
            force_polling=force_polling,
            reads=frozenset(path.name for path in files.paths).__contains__,
        )

    async def reload(self, reason: str = "manual") -> bool | None:
        """Build a context from the files if they changed; True: applied, False: refused, None: unchanged."""
        async with self._lock:
            fingerprint = await asyncio.to_thread(self.files.fingerprint)
            if fingerprint == self._loaded:
                return None
            try:
                context = await asyncio.to_thread(self.files.build)
            except TlsConfigError as exc:
                # Remembered, so the same bad content is reported once, not at every event.
                self._loaded = fingerprint
                self.reloads_error += 1
                self.last_error = log_refused(log, f"{self.name} TLS files", reason, "the last good ones", [str(exc)])
                self._done()
                return False
            self._loaded = fingerprint
            self._apply(context)
            self.reloads_ok += 1
            self.last_error = None
            log.info("%s TLS files reloaded (%s): new connections use them", self.name, reason)
            self._done()
            return True

    def _done(self) -> None:
        if self.on_done is not None:
            self.on_done()

    async def start(self) -> None:
        self._watcher.start()

    async def aclose(self) -> None:
        await self._watcher.aclose()
